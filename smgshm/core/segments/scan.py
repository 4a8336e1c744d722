"""One streaming pass over the shm dir: the listing gc, doctor and watch read, and its report.

``Scan`` opens the dir, decides trust, indexes holders and reads the sightings once, then judges one
entry at a time (``judge.Judge``) and keeps only tallies, so memory does not grow with the dir. A
whole listing ends by storing what it saw (segments/sightings.py), the next scan's proofs.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from smgshm.core.errors import HostError
from smgshm.core.host.holders import holder_index
from smgshm.core.host.pidtrust import Trust, judge_trust, unsure_of_holders
from smgshm.core.segments.judge import Judge, ScanOptions, SegmentInfo, Tally
from smgshm.core.segments.sightings import Sightings


@dataclass(frozen=True)
class Deletion:
    """What gc --delete did with one chosen entry, or why it left it."""

    name: str
    nbytes: int
    deleted: bool
    reason: str
    ino: int = 0
    freed_bytes: int = 0  # 0 when another link keeps the data, or nothing was unlinked
    kept: str = ""  # why it was left, as a class (reaping.KEPT_REASONS: a metric's label); "" when deleted


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
        self._fd = -1
        try:
            # Listed by fd: each entry's lstat is then relative to it (fstatat), no path to
            # build and walk per entry; and the dev and sizes are those of the very dir listed.
            self._fd = os.open(opts.shm_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._dir = os.scandir(self._fd)
            st = os.fstat(self._fd)
            vfs = os.fstatvfs(self._fd)
        except OSError as err:
            self.close()
            raise _host_error(err, opts.shm_dir) from err
        self.dev = st.st_dev
        self.shm_total_bytes = vfs.f_blocks * vfs.f_frsize
        self.shm_free_bytes = vfs.f_bavail * vfs.f_frsize
        self.sightings = Sightings(opts.shm_dir, self.dev)
        self.trust, self.judge = self.make_judge()
        self.tally = Tally()

    def make_judge(self) -> tuple[Trust, Judge]:
        """Whether pids can be trusted here and the judge of each entry (core/node judges by a pod's pid namespace)."""
        trust, stuck = judge_trust(self.opts.shm_dir), dict[int, str]()
        holders = holder_index(self.dev, stuck=stuck)  # a process one of whose reads stuck: its holds unknown
        trust = unsure_of_holders(trust, stuck)
        return trust, Judge(self.opts, trust, holders, self.dev, self.sightings)

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

    def close(self) -> None:
        """Release the dir (done when the iteration ends; a scan never iterated calls it, or is collected)."""
        if getattr(self, "_dir", None) is not None:
            self._dir.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def __iter__(self) -> Iterator[SegmentInfo]:
        # The judge's own generator, none between (a hop per entry of a million): it calls _ended as it ends.
        return self.judge.each(self._dir, self.tally, self.progress, on_end=self._ended)

    def _ended(self, whole: bool) -> None:
        """The listing has ended (``whole``: to its end) or been left: the dir closed; only a whole listing may
        drop the sightings of what it did not see, so a partial one keeps the store as it was."""
        self.close()
        if whole:
            self.sightings.save()

    def report(self, segments: list[SegmentInfo]) -> GcReport:
        t = self.tally
        return GcReport(
            self.opts.shm_dir,
            segments,
            dict(t.counts),
            dict(t.bytes_by_state),
            t.reclaimable_bytes,
            self.shm_total_bytes,
            self.shm_total_bytes - self.shm_free_bytes,
            self.shm_free_bytes,
            self.trust.trusted,
            self.trust.note,
            self.scan_ms,
            [],
            dict(t.counts),
            dict(t.bytes_by_state),
        )


def scan_segments(opts: ScanOptions, progress: Callable[[int], None] | None = None) -> GcReport:
    """List and judge every ``smg-*`` entry of the shm dir (never following links), sorted by name.

    Keeps every entry: for callers that want the whole list (doctor, tests). A listing of a
    crowded dir streams ``Scan`` instead.
    """
    scan = Scan(opts, progress)
    segs = sorted(scan, key=lambda s: s.name)
    return scan.report(segs)


def judge_entry(
    shm_dir: str, name: str, opts: ScanOptions | None = None, sightings: Sightings | None = None
) -> SegmentInfo | None:
    """The gc judgement of ONE entry of ``shm_dir`` (the scan's own code path); None once it is gone.

    For callers that follow single names (``watch``'s orphans): it pays the pid-namespace
    check and one holder walk of /proc per call, so it is not for whole listings. ``sightings``:
    the store as the caller holds it (loaded once for many calls); by default it is read anew.
    One entry's judgement stores nothing.
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
    try:
        return Judge(opts, judge_trust(shm_dir), holder_index(st.st_dev, names=one), dir_dev, sightings)(name, st)
    finally:
        if sightings is not None:  # what the judge noted to save: nothing is, and a held store must not grow
            sightings.forget()


__all__ = ["Deletion", "GcReport", "Scan", "judge_entry", "scan_segments"]
