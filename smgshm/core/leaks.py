"""List the shm dir's SMG entries and judge each one: in flight, held, leaked, stale, hazard, unknown.

Liveness is judged like omnigent#7495 does it, not like SMG's own sweep: a producer pid
is alive only if a process with that pid exists *and* started before the segment was
written (a younger one means the pid was reused); and a pid verdict is trusted only when
no other pid namespace can reach this filesystem (core/pidtrust.py), since there a live
producer's pid means nothing to us. Holders are found by inode (core/holders.py).

The listing streams: ``Scan`` opens the dir, decides trust and indexes holders once, then
judges one entry at a time and keeps only tallies, so memory does not grow with the dir.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from smgshm.core.errors import HostError
from smgshm.core.holders import Holder, holder_index
from smgshm.core.paths import DEFAULT_SHM_DIR, GATEWAY_PREFIX, SMG_FAMILY_PREFIX, SMGSHM_PREFIX
from smgshm.core.pidtrust import INIT_PID_NS, Trust, judge_trust, mount_points

# Where --delete sets an entry aside before it unlinks it (core/reaping.py): SMG's family, so
# gc lists one left by a gc that died mid-way, but no pid pattern, so it is never auto-reaped.
ASIDE_PREFIX = "smg-smgshm-gc-"

# ASCII digits only and a full match: \d would take any Unicode digit (smg-tokenspeed-١٢٣-1-0)
# and `$` matches before a trailing newline; either would hand gc a pid the name never meant.
_D = "([0-9]+)"
# One pattern for all four forms (one regex call per entry, not four); which group matched
# says the kind. The payload forms first: "probe" is no number, so they never take a probe.
_NAME = re.compile(
    re.escape(GATEWAY_PREFIX) + f"(?:{_D}-{_D}-{_D}|probe-{_D})|"
    + re.escape(SMGSHM_PREFIX) + f"(?:{_D}-{_D}-{_D}|probe-{_D}-{_D})"
)  # fmt: skip
# lastindex -> (kind, group of the pid, group of the nanos or 0)
_BY_LAST = {3: ("gateway", 1, 2), 4: ("gateway_probe", 4, 0), 7: ("smgshm", 5, 6), 9: ("smgshm_probe", 8, 9)}
KINDS = ("gateway", "gateway_probe", "smgshm", "smgshm_probe", "gc_aside", "other")


class State(enum.Enum):
    IN_FLIGHT = "in_flight"  # producer alive, segment young: a request on its way
    HELD = "held"  # some process has it open or mapped
    LEAKED = "leaked"  # producer provably dead, nobody holds it
    STALE = "stale"  # producer alive, but the segment is older than --stale-after
    HAZARD = "hazard"  # not a regular file (SMG's reader refuses it, a FIFO hangs it), or a mount point
    UNKNOWN = "unknown"  # liveness cannot be trusted here, or the name carries no pid


class SegmentInfo(NamedTuple):
    """One judged entry. A NamedTuple, not a frozen dataclass: a listing builds one per entry
    and a frozen dataclass costs ten times as much to construct, which a 1M-entry dir feels."""

    name: str  # os.fsdecode form: lossless, undecodable bytes as surrogates; show it escaped
    kind: str  # gateway | gateway_probe | smgshm | smgshm_probe | gc_aside | other
    file_type: str  # regular | symlink | fifo | directory | socket | char_device | block_device
    nbytes: int
    allocated_bytes: int
    age_s: float
    uid: int
    producer_pid: int | None
    producer_alive: bool | None
    holders: tuple[Holder, ...]
    state: State
    reason: str
    ino: int = 0
    nlink: int = 1  # > 1: unlinking this name frees nothing while the other links remain
    dev: int = 0

    @property
    def frees_bytes(self) -> int:
        """What unlinking this name would give back: nothing while another link remains."""
        return self.allocated_bytes if self.nlink <= 1 else 0


@dataclass(frozen=True)
class ScanOptions:
    shm_dir: str = DEFAULT_SHM_DIR
    stale_after_s: float = 3600.0
    assume_dead: bool = False


@dataclass(frozen=True)
class Deletion:
    name: str
    nbytes: int
    deleted: bool
    reason: str
    ino: int = 0
    freed_bytes: int = 0  # 0 when another link keeps the data, or nothing was unlinked


@dataclass(frozen=True)
class GcReport:
    shm_dir: str
    segments: list[SegmentInfo]
    counts: dict[str, int]
    bytes_by_state: dict[str, int]
    reclaimable_bytes: int
    shm_total_bytes: int
    shm_used_bytes: int
    shm_free_bytes: int
    liveness_trusted: bool
    liveness_note: str
    scan_ms: float
    deleted: list[Deletion] = field(default_factory=list)
    remaining_counts: dict[str, int] = field(default_factory=dict)  # after --delete; else equal to counts
    remaining_bytes_by_state: dict[str, int] = field(default_factory=dict)


def parse_name(name: str) -> tuple[str, int | None, int | None]:
    """(kind, producer pid, creation time in ns if the name carries one)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return ("gc_aside" if name.startswith(ASIDE_PREFIX) else "other"), None, None
    kind, p, t = _BY_LAST[m.lastindex]  # type: ignore[index]
    pid = int(m.group(p))
    return kind, pid if pid < 2**32 else None, int(m.group(t)) if t else None


