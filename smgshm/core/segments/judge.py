"""Judge each of the shm dir's SMG entries: in flight, held, leaked, stale, hazard, unknown.

Liveness is judged like omnigent#7495 does it, not like SMG's own sweep: a producer pid
is alive only if a process with that pid exists *and* started before the segment was
written (a younger one means the pid was reused); and a pid verdict is trusted only when
no other pid namespace can reach this filesystem (core/host/pidtrust.py), since there a live
producer's pid means nothing to us. Holders are found by inode (core/host/holders.py).
The listing that feeds it is segments/scan.py's.

The rule for a producer pid that a process holds, which is the one place the clocks matter:
a verdict gc deletes on (leaked, stale) is never drawn from the wall clock, which can be
stepped. Pid reuse is proven only when that process started, on the boot clock, after smgshm
first saw the segment (segments/sightings.py); staleness only when smgshm first saw the segment
at least --stale-after ago. Where the wall clock alone says reused or stale (``reuse_bounds``), the
entry is unknown, with a reason that says so, and kept: a step can fake either.

A leaked verdict is ``proven_dead`` when the pid was judged under trust (not --assume-dead) and a
sighting shows the segment there before the trust's look began (``Trust.since_ns``): then no process
that joined another pid namespace since can have written it under its own pid, and gc --delete
needs no age to reap it (segments/reaping.py).
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol
from zlib import crc32

from smgshm.core.closed import Closed
from smgshm.core.host import clock
from smgshm.core.host.clock import WallClock
from smgshm.core.host.holders import Holder
from smgshm.core.host.mountpoints import mount_points
from smgshm.core.host.pidtrust import Trust
from smgshm.core.names import (
    KINDS,
    MATCH_GROUPS,
    PID_LIMIT,
    SMG_FAMILY_PREFIX,
    Kind,
    match_name,
    unmatched_kind,
)
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.segments.asides import GcState, aside_reason
from smgshm.core.segments.sightings import FS_ENCODING, FS_ERRORS, Sightings


class State(Closed):
    """gc's judgement of an entry (watch's orphans carry it too)."""

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
    kind: Kind
    file_type: str  # what it is (a FileType)
    nbytes: int
    allocated_bytes: int
    age_s: float  # seconds since its mtime (wall clock)
    uid: int
    producer_pid: int | None
    producer_alive: bool | None
    holders: tuple[Holder, ...]
    state: State
    reason: str
    ino: int = 0
    nlink: int = 1  # > 1: unlinking this name frees nothing while the other links remain
    dev: int = 0
    # How long smgshm has seen it, on the boot clock (0.0: first seen now); None where no producer
    # process is there to need it. What proves stale, and what --min-age reads for a stale one.
    seen_s: float | None = None
    # Leaked, and proven so with no clock: its producer pid judged (not --assume-dead) in the pid namespace(s)
    # that write here, and the segment seen (a sighting) before the look that trusted that judgement, so
    # no process that joined since can have written it. gc --delete takes it at any age (reaping.keep_reason).
    proven_dead: bool = False

    @property
    def frees_bytes(self) -> int:
        """What unlinking this name would give back: nothing while another link remains."""
        return self.allocated_bytes if self.nlink <= 1 else 0


@dataclass(frozen=True)
class ScanOptions:
    shm_dir: str = DEFAULT_SHM_DIR
    stale_after_s: float = 3600.0
    assume_dead: bool = False


class FileType(Closed):
    """What an entry is (its st_mode's type), as gc's JSON names it."""

    REGULAR = "regular"
    SYMLINK = "symlink"
    FIFO = "fifo"
    DIRECTORY = "directory"
    SOCKET = "socket"
    CHAR_DEVICE = "char_device"
    BLOCK_DEVICE = "block_device"
    OTHER = "other"


_TYPES = {
    stat.S_IFREG: FileType.REGULAR,
    stat.S_IFLNK: FileType.SYMLINK,
    stat.S_IFIFO: FileType.FIFO,
    stat.S_IFDIR: FileType.DIRECTORY,
    stat.S_IFSOCK: FileType.SOCKET,
    stat.S_IFCHR: FileType.CHAR_DEVICE,
    stat.S_IFBLK: FileType.BLOCK_DEVICE,
}


# starttime's ticks, a coarse mtime, the clocks' reads: a producer's own segment is never this much older than it
CLOCK_SLACK_S = 1.0


def _start_time(pid: int) -> float | None:
    """When the process ``pid`` started, in seconds on the boot clock (CLOCK_BOOTTIME, which no step
    of the wall clock moves); None if no process has it.

    Field 22 of /proc/P/stat, read straight from /proc (importing psutil was a tenth of every gc
    run's start-up). A process that exists but whose start cannot be read (its stat denied, as under
    hidepid, or unparsable) counts as started before anything: alive, so its segments are kept; only
    a pid no process has is dead.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return -math.inf
    # The command name (field 2, in parentheses) may hold spaces and ")": the fields after the
    # last ")" start at field 3, so field 22, starttime in clock ticks since boot, is index 19.
    fields = data.rpartition(b")")[2].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return -math.inf
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


class Bounds(NamedTuple):
    """``reuse_bounds``' answer for one pid a process holds."""

    alive_from: float  # wall clock: a segment written at or after it may be the process's own
    reused_before: float  # wall clock: one written before it predates the process, unless the clock was stepped
    started_ns: int  # the process's start on the boot clock, rounded down; -1: unreadable (it may be any age)


def reuse_bounds(pid: int, wall: WallClock) -> Bounds | None:
    """What the wall clock says of "pid ``pid`` was reused", as two bounds on a segment's time (the
    later of its name's nanoseconds and its mtime, on the wall clock as it reads now): a segment
    written at or after ``alive_from`` may be the live process's own; one written before
    ``reused_before`` reads as written before the process now holding the pid started; in between
    even that reading is undecided. None when no process has the pid. ``started_ns``, the start on
    the boot clock, is what the judge proves reuse with, against a sighting: the wall clock's
    verdicts are never enough to delete on (see the module's docstring).

    What it proves. The process's start is exact on the boot clock (/proc/P/stat) and is put on the
    wall clock with the offset read at the scan (``wall.offset``); a segment's time was put there by
    the wall clock of its own moment. The two differ by how far the wall clock was stepped since the
    segment was written: a forward step (NTP, ``date -s``, a VM's clock set on resume) makes a live
    producer's segment look older than its producer. So a start later than the segment by up to 1 s
    (granularity) plus every forward step the host shows since proves nothing: the traces of
    host/clock.py, the shm dir's birth time (on a tmpfs, made after boot) read as before boot
    (``wall.dir_step``), and the process's /proc/P directory, made when something first looked at
    it, read as made before the process started. A backward step only makes segments look younger.

    What it does not prove. Linux keeps no history of steps (host/clock.py), so a forward step that
    left no trace goes unseen: one smaller than the shm dir's age at the time, taken before anything
    looked at the process (or, for a segment written more than 1 s before that look, after it). So
    "written before reused_before" means "reused, unless the clock was stepped": a reason, never a proof.
    """
    started = _start_time(pid)
    if started is None or started == -math.inf:
        return None if started is None else Bounds(-math.inf, -math.inf, -1)  # unreadable: any segment may be its own
    alive_from = started + wall.offset - CLOCK_SLACK_S
    shown = max(wall.dir_step, clock.step_shown(clock.stamp(f"/proc/{pid}"), started, wall.offset))
    return Bounds(alive_from, alive_from - shown, int(started * 1e9) - 1000)  # 1 µs: float rounding, downward


_new = tuple.__new__
_IFMT = 0o170000  # stat.S_IFMT's mask: inline, not a call per entry
_IFREG = stat.S_IFREG


class ListedEntry(Protocol):
    """What ``Judge.each`` reads of an ``os.DirEntry``."""

    @property
    def name(self) -> str: ...

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result: ...


class _Lstated:
    """One entry already lstat'ed, as ``Judge.each`` takes it."""

    __slots__ = ("name", "st")

    def __init__(self, name: str, st: os.stat_result) -> None:
        self.name, self.st = name, st

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return self.st


class Judge:
    """The judgement of one entry, with what a scan decides once: trust, holders, start times.

    It runs once per entry of a listing that may hold a million, so what depends only on the
    producer pid (its start time, the sentence that explains its verdict) is worked out once
    per pid and looked up after; what depends on the entry (its stat, its name's time) is
    judged every time, by the same rules.
    """

    # Kinds whose pid is looked up apart from the rest (``bounds`` gets it plus PID_LIMIT): the node view
    # judges smgshm's own names in the host's pid namespace too. None here.
    own_kinds: frozenset[str] = frozenset()

    def __init__(
        self,
        opts: ScanOptions,
        trust: Trust,
        holders: dict[tuple[int, int], list[Holder]],
        dir_dev: int | None = None,
        sightings: Sightings | None = None,
        mounted: dict[str, str] | None = None,
        wall: WallClock | None = None,
    ) -> None:
        self.opts, self.trust, self.holders = opts, trust, holders
        # What earlier scans saw (read once; a scan saves what it adds): the proofs of reuse and staleness.
        self.sightings = sightings if sightings is not None else Sightings(opts.shm_dir, dir_dev)
        self.dir_dev = dir_dev  # the shm dir's device: an entry on another one is a mount point
        # and one bound from this very filesystem, here or in another mount namespace (name -> which)
        # (``mounted``: read already, with other dirs' in one pass: the node view's many tmpfs)
        self.mounted = mount_points(opts.shm_dir) if mounted is None else mounted
        # The clocks, read once per scan; then per pid its reuse_bounds: a dir of 1M segments has a handful of pids.
        self.wall = clock.read_wall_clock(opts.shm_dir, dir_dev) if wall is None else wall
        self.starts: dict[int, Bounds | None] = {}
        self.said: dict[tuple[str, int, str], str] = {}  # (verdict, pid, kind) -> its reason, made once
        self.aside_gcs: dict[tuple[int, int, int], tuple[GcState, str]] = {}  # per gc that set entries aside
        # By inode alone for the dir's own device (an int key, no tuple per entry); as tuples, once.
        self.held_here: dict[int, tuple[Holder, ...]] = {
            ino: tuple(hs) for (d, ino), hs in holders.items() if d == dir_dev
        }
        self.now = time.time()
        self.boot_now = clock.boot_clock_ns()  # the sightings' clock, read once: their ages are at least this old

    def __call__(self, name: str, st: os.stat_result) -> SegmentInfo:
        """The judgement of one entry already lstat'ed: ``each``'s own code, for one."""
        return next(self.each((_Lstated(name, st),), family=""))

    # One piece on purpose: a million entries, no call per entry but the lstat (the docstring says why).
    def each(  # noqa: C901, PLR0912, PLR0915
        self,
        entries: Iterable[ListedEntry],
        tally: Tally | None = None,
        progress: Callable[[int], None] | None = None,
        family: str = SMG_FAMILY_PREFIX,
        other: Callable[[ListedEntry], None] | None = None,
        on_end: Callable[[bool], None] | None = None,
    ) -> Iterator[SegmentInfo]:
        """Judge each entry (an ``os.DirEntry`` of the dir, or alike) whose name starts with ``family``,
        adding it to ``tally``; ``progress(n)`` every 1024 entries; ``other(entry)`` for each of the rest
        (the node view counts them: here, not in a generator between, which was a tenth of this loop's
        cost); ``on_end(whole)`` once the listing ends (whole: it was listed to its end) or is left. One loop
        with everything in
        locals and no call per entry but the lstat: a crowded dir has a million entries, and a
        Python call costs as much as a third of the lstat."""
        now, dir_dev, holders, held_here, mounted = self.now, self.dir_dev, self.holders, self.held_here, self.mounted
        starts, said, fullmatch, by_group, pid_limit = self.starts, self.said, match_name, MATCH_GROUPS, PID_LIMIT
        boot_now, sights = self.boot_now, self.sightings
        index, s_uids, s_ctimes, keep, new = sights.index, sights.uids, sights.ctimes, sights.keep, sights.new
        s_sums, s_seen, enc, errs = sights.sums, sights.seen, FS_ENCODING, FS_ERRORS
        keep_append, new_append = keep.append, new.append
        judge_pid = not self.opts.assume_dead
        trusted, doubt, stale_after = self.trust.trusted, self.trust.doubt_uids, self.opts.stale_after_s
        looked = self.trust.since_ns  # a sighting before it proves the segment older than the trust's look
        # A kind judged apart (own_kinds: the node view's own names) has its pid keyed past every pid: per group.
        groups = {g: (kind, p, t, pid_limit if kind in self.own_kinds else 0) for g, (kind, p, t) in by_group.items()}
        untrusted, doubting = judge_pid and not trusted, judge_pid and bool(doubt)
        regular_type = FileType.REGULAR
        seen = 0
        last_key, bounds = -1, None  # the pid whose bounds were looked up last, and them
        dead_pid, dead_kind, dead = -1, "", ""  # the last dead producer's sentence
        # The tally by runs of one state and kind (a crowded dir's entries come alike), each added as it ends and
        # the last once the listing ends or is left (``finally``): Tally.add per entry was a tenth of this loop.
        r_state: State | None = None
        r_kind: Kind = "other"
        r_n, r_bytes, r_multi = 0, 0, 0  # r_multi: the bytes of entries with other links than this one
        whole = False
        try:
            for entry in entries:
                name = entry.name
                if not name.startswith(family):
                    if other is not None:
                        other(entry)
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)  # on a dir listed by fd: fstatat(fd, name, NOFOLLOW)
                except FileNotFoundError:
                    continue  # unlinked since the listing: nothing to report
                # parse_name, inline from the grammar's fast form (the nanos are read only when needed).
                m = fullmatch(name)
                if m is None:
                    kind, pid, t, apart = unmatched_kind(name), None, 0, 0
                else:
                    kind, p, t, apart = groups[m.lastindex]
                    pid = int(m[p])
                    if pid >= pid_limit:
                        pid = None
                dev = st.st_dev  # (one field at a time: a tuple of six built and unpacked costs more)
                ino = st.st_ino
                nlink = st.st_nlink
                mtime = st.st_mtime
                mode = st.st_mode
                uid = st.st_uid
                here = dev == dir_dev  # on the dir's own filesystem (not a mount point)
                regular = mode & _IFMT == _IFREG  # a bool: a str enum's == is a call
                ftype = regular_type if regular else _TYPES.get(mode & _IFMT, FileType.OTHER)
                age = now - mtime
                # Its sighting (a row of the store): every regular entry with a pid is recorded, the leaked too.
                row, seen_s, sight, proven_dead = None, None, None, False
                if pid is not None and regular and here:
                    row = index.get(ino) if index else None
                    if row is not None and s_ctimes[row] == st.st_ctime_ns and s_uids[row] == uid:
                        keep_append(row)
                    else:  # first seen now, or the inode is another entry's now (another owner, a rename, a write)
                        row = None
                        new_append((ino, uid, st.st_ctime_ns, name))
                if here:
                    held = held_here.get(ino, ()) if held_here else ()
                else:
                    held = tuple(holders.get((dev, ino), ())) if holders else ()
                if (
                    not regular
                    or held
                    or pid is None
                    or (not here and dir_dev is not None)
                    or (mounted and name in mounted)
                ):
                    state, reason, alive = self._not_by_pid(name, dev, kind, ftype, held)
                else:  # a regular file on this filesystem nobody holds, with a producer pid: the pid decides
                    key = pid + apart  # (a kind judged apart: past every pid)
                    if key != last_key:
                        last_key = key
                        bounds = starts[key] if key in starts else starts.setdefault(key, self.bounds(key))
                    proven = False  # reuse proven on the boot clock
                    if row is not None:
                        # Sightings.first_seen, inline: its sighting if of this very name (its checksum), else None.
                        sight = s_seen[row] if s_sums[row] == crc32(name.encode(enc, errs)) else None  # boot clock, ns
                        if sight is None:  # the same inode and ctime, another name: another entry
                            keep.pop()
                            new_append((ino, uid, st.st_ctime_ns, name))
                    if bounds is None:
                        alive = False  # no process has that pid: whenever the segment was written
                    else:
                        # The later of the name's time and mtime: a forged or skewed name can only make gc keep more.
                        nanos = int(m[t]) if t and m is not None else 0  # t is 0 where no name matched
                        written = mtime if not nanos or nanos / 1e9 < mtime else nanos / 1e9
                        # By the wall clock: written before the process holding the pid started, or near it.
                        alive = True if written >= bounds[0] else False if written < bounds[1] else None
                        seen_s = 0.0 if sight is None else (boot_now - sight) / 1e9
                        # The producer existed before its segment: a process that started after smgshm saw it is not it.
                        proven = sight is not None and bounds[2] > sight
                        if proven:
                            alive = False
                        elif alive is False:
                            alive = None  # reused by the wall clock only: a step can fake it
                    if untrusted:
                        state, reason, alive = State.UNKNOWN, "producer liveness cannot be trusted here", alive or None
                    elif doubting and uid in doubt:
                        state, reason = State.UNKNOWN, f"the pid namespaces of uid {uid}'s processes cannot be read"
                        alive = alive or None
                    elif alive is None and bounds is not None:  # (alive is None only where bounds is not)
                        state, reason = State.UNKNOWN, self._clock_reason(pid, bounds, written)
                    elif not alive:
                        if proven and bounds is not None and sight is not None:  # (as proven implies)
                            state, reason = State.LEAKED, self._reused_reason(kind, pid, bounds, sight)
                        else:  # Each sentence is made once per pid: a crowded dir repeats a handful of pids.
                            state = State.LEAKED
                            if pid != dead_pid or kind is not dead_kind:
                                dead_pid, dead_kind, got = pid, kind, said.get(("dead", pid, kind))
                                dead = self._dead_reason(kind, pid) if got is None else got
                            reason = dead
                        # By a trusted pid, and there before the look that trusted it: no age needed.
                        proven_dead = judge_pid and sight is not None and sight < looked
                    elif seen_s is not None and seen_s >= stale_after:
                        state = State.STALE
                        reason = f"producer pid {pid} lives, but smgshm has seen the segment for {seen_s:.0f} s"
                    elif age >= stale_after:
                        state, reason = (
                            State.UNKNOWN,
                            (
                                f"producer pid {pid} lives; the segment is {age:.0f} s old by the wall clock, "
                                f"which can be stepped, but smgshm first saw it only {seen_s:.0f} s ago: stale, and "
                                f"reapable, once seen for {stale_after:.0f} s"
                            ),
                        )
                    else:
                        state, young = State.IN_FLIGHT, said.get(("young", pid, ""))
                        if young is None:
                            young = said["young", pid, ""] = f"producer pid {pid} lives and the segment is young"
                        reason = young
                if nlink > 1 and regular:
                    reason += f"; it has {nlink} links: unlinking this name frees nothing"
                # tuple.__new__: the NamedTuple's own __new__ is a Python function, a third of the cost again.
                nbytes = st.st_blocks * 512
                seg = _new(
                    SegmentInfo,
                    (
                        name,
                        kind,
                        ftype,
                        st.st_size,
                        nbytes,
                        age if age > 0.0 else 0.0,
                        uid,
                        pid,
                        alive,
                        held,
                        state,
                        reason,
                        ino,
                        nlink,
                        dev,
                        seen_s,
                        proven_dead,
                    ),
                )
                if state is r_state and kind is r_kind:
                    r_n += 1
                    r_bytes += nbytes
                    if nlink > 1:
                        r_multi += nbytes
                else:
                    if r_n and tally is not None:
                        tally.add_run(r_state, r_kind, r_n, r_bytes, r_multi)
                    r_state, r_kind, r_n, r_bytes, r_multi = state, kind, 1, nbytes, nbytes if nlink > 1 else 0
                yield seg
                if progress is not None:
                    seen += 1
                    if not seen & 1023:
                        progress(seen)
            whole = True
        finally:
            if r_n and tally is not None:
                tally.add_run(r_state, r_kind, r_n, r_bytes, r_multi)
            if on_end is not None:
                on_end(whole)

    def bounds(self, pid: int) -> Bounds | None:
        """``reuse_bounds`` of the producer pid a name carries, asked once per pid: here the pid is one
        of this pid namespace; a judge of another namespace's names (core/node) translates it first.
        A name of ``own_kinds`` asks with its pid plus PID_LIMIT (never so here: the set is empty)."""
        return reuse_bounds(pid, self.wall)

    @staticmethod
    def _probe_note(kind: str, pid: int) -> str:
        if kind != "gateway_probe":
            return ""
        return f"; a gateway with pid {pid} will find /dev/shm unwritable and stay inline"

    def _dead_reason(self, kind: str, pid: int) -> str:
        reason = f"producer pid {pid} is dead: no process has that pid{self._probe_note(kind, pid)}"
        self.said["dead", pid, kind] = reason
        return reason

    def _reused_reason(self, kind: str, pid: int, bounds: Bounds, sight: int) -> str:
        after = (bounds.started_ns - sight) / 1e9
        return (
            f"producer pid {pid} is dead: its pid now belongs to a process that started {after:.0f} s (boot "
            f"clock) after smgshm first saw this segment (reused){self._probe_note(kind, pid)}"
        )

    def _clock_reason(self, pid: int, bounds: Bounds, written: float) -> str:
        """Why a segment the wall clock alone calls older than its pid's process is kept. One sentence
        per pid and band: the wall clock's margin (steps shown) or beyond it."""
        beyond = written < bounds.reused_before
        reason = self.said.get(("clock" if beyond else "band", pid, ""))
        if reason is not None:
            return reason
        if beyond:
            why = (
                f"pid {pid} is held by a process that started after this segment's time by the wall clock: "
                "reused unless the clock was stepped"
            )
        else:
            stepped = bounds.alive_from - bounds.reused_before
            why = (
                f"producer pid {pid} lives or was reused: the segment's time is before its process started, but "
                f"by less than the wall clock has been stepped forward since ({stepped:.0f} s) plus "
                f"{CLOCK_SLACK_S:.0f} s"
            )
        reason = self.said["clock" if beyond else "band", pid, ""] = (
            f"{why}; kept, as smgshm first saw the segment only after that process started: never deleted on the "
            "wall clock; reaped once no process has the pid, or one that started after a scan saw the segment"
        )
        return reason

    def _not_by_pid(
        self, name: str, dev: int, kind: str, ftype: str, held: tuple[Holder, ...]
    ) -> tuple[State, str, bool | None]:
        """The verdicts no pid can change: hazards, held entries, names without a pid."""
        if (self.dir_dev is not None and dev != self.dir_dev) or name in self.mounted:
            # Something is mounted over this name (a bind-mounted file or dir): unlink gets EBUSY,
            # and the inode is another filesystem's, never a segment this dir's producer wrote.
            if self.mounted.get(name):  # only there: here rename and unlink succeed and detach it
                return (
                    State.HAZARD,
                    f"a mount point in another mount namespace ({self.mounted[name]}); "
                    "deleting it would detach that mount; never touched",
                    None,
                )
            return (
                State.HAZARD,
                f"a mount point ({ftype.replace('_', ' ')} of another filesystem) named like a segment; never touched",
                None,
            )
        if ftype != "regular":
            what = "a FIFO would hang SMG's reader" if ftype == "fifo" else "SMG's reader refuses it"
            return State.HAZARD, f"a {ftype.replace('_', ' ')} named like a segment: {what}; never touched", None
        if held:
            who = ", ".join(f"{h.pid} ({h.comm}, {h.how})" for h in held[:3])
            return State.HELD, f"open or mapped by {who}", None
        if kind == "gc_aside":  # by the gc that set it aside (segments/asides.py): its batch under way, or stranded
            runs, why = aside_reason(name, self.opts.shm_dir, self.aside_gcs)
            return (State.IN_FLIGHT if runs else State.UNKNOWN), why, None
        return State.UNKNOWN, "the name carries no producer pid", None


