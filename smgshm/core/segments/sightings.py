"""Sightings: when smgshm first saw each segment, on the boot clock, kept from one scan to the next.

gc must never delete on the wall clock alone: a segment's name and mtime are wall-clock times,
and a step of that clock (host/clock.py) moves everything stamped before it. The boot clock
(CLOCK_BOOTTIME) cannot be stepped, and it is the clock of a process's start (/proc/P/stat field
22). So a scan records, for each segment whose producer pid a process holds, the boot-clock time
at which it saw the segment; a later judgement (segments/judge.py) then has two proofs with no
wall clock in them. A producer exists before its segment, so a process that started after a
sighting is not the producer: the pid was reused. And a segment first seen at least ``s`` seconds
ago is at least ``s`` seconds old.

A sighting is keyed by the entry's inode and holds its owner, its change time (ctime, which
creation, a rename and a write all set: here only an identity, never a time) and a checksum of
its name, so that a reused inode, a renamed or rewritten entry is a new sighting, never an old
one. One store per shm dir (its device and inode name the file), stamped with the boot clock it
was read on (the boot id and this process's time namespace) and the dir's own birth time: a store
of another boot, clock or mount of the same device reads as empty.

Every regular entry whose name carries a pid is recorded, the leaked too: a producer that died
leaves a segment whose pid a later process may take, and only a sighting from before that
process started proves the reuse. Columns of fixed-size integers, so that a store of 100,000
sightings loads in milliseconds (benchmarks/gc_scan.py: gc's speed is the README's).

Where: root's under /run/smgshm (a tmpfs: it dies with the boot), made 0700; another user's in
their own cache dir; $SMGSHM_STATE_DIR, when absolute, instead of either. Any of them is read
through host/usercache.py as hostile input: only a regular file of this user's, writable by no one
else, in a dir of the same, bounded in size, wholly well formed, with no sighting in the future;
anything else reads as no sightings, which proves nothing and so deletes nothing the wall clock
alone would have. Writing can fail (read-only /run, a full
disk): the judgement is then the no-sightings one. Nothing here raises.
"""

from __future__ import annotations

import array
import contextlib
import os
import struct
import sys
import time
import zlib

from smgshm.core.host import clock, usercache
from smgshm.core.host.proc import statx

ROOT_STORE_DIR = "/run/smgshm"
MAX_RECORDS = 1 << 21  # two million entries of a crowded shm dir; beyond that, newcomers wait for room
_MAGIC = "smgshm-sightings 2"
# The columns, in file order: inode, uid, ctime (ns), name checksum, first seen (boot clock, ns).
_COLUMNS = "QIqIQ"
_RECORD = sum(array.array(c).itemsize for c in _COLUMNS)
MAX_BYTES = 512 + _RECORD * MAX_RECORDS  # the header, then the columns: a bigger file is no store of ours
_PREFIX = "sightings-"
_SWEEP_AFTER_S = 86400.0  # another dir's store untouched this long: its dir is gone (or idle: it restarts)
_SWEEP_MAX = 256  # entries of the store dir looked at per write
_STATX_INO, _STATX_BTIME = 0x100, 0x800  # linux/stat.h


STATE_DIR_ENV = "SMGSHM_STATE_DIR"  # an absolute dir instead (a DaemonSet's volume, a test session's own)


def store_dir() -> str:
    """Where this user's sightings live: $SMGSHM_STATE_DIR when absolute; else /run/smgshm for root,
    the user's cache dir for others. The same private-file rules hold wherever it is."""
    chosen = os.environ.get(STATE_DIR_ENV, "")
    if os.path.isabs(chosen):
        return chosen
    return ROOT_STORE_DIR if os.geteuid() == 0 else usercache.cache_dir()


def name_sum(name: str) -> int:
    """The checksum of a name a sighting keeps (CRC-32 of its bytes)."""
    return zlib.crc32(os.fsencode(name))


def _dir_witness(path: str) -> tuple[int, int] | None:
    """(inode, birth time in ns, 0 when not given) of the dir ``path``; None when it cannot be stat'ed."""
    got = statx(path, _STATX_INO | _STATX_BTIME)
    if got is None or not got[0] & _STATX_INO:
        return None
    ino = struct.unpack_from("=Q", got[1], 32)[0]  # stx_ino
    if not got[0] & _STATX_BTIME:
        return ino, 0
    sec, nsec = struct.unpack_from("=qI", got[1], 80)  # stx_btime
    return ino, sec * 10**9 + nsec


