"""watch's orphans: segments still in flight after ``--orphan-after``, each judged by gc's own rules.

The judgement reads the store of sightings (gc's proofs on the boot clock; watch/witness.py adds
watch's own) once, and again only when the file changed, not at each call.

A judgement walks /proc (tens of ms), so a step judges at most a few new ones and re-judges a
listed one only after ``rejudge_after_s``; judgements are kept for the listed orphans only, so
memory stays bounded however long the watch runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from smgshm.core.causes import Cause, Found, Where, found
from smgshm.core.errors import SmgshmError
from smgshm.core.segments.judge import ScanOptions, SegmentInfo, State
from smgshm.core.segments.reaping import DEFAULT_MIN_AGE_S
from smgshm.core.segments.scan import judge_entry
from smgshm.core.segments.sightings import Sightings
from smgshm.core.units import human_duration, human_size
from smgshm.core.watch.figures import Orphan, Unseen, WatchOptions
from smgshm.core.watch.follow import SegmentLife, SegmentTracker

_MAX_JUDGED_PER_STEP = 4  # each judgement walks /proc (tens of ms): a leaking host must not stall the watch


class OrphanJudge:
    """Lists a tracker's orphans each step, with gc's verdict on each (cached, bounded)."""

    def __init__(self, opts: WatchOptions, on_orphan: Callable[[Orphan], None] | None = None) -> None:
        self.opts = opts
        self.on_orphan = on_orphan
        self.seen = 0  # orphans ever seen
        self._judged: dict[str, tuple[SegmentInfo | None, float, str]] = {}
        self._sightings: tuple[tuple[int, int], Sightings] | None = None  # (the shm dir's dev and inode, its store)

    def sightings(self) -> Sightings | None:
        """The store of sightings, read once and again only when it changed (or the shm dir did)."""
        try:
            st = os.stat(self.opts.shm_dir)
        except OSError:
            return None  # judge_entry says why
        held = self._sightings
        if held is None or held[0] != (st.st_dev, st.st_ino) or held[1].changed():
            held = self._sightings = ((st.st_dev, st.st_ino), Sightings(self.opts.shm_dir, st.st_dev))
        return held[1]

    def look(self, tracker: SegmentTracker) -> tuple[int, int, list[Orphan]]:
        """(orphans now, their bytes, the listed ones with their judgement)."""
        now_ns = time.time_ns()
        cutoff = now_ns - int(self.opts.orphan_after_s * 1e9)
        count, nbytes, new, old = tracker.orphans(cutoff, self.opts.max_orphans_listed, now_ns)
        self.seen += new
        listed_names = {life.name for life in old}
        for gone in [n for n in self._judged if n not in listed_names]:
            del self._judged[gone]  # judgements are kept for the listed ones only: bounded
        listed: list[Orphan] = []
        budget = _MAX_JUDGED_PER_STEP
        for life in old:
            orphan, judged_now = self._orphan(life, budget > 0)
            budget -= judged_now
            listed.append(orphan)
        return count, nbytes, listed

    def _orphan(self, life: SegmentLife, may_judge: bool) -> tuple[Orphan, int]:
        seen = self._judged.get(life.name)
        now = time.monotonic()
        judged = 0
        first = seen is None
        if (seen is None or now - seen[1] >= self.opts.rejudge_after_s) and may_judge:
            opts = ScanOptions(self.opts.shm_dir, self.opts.stale_after_s, self.opts.assume_dead)
            try:
                info, err = judge_entry(self.opts.shm_dir, life.name, opts, self.sightings()), ""
            except SmgshmError as e:
                info, err = None, str(e)
            seen, judged = (info, now, err), 1
            self._judged[life.name] = seen
        age = life.in_flight_ns / 1e9
        if seen is None:
            o = Orphan(
                life.name,
                life.kind,
                life.producer_pid,
                None,
                Unseen.UNJUDGED,
                "not judged yet",
                life.nbytes,
                age,
                life.reads,
            )
        else:
            info, _, err = seen
            if info is None:
                state, reason = (
                    (State.UNKNOWN, err) if err else (Unseen.GONE, "unlinked since; its unlink event is queued")
                )
                o = Orphan(life.name, life.kind, life.producer_pid, None, state, reason, life.nbytes, age, life.reads)
            else:
                o = Orphan(
                    life.name,
                    life.kind,
                    life.producer_pid,
                    info.producer_alive,
                    info.state,
                    info.reason,
                    life.nbytes if life.nbytes is not None else info.nbytes,
                    age,
                    life.reads,
                )
        if first and judged and self.on_orphan is not None:
            self.on_orphan(o)
        return o, judged


def orphans_cause(orphans: list[Orphan], shm_dir: str, assume_dead: bool = False) -> Found | None:
    """The listed orphans' cause: leaked (their producer is dead) first, as gc frees them; else stranded
    (their producer lives, nobody reads them: SMG never removes its own while it lives); None for neither.

    The fix for leaked ones is the catalogue's, with gc's command. watch recorded each as it saw it
    (watch/witness.py), before any later gc's look at the pid namespaces, so that gc proves them dead and
    reaps them at once; judged with ``assume_dead`` they are proven nothing, and gc (told --assume-dead too)
    reaps each only past its --min-age: the message says when."""
    leaked = [o for o in orphans if o.state == State.LEAKED]
    if leaked:
        when = ""
        if assume_dead:
            wait = max(0.0, DEFAULT_MIN_AGE_S - min(o.age_s for o in leaked))
            when = (
                ": gc reaps them once older than its --min-age (--assume-dead proves no producer dead), the youngest "
                f"in {human_duration(wait)} at the latest"
            )
        return found(
            Cause.SEGMENTS_LEAKED,
            f"{len(leaked)} orphan(s) leaked by a dead producer ({_bytes(leaked)}){when}",
            Where(shm_dir, assume_dead=assume_dead),
        )
    stranded = [o for o in orphans if o.producer_alive and o.state in (State.IN_FLIGHT, State.STALE)]
    if stranded:
        pids = ", ".join(str(p) for p in sorted({o.producer_pid for o in stranded if o.producer_pid is not None}))
        return found(
            Cause.SEGMENTS_STRANDED,
            f"{len(stranded)} orphan(s) stranded by live producer pid(s) {pids} "
            f"({_bytes(stranded)}): no reader will take them",
        )
    return None


def _bytes(orphans: list[Orphan]) -> str:
    """Their size in units; a size never read is unknown, never 0 (what is known is then a floor)."""
    known = [o.nbytes for o in orphans if o.nbytes is not None]
    if not known:
        return "size unknown"
    unknown = len(orphans) - len(known)
    total = human_size(sum(known))
    return f"at least {total}: {unknown} size unknown" if unknown else total