_TYPES = {stat.S_IFREG: "regular", stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo", stat.S_IFDIR: "directory",
          stat.S_IFSOCK: "socket", stat.S_IFCHR: "char_device", stat.S_IFBLK: "block_device"}  # fmt: skip


def _start_time(pid: int) -> float | None:
    """The process start time (epoch seconds) of ``pid``, None if no process has it."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


_new = tuple.__new__


class Judge:
    """The judgement of one entry, with what a scan decides once: trust, holders, start times."""

    def __init__(
        self, opts: ScanOptions, trust: Trust, holders: dict[tuple[int, int], list[Holder]], dir_dev: int | None = None
    ) -> None:
        self.opts, self.trust, self.holders = opts, trust, holders
        self.dir_dev = dir_dev  # the shm dir's device: an entry on another one is a mount point
        # and one bound from this very filesystem, here or in another mount namespace (name -> which)
        self.mounted = mount_points(opts.shm_dir)
        self.starts: dict[int, float | None] = {}  # per scan: a dir of 1M segments has a handful of pids
        self.now = time.time()

    def __call__(self, name: str, st: os.stat_result) -> SegmentInfo:
        kind, pid, nanos = parse_name(name)
        ftype = _TYPES.get(stat.S_IFMT(st.st_mode), "other")
        age = self.now - st.st_mtime
        held = tuple(self.holders.get((st.st_dev, st.st_ino), ())) if self.holders else ()
        state, reason, alive = self._verdict(name, st, kind, pid, nanos, ftype, age, held)
        if st.st_nlink > 1 and ftype == "regular":
            reason += f"; it has {st.st_nlink} links: unlinking this name frees nothing"
        # tuple.__new__: the NamedTuple's own __new__ is a Python function, a third of the cost again.
        return _new(SegmentInfo, (name, kind, ftype, st.st_size, st.st_blocks * 512, age if age > 0.0 else 0.0,
                                  st.st_uid, pid, alive, held, state, reason, st.st_ino, st.st_nlink, st.st_dev))

    def _verdict(
        self, name: str, st: os.stat_result, kind: str, pid: int | None, nanos: int | None, ftype: str, age: float,
        held: tuple[Holder, ...],
    ) -> tuple[State, str, bool | None]:  # fmt: skip
        if (self.dir_dev is not None and st.st_dev != self.dir_dev) or name in self.mounted:
            # Something is mounted over this name (a bind-mounted file or dir): unlink gets EBUSY,
            # and the inode is another filesystem's, never a segment this dir's producer wrote.
            if self.mounted.get(name):  # only there: here rename and unlink succeed and detach it
                return State.HAZARD, f"a mount point in another mount namespace ({self.mounted[name]}); " \
                    "deleting it would detach that mount; never touched", None  # fmt: skip
            return State.HAZARD, f"a mount point ({ftype.replace('_', ' ')} of another filesystem) named like a " \
                "segment; never touched", None  # fmt: skip
        if ftype != "regular":
            what = "a FIFO would hang SMG's reader" if ftype == "fifo" else "SMG's reader refuses it"
            return State.HAZARD, f"a {ftype.replace('_', ' ')} named like a segment: {what}; never touched", None
        if held:
            who = ", ".join(f"{h.pid} ({h.comm}, {h.how})" for h in held[:3])
            return State.HELD, f"open or mapped by {who}", None
        if pid is None:
            if kind == "gc_aside":
                return State.UNKNOWN, "set aside by a gc --delete that did not finish; inspect, remove by hand", None
            return State.UNKNOWN, "the name carries no producer pid", None
        starts = self.starts
        started = starts[pid] if pid in starts else starts.setdefault(pid, _start_time(pid))
        # The later of the name's time and mtime: a forged or skewed name can only make gc keep more.
        written = st.st_mtime if not nanos or nanos / 1e9 < st.st_mtime else nanos / 1e9
        # A process that started after the segment was written cannot have written it (1 s slack
        # for clock granularity): the pid was reused.
        alive = started is not None and started <= written + 1.0
        if not self.opts.assume_dead:
            if not self.trust.trusted:
                return State.UNKNOWN, "producer liveness cannot be trusted here", alive or None
            if st.st_uid in self.trust.doubt_uids:
                return State.UNKNOWN, f"the pid namespaces of uid {st.st_uid}'s processes cannot be read", alive or None
        if not alive:
            why = "no process has that pid" if started is None else "its pid now belongs to a younger process (reused)"
            note = f"; a gateway with pid {pid} will find /dev/shm unwritable and stay inline" \
                if kind == "gateway_probe" else ""  # fmt: skip
            return State.LEAKED, f"producer pid {pid} is dead: {why}{note}", False
        if age >= self.opts.stale_after_s:
            return State.STALE, f"producer pid {pid} lives, but the segment is {age:.0f} s old", True
        return State.IN_FLIGHT, f"producer pid {pid} lives and the segment is young", True


class Tally:
    """Counts and bytes per state and per kind; reclaimable bytes (leaked, single-link)."""

    def __init__(self) -> None:
        self.counts = {s.value: 0 for s in State}
        self.bytes_by_state = {s.value: 0 for s in State}
        self.counts_by_kind = {k: 0 for k in KINDS}
        self.bytes_by_kind = {k: 0 for k in KINDS}
        self.reclaimable_bytes = 0
        self.total = 0

    def add(self, seg: SegmentInfo) -> None:
        # _value_, not .value: Enum.value is a descriptor call, and this runs once per entry.
        st, n = seg.state._value_, seg.allocated_bytes
        self.counts[st] += 1
        self.bytes_by_state[st] += n
        self.counts_by_kind[seg.kind] += 1
        self.bytes_by_kind[seg.kind] += n
        self.total += 1
        if st == "leaked":
            self.reclaimable_bytes += n if seg.nlink <= 1 else 0

    def remove(self, seg: SegmentInfo) -> None:
        st, n = seg.state._value_, seg.allocated_bytes
        self.counts[st] -= 1
        self.bytes_by_state[st] -= n
        self.counts_by_kind[seg.kind] -= 1
        self.bytes_by_kind[seg.kind] -= n
        self.total -= 1
        if st == "leaked":
            self.reclaimable_bytes -= n if seg.nlink <= 1 else 0


def _host_error(err: OSError, shm_dir: str) -> HostError:
    if err.errno in (errno.EACCES, errno.EPERM):
        return HostError("permission denied listing the shm dir", path=shm_dir, uid=os.getuid())
    if err.errno == errno.ENOTDIR:
        return HostError("the shm dir is not a directory", path=shm_dir)
    return HostError("shm dir does not exist", path=shm_dir)


class Scan:
    """One streaming pass over the shm dir: iterate it for judged entries; ``tally`` grows as it goes.

    Everything that can fail for the dir as a whole (missing, unreadable) fails here, in the
    constructor, before a single entry is reported. ``progress(n)`` is called every 1024 entries.
    """

    def __init__(self, opts: ScanOptions, progress: Callable[[int], None] | None = None) -> None:
        self.t0 = time.monotonic()
        self.opts, self.progress = opts, progress
        try:
            self._dir = os.scandir(opts.shm_dir)
            st = os.stat(opts.shm_dir)
            vfs = os.statvfs(opts.shm_dir)
        except OSError as err:
            raise _host_error(err, opts.shm_dir) from err
        self.dev = st.st_dev
        self.shm_total_bytes = vfs.f_blocks * vfs.f_frsize
        self.shm_free_bytes = vfs.f_bavail * vfs.f_frsize
        self.trust = judge_trust(opts.shm_dir)
        self.judge = Judge(opts, self.trust, holder_index(self.dev), self.dev)
        self.tally = Tally()

    def usage_now(self) -> tuple[int, int]:
        """(used, free) bytes of the shm dir's filesystem read again now (after a --delete, say);
        the scan's own figures if it cannot be read any more."""
        try:
            vfs = os.statvfs(self.opts.shm_dir)
        except OSError:
            return self.shm_total_bytes - self.shm_free_bytes, self.shm_free_bytes
        total, free = vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize
        return total - free, free

    @property
    def scan_ms(self) -> float:
        return (time.monotonic() - self.t0) * 1e3

    def __iter__(self) -> Iterator[SegmentInfo]:
        judge, add, progress, seen = self.judge, self.tally.add, self.progress, 0
        with self._dir as entries:
            for entry in entries:
                name = entry.name
                if not name.startswith(SMG_FAMILY_PREFIX):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # unlinked since the listing: nothing to report
                seg = judge(name, st)
                add(seg)
                yield seg
                seen += 1
                if progress and not seen & 1023:
                    progress(seen)

    def report(self, segments: list[SegmentInfo]) -> GcReport:
        t = self.tally
        return GcReport(self.opts.shm_dir, segments, dict(t.counts), dict(t.bytes_by_state), t.reclaimable_bytes,
                        self.shm_total_bytes, self.shm_total_bytes - self.shm_free_bytes, self.shm_free_bytes,
                        self.trust.trusted, self.trust.note, self.scan_ms, [], dict(t.counts),
                        dict(t.bytes_by_state))  # fmt: skip


