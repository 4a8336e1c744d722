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

Two writers share a store: a gc (or doctor) scan, and ``smgshm watch``, which records each
segment as it sees it created (watch/witness.py). So a write is a merge, under a lock of the store
dir (flock; one bounded wait a run, host/usercache.LockWaits; no lock, no write): it re-reads the
store and keeps, of two sightings of the same entry, the EARLIER, both being real; it only ever
takes a time someone saw, never makes one up. Each writer drops what it knows has ended
(``write_merged``) and carries the rest.

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
from collections.abc import Callable, Iterable
from typing import NamedTuple

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


def refused(directory: str | None = None) -> str:
    """``"<dir>: <why>"`` when the state dir (``store_dir()`` by default) is refused for sightings (not this
    user's private dir: usercache.refusal); "" when it is, or will be made, one."""
    directory = directory or store_dir()
    why = usercache.refusal(directory)
    return "" if why is None else f"{directory}: {why}"


# A name's bytes as os.fsencode makes them, without its call per name (the judge inlines name_sum).
FS_ENCODING, FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def name_sum(name: str) -> int:
    """The checksum of a name a sighting keeps (CRC-32 of its bytes, os.fsencode's)."""
    return zlib.crc32(name.encode(FS_ENCODING, FS_ERRORS))


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


Columns = tuple["array.array[int]", "array.array[int]", "array.array[int]", "array.array[int]", "array.array[int]"]


def as_columns(cols: Iterable[array.array[int]]) -> Columns:
    """Five columns, in _COLUMNS' order, as the fixed tuple ``Columns`` is."""
    inos, uids, ctimes, sums, seen = cols
    return inos, uids, ctimes, sums, seen


def _columns() -> Columns:
    return as_columns(array.array(c) for c in _COLUMNS)


class StoreFile(NamedTuple):
    """Where one shm dir's sightings live and the header that says whose they are."""

    directory: str
    file: str
    header: bytes  # magic, byte order, boot clock, the dir's device, inode and birth time


def store_file(shm_dir: str, dir_dev: int | None, directory: str | None = None) -> StoreFile | None:
    """The store of ``shm_dir`` (on device ``dir_dev``); None when the boot clock or the dir cannot be
    identified (then there is none: nothing is read or written)."""
    clock_id = clock.boot_clock_id()
    dir_witness = _dir_witness(shm_dir)
    if clock_id is None or dir_witness is None or dir_dev is None:
        return None
    header = f"{_MAGIC} {sys.byteorder} {clock_id} {dir_dev} {dir_witness[0]} {dir_witness[1]}".encode()
    return StoreFile(directory or store_dir(), f"{_PREFIX}{dir_dev}-{dir_witness[0]}", header)


def decode(data: bytes, header: bytes, now_ns: int) -> tuple[Columns, dict[int, int]] | None:
    """The columns of store ``data`` and their index (inode -> row) if it is wholly well formed, of
    ``header`` (boot, clock, dir), has one row per inode and sees nothing later than ``now_ns``; None
    otherwise."""
    head, nl, body = data.partition(b"\n")
    fields = head.rsplit(b" ", 1)
    if not nl or len(fields) != 2 or fields[0] != header or not fields[1].isdigit():
        return None
    n = int(fields[1])
    if n > MAX_RECORDS or len(body) != n * _RECORD:
        return None
    cols, at = _columns(), 0
    for col in cols:
        size = n * col.itemsize
        col.frombytes(body[at : at + size])
        at += size
    index = dict(zip(cols[0], range(n), strict=True))
    if len(index) != n or (n and max(cols[4]) > now_ns):
        return None
    return cols, index


def encode(header: bytes, cols: Columns) -> bytes:
    return b"".join([header, b" %d\n" % len(cols[0]), *(c.tobytes() for c in cols)])


def _rows(cols: Columns, rows: list[int]) -> Columns:
    return as_columns(array.array(c.typecode, map(c.__getitem__, rows)) for c in cols)


def unique(cols: Columns) -> Columns:
    """``cols`` with one row per inode, the first (two links of one inode are one entry to the store:
    the second name's sighting is not kept, so it is first seen at each scan, which proves nothing)."""
    inos = cols[0]
    if len(set(inos)) == len(inos):
        return cols
    firsts = dict(zip(reversed(inos), range(len(inos) - 1, -1, -1), strict=True))
    return _rows(cols, sorted(firsts.values()))


