"""The wall clock against the boot clock: how far apart they are now, and the traces a step leaves.

CLOCK_REALTIME minus CLOCK_BOOTTIME, the boot offset (when the host booted, as the wall clock reads
now), moves only when the wall clock is stepped: settimeofday, clock_settime, an NTP daemon's step, a
VM's clock set on resume, a leap second. A slew moves both clocks alike and a suspend adds to both.

The kernel keeps no history of it. /proc/stat's ``btime`` is the offset recomputed at every read
(``getboottime64``), so it moves with each step; a file's times (mtime, ctime, statx's birth time)
are stamped from the wall clock, as SMG's segment names are, and step with them. So how far the clock
was stepped since a given moment cannot be read. What a forward step does leave is a trace: a stamp
made at a moment known to come after boot time ``b`` reads, with today's offset, as if made before
``b``, by as much as the clock was stepped forward since, less however long after ``b`` it was made.
A trace is a lower bound of a step, never the whole of it (``step_shown``).

The boot clock itself (``boot_clock_ns``) cannot be stepped: it is what gc proves with (a sighting
of a segment, segments/sightings.py, against a process's start), and ``boot_clock_id`` says which
boot clock a stored time was read on.
"""

from __future__ import annotations

import os
import struct
import time
from typing import NamedTuple

from smgshm.core.host.mounts import mount_of, read_mounts
from smgshm.core.host.proc import statx
from smgshm.core.paths import BOOT_ID_PATH

# Filesystems that cannot outlive a boot: whatever is stamped on them was stamped after it.
BOOT_BOUND_FS = frozenset({"tmpfs", "ramfs"})
_STATX_BTIME = 0x800  # linux/stat.h


class WallClock(NamedTuple):
    """The clocks as one scan reads them, once."""

    offset: float  # boot_offset() at the scan's start: puts a boot-clock time on the wall clock as it reads now
    dir_step: float  # how far forward the wall clock was stepped since the shm dir was made, as far as shown (0: none)


def boot_offset() -> float:
    """CLOCK_REALTIME minus CLOCK_BOOTTIME now, in seconds: the tightest of three reads, so that a
    preemption between the two clocks' reads does not move it."""
    reads = []  # (window, offset) in ns
    for _ in range(3):
        b0 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        b1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        reads.append((b1 - b0, real - (b0 + b1) // 2))
    return min(reads)[1] / 1e9


def boot_clock_ns() -> int:
    """CLOCK_BOOTTIME now, in ns: the clock /proc/P/stat's starttime counts on, which nothing steps."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


_clock_id: list[str] = []  # read once: a process's boot and time namespace are its own for life


def _forgotten() -> None:
    _clock_id.clear()  # a child forked after its parent unshared a time namespace is in that one


os.register_at_fork(after_in_child=_forgotten)


def boot_clock_id() -> str | None:
    """Which boot clock ``boot_clock_ns`` reads: this boot's id and this process's time namespace (whose
    offsets shift it); None when either cannot be read. Times read under another id mean nothing here.
    Read once per process (a node's run asks it for every tmpfs): neither changes for a process."""
    if not _clock_id and (read := _read_clock_id()) is not None:  # (one not read is asked again)
        _clock_id.append(read)
    return _clock_id[0] if _clock_id else None


def _read_clock_id() -> str | None:
    try:
        with open(BOOT_ID_PATH, "rb") as f:
            boot = f.read(64).strip()
        timens = os.readlink("/proc/self/ns/time")
    except OSError:
        return None
    if not boot or not all(c in b"0123456789abcdef-" for c in boot):
        return None
    return f"{boot.decode()}/{timens.removeprefix('time:').strip('[]')}"


def step_shown(stamp: float | None, after_boot_s: float, offset: float) -> float:
    """How far forward the wall clock has been stepped, at least, since ``stamp`` (a wall-clock time)
    was made, given that it was made no earlier than ``after_boot_s`` on the boot clock; 0 when it
    shows none. With today's ``offset`` that moment reads ``after_boot_s + offset``: a stamp earlier
    than that was made while the offset was smaller, by at least the difference."""
    if stamp is None:
        return 0.0
    return max(0.0, after_boot_s + offset - stamp)


def stamp(path: str) -> float | None:
    """The earliest of ``path``'s access, change and modification times (None when it cannot be
    stat'ed): for an inode stamped once when it is made (a /proc/P directory, made when something
    first looks at the process), the wall-clock time it was made, as the clock read then."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return min(st.st_atime, st.st_mtime, st.st_ctime)


def birth_time(path: str) -> float | None:
    """``path``'s birth time (statx STATX_BTIME) in wall-clock seconds; None where the kernel, the
    filesystem or the C library does not give it."""
    got = statx(path, _STATX_BTIME)
    if got is None or not got[0] & _STATX_BTIME:  # the mask: what the kernel filled in
        return None
    buf = got[1]
    sec: int
    nsec: int
    sec, nsec = struct.unpack_from("=qI", buf, 80)  # stx_btime
    return sec + nsec / 1e9


def dir_step_shown(path: str, dev: int | None, offset: float) -> float:
    """How far forward the wall clock has been stepped since the dir ``path`` (of device ``dev``) was
    made, as its birth time shows; 0 unless it lies on a filesystem made after boot (``BOOT_BOUND_FS``),
    where its making is known to come after boot time 0."""
    if dev is None:
        return 0.0
    try:
        where = mount_of(read_mounts(), dev)
    except OSError:
        return 0.0
    if where is None or where.fstype not in BOOT_BOUND_FS:
        return 0.0
    return step_shown(birth_time(path), 0.0, offset)


def read_wall_clock(shm_dir: str, dev: int | None) -> WallClock:
    """The clocks for one scan of ``shm_dir`` (of device ``dev``), read once."""
    offset = boot_offset()
    return WallClock(offset, dir_step_shown(shm_dir, dev, offset))


__all__ = [
    "BOOT_BOUND_FS",
    "WallClock",
    "birth_time",
    "boot_clock_id",
    "boot_clock_ns",
    "boot_offset",
    "dir_step_shown",
    "read_wall_clock",
    "stamp",
    "step_shown",
]
