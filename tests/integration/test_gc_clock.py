"""gc's start-time rule under a stepped wall clock (issue #21, finding 2), the step simulated.

This machine's clock is never set. A step is simulated where gc reads it, host/clock.py's
``boot_offset`` (CLOCK_REALTIME minus CLOCK_BOOTTIME, which moves only when the wall clock is
stepped): everything on the host was stamped with the offset as it is, and gc reads it ``s`` seconds
larger (the clock stepped forward by ``s`` since) or smaller (backward). Each judgement passes
``assume_dead`` (see test_core_leaks.py): the trust decision has its own tests.

The rule since: the wall clock never decides a deletion. A step of any size, traced or not, leaves
a live producer's segment unknown (kept); reuse is proven on the boot clock alone, by a sighting
that precedes the process's start (test_gc_sightings.py runs that for real in a pid namespace; here
with the step simulated in the gc that proves it).
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import pytest

from smgshm.core.host import clock
from smgshm.core.host.mounts import mount_of, read_mounts
from smgshm.core.segments.judge import CLOCK_SLACK_S, ScanOptions, SegmentInfo, State, reuse_bounds
from smgshm.core.segments.reaping import ReapRule, choose, reap_choice
from smgshm.core.segments.scan import Scan
from tests.conftest import Children, make_file
from tests.support.cli_gc import PY, SHM, SLEEPER, WRITER, seg_name, unique
from tests.support.gc_sightings import needs_pidns, run_scenario

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = pytest.mark.trust

HOUR_NS = 3600 * 10**9


@pytest.fixture
def scratch(tmpfs_dir: str) -> str:
    return tmpfs_dir


def stepped(monkeypatch: pytest.MonkeyPatch, s: float) -> None:
    """gc reads the boot offset ``s`` seconds off: the wall clock was stepped by ``s`` since everything was stamped."""
    real = clock.boot_offset
    monkeypatch.setattr(clock, "boot_offset", lambda: real() + s)


def judged(d: str) -> dict[str, SegmentInfo]:
    scan = Scan(ScanOptions(shm_dir=d, assume_dead=True))
    return {s.name: s for s in scan}


def delete_leaked(d: str) -> dict[str, bool]:
    """gc --delete --include-stale --min-age 0s, in-process: name -> deleted."""
    scan = Scan(ScanOptions(shm_dir=d, assume_dead=True))
    choice = choose(scan, ReapRule(frozenset({State.LEAKED, State.STALE}), 0.0), lambda seg, row: None)
    return {x.name: x.deleted for x in reap_choice(scan, choice).deleted}


def live_producer(children: Children, d: str) -> tuple[int, str]:
    """A producer that writes one segment as it starts, looked at as it starts (as ps and monitoring do)."""
    p = children.spawn([PY, "-c", WRITER, d])
    os.stat(f"/proc/{p.pid}")
    assert p.stdout is not None
    name = p.stdout.readline().strip()
    assert name, "the producer died"
    return p.pid, name


@pytest.mark.slow
@pytest.mark.parametrize("step", [2, 600, 10**7])
@pytest.mark.parametrize("traced", [True, False])
def test_a_forward_step_never_makes_a_live_producers_segment_reapable(
    children: Children, scratch: str, monkeypatch: pytest.MonkeyPatch, step: int, traced: bool
) -> None:
    pid, name = live_producer(children, scratch)
    assert judged(scratch)[name].state is State.IN_FLIGHT

    # Forward: the segment's time is now ``step`` s before its producer's start. Traced, the
    # producer's /proc entry reads as made that long before the producer started; untraced, as
    # nothing shows a step at all (Linux keeps no history): only the boot clock can tell.
    if not traced:
        monkeypatch.setattr(clock, "stamp", lambda path: None)
        monkeypatch.setattr(clock, "birth_time", lambda path: None)
    stepped(monkeypatch, step)
    seg = judged(scratch)[name]
    assert seg.state is State.UNKNOWN, seg.reason
    assert seg.producer_alive is None
    assert "never deleted on the wall clock" in seg.reason
    if traced and step == 600:
        assert f"producer pid {pid} lives or was reused" in seg.reason
        assert re.search(r"stepped forward since \((599|600) s\) plus 1 s", seg.reason), seg.reason
    elif not traced:
        assert (
            f"pid {pid} is held by a process that started after this segment's time by the wall clock: "
            "reused unless the clock was stepped" in seg.reason
        )
    assert delete_leaked(scratch) == {}
    assert os.path.exists(os.path.join(scratch, name))
    assert judged(scratch)[name].state is State.UNKNOWN, "nor at the next scan: a sighting never predates its producer"


def test_a_step_the_shm_dir_shows_keeps_a_producer_nothing_looked_at(
    children: Children, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other trace: nothing looked at the producer before the step, but the shm dir, a tmpfs
    made a second after boot as /dev/shm is, reads as made before boot: a boot-time NTP step, a VM
    restore. (Its birth time is set by the seam too: a dir made now is as old as the boot clock.)"""
    _, name = live_producer(children, scratch)
    monkeypatch.setattr(clock, "stamp", lambda path: None)  # nothing looked at the process before the step
    made_at_boot = clock.boot_offset() + 1.0
    monkeypatch.setattr(clock, "birth_time", lambda path: made_at_boot)
    stepped(monkeypatch, 600)
    seg = judged(scratch)[name]
    assert seg.state is State.UNKNOWN, seg.reason
    assert delete_leaked(scratch) == {}
    assert os.path.exists(os.path.join(scratch, name))


