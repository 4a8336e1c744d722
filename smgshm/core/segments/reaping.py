"""Unlink leaked segments so that what is unlinked is provably the inode that was judged.

Between a scan and an unlink another process can swap the entry (a symlink, another file).
Checking the name and then unlinking it leaves that window open, so gc never unlinks a
judged name: it renames the entry to a private name in the same directory with
RENAME_NOREPLACE (atomic; nothing can be swapped under a name the swapper does not know),
pins what it moved with an O_PATH fd (never opens a FIFO), verifies that it is the judged
(st_dev, st_ino), still a regular file, held by nobody (one holder walk per batch, after
the batch was set aside, so a process that opened it before the rename is seen) and mounted
on in no mount namespace (one read of every namespace's mount table per batch), and only
then unlinks the private name. Anything else is renamed back. The pinned fd then shows
whether the data went (st_nlink 0) or another link keeps it (freed 0 bytes).

The private name is in SMG's family (``names.aside_name``) so that a gc killed mid-way leaves an
entry the next gc lists, never one it would reap by a pid; it carries this gc's pid, start time and
pid namespace and the entry's name, so that a later run can tell this gc dead and put the entry back
(segments/asides.py). SIGTERM and SIGHUP unwind as Ctrl-C does (the CLI's ``unwind_on_signals``), so
only SIGKILL leaves a batch aside.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from smgshm.core.host.holders import Holder, holder_index
from smgshm.core.host.mountpoints import mount_points
from smgshm.core.host.proc import CAP_FOWNER, CAP_SYS_PTRACE, has_effective_cap
from smgshm.core.names import in_family
from smgshm.core.segments.asides import rename_noreplace, this_gc_aside
from smgshm.core.segments.judge import SegmentInfo, State, Tally
from smgshm.core.segments.scan import Deletion, Scan
from smgshm.core.units import human_duration

BATCH = 1024  # entries set aside per holder walk: bounds both the walk count and the aside window

# Why a chosen entry was left, as a class (Deletion.kept): the rule's three, then what the checks
# after the rename found. Only SET_ASIDE_FAILED is a failure to do what was asked; the others are
# gc keeping its promise (the textfile's ``last_run_success`` says so).
TOO_YOUNG, OTHER_USER, NOT_SMG_NAME = "too_young", "other_user", "not_smg_name"
ALREADY_GONE, SET_ASIDE_FAILED = "already_gone", "set_aside_failed"
REPLACED, OPENED, MOUNTED = "replaced_since_scan", "opened_since_scan", "mounted_since_scan"
KEPT_REASONS = (TOO_YOUNG, OTHER_USER, NOT_SMG_NAME, ALREADY_GONE, SET_ASIDE_FAILED, REPLACED, OPENED, MOUNTED)
DEFAULT_MIN_AGE_S = 600.0  # gc --delete's --min-age (10m): what a pasted fix waits, where it waits


def _renameat2(dfd: int, src: str, dst: str) -> None:
    rename_noreplace(dfd, src, dst)


def keep_reason(
    seg: SegmentInfo, *, uid: int, all_users: bool, min_age_s: float, fowner: bool = False, assume_dead: bool = False
) -> tuple[str, str] | None:
    """Why a chosen segment is kept before anything is tried, (class, sentence); None: it may be deleted.

    A leaked segment proven so with no clock (``SegmentInfo.proven_dead``: its producer's pid judged in
    the pid namespace that wrote it, and the segment seen before the look that trusted that) needs no age:
    nothing can read or remove it, and waiting only leaves its memory taken. --min-age holds for the rest:
    what is judged by age (stale: its producer lives, so its age is the boot clock's, how long smgshm has
    seen it, segments/sightings.py), and a leaked verdict not proven so: judged with --assume-dead, or first
    seen by this very scan, after the look (a process that joined another pid namespace since may have
    written it under its own pid). For those it reads the wall-clock age (mtime): a step of the clock only
    reaps one a little sooner or later. Another user's segment goes only with ``all_users`` and the power
    to unlink it in a sticky dir (a pod's memory emptyDir and the runtime's sandbox shm are 1777): root,
    or ``fowner``, CAP_FOWNER held with CAP_SYS_PTRACE (the node image's reclaim entrypoint, uid 65532).
    A leaked one judged by pid (not ``assume_dead``) and kept only as first seen after the look is said so:
    the next run, whose look follows this run's stored sighting, proves it dead and takes it at once."""
    if not in_family(seg.name):
        return NOT_SMG_NAME, "not an SMG name"
    if seg.state is State.LEAKED and seg.proven_dead:
        pass  # proven dead: any age
    elif seg.state is State.STALE and seg.seen_s is not None:
        if seg.seen_s < min_age_s:
            return TOO_YOUNG, f"seen for less than --min-age ({seg.seen_s:.0f} s < {min_age_s:.0f} s, boot clock)"
    elif seg.age_s < min_age_s:
        wait = human_duration(max(0.0, min_age_s - seg.age_s))
        if seg.state is State.LEAKED and not assume_dead:
            return TOO_YOUNG, (
                "its producer is dead, but this run first saw it after its pid check: the next run, whose check "
                f"follows this run's stored sighting, reaps it at once (were none stored, --min-age would, in {wait})"
            )
        return TOO_YOUNG, f"younger than --min-age ({seg.age_s:.0f} s < {min_age_s:.0f} s): reclaimable in {wait}"
    if seg.uid != uid and not (all_users and (uid == 0 or fowner)):
        return OTHER_USER, (
            f"owned by uid {seg.uid} (--all-users, as root or with CAP_FOWNER, may delete other users' segments)"
        )
    return None


def reapable(states: set[State] | frozenset[State]) -> Callable[[SegmentInfo], bool]:
    return lambda seg: seg.state in states and seg.file_type == "regular"


def _batches(items: Iterable[SegmentInfo]) -> Iterator[list[SegmentInfo]]:
    it = iter(items)
    while batch := list(itertools.islice(it, BATCH)):
        yield batch


def reap(
    candidates: Iterable[SegmentInfo], shm_dir: str, on_action: Callable[[Deletion], None] | None = None
) -> list[Deletion]:
    """Unlink each candidate (already judged and filtered by ``keep_reason``) as the module says."""
    done: list[Deletion] = []
    dfd = os.open(shm_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dev = os.fstat(dfd).st_dev
        for batch in _batches(candidates):
            aside: list[tuple[SegmentInfo, str]] = []
            results: list[Deletion] = []
            finished = 0
            try:
                for seg in batch:
                    private = this_gc_aside(seg.name)
                    if private is None:  # no set-aside name keeps its way back: left, as it could not be set aside
                        why = "its name is too long to set it aside under one that keeps it"
                        results.append(
                            Deletion(seg.name, seg.allocated_bytes, False, why, seg.ino, kept=SET_ASIDE_FAILED)
                        )
                        continue
                    # Listed before the rename: a Ctrl-C raised as the rename returns (Python runs the
                    # handler at the next bytecode) must still find it to put back. A name never set
                    # aside fails to go back with ENOENT, and RENAME_NOREPLACE never clobbers.
                    aside.append((seg, private))
                    try:
                        _renameat2(dfd, seg.name, private)
                    except OSError as err:
                        aside.pop()
                        gone = err.errno == errno.ENOENT
                        why = "already gone" if gone else f"cannot set it aside atomically: {err.strerror}"
                        kept = ALREADY_GONE if gone else SET_ASIDE_FAILED
                        results.append(Deletion(seg.name, seg.allocated_bytes, False, why, seg.ino, kept=kept))
                # After the rename a holder's fd link shows the private name; with every file single-link
                # the walk may pick fds by those names (a hard link needs the full walk).
                single = all(_links(dfd, p) == 1 for _, p in aside)  # now, not at the scan: a link may be new
                held = holder_index(dev, names=[p for _, p in aside] if single else None) if aside else {}
                # A mount made over a name since the scan, in another mount namespace only: the rename
                # went through and the mount moved with the dentry; unlinking would detach it.
                mounted = mount_points(shm_dir) if aside else {}
                for seg, private in aside:
                    results.append(_finish(seg, private, dfd, dev, held, mounted))
                    finished += 1
            except BaseException:  # Ctrl-C mid-batch: what is still set aside goes back under its name
                for seg, private in aside[finished:]:
                    with contextlib.suppress(OSError):
                        _renameat2(dfd, private, seg.name)
                raise
            for d in results:
                done.append(d)
                if on_action:
                    on_action(d)
    finally:
        os.close(dfd)
    return done


def _links(dfd: int, name: str) -> int:
    try:
        return os.lstat(name, dir_fd=dfd).st_nlink
    except OSError:
        return 0  # gone or unreadable: take the full walk


_MOVED = "no longer under its private name: put back or removed by another run meanwhile"


def _finish(
    seg: SegmentInfo,
    private: str,
    dfd: int,
    dev: int,
    held: dict[tuple[int, int], list[Holder]],
    mounted: dict[str, str],
) -> Deletion:
    try:
        fd = os.open(private, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:  # put back by a run that judged this gc dead (segments/asides.py), or removed
        return Deletion(seg.name, seg.allocated_bytes, False, _MOVED, seg.ino, kept=ALREADY_GONE)
    try:
        st = os.fstat(fd)
        kept = REPLACED
        if not stat.S_ISREG(st.st_mode):
            problem = "replaced since the scan by something that is not a regular file"
        # The judged device, not the dir's now: a tmpfs mounted over the dir since numbers its inodes alike.
        elif (st.st_dev, st.st_ino) != (seg.dev or dev, seg.ino):
            problem = "replaced since the scan by another file (another inode)"
        elif (st.st_dev, st.st_ino) in held:
            problem, kept = "opened or mapped since the scan", OPENED
        elif private in mounted:
            where = f" in another mount namespace ({mounted[private]})" if mounted[private] else ""
            problem, kept = f"mounted on since the scan{where}", MOUNTED
        else:
            problem = ""
        if problem:
            try:
                _renameat2(dfd, private, seg.name)
            except OSError as err:
                problem += f"; left as {private}: putting it back failed ({err.strerror})"
            return Deletion(seg.name, seg.allocated_bytes, False, problem, seg.ino, kept=kept)
        try:
            os.unlink(private, dir_fd=dfd)
        except FileNotFoundError:
            return Deletion(seg.name, seg.allocated_bytes, False, _MOVED, seg.ino, kept=ALREADY_GONE)
        after = os.fstat(fd).st_nlink
        if after != st.st_nlink - 1:  # only a swap of the private name itself can do this
            why = (
                f"an entry swapped in under the private name {private} after the check was unlinked instead; "
                "the judged inode is still there"
            )
            return Deletion(seg.name, seg.allocated_bytes, False, why, seg.ino, kept=REPLACED)
        if after == 0:
            return Deletion(seg.name, seg.allocated_bytes, True, seg.reason, seg.ino, st.st_blocks * 512)
        why = f"{seg.reason}; freed nothing: {after} other link(s) keep its data"
        return Deletion(seg.name, seg.allocated_bytes, True, why, seg.ino, 0)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ReapRule:
    """What gc --delete may take: regular files in ``states``, at least ``min_age_s`` old, owned by
    ``uid`` (with ``all_users``, as root or with CAP_FOWNER: by anyone)."""

    states: frozenset[State]
    min_age_s: float
    all_users: bool = False
    uid: int = field(default_factory=os.getuid)
    # FOWNER unlinks another uid's file, but only SYS_PTRACE reads another uid's fds and maps: without it a
    # live holder of that file is invisible (its fd table reads empty), so FOWNER alone takes nothing of theirs.
    fowner: bool = field(default_factory=lambda: has_effective_cap(CAP_FOWNER, CAP_SYS_PTRACE))
    assume_dead: bool = False  # the scans' --assume-dead: their leaked verdicts prove nothing, at any run

    @classmethod
    def of(cls, *, include_stale: bool, min_age_s: float, all_users: bool, assume_dead: bool = False) -> ReapRule:
        """gc's rule: the leaked, and with ``include_stale`` the stale too."""
        states = frozenset({State.LEAKED, State.STALE} if include_stale else {State.LEAKED})
        return cls(states, min_age_s, all_users, assume_dead=assume_dead)

    def keep(self, seg: SegmentInfo) -> tuple[str, str] | None:
        """Why a reapable ``seg`` is kept before anything is tried, (class, sentence); None: it may go.
        gc's rule is ``keep_reason``'s; preflight's own proof overrides this (core/node/preflight.py)."""
        return keep_reason(
            seg,
            uid=self.uid,
            all_users=self.all_users,
            min_age_s=self.min_age_s,
            fowner=self.fowner,
            assume_dead=self.assume_dead,
        )


@dataclass(frozen=True)
class Choice:
    """What one pass over a scan chose to reap, and what the rule kept before anything was tried."""

    chosen: list[SegmentInfo]
    refused: list[Deletion]
    rows: dict[int, int]  # inode -> row in the listing, of the chosen only


def choose(
    entries: Iterable[SegmentInfo], rule: ReapRule | None, on_entry: Callable[[SegmentInfo, int], None]
) -> Choice:
    """Hand each entry to ``on_entry`` with its row as the scan streams it, and pick by ``rule`` (None:
    nothing) what to reap. No call per entry beyond ``on_entry`` unless reaping: a listing may hold a million."""
    chosen: list[SegmentInfo] = []
    refused: list[Deletion] = []
    rows: dict[int, int] = {}
    if rule is None:  # the loop in C (map, drained by a deque of none): a listing may hold a million
        collections.deque(map(on_entry, entries, itertools.count()), maxlen=0)
        return Choice(chosen, refused, rows)
    want = reapable(rule.states)
    for row, seg in enumerate(entries):
        on_entry(seg, row)
        if want(seg):
            why = rule.keep(seg)
            if why:
                refused.append(Deletion(seg.name, seg.allocated_bytes, False, why[1], seg.ino, kept=why[0]))
            else:
                chosen.append(seg)
                rows[seg.ino] = row
    return Choice(chosen, refused, rows)


@dataclass(frozen=True)
class ReapReport:
    """A scan's tallies before and after reaping its choice, and the filesystem's usage now."""

    deleted: list[Deletion]  # what the rule refused, then each chosen entry as tried
    before: Tally  # the scan's
    after: Tally  # less what was deleted
    used_bytes: int
    free_bytes: int
    done_rows: set[int]  # the listing rows of what was deleted

    @property
    def leaked_or_hazard(self) -> int:
        """What remains that --check fails on."""
        return self.after.counts["leaked"] + self.after.counts["hazard"]

    @property
    def nothing_judged(self) -> bool:
        """Every SMG entry the scan found is unknown (one at least): a --check of them judged nothing, so it
        is inconclusive, never passed. An empty dir is judged: nothing there is nothing leaked."""
        return self.before.judged_nothing


def reap_choice(scan: Scan, choice: Choice, on_action: Callable[[Deletion], None] | None = None) -> ReapReport:
    """Reap what ``choose`` picked from ``scan`` (``reap``), then count again what remains."""
    before, after = scan.tally, scan.tally.copy()
    deleted = list(choice.refused)
    if choice.chosen:
        by_ino = {s.ino: s for s in choice.chosen}
        for d in reap(choice.chosen, scan.opts.shm_dir, on_action):
            deleted.append(d)
            if d.deleted:
                after.remove(by_ino[d.ino])
    # The figures before any delete are the scan's; after one, the filesystem's now.
    if any(d.deleted for d in deleted):
        used, free = scan.usage_now()
    else:
        used, free = scan.shm_total_bytes - scan.shm_free_bytes, scan.shm_free_bytes
    done_rows = {choice.rows[d.ino] for d in deleted if d.deleted}
    return ReapReport(deleted, before, after, used, free, done_rows)


__all__ = [
    "BATCH",
    "DEFAULT_MIN_AGE_S",
    "KEPT_REASONS",
    "Choice",
    "ReapReport",
    "ReapRule",
    "choose",
    "keep_reason",
    "reap",
    "reap_choice",
    "reapable",
]
