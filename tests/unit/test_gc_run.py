"""The one gc run (core/segments/gcrun.py) that gc, gc --node and preflight share (issue #29, item 4):
one confirmation over everything chosen on every tmpfs, a "no" that deletes nothing, counts summed once,
and the check's outcome (a check of nothing never passes).

The scans here are lists of judged entries in a tmp dir (regular files where something is reaped):
no process, socket or mount.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.outcomes import Outcome
from smgshm.core.segments import gcrun
from smgshm.core.segments.judge import ScanOptions, SegmentInfo, State, Tally
from smgshm.core.segments.reaping import NOT_SMG_NAME, ReapRule
from smgshm.core.segments.sightings import Sightings
from tests.conftest import make_file

DEAD = 3_999_999_999  # a pid no process can have, below names.PID_LIMIT
RULE = ReapRule.of(include_stale=False, min_age_s=0.0, all_users=False)


class Listed:
    """A scan of ``d`` whose entries are already judged: what gcrun reads of a Scan, and no more."""

    def __init__(self, d: Path, segs: list[SegmentInfo]) -> None:
        self.opts = ScanOptions(str(d))
        self.tally = Tally()
        self.shm_total_bytes, self.shm_free_bytes = 1 << 20, 1 << 19
        self._segs = segs
        self.sightings = Sightings(str(d), None)  # no dir identified: nothing read or stored

    def __iter__(self) -> Iterator[SegmentInfo]:
        for seg in self._segs:
            self.tally.add(seg)
            yield seg

    def usage_now(self) -> tuple[int, int]:
        return 0, self.shm_total_bytes


_n = iter(range(1, 1 << 30))


def entry(d: Path, state: State, *, on_disk: bool = False) -> SegmentInfo:
    """A judged entry of ``d``: a real regular file when it may be reaped (``on_disk``), else only its verdict."""
    name = f"smg-tokenspeed-{DEAD}-{time.time_ns()}-{next(_n)}"
    ino, dev = next(_n), 0
    if on_disk:
        st = os.lstat(make_file(str(d), name, age_s=3600))
        ino, dev = st.st_ino, st.st_dev
    return SegmentInfo(
        name, "gateway", "regular", 4096, 4096, 3600.0, os.getuid(), DEAD, False, (), state, "judged", ino, 1, dev
    )


@dataclass
class Asked:
    calls: list[list[str]]
    answer: bool

    def __call__(self, chosen: Sequence[tuple[Any, SegmentInfo]]) -> bool:
        self.calls.append([seg.name for _, seg in chosen])
        return self.answer


def _dirs(tmp_path: Path, n: int) -> list[Path]:
    dirs = [tmp_path / f"tmpfs-{i}" for i in range(n)]
    for d in dirs:
        d.mkdir()
    return dirs


def test_one_question_covers_every_tmpfs_and_yes_reaps_each(tmp_path: Path) -> None:
    a, b = _dirs(tmp_path, 2)
    leaked_a, leaked_b = entry(a, State.LEAKED, on_disk=True), entry(b, State.LEAKED, on_disk=True)
    asked = Asked([], True)
    ticks: list[tuple[int, int]] = []
    run = gcrun.run(
        [Listed(a, [leaked_a]), Listed(b, [leaked_b, entry(b, State.IN_FLIGHT)])],  # type: ignore[list-item]
        RULE,
        confirm=asked,
        on_action=lambda n, of: ticks.append((n, of)),
    )
    assert asked.calls == [[leaked_a.name, leaked_b.name]], "one question, over both tmpfs"
    assert ticks == [(1, 2), (2, 2)]
    assert not os.listdir(a)
    assert not os.listdir(b)
    assert (run.declined, run.deleted) == (False, 2)
    assert run.before.counts["leaked"] == 2
    assert run.after.counts["leaked"] == 0
    assert (run.before.total, run.after.total) == (3, 1)
    assert [p.report.before.total for p in run.parts] == [1, 2]
    assert run.outcome is Outcome.OK


def test_a_no_deletes_nothing_anywhere_and_the_leaks_still_fail_the_check(tmp_path: Path) -> None:
    a, b = _dirs(tmp_path, 2)
    segs = [entry(a, State.LEAKED, on_disk=True), entry(b, State.LEAKED, on_disk=True)]
    asked = Asked([], False)
    run = gcrun.run([Listed(a, segs[:1]), Listed(b, segs[1:])], RULE, confirm=asked)  # type: ignore[list-item]
    assert len(asked.calls) == 1
    assert run.declined is True
    assert run.deleted == 0
    assert [s.name in os.listdir(d) for s, d in zip(segs, (a, b), strict=True)] == [True, True]
    assert all(not p.choice.chosen for p in run.parts), "a declined run is a listing"
    assert run.after.counts["leaked"] == 2
    assert run.outcome is Outcome.CHECK_FAILED


def test_nothing_chosen_asks_nothing(tmp_path: Path) -> None:
    (a,) = _dirs(tmp_path, 1)
    asked = Asked([], True)
    listed: list[str] = []
    scan = Listed(a, [entry(a, State.LEAKED, on_disk=True), entry(a, State.HELD)])
    run = gcrun.run([scan], None, lambda _s: lambda seg, _row: listed.append(seg.name), asked)  # type: ignore[list-item]
    assert asked.calls == [], "a listing asks nothing"
    assert len(listed) == 2, "every entry is listed"
    assert len(os.listdir(a)) == 1
    assert (run.declined, run.deleted) == (False, 0)


def test_no_confirmation_is_yes(tmp_path: Path) -> None:
    """preflight and --npd never ask: they pass no confirmation."""
    (a,) = _dirs(tmp_path, 1)
    run = gcrun.run([Listed(a, [entry(a, State.LEAKED, on_disk=True)])], RULE)  # type: ignore[list-item]
    assert run.deleted == 1
    assert os.listdir(a) == []


def test_the_rules_own_refusal_is_kept_with_its_reason_and_not_asked_about(tmp_path: Path) -> None:
    """A rule's ``keep`` (preflight's proof overrides it) decides before the question."""

    @dataclass(frozen=True)
    class Never(ReapRule):
        def keep(self, seg: SegmentInfo) -> tuple[str, str] | None:
            return NOT_SMG_NAME, f"{seg.reason}; kept: by this rule"

    (a,) = _dirs(tmp_path, 1)
    asked = Asked([], True)
    seg = entry(a, State.LEAKED, on_disk=True)
    run = gcrun.run([Listed(a, [seg])], Never(RULE.states, 0.0), confirm=asked)  # type: ignore[list-item]
    assert asked.calls == []
    (kept,) = run.parts[0].report.deleted
    assert (kept.deleted, kept.kept, kept.reason) == (False, NOT_SMG_NAME, "judged; kept: by this rule")
    assert os.listdir(a) == [seg.name]


U, F, L, H = State.UNKNOWN, State.IN_FLIGHT, State.LEAKED, State.HAZARD


@pytest.mark.parametrize(
    ("tmpfs", "outcome"),
    [
        ([[]], Outcome.OK),  # an empty tmpfs is judged: nothing there is nothing leaked
        ([[U, U]], Outcome.UNDETERMINED),  # every entry unknown: a check of nothing never passes
        ([[U, F]], Outcome.OK),
        ([[U, H]], Outcome.CHECK_FAILED),
        ([[U], [L]], Outcome.CHECK_FAILED),
        ([[], [U]], Outcome.UNDETERMINED),  # gc --node: an empty tmpfs neither makes nor spoils it
        ([[U], [F]], Outcome.OK),  # ... one judged entry anywhere on the node does
        ([[], []], Outcome.OK),
    ],
)
def test_the_checks_outcome(tmp_path: Path, tmpfs: list[list[State]], outcome: Outcome) -> None:
    dirs = _dirs(tmp_path, len(tmpfs))
    scans = [Listed(d, [entry(d, st) for st in states]) for d, states in zip(dirs, tmpfs, strict=True)]
    run = gcrun.run(scans, None)  # type: ignore[arg-type]
    assert run.outcome is outcome
    assert run.nothing_judged is (outcome is Outcome.UNDETERMINED)
    assert run.before.total == sum(map(len, tmpfs))


def test_every_smg_name_unknown_judges_nothing_look_alikes_too_but_not_gcs_own_set_asides() -> None:
    """A check where every entry is unknown, one at least an SMG name (a producer's, or a look-alike: a name
    without a pid), judged nothing: inconclusive, never passed (README: exit 6). An empty dir is judged, and
    gc's own set-asides are not SMG segments: alone they neither make nor spoil a verdict."""
    from smgshm.core.names import Kind
    from smgshm.core.segments.judge import State, Tally

    def tally(*kinds: Kind, state: State = State.UNKNOWN) -> Tally:
        t = Tally()
        for k in kinds:
            t.add_run(state, k, 1, 4096, 0)
        return t

    assert not Tally().judged_nothing  # an empty dir is judged
    assert not tally("gc_aside").judged_nothing
    assert tally("other").judged_nothing  # smg-foo, smg-tokenspeed-12x: names without a pid
    assert tally("other", "gc_aside").judged_nothing
    assert tally("gateway").judged_nothing
    assert tally("gateway", "other").judged_nothing
    # Another gc's set-aside batch in flight beside look-alikes makes no pass of them.
    beside = tally("other")
    beside.add_run(State.IN_FLIGHT, "gc_aside", 3, 3 * 4096, 0)
    assert beside.judged_nothing
    beside.add_run(State.LEAKED, "gateway", 1, 4096, 0)  # one SMG segment judged: a verdict
    assert not beside.judged_nothing
    assert not beside.copy().judged_nothing