def merge(
    mine: Columns,
    disk: tuple[Columns, dict[int, int]] | None,
    *,
    since_ns: int | None = None,
    ended: frozenset[tuple[int, int, int, int]] | set[tuple[int, int, int, int]] = frozenset(),
) -> Columns:
    """``mine`` (one writer's rows, one per inode) merged with the store on ``disk`` (``decode``'s,
    whose index it consumes): a row of the same entry (inode, owner, ctime, name) takes the EARLIER
    sighting of the two; a disk row of an inode ``mine`` holds as another entry is dropped (``mine``
    is what that writer saw there last); any other disk row is kept, unless it was seen before
    ``since_ns`` or is one of ``ended`` (inode, owner, ctime, name checksum). At most MAX_RECORDS rows,
    ``mine`` first."""
    if disk is None or not disk[1]:
        return mine
    (d_inos, d_uids, d_ctimes, d_sums, d_seen), others = disk
    inos, uids, ctimes, sums, seen = mine
    seen = array.array("Q", seen)
    pop = others.pop
    for i, ino in enumerate(inos):
        j = pop(ino, None)
        if (
            j is not None
            and d_seen[j] < seen[i]
            and (d_uids[j], d_ctimes[j], d_sums[j]) == (uids[i], ctimes[i], sums[i])
        ):
            seen[i] = d_seen[j]
    rest = sorted(others.values())
    if since_ns is not None:
        rest = [j for j in rest if d_seen[j] >= since_ns]
    if ended:
        rest = [j for j in rest if (d_inos[j], d_uids[j], d_ctimes[j], d_sums[j]) not in ended]
    carried = _rows(disk[0], rest[: max(0, MAX_RECORDS - len(inos))])
    return as_columns(a + b for a, b in zip((inos, uids, ctimes, sums, seen), carried, strict=True))


def write_merged(
    store: StoreFile,
    mine: Columns,
    *,
    since_ns: int | None = None,
    ended: frozenset[tuple[int, int, int, int]] | set[tuple[int, int, int, int]] = frozenset(),
    unchanged: Callable[[], bool] | None = None,
) -> Columns | None:
    """Write ``mine`` merged (``merge``, with ``since_ns`` and ``ended``) with the store as it is now,
    under the store dir's lock, which every writer takes (so no write between the read and the
    rename is lost). ``unchanged()``: the store is still what this writer read, and ``mine``
    holds all of it that is to be kept, merged (a gc's common case: no merge to pay). The rows written;
    None when nothing was (the lock not had in time, a dir or file not private, a full disk)."""
    mine = unique(mine)
    with usercache.locked(store.directory) as locked:
        if not locked:
            return None
        # Unchanged since this writer read it: ``mine`` holds all of it that is to stay, merged.
        data = (
            None
            if unchanged is not None and unchanged()
            else usercache.read_private(store.file, MAX_BYTES, store.directory)
        )
        disk = None if data is None else decode(data, store.header, clock.boot_clock_ns())
        cols = merge(mine, disk, since_ns=since_ns, ended=ended)
        if not usercache.write_private(store.file, encode(store.header, cols), store.directory):
            return None
    return cols


