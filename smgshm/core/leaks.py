"""Scan the shm dir for SMG's segments, judge each one, and reap only the provably dead.

Liveness is judged like omnigent#7495 does it, not like SMG's own sweep: a producer
pid is alive only if a process with that pid exists *and* started before the
segment was written (a younger one means the pid was reused); and a pid verdict is
trusted only when no other pid namespace shares this tmpfs, since there a live
producer's pid means nothing to us.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from smgshm.core.errors import HostError
from smgshm.core.paths import (
    DEFAULT_SHM_DIR,
    GATEWAY_PREFIX,
    GATEWAY_PROBE_PREFIX,
    SMG_FAMILY_PREFIX,
    SMGSHM_PREFIX,
    SMGSHM_PROBE_PREFIX,
)

INIT_PID_NS = "pid:[4026531836]"  # PROC_PID_INIT_INO: the host's initial pid namespace

# ASCII digits only and a full match: \d would take any Unicode digit (smg-tokenspeed-١٢٣-1-0)
# and `$` matches before a trailing newline; either would hand gc a pid the name never meant.
_D = "([0-9]+)"
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("gateway_probe", re.compile(re.escape(GATEWAY_PROBE_PREFIX) + _D)),
    ("smgshm_probe", re.compile(re.escape(SMGSHM_PROBE_PREFIX) + f"{_D}-{_D}")),
    ("gateway", re.compile(re.escape(GATEWAY_PREFIX) + f"{_D}-{_D}-{_D}")),
    ("smgshm", re.compile(re.escape(SMGSHM_PREFIX) + f"{_D}-{_D}-{_D}")),
]


class State(enum.Enum):
    IN_FLIGHT = "in_flight"  # producer alive, segment young: a request on its way
    HELD = "held"  # some process has it open or mapped
    LEAKED = "leaked"  # producer provably dead, nobody holds it
    STALE = "stale"  # producer alive, but the segment is older than --stale-after
    HAZARD = "hazard"  # not a regular file: SMG's reader refuses it, a FIFO hangs it
    UNKNOWN = "unknown"  # liveness cannot be trusted here, or the name carries no pid


@dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    how: str  # fd | map


@dataclass(frozen=True)
class SegmentInfo:
    name: str
    kind: str  # gateway | gateway_probe | smgshm | smgshm_probe | other
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


@dataclass(frozen=True)
class ScanOptions:
    shm_dir: str = DEFAULT_SHM_DIR
    stale_after_s: float = 3600.0
    assume_dead: bool = False


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


@dataclass(frozen=True)
class Deletion:
    name: str
    nbytes: int
    deleted: bool
    reason: str


def parse_name(name: str) -> tuple[str, int | None, int | None]:
    """(kind, producer pid, creation time in ns if the name carries one)."""
    for kind, pat in _PATTERNS:
        m = pat.fullmatch(name)
        if m:
            pid = int(m.group(1))
            nanos = int(m.group(2)) if m.lastindex and m.lastindex >= 2 else None
            return kind, pid if pid < 2**32 else None, nanos
    return "other", None, None


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "regular"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISDIR, "directory"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char_device"),
                       (stat.S_ISBLK, "block_device")):  # fmt: skip
        if test(mode):
            return name
    return "other"


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def _start_times() -> Callable[[int], float | None]:
    """pid -> process start time (epoch seconds), via psutil, cached per scan."""
    import psutil

    cache: dict[int, float | None] = {}

    def start(pid: int) -> float | None:
        if pid not in cache:
            try:
                cache[pid] = psutil.Process(pid).create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                cache[pid] = None
        return cache[pid]

    return start


def scan_holders(targets: set[tuple[int, int]]) -> dict[tuple[int, int], list[Holder]]:
    """Who has each (st_dev, st_ino) open or mapped, as lsfd would say; survives exiting processes."""
    found: dict[tuple[int, int], list[Holder]] = {}
    if not targets:
        return found
    for pid in _pids():
        base = f"/proc/{pid}"
        hits: list[tuple[tuple[int, int], str]] = []
        try:
            for fd in os.scandir(f"{base}/fd"):
                try:
                    link = os.readlink(fd.path)
                    if SMG_FAMILY_PREFIX not in link:
                        continue  # cheap filter before a stat
                    st = os.stat(fd.path)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) in targets:
                    hits.append(((st.st_dev, st.st_ino), "fd"))
            with open(f"{base}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    if SMG_FAMILY_PREFIX not in line:
                        continue
                    parts = line.split(None, 5)
                    major, minor = (int(x, 16) for x in parts[3].split(":"))
                    key = (os.makedev(major, minor), int(parts[4]))
                    if key in targets:
                        hits.append((key, "map"))
        except OSError:
            continue  # gone, or not ours to read
        if hits:
            try:
                with open(f"{base}/comm", encoding="utf-8") as f:
                    comm = f.read().strip()
            except OSError:
                comm = ""
            for key, how in dict.fromkeys(hits):
                found.setdefault(key, []).append(Holder(pid, comm, how))
    return found


def pid_liveness_trust(shm_dir: str) -> tuple[bool, str]:
    """Whether a dead-looking pid proves a dead producer for segments in ``shm_dir``."""
    shm_dir = os.path.abspath(shm_dir)
    try:
        mine = os.readlink("/proc/self/ns/pid")
        dev = os.stat(shm_dir).st_dev
    except OSError as err:
        return False, f"cannot read this process's pid namespace or shm dir: {err.strerror}"
    if mine != INIT_PID_NS:
        return False, (
            "gc runs in a container's pid namespace: a producer in another namespace sharing this /dev/shm "
            "would look dead (pass --assume-dead if this namespace is the only writer)"
        )
    m = re.match(r"/proc/(\d+)/root(/|$)", shm_dir)
    if m:  # another process's view of its shm dir: its names carry that process's pids
        try:
            theirs = os.readlink(f"/proc/{m.group(1)}/ns/pid")
        except OSError:
            theirs = ""
        if theirs != mine:
            return False, (
                f"{shm_dir} is seen through pid {m.group(1)}, whose pid namespace ({theirs or 'unknown'}) is not "
                "this one: the pids in its segment names mean nothing here (pass --assume-dead to judge anyway)"
            )
    seen: set[str] = {mine}
    for pid in _pids():
        try:
            ns = os.readlink(f"/proc/{pid}/ns/pid")
            if ns in seen:
                continue
            seen.add(ns)
            # Where that namespace sees this dir, and where it keeps its own /dev/shm.
            views = {f"/proc/{pid}/root{shm_dir}", f"/proc/{pid}/root{DEFAULT_SHM_DIR}"}
            if any(_dev_of(v) == dev for v in views):
                return False, (
                    f"processes in another pid namespace ({ns}, e.g. pid {pid}) share this tmpfs: their pids "
                    "mean nothing here (pass --assume-dead to judge by this namespace's pids anyway)"
                )
        except OSError:
            continue
    return True, "gc sees every pid namespace that shares this tmpfs"


def _dev_of(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def _judge(
    name: str, st: os.stat_result, now: float, opts: ScanOptions, trusted: bool, start: Callable[[int], float | None],
    holders: list[Holder],
) -> SegmentInfo:  # fmt: skip
    kind, pid, nanos = parse_name(name)
    ftype = _file_type(st.st_mode)
    # The later of the name's time and mtime: a forged or skewed name can only make gc keep more.
    written = max(nanos / 1e9 if nanos else 0.0, st.st_mtime)
    age = max(0.0, now - st.st_mtime)

    def info(state: State, reason: str, alive: bool | None = None) -> SegmentInfo:
        return SegmentInfo(name, kind, ftype, st.st_size, st.st_blocks * 512, age, st.st_uid, pid, alive,
                           tuple(holders), state, reason, st.st_ino)  # fmt: skip

    if ftype != "regular":
        what = "a FIFO would hang SMG's reader" if ftype == "fifo" else "SMG's reader refuses it"
        return info(State.HAZARD, f"a {ftype.replace('_', ' ')} named like a segment: {what}; never touched")
    if holders:
        who = ", ".join(f"{h.pid} ({h.comm}, {h.how})" for h in holders[:3])
        return info(State.HELD, f"open or mapped by {who}")
    if pid is None:
        return info(State.UNKNOWN, "the name carries no producer pid")
    started = start(pid)
    # A process that started after the segment was written cannot have written it (1 s slack
    # for clock granularity): the pid was reused.
    alive = started is not None and started <= written + 1.0
    if not trusted and not opts.assume_dead:
        return info(State.UNKNOWN, "producer liveness cannot be trusted here", alive if alive else None)
    probe_note = (
        f"; a gateway with pid {pid} will find /dev/shm unwritable and stay inline" if kind == "gateway_probe" else ""
    )
    if not alive:
        why = "no process has that pid" if started is None else "its pid now belongs to a younger process (reused)"
        return info(State.LEAKED, f"producer pid {pid} is dead: {why}{probe_note}", False)
    if age >= opts.stale_after_s:
        return info(State.STALE, f"producer pid {pid} lives, but the segment is {age:.0f} s old", True)
    return info(State.IN_FLIGHT, f"producer pid {pid} lives and the segment is young", True)


def scan_segments(opts: ScanOptions, progress: Callable[[int, int], None] | None = None) -> GcReport:
    """List and judge every ``smg-*`` entry of the shm dir (never following links)."""
    t0 = time.monotonic()
    try:
        names = [e.name for e in os.scandir(opts.shm_dir) if e.name.startswith(SMG_FAMILY_PREFIX)]
        vfs = os.statvfs(opts.shm_dir)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM):
            raise HostError("permission denied listing the shm dir", path=opts.shm_dir, uid=os.getuid()) from err
        raise HostError("shm dir does not exist", path=opts.shm_dir) from err
    stats: dict[str, os.stat_result] = {}
    for i, name in enumerate(names):
        try:
            stats[name] = os.lstat(os.path.join(opts.shm_dir, name))
        except FileNotFoundError:
            continue  # unlinked since the listing: nothing to report
        if progress and i % 1000 == 0:
            progress(i, len(names))
    trusted, note = pid_liveness_trust(opts.shm_dir)
    holders = scan_holders({(s.st_dev, s.st_ino) for s in stats.values() if stat.S_ISREG(s.st_mode)})
    start, now = _start_times(), time.time()
    segs = [
        _judge(n, s, now, opts, trusted, start, holders.get((s.st_dev, s.st_ino), [])) for n, s in sorted(stats.items())
    ]
    return _report(opts, segs, vfs, trusted, note, (time.monotonic() - t0) * 1e3)


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
        raise HostError(f"cannot stat a segment: {err.strerror}", path=os.path.join(shm_dir, name)) from err
    trusted, _ = pid_liveness_trust(shm_dir)
    key = (st.st_dev, st.st_ino)
    holders = scan_holders({key}).get(key, []) if stat.S_ISREG(st.st_mode) else []
    return _judge(name, st, time.time(), opts, trusted, _start_times(), holders)


def _report(
    opts: ScanOptions, segs: list[SegmentInfo], vfs: os.statvfs_result, trusted: bool, note: str, ms: float
) -> GcReport:
    counts, by_state = _tally(segs)
    remaining = (dict(counts), dict(by_state))
    total, free = vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize
    return GcReport(opts.shm_dir, segs, counts, by_state, by_state["leaked"], total, total - free, free, trusted,
                    note, ms, [], *remaining)  # fmt: skip


def _tally(segs: list[SegmentInfo]) -> tuple[dict[str, int], dict[str, int]]:
    counts = {s.value: 0 for s in State}
    by_state = {s.value: 0 for s in State}
    for seg in segs:
        counts[seg.state.value] += 1
        by_state[seg.state.value] += seg.allocated_bytes
    return counts, by_state


def reap(
    report: GcReport,
    opts: ScanOptions,
    *,
    include_stale: bool = False,
    min_age_s: float = 600.0,
    all_users: bool = False,
    on_action: Callable[[Deletion], None] | None = None,
) -> GcReport:
    """Unlink the leaked (and, if asked, stale) segments, re-checking each one right before."""
    states = {State.LEAKED} | ({State.STALE} if include_stale else set())
    uid = os.getuid()
    chosen = [s for s in report.segments if s.state in states]
    # One fresh holder scan for all candidates: a process may have opened one since the listing.
    dev = os.stat(opts.shm_dir).st_dev
    held_now = scan_holders({(dev, s.ino) for s in chosen})
    done: list[Deletion] = []
    dfd = os.open(opts.shm_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for seg in chosen:
            d = _reap_one(seg, dfd, dev, uid, all_users, min_age_s, held_now)
            done.append(d)
            if on_action:
                on_action(d)
    finally:
        os.close(dfd)
    gone = {d.name for d in done if d.deleted}
    counts, by_state = _tally([s for s in report.segments if s.name not in gone])
    # segments and counts stay the scan's story; remaining_* say what is in the shm dir now,
    # so that --check and --prometheus report the result of the deletion.
    return replace(report, deleted=done, remaining_counts=counts, remaining_bytes_by_state=by_state)


def _reap_one(
    seg: SegmentInfo, dfd: int, dev: int, uid: int, all_users: bool, min_age_s: float,
    held_now: dict[tuple[int, int], list[Holder]],
) -> Deletion:  # fmt: skip
    def keep(reason: str) -> Deletion:
        return Deletion(seg.name, seg.allocated_bytes, False, reason)

    if not seg.name.startswith(SMG_FAMILY_PREFIX) or "/" in seg.name:
        return keep("not an SMG name")
    if seg.age_s < min_age_s:
        return keep(f"younger than --min-age ({seg.age_s:.0f} s < {min_age_s:.0f} s)")
    if seg.uid != uid and not (uid == 0 and all_users):
        return keep(f"owned by uid {seg.uid} (root with --all-users may delete other users' segments)")
    if (dev, seg.ino) in held_now:
        return keep("opened or mapped since the scan")
    try:
        st = os.lstat(seg.name, dir_fd=dfd)
    except FileNotFoundError:
        return keep("already gone")
    if not stat.S_ISREG(st.st_mode) or st.st_ino != seg.ino:
        return keep("replaced since the scan (another inode or not a regular file)")
    try:
        os.unlink(seg.name, dir_fd=dfd)
    except FileNotFoundError:
        return keep("already gone")
    except OSError as err:
        return keep(f"unlink failed: {err.strerror}")
    return Deletion(seg.name, seg.allocated_bytes, True, seg.reason)


def growth(before: GcReport, after: GcReport) -> dict[str, int]:
    """Per state, how many more segments the later scan has."""
    return {k: after.counts.get(k, 0) - before.counts.get(k, 0) for k in after.counts}


__all__: Iterable[str] = [
    "GcReport", "ScanOptions", "SegmentInfo", "State", "judge_entry", "parse_name", "reap", "scan_segments",
]  # fmt: skip