def scan_segments(opts: ScanOptions, progress: Callable[[int], None] | None = None) -> GcReport:
    """List and judge every ``smg-*`` entry of the shm dir (never following links), sorted by name.

    Keeps every entry: for callers that want the whole list (doctor, tests). A listing of a
    crowded dir streams ``Scan`` instead.
    """
    scan = Scan(opts, progress)
    segs = sorted(scan, key=lambda s: s.name)
    return scan.report(segs)


def judge_entry(shm_dir: str, name: str, opts: ScanOptions | None = None) -> SegmentInfo | None:
    """The gc judgement of ONE entry of ``shm_dir`` (the scan's own code path); None once it is gone.

    For callers that follow single names (``watch``'s orphans): it pays the pid-namespace
    check and one holder walk of /proc per call, so it is not for whole listings.
    """
    opts = replace(opts, shm_dir=shm_dir) if opts else ScanOptions(shm_dir=shm_dir)
    try:
        st = os.lstat(os.path.join(shm_dir, name))
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _host_error(err, shm_dir) from err
    try:
        dir_dev = os.stat(shm_dir).st_dev
    except OSError as err:
        raise _host_error(err, shm_dir) from err
    one = [name] if st.st_nlink == 1 else None  # a single link: holders can be picked by name first
    return Judge(opts, judge_trust(shm_dir), holder_index(st.st_dev, names=one), dir_dev)(name, st)


def pid_liveness_trust(shm_dir: str) -> tuple[bool, str]:
    """Kept for callers of the old name: (trusted, note) of ``pidtrust.judge_trust``."""
    t = judge_trust(shm_dir)
    return t.trusted, t.note


def growth(before: GcReport, after: GcReport) -> dict[str, int]:
    """Per state, how many more segments the later scan has."""
    return {k: after.counts.get(k, 0) - before.counts.get(k, 0) for k in after.counts}


__all__: Iterable[str] = [
    "INIT_PID_NS", "Deletion", "GcReport", "Holder", "Judge", "Scan", "ScanOptions", "SegmentInfo", "State",
    "Tally", "judge_entry", "parse_name", "scan_segments",
]  # fmt: skip