class Tally:
    """Counts and bytes per state and per kind; reclaimable bytes (leaked, single-link)."""

    def __init__(self) -> None:
        self.counts = {s.value: 0 for s in State}
        self.bytes_by_state = {s.value: 0 for s in State}
        self.counts_by_kind = {k: 0 for k in KINDS}
        self.bytes_by_kind = {k: 0 for k in KINDS}
        self.reclaimable_bytes = 0
        self.total = 0
        self.judged = 0  # SMG entries (not gc's set-asides) judged other than unknown

    def add(self, seg: SegmentInfo) -> None:
        self.add_run(seg.state, seg.kind, 1, seg.allocated_bytes, seg.allocated_bytes if seg.nlink > 1 else 0)

    @property
    def judged_nothing(self) -> bool:
        """Every entry is unknown, and one at least is an SMG name (a producer's, or a look-alike: a name without
        a pid): a check of them judged nothing, so it is inconclusive, never passed. An empty dir is judged
        (nothing there is nothing leaked); gc's own set-asides are no SMG segment and alone judge nothing either
        way: another gc's set-aside batch in flight beside them makes no pass of them either."""
        smg = self.total - self.counts_by_kind["gc_aside"]
        return smg > 0 and self.judged == 0

    def add_run(self, state: State | None, kind: Kind, n: int, nbytes: int, multi_link_bytes: int) -> None:
        """``n`` entries of one ``state`` and ``kind``, of ``nbytes`` in all, ``multi_link_bytes`` of them with other
        links (unlinking those frees nothing: not reclaimable). Judge.each's tally, a run at a time; the one rule
        of a tally's figures (``add`` and ``remove`` are runs of one)."""
        if state is None:
            return
        sv = state._value_
        self.counts[sv] += n
        self.bytes_by_state[sv] += nbytes
        self.counts_by_kind[kind] += n
        self.bytes_by_kind[kind] += nbytes
        self.total += n
        if sv != "unknown" and kind != "gc_aside":
            self.judged += n
        if sv == "leaked":
            self.reclaimable_bytes += nbytes - multi_link_bytes

    def copy(self) -> Tally:
        """Another tally of the same figures (its dicts its own)."""
        out = Tally.__new__(Tally)
        out.counts, out.bytes_by_state = dict(self.counts), dict(self.bytes_by_state)
        out.counts_by_kind, out.bytes_by_kind = dict(self.counts_by_kind), dict(self.bytes_by_kind)
        out.reclaimable_bytes, out.total, out.judged = self.reclaimable_bytes, self.total, self.judged
        return out

    def remove(self, seg: SegmentInfo) -> None:
        """``add``'s undoing (what gc deleted): a run of minus one."""
        self.add_run(seg.state, seg.kind, -1, -seg.allocated_bytes, -seg.allocated_bytes if seg.nlink > 1 else 0)


__all__ = [
    "CLOCK_SLACK_S",
    "Bounds",
    "Judge",
    "ListedEntry",
    "ScanOptions",
    "SegmentInfo",
    "State",
    "Tally",
    "reuse_bounds",
]
