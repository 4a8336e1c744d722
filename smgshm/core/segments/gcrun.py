"""One gc run: choose, confirm, reap, report. ``gc``, ``gc --node`` and preflight all reap through it.

Each scan (one tmpfs) is listed and judged as it streams, and ``choose`` picks what the rule lets it
reap there. Then ONE confirmation covers everything chosen on every tmpfs (the CLI asks on a
terminal; preflight and a node-problem-detector run never ask). A "no" deletes nothing and is no
failure: the run is then a listing. Only after that is each tmpfs reaped (``reap_choice``), and the
figures are counted once here, with the check's outcome, so the commands cannot diverge on the
prompt, the exit code or the counts (as kubectl's drain.Helper is one flow for its callers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from smgshm.core.outcomes import Outcome
from smgshm.core.segments.judge import SegmentInfo, Tally
from smgshm.core.segments.reaping import Choice, ReapReport, ReapRule, choose, reap_choice
from smgshm.core.segments.scan import Deletion, Scan

S = TypeVar("S", bound=Scan)

OnEntry = Callable[[SegmentInfo, int], None]  # each entry as the scan streams it, with its row


@dataclass(frozen=True)
class Part(Generic[S]):
    """One tmpfs of a run: its scan, what was chosen there (as reaped: nothing once declined), and its report."""

    scan: S
    choice: Choice
    report: ReapReport


@dataclass(frozen=True)
class GcRun(Generic[S]):
    """What a gc run found and did, per tmpfs and in total, and what a --check of it says."""

    parts: list[Part[S]]
    declined: bool  # something was chosen and the confirmation said no: nothing was tried
    before: Tally  # every tmpfs's scan, summed
    after: Tally  # less what was deleted

    @property
    def deleted(self) -> int:
        """How many entries were unlinked."""
        return sum(d.deleted for p in self.parts for d in p.report.deleted)

    @property
    def leaked_or_hazard(self) -> int:
        """What remains that a check fails on."""
        return self.after.counts["leaked"] + self.after.counts["hazard"]

    @property
    def nothing_judged(self) -> bool:
        """Every SMG entry found, on every tmpfs, is unknown (one at least): a check of them judged nothing.
        An empty tmpfs is judged (nothing there is nothing leaked), so it neither makes nor spoils this."""
        return self.before.judged_nothing

    @property
    def outcome(self) -> Outcome:
        """The check's outcome: failed when anything leaked or hazardous remains, undetermined when nothing
        could be judged (a check of nothing never passes), else OK."""
        if self.leaked_or_hazard:
            return Outcome.CHECK_FAILED
        if self.nothing_judged:
            return Outcome.UNDETERMINED
        return Outcome.OK


def _sum(tallies: Iterable[Tally]) -> Tally:
    total = Tally()
    for t in tallies:
        for st in total.counts:
            total.counts[st] += t.counts[st]
            total.bytes_by_state[st] += t.bytes_by_state[st]
        for kind in total.counts_by_kind:
            total.counts_by_kind[kind] += t.counts_by_kind[kind]
            total.bytes_by_kind[kind] += t.bytes_by_kind[kind]
        total.reclaimable_bytes += t.reclaimable_bytes
        total.total += t.total
        total.judged += t.judged
    return total


def _nothing(_seg: SegmentInfo, _row: int) -> None:
    return None


def run(
    scans: Iterable[S],
    rule: ReapRule | None,
    listing: Callable[[S], OnEntry] | None = None,
    confirm: Callable[[Sequence[tuple[S, SegmentInfo]]], bool] | None = None,
    on_action: Callable[[int, int], None] | None = None,
    on_part: Callable[[Part[S]], None] | None = None,
) -> GcRun[S]:
    """List, choose, confirm once, reap and count, over ``scans`` (each one tmpfs; iterated in turn).

    ``rule``: what may be reaped (None: nothing, a listing). ``listing(scan)``: the callback that is handed
    each of that scan's entries as it streams. ``confirm``: called once, only when something was chosen,
    with every chosen entry and its scan; False deletes nothing (None: no question, as ``--yes``).
    ``on_action(tried, chosen)``: after each chosen entry is tried (between reap batches, none set aside).
    ``on_part(part)``: each tmpfs's part once it is done; in a listing (no rule: nothing to confirm) right after
    its scan, before the next one is listed, so that a caller can write it out and keep nothing of it."""
    if rule is None:
        listed: list[Part[S]] = []
        for scan in scans:
            choice = choose(scan, None, listing(scan) if listing else _nothing)
            scan.sightings.release()  # listed and stored: reaping reads none (a node's tmpfs, one at a time)
            listed.append(Part(scan, choice, reap_choice(scan, choice)))
            if on_part is not None:
                on_part(listed[-1])
        return GcRun(listed, False, _sum(p.report.before for p in listed), _sum(p.report.after for p in listed))
    chosen: list[tuple[S, Choice]] = []
    for scan in scans:
        chosen.append((scan, choose(scan, rule, listing(scan) if listing else _nothing)))
        scan.sightings.release()
    picked = [(scan, seg) for scan, choice in chosen for seg in choice.chosen]
    declined = bool(picked) and confirm is not None and not confirm(picked)
    if declined:  # the rule's refusals still stand: they say why each was kept
        chosen = [(scan, Choice([], choice.refused, {})) for scan, choice in chosen]
    total, tried = len(picked), 0

    def tick(_d: Deletion) -> None:
        nonlocal tried
        tried += 1
        if on_action is not None:
            on_action(tried, total)

    parts = [Part(scan, choice, reap_choice(scan, choice, tick)) for scan, choice in chosen]
    if on_part is not None:
        for part in parts:
            on_part(part)
    return GcRun(parts, declined, _sum(p.report.before for p in parts), _sum(p.report.after for p in parts))


__all__ = ["GcRun", "OnEntry", "Part", "run"]