def test_a_backward_step_keeps_the_live_and_the_wall_clock_alone_reaps_nothing(
    children: Children, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, name = live_producer(children, scratch)
    fresh = children.spawn([PY, "-c", SLEEPER])  # a pid an hour-old segment names: reused, by the wall clock
    old = seg_name(fresh.pid, time.time_ns() - HOUR_NS)
    make_file(scratch, old, age_s=3600)

    stepped(monkeypatch, -600)  # segments look younger: never a reason to delete
    segs = judged(scratch)
    assert segs[name].state is State.IN_FLIGHT
    assert segs[old].state is State.UNKNOWN, segs[old].reason
    assert "reused unless the clock was stepped" in segs[old].reason
    assert delete_leaked(scratch) == {}
    assert os.path.exists(os.path.join(scratch, name))
    assert os.path.exists(os.path.join(scratch, old))


@needs_pidns
@pytest.mark.parametrize("step", [-600, 0, 600])
def test_reuse_is_proven_and_reaped_by_a_sighting_before_the_start_whatever_the_wall_clock_did(
    children: Children, tmp_path: Path, step: float
) -> None:
    got = run_scenario(children, tmp_path, "sighted-first", how="core", step=step)
    assert got["delete"]["state"] == "leaked", got["delete"]
    assert "after smgshm first saw this segment (reused)" in got["delete"]["reason"]
    assert got["delete"]["deleted"] is True
    assert got["holder_alive"] is True


def test_a_segment_as_old_as_the_margin_is_kept_and_one_beyond_is_kept_too(
    children: Children, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The margin's edges: 1 s plus the step shown (300 s here, as the shm dir's birth time would show it).
    Beyond it the wall clock says reused, which is no proof either: unknown, kept."""
    fresh = children.spawn([PY, "-c", SLEEPER])
    wall = clock.WallClock(clock.boot_offset(), 300.0)
    monkeypatch.setattr(clock, "read_wall_clock", lambda shm_dir, dev: wall)
    bounds = reuse_bounds(fresh.pid, wall)
    assert bounds is not None
    alive_from, reused_before, _ = bounds
    assert alive_from - reused_before >= 300.0
    started = alive_from + CLOCK_SLACK_S
    at = {
        "slack": seg_name(fresh.pid, math.ceil(alive_from * 1e9) + 1000, 1),  # the start less 1 s: its own
        "margin": seg_name(fresh.pid, math.ceil(reused_before * 1e9) + 1000, 2),  # less 1 s and the step: kept
        "beyond": seg_name(fresh.pid, math.floor((reused_before - 0.5) * 1e9), 3),  # beyond it: reused
    }
    for name in at.values():
        make_file(scratch, name)
        os.utime(os.path.join(scratch, name), (started - 400, started - 400))  # older than each name: it decides
    segs = judged(scratch)
    assert segs[at["slack"]].state is State.IN_FLIGHT
    assert segs[at["margin"]].state is State.UNKNOWN
    assert segs[at["beyond"]].state is State.UNKNOWN
    assert "reused unless the clock was stepped" in segs[at["beyond"]].reason
    assert "lives or was reused" in segs[at["margin"]].reason
    assert delete_leaked(scratch) == {}


def test_btime_is_todays_offset_so_only_traces_show_a_step(tmp_path: Path) -> None:
    """/proc/stat's btime is the boot offset recomputed at each read: it cannot tell a step. A trace
    can: a stamp made after a known boot-clock time that reads, on today's offset, as made before it."""
    with open("/proc/stat", "rb") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    assert abs(clock.boot_offset() - btime) < 1.5
    assert abs(clock.boot_offset() - (time.time() - time.clock_gettime(time.CLOCK_BOOTTIME))) < 0.01

    assert clock.step_shown(None, 10.0, 1000.0) == 0.0
    assert clock.step_shown(1005.0, 10.0, 1000.0) == 5.0  # made at boot time >= 10, reads as 5
    assert clock.step_shown(1020.0, 10.0, 1000.0) == 0.0  # made at 20: no step shown

    d = os.path.join(SHM, f"smgshm-test-{unique()}")
    os.mkdir(d)
    try:
        born = clock.birth_time(d)
        if born is None:
            pytest.skip("no statx birth time for tmpfs on this kernel")
        assert abs(born - time.time()) < 5
        assert clock.dir_step_shown(d, os.stat(d).st_dev, born + 7) == pytest.approx(7.0)
        assert clock.dir_step_shown(d, os.stat(d).st_dev, born - 7) == 0.0
    finally:
        os.rmdir(d)
    # A filesystem that outlives a boot shows nothing: what is on it may predate the boot.
    where = mount_of(read_mounts(), os.stat(tmp_path).st_dev)
    if where is not None and where.fstype not in clock.BOOT_BOUND_FS:
        assert clock.dir_step_shown(str(tmp_path), os.stat(tmp_path).st_dev, time.time() + 3600) == 0.0
