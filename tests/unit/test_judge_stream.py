"""A listing judged as one stream says of each entry what judging it alone says (segments/judge.py).

``Judge.each`` keeps what it looked up last (a pid's bounds, a dead producer's sentence) for the next entry:
a crowded dir repeats a handful of pids. Interleaved pids and kinds must never borrow each other's.
"""

from __future__ import annotations

import os
import time

from smgshm.core.host.pidtrust import Trust
from smgshm.core.segments.judge import Judge, ScanOptions, SegmentInfo, State, Tally
from smgshm.core.segments.sightings import Sightings
from tests.conftest import make_file

DEAD_A, DEAD_B = 3_999_999_991, 3_999_999_992  # pids no process can have, below names.PID_LIMIT


class _Entry:
    def __init__(self, d: str, name: str) -> None:
        self.name, self.st = name, os.lstat(os.path.join(d, name))

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return self.st


def _judge(d: str) -> Judge:
    dev = os.stat(d).st_dev
    return Judge(ScanOptions(d), Trust(True, "this namespace alone"), {}, dev, Sightings(d, dev))


def test_interleaved_pids_and_kinds_are_each_judged_as_alone(tmpfs_dir: str) -> None:
    now = time.time_ns()
    producers = [
        f"smg-tokenspeed-{DEAD_A}-{now}",
        f"smg-tokenspeed-{os.getpid()}-{now}",  # alive, young: in flight
        f"smg-tokenspeed-probe-{DEAD_A}",  # the same pid as another kind: its own sentence
        f"smg-tokenspeed-{DEAD_B}-{now}",
        "smg-no-pid-here",
    ]
    names = [f"{p}-{i}" if "probe" not in p and "no-pid" not in p else p for i in range(3) for p in producers]
    names = list(dict.fromkeys(names))  # the probe and no-pid names once each
    for name in names:
        make_file(tmpfs_dir, name)
    entries = [_Entry(tmpfs_dir, n) for n in names]
    streamed = list(_judge(tmpfs_dir).each(entries))
    alone = [_judge(tmpfs_dir)(e.name, e.st) for e in entries]

    def said(seg: SegmentInfo) -> tuple[str, State, bool | None, str]:
        return seg.name, seg.state, seg.producer_alive, seg.reason

    assert [said(s) for s in streamed] == [said(s) for s in alone]
    by_name = {s.name: s for s in streamed}
    assert by_name[f"smg-tokenspeed-{os.getpid()}-{now}-1"].state is State.IN_FLIGHT
    assert f"pid {DEAD_B} is dead" in by_name[f"smg-tokenspeed-{DEAD_B}-{now}-2"].reason
    assert "gateway with pid" in by_name[f"smg-tokenspeed-probe-{DEAD_A}"].reason  # the probe's own sentence
    assert "gateway with pid" not in by_name[f"smg-tokenspeed-{DEAD_A}-{now}-2"].reason


def _tallied(segs: list[SegmentInfo]) -> Tally:
    t = Tally()
    for s in segs:
        t.add(s)
    return t


def _figures(t: Tally) -> tuple[object, ...]:
    return t.counts, t.bytes_by_state, t.counts_by_kind, t.bytes_by_kind, t.reclaimable_bytes, t.total, t.judged


def test_the_streamed_tally_is_each_entrys_added(tmpfs_dir: str) -> None:
    # Runs of one state and kind, broken by others; a leaked entry with a second link frees nothing.
    now = time.time_ns()
    names = [f"smg-tokenspeed-{DEAD_A}-{now}-{i}" for i in range(4)]
    names += [f"smg-tokenspeed-{os.getpid()}-{now}-{i}" for i in range(2)]
    names += ["smg-no-pid-here", f"smg-tokenspeed-{DEAD_B}-{now}-0", f"smg-tokenspeed-probe-{DEAD_B}"]
    for i, name in enumerate(names):
        with open(os.path.join(tmpfs_dir, name), "wb") as f:
            f.write(b"x" * 4096 * (i + 1))
    os.link(os.path.join(tmpfs_dir, names[1]), os.path.join(tmpfs_dir, "second-link"))
    entries = [_Entry(tmpfs_dir, n) for n in names]
    tally = Tally()
    segs = list(_judge(tmpfs_dir).each(entries, tally))
    assert {s.state for s in segs} >= {State.LEAKED, State.IN_FLIGHT, State.UNKNOWN}
    assert _figures(tally) == _figures(_tallied(segs))
    assert 0 < tally.reclaimable_bytes < tally.bytes_by_state["leaked"]  # the linked one is not reclaimable


def test_a_listing_left_midway_has_tallied_what_it_gave(tmpfs_dir: str) -> None:
    now = time.time_ns()
    names = [f"smg-tokenspeed-{DEAD_A}-{now}-{i}" for i in range(6)]
    for name in names:
        make_file(tmpfs_dir, name)
    tally = Tally()
    listing = _judge(tmpfs_dir).each([_Entry(tmpfs_dir, n) for n in names], tally)
    given = [next(listing) for _ in range(4)]
    listing.close()  # as a consumer that stopped (an error, Ctrl-C) leaves it
    assert tally.total == 4
    assert _figures(tally) == _figures(_tallied(given))