class Sightings:
    """The sightings of one shm dir, as columns (``inos``, ``uids``, ``ctimes``, ``sums``, ``seen``)
    with ``index`` (inode -> row); and what this scan keeps and adds. The judge fills ``keep``
    (rows seen again, the same entry) and ``new`` ((inode, uid, ctime, name), first seen) as it
    goes; ``save`` writes them, dropping what was not seen again."""

    def __init__(self, shm_dir: str, dir_dev: int | None, *, directory: str | None = None) -> None:
        self.shm_dir, self.directory = shm_dir, directory or store_dir()
        self.index: dict[int, int] = {}
        self.inos, self.uids, self.ctimes, self.sums, self.seen = (array.array(c) for c in _COLUMNS)
        self.keep: list[int] = []
        self.new: list[tuple[int, int, int, str]] = []
        self.header: bytes | None = None
        self.file = ""
        self.note = ""  # why nothing was loaded, for the curious
        clock_id = clock.boot_clock_id()
        dir_witness = _dir_witness(shm_dir)
        if clock_id is None or dir_witness is None or dir_dev is None:
            self.note = "the boot clock or the shm dir cannot be identified: no sightings"
            return
        self.file = f"{_PREFIX}{dir_dev}-{dir_witness[0]}"
        self.header = f"{_MAGIC} {sys.byteorder} {clock_id} {dir_dev} {dir_witness[0]} {dir_witness[1]}".encode()
        data = usercache.read_private(self.file, MAX_BYTES, self.directory)
        if data is not None and not self._load(data, clock.boot_clock_ns()):
            self.note = "the stored sightings are not this boot's, clock's or dir's, or not well formed: ignored"
            self.index = {}
            self.inos, self.uids, self.ctimes, self.sums, self.seen = (array.array(c) for c in _COLUMNS)

    def _load(self, data: bytes, now_ns: int) -> bool:
        """Take the store ``data`` if it is wholly well formed, of this header (boot, clock, dir), and
        sees nothing later than ``now_ns``; False (nothing taken) otherwise."""
        head, nl, body = data.partition(b"\n")
        fields = head.rsplit(b" ", 1)
        if not nl or len(fields) != 2 or fields[0] != self.header or not fields[1].isdigit():
            return False
        n = int(fields[1])
        if n > MAX_RECORDS or len(body) != n * _RECORD:
            return False
        at = 0
        for col in (self.inos, self.uids, self.ctimes, self.sums, self.seen):
            size = n * col.itemsize
            col.frombytes(body[at : at + size])
            at += size
        self.index = dict(zip(self.inos, range(n), strict=True))
        return len(self.index) == n and (not n or max(self.seen) <= now_ns)

    def first_seen(self, row: int, name: str) -> int | None:
        """When the stored sighting ``row`` (its inode, uid and ctime matched) was made, if it was of
        ``name`` too; None for another name."""
        return self.seen[row] if self.sums[row] == name_sum(name) else None

    def save(self) -> bool:
        """Write what this scan kept and first saw (the latter at the boot clock's now, which comes
        after the scan saw each of them); stored sightings not seen again are dropped. False when
        nothing was written (nothing changed, or it could not be)."""
        if self.header is None or (not self.new and len(self.keep) == len(self.inos)):
            return False
        now = clock.boot_clock_ns()
        keep = self.keep
        new = self.new[: max(0, MAX_RECORDS - len(keep))]  # the oldest are the ones a proof needs
        cols = [
            array.array("Q", [self.inos[i] for i in keep] + [r[0] for r in new]),
            array.array("I", [self.uids[i] for i in keep] + [r[1] for r in new]),
            array.array("q", [self.ctimes[i] for i in keep] + [r[2] for r in new]),
            array.array("I", [self.sums[i] for i in keep] + [name_sum(r[3]) for r in new]),
            array.array("Q", [self.seen[i] for i in keep] + [now] * len(new)),
        ]
        data = b"".join([self.header, b" %d\n" % len(cols[0]), *(c.tobytes() for c in cols)])
        ok = usercache.write_private(self.file, data, self.directory)
        if ok:
            self._sweep()
        return ok

    def _sweep(self) -> None:
        """Remove other dirs' stores that nothing wrote for a day (their dir gone, a tmpfs unmounted).
        The wall clock decides, which is harmless: a store removed too soon only proves less."""
        cutoff = time.time() - _SWEEP_AFTER_S
        with contextlib.suppress(OSError):
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if os.fstat(dfd).st_uid != os.geteuid():
                    return
                with os.scandir(dfd) as it:
                    for n, entry in enumerate(it):
                        if n >= _SWEEP_MAX:
                            break
                        if entry.name.startswith(_PREFIX) and entry.name != self.file:
                            with contextlib.suppress(OSError):
                                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                                    os.unlink(entry.name, dir_fd=dfd)
            finally:
                os.close(dfd)


__all__ = ["MAX_BYTES", "MAX_RECORDS", "ROOT_STORE_DIR", "Sightings", "name_sum", "store_dir"]