class NewRows:
    """The sightings a scan first made, as columns (inode, uid, ctime, name checksum): some 24 bytes a row,
    never a Python object per entry, so that a listing of a crowded dir stays small while it runs. At most
    ``limit`` rows (the first listed); ``dropped`` counts the rest, which are not stored (a later scan sees
    them first again: a later proof, never a false one)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit, self.dropped = MAX_RECORDS if limit is None else limit, 0
        self.inos, self.uids, self.ctimes, self.sums = (array.array(c) for c in _COLUMNS[:4])

    def append(self, row: tuple[int, int, int, str]) -> None:
        if len(self.inos) >= self.limit:
            self.dropped += 1
            return
        self.inos.append(row[0])
        self.uids.append(row[1])
        self.ctimes.append(row[2])
        self.sums.append(name_sum(row[3]))

    def __len__(self) -> int:
        return len(self.inos)

    def clear(self) -> None:
        for col in (self.inos, self.uids, self.ctimes, self.sums):
            del col[:]
        self.dropped = 0


class Sightings:
    """The sightings of one shm dir, as columns (``inos``, ``uids``, ``ctimes``, ``sums``, ``seen``)
    with ``index`` (inode -> row); and what this scan keeps and adds. The judge fills ``keep``
    (rows seen again, the same entry) and ``new`` ((inode, uid, ctime, name), first seen) as it
    goes, both as compact columns; ``save`` writes them, dropping what was not seen again. ``dropped``:
    sightings this scan made that the store had no room for (MAX_RECORDS), after ``save``."""

    def __init__(self, shm_dir: str, dir_dev: int | None, *, directory: str | None = None) -> None:
        # Before the listing: a stored sighting made since may be of an entry created behind it.
        self.since_ns = clock.boot_clock_ns()
        self.shm_dir, self.directory = shm_dir, directory or store_dir()
        self.index: dict[int, int] = {}
        self.inos, self.uids, self.ctimes, self.sums, self.seen = _columns()
        self.keep = array.array("Q")  # rows seen again (their indexes)
        self.new = NewRows()
        self.header: bytes | None = None
        self.file = ""
        self.note = ""  # why nothing was loaded, for the curious
        self.stored = False  # after ``save``: the store holds every sighting this scan made (a later scan's proofs)
        self.stamp: tuple[int, int, int, int] | None = None  # the file read (``changed``)
        self.dropped = 0  # sightings made but not stored, the store being full (``save``)
        # A state dir that is not this user's own private one (a shared 1777 dir named by $SMGSHM_STATE_DIR)
        # is refused whole, and never chmod'ed: "<dir>: <why>", for a warning; nothing is read or stored.
        self.refused = refused(self.directory)
        if self.refused:
            self.note = f"state dir {self.refused}: no sightings read or stored"
            return
        store = store_file(shm_dir, dir_dev, self.directory)
        if store is None:
            self.note = "the boot clock or the shm dir cannot be identified: no sightings"
            return
        self.file, self.header = store.file, store.header
        self.stamp = self._stamp()  # before the read: a write after it is a change, whichever was read
        data = usercache.read_private(self.file, MAX_BYTES, self.directory)
        if data is not None and not self._load(data, clock.boot_clock_ns()):
            self.note = "the stored sightings are not this boot's, clock's or dir's, or not well formed: ignored"

    def _load(self, data: bytes, now_ns: int) -> bool:
        """Take the store ``data`` if it is wholly well formed, of this header (boot, clock, dir), and
        sees nothing later than ``now_ns``; False (nothing taken) otherwise."""
        got = decode(data, self.header or b"", now_ns)
        if got is None:
            return False
        (self.inos, self.uids, self.ctimes, self.sums, self.seen), self.index = got
        return True

    def _stamp(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(os.path.join(self.directory, self.file), follow_symlinks=False)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size

    def changed(self) -> bool:
        """Whether the store file is another than the one read (written since: a rename, always)."""
        return self.header is not None and self._stamp() != self.stamp

    def forget(self) -> None:
        """Drop what this scan kept and first saw (a judgement whose store is not to be written)."""
        del self.keep[:]
        self.new.clear()

    def release(self) -> None:
        """Drop what was read and kept (its judgement over, its store written or not): a run over many dirs
        holds one dir's sightings at a time. What the run reports (``stored``, ``dropped``, ``note``) stays."""
        self.index = {}
        self.inos, self.uids, self.ctimes, self.sums, self.seen = _columns()
        self.forget()

    def first_seen(self, row: int, name: str) -> int | None:
        """When the stored sighting ``row`` (its inode, uid and ctime matched) was made, if it was of
        ``name`` too; None for another name."""
        return self.seen[row] if self.sums[row] == name_sum(name) else None

    def save(self) -> bool:
        """Write what this scan kept and first saw (the latter at the boot clock's now, which comes
        after the scan saw each of them), merged (``write_merged``) with what another writer stored
        meanwhile: a stored sighting neither seen again nor made since the scan began is dropped (the
        listing would have seen it). False when nothing was written (nothing changed, or it could not be)."""
        if self.header is None or (not self.new and len(self.keep) == len(self.inos)):
            self.stored = self.header is not None  # nothing new to write: what it saw is stored already
            return False
        now = clock.boot_clock_ns()
        keep, new = self.keep, self.new
        room = min(len(new), max(0, MAX_RECORDS - len(keep)))  # the first listed; the oldest a proof needs
        self.dropped = new.dropped + len(new) - room
        cols: Columns = (
            array.array("Q", map(self.inos.__getitem__, keep)) + new.inos[:room],
            array.array("I", map(self.uids.__getitem__, keep)) + new.uids[:room],
            array.array("q", map(self.ctimes.__getitem__, keep)) + new.ctimes[:room],
            array.array("I", map(self.sums.__getitem__, keep)) + new.sums[:room],
            array.array("Q", map(self.seen.__getitem__, keep)) + array.array("Q", [now]) * room,
        )
        store = StoreFile(self.directory, self.file, self.header)
        # The file read, if nothing in it was made since the listing began: unchanged, nothing is left to merge.
        # (A file replaced since has a new inode, and its own times: the stamp tells, bar an inode number
        # freed and taken again with the same size within one timestamp tick, which would lose the other's
        # sightings: only ever a later proof.)
        read = self.stamp if self.stamp is not None and (not len(self.seen) or max(self.seen) < self.since_ns) else None
        ok = (
            write_merged(
                store, cols, since_ns=self.since_ns, unchanged=lambda: read is not None and self._stamp() == read
            )
            is not None
        )
        self.stored = ok and not self.dropped
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


__all__ = [
    "FS_ENCODING",
    "FS_ERRORS",
    "MAX_BYTES",
    "MAX_RECORDS",
    "ROOT_STORE_DIR",
    "Columns",
    "NewRows",
    "Sightings",
    "StoreFile",
    "as_columns",
    "decode",
    "encode",
    "merge",
    "name_sum",
    "refused",
    "store_dir",
    "store_file",
    "unique",
    "write_merged",
]
