"""doctor's gc scan: leaked segments, hazards named like segments, and whether liveness is trusted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from smgshm.core.causes import Cause
from smgshm.core.doctor.check import Check
from smgshm.core.errors import SmgshmError
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.paths import smgshm_cmd
from smgshm.core.units import human_duration, human_size

if TYPE_CHECKING:
    from smgshm.core.segments.judge import SegmentInfo

# A segment lives for one request (the worker reads and unlinks it at once, or the gateway removes it when the
# request fails): one of a live gateway's, nobody holding it, this old, will never be read.
STRANDED_AFTER_S = 300.0


def check_leaks(shm_dir: str, stranded_after_s: float = STRANDED_AFTER_S) -> list[Check]:
    from smgshm.core.segments.judge import ScanOptions
    from smgshm.core.segments.scan import Scan

    try:
        scan = Scan(ScanOptions(shm_dir, stale_after_s=stranded_after_s))
        r = scan.report(sorted(scan, key=lambda s: s.name))
    except SmgshmError as err:
        return [Check("leaks", Status.FAIL, str(err), err.hint or "", Outcome.HOST)]
    out = leak_checks(
        r.counts,
        r.segments,
        r.reclaimable_bytes,
        lambda *a: smgshm_cmd(shm_dir, "gc", *a),
        stranded_after_s,
        reap_wait(r.segments, scan.sightings.stored),
    )
    if not r.liveness_trusted:
        out.append(Check("liveness", Status.WARN, r.liveness_note))
    return out


def reap_wait(segments: Sequence[SegmentInfo], stored: bool) -> float | None:
    """How long until ``gc --delete`` (its default --min-age) reaps the youngest leaked segment of a scan that
    stored its sightings (``stored``) or not: None at once. A scan's sightings come before any later gc's look
    at the pid namespaces, so that gc proves each leaked one dead and reaps it at any age (reaping.keep_reason);
    a scan that could not store them leaves gc only --min-age."""
    from smgshm.core.segments.judge import State
    from smgshm.core.segments.reaping import DEFAULT_MIN_AGE_S

    if stored:
        return None
    ages = [s.age_s for s in segments if s.state is State.LEAKED and not s.proven_dead]
    return max(0.0, DEFAULT_MIN_AGE_S - min(ages)) if ages else None


def leak_checks(
    counts: dict[str, int],
    segments: Sequence[SegmentInfo],
    reclaimable_bytes: int,
    gc_cmd: Callable[..., list[str]],
    stranded_after_s: float = STRANDED_AFTER_S,
    wait_s: float | None = None,
) -> list[Check]:
    """The leaks, stranded segments and hazards of one judged listing (``counts`` by state), each failure
    with the gc command that fixes it: ``gc_cmd(*gc_args)`` is its argv (``smgshm gc ...`` for this shm
    dir; ``smgshm gc --node ...`` for a node's pod tmpfs). ``wait_s``: ``reap_wait``'s, how long until that
    command reaps the youngest leaked segment (None: at once)."""
    from smgshm.core.segments.judge import State

    c = counts
    out = []
    if c["leaked"]:
        when = (
            "reap them:"
            if not wait_s
            else (
                "reap them once older than gc's --min-age (this scan could not store its sightings, so gc proves "
                f"no producer dead): the youngest in {human_duration(wait_s)}, with:"
            )
        )
        out.append(
            Check(
                "leaks",
                Status.FAIL,
                f"{c['leaked']} leaked segment(s), {human_size(reclaimable_bytes)} reclaimable",
                when,
                Outcome.CHECK_FAILED,
                fix_cmd=gc_cmd("--delete"),
                cause=Cause.SEGMENTS_LEAKED,
            )
        )
    elif _judged_nothing(segments):  # gc --check's rule: a check of nothing never passes
        why = Counter(s.reason for s in segments).most_common(1)[0][0]
        out.append(
            Check(
                "leaks",
                Status.UNKNOWN,
                f"{len(segments)} SMG segment(s), none could be judged: {why}",
                "judge them where their producers' pid namespace is seen (as root, on the host), or list them:",
                Outcome.UNDETERMINED,
                fix_cmd=gc_cmd("--all"),
            )
        )
    else:
        unknown = f" ({c['unknown']} unknown)" if c["unknown"] else ""
        out.append(Check("leaks", Status.OK, f"{len(segments)} SMG segment(s), none leaked{unknown}"))
    stranded = [s for s in segments if s.state is State.STALE and s.kind == "gateway"]
    if stranded:
        nbytes = sum(s.frees_bytes for s in stranded)
        pids = sorted({s.producer_pid for s in stranded if s.producer_pid is not None})
        after, secs = human_duration(stranded_after_s), f"{int(stranded_after_s)}s"
        out.append(
            Check(
                "stranded",
                Status.FAIL,
                f"{len(stranded)} segment(s) of live gateway pid(s) {', '.join(map(str, pids))} older than {after} "
                f"with no reader: {human_size(nbytes)} held (a worker died or refused a request before reading)",
                "no worker will read them, and SMG never removes its own while it lives (not even on SIGTERM; a "
                "restarted gateway sweeps them at its first SHM write); free them now:",
                Outcome.CHECK_FAILED,
                fix_cmd=gc_cmd("--delete", "--include-stale", "--stale-after", secs, "--min-age", secs),
                cause=Cause.SEGMENTS_STRANDED,
            )
        )
    if c["hazard"]:
        out.append(
            Check(
                "hazards",
                Status.FAIL,
                f"{c['hazard']} non-regular entr(ies) or mount points named like segments (SMG's reader refuses them; "
                "a FIFO hangs it)",
                "inspect and remove them by hand; they are listed by:",
                Outcome.CHECK_FAILED,
                fix_cmd=gc_cmd("--all"),
            )
        )
    return out


def _judged_nothing(segments: Sequence[SegmentInfo]) -> bool:
    from smgshm.core.segments.judge import Tally

    tally = Tally()
    for s in segments:
        tally.add(s)
    return tally.judged_nothing
