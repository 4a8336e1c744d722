"""watch's figures: the gateway's rates and verdict, bounded memory (its streaming percentiles: test_core_stats)."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest

from smgshm.core.gateway.metrics import parse_metrics
from smgshm.core.gateway.rates import gateway_rates
from smgshm.core.stats import StreamingQuantiles
from smgshm.core.watch.figures import Totals as _Totals
from smgshm.core.watch.figures import WatchOptions
from smgshm.core.watch.follow import SegmentTracker, ShmEvent
from smgshm.core.watch.session import WatchSession

EXPO = """\
# TYPE smg_mm_tensors_total counter
smg_mm_tensors_total{{runtime="vllm",path="inline"}} {inline_n}
smg_mm_tensors_total{{runtime="vllm",path="shm"}} {shm_n}
# TYPE smg_mm_tensor_bytes_total counter
smg_mm_tensor_bytes_total{{runtime="vllm",path="inline"}} {inline_b}
smg_mm_tensor_bytes_total{{runtime="vllm",path="shm"}} {shm_b}
# TYPE smg_mm_shm_write_failures_total counter
smg_mm_shm_write_failures_total{{runtime="vllm"}} {fail}
"""


def snap(inline_n: int = 0, shm_n: int = 0, inline_b: int = 0, shm_b: int = 0, fail: int = 0) -> object:
    text = EXPO.format(inline_n=inline_n, shm_n=shm_n, inline_b=inline_b, shm_b=shm_b, fail=fail)
    return parse_metrics(text, "http://127.0.0.1:29000/metrics")


def test_shm_traffic_share_and_no_verdict() -> None:
    # Under shm: pixel_values through SHM, the two small tensors inline (smg-facts §5.2).
    r = gateway_rates(snap(), snap(inline_n=20, shm_n=10, inline_b=320, shm_b=48_168_960), 2.0)  # type: ignore[arg-type]
    assert r.tensors == {"inline": 20, "shm": 10}
    assert r.tensors_per_s == {"inline": 10.0, "shm": 5.0}
    assert r.bytes_per_s["shm"] == 24_084_480.0
    assert r.shm_byte_share is not None
    assert r.shm_byte_share > 0.9999
    assert (r.eligible_inline, r.verdict) == (False, "")


def test_inline_transport_is_called_out() -> None:
    r = gateway_rates(snap(), snap(inline_n=3, inline_b=4_816_896 + 32), 1.0)  # type: ignore[arg-type]
    assert r.eligible_inline
    assert r.shm_byte_share == 0.0
    assert "all traffic went inline" in r.verdict
    assert "SHM-eligible tensors went inline" in r.verdict


def test_mixed_and_failures() -> None:
    mixed = gateway_rates(snap(), snap(inline_n=4, shm_n=1, inline_b=9_633_824, shm_b=4_816_896), 1.0)  # type: ignore[arg-type]
    assert mixed.eligible_inline
    assert mixed.verdict.startswith("some SHM-eligible tensors went inline")
    failed = gateway_rates(snap(), snap(inline_n=3, inline_b=96, fail=2), 1.0)  # type: ignore[arg-type]
    assert failed.eligible_inline
    assert "2 SHM write(s) failed" in failed.verdict
    small = gateway_rates(snap(), snap(inline_n=3, inline_b=96), 1.0)  # type: ignore[arg-type]
    assert (small.eligible_inline, small.verdict) == (False, "")  # small tensors are inline by design
    idle = gateway_rates(snap(), snap(), 1.0)  # type: ignore[arg-type]
    assert idle.shm_byte_share is None
    assert idle.tensors == {}


@pytest.mark.slow
@pytest.mark.parametrize("n", [100_000])
def test_memory_does_not_grow_with_segments_seen(n: int) -> None:
    """A hundred thousand segments through the tracker and the totals: memory stays flat."""
    tracker, totals, q = SegmentTracker(), _Totals(), StreamingQuantiles()

    def batch(start: int, size: int) -> list[ShmEvent]:
        out = []
        for i in range(start, start + size):
            name = f"smg-tokenspeed-42-{1_000_000 + i}-{i}"
            out += [
                ShmEvent("created", name, i * 1000),
                ShmEvent("opened", name, i * 1000 + 1),
                ShmEvent("closed", name, i * 1000 + 2, 4096),
                ShmEvent("opened", name, i * 1000 + 500),
                ShmEvent("removed", name, i * 1000 + 900 + i % 97),
            ]
        return out

    totals.add(tracker.feed(batch(0, 10_000)), q)  # warm up: dicts and buckets at their size
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for start in range(10_000, n, 10_000):
        totals.add(tracker.feed(batch(start, 10_000)), q)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(tracker) == 0
    assert tracker.created == n
    assert totals.count("consumed") == n
    assert totals.flight.count == n
    assert grown < 256 * 1024, f"memory grew by {grown} bytes over {n} segments"


def test_a_step_begun_after_its_interval_still_reads_what_is_queued(tmp_path: Path) -> None:
    """A watch descheduled past its interval's end still reads the queue in that step, so an
    interval with no event read means none was queued (benchmarks/watch_rate.py ends a round
    on two such intervals after its producer exited: before, two late steps ended it with
    the last segments unread, a loss without an overflow)."""
    with WatchSession(WatchOptions(shm_dir=str(tmp_path), interval_s=0.05)) as session:
        name = tmp_path / f"smg-smgshm-{os.getpid()}-{time.time_ns()}-1"
        os.close(os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        name.unlink()
        time.sleep(0.2)  # the interval ended before the step began (queued events are already there)
        st = session.step()
        assert (st.created, st.cleaned, st.overflows) == (1, 1, 0)
        assert st.events_read >= 4  # IN_CREATE, IN_OPEN, IN_CLOSE_WRITE, IN_DELETE


def test_verdicts_name_their_cause_from_the_catalogue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from smgshm.core.causes import CATALOGUE, Cause

    failed = gateway_rates(snap(), snap(inline_n=3, inline_b=600_000, fail=2), 1.0)  # type: ignore[arg-type]
    assert failed.cause_info is not None
    assert failed.cause_info.code == "shm_writes_failing"  # the gateway is not known to write here: no split
    assert failed.cause_info.message == failed.verdict
    assert failed.cause_info.fix == CATALOGUE[Cause.SHM_WRITES_FAILING].fix
    # Writing to this host's shm dir, the dir tells which: smaller than a tensor the writes needed, then full.
    monkeypatch.setattr("smgshm.core.host.capacity.shm_space", lambda _d: (150_000, 150_000))
    small = gateway_rates(snap(), snap(inline_n=3, inline_b=600_000, fail=2), 1.0, shm_dir=str(tmp_path))  # type: ignore[arg-type]
    assert small.cause_info is not None
    assert small.cause_info.code == "shm_too_small"
    assert small.cause_info.fix_cmd == ["smgshm", "doctor", "--shm-dir", str(tmp_path)]
    monkeypatch.setattr("smgshm.core.host.capacity.shm_space", lambda _d: (1 << 30, 1000))
    full = gateway_rates(snap(), snap(inline_n=3, inline_b=600_000, fail=2), 1.0, shm_dir=str(tmp_path))  # type: ignore[arg-type]
    assert full.cause_info is not None
    full_gc = ["smgshm", "gc", "--delete", "--shm-dir", str(tmp_path)]  # the catalogue's: gc frees a full dir
    assert (full.cause_info.code, full.cause_info.fix_cmd) == ("shm_full", full_gc)
    # Large tensors inline: nothing through SHM is the mode (or a namespace); some through SHM, some workers'.
    inline = gateway_rates(snap(), snap(inline_n=3, inline_b=4_816_896 + 32), 1.0)  # type: ignore[arg-type]
    assert inline.cause_info is not None
    assert inline.cause_info.code == "mode_inline"
    assert "another namespace" in inline.cause_info.fix
    mixed = gateway_rates(snap(), snap(inline_n=4, shm_n=1, inline_b=9_633_824, shm_b=4_816_896), 1.0)  # type: ignore[arg-type]
    assert mixed.cause_info is not None
    assert mixed.cause_info.code == "some_workers_inline"
    small_inline = gateway_rates(snap(), snap(inline_n=3, inline_b=96), 1.0)  # type: ignore[arg-type]
    assert small_inline.cause_info is None  # no verdict, no cause


def test_orphans_name_leaked_or_stranded() -> None:
    from smgshm.core.watch.figures import Orphan
    from smgshm.core.watch.orphans import orphans_cause

    def orphan(state: str, alive: bool | None) -> Orphan:
        return Orphan("smg-x", "gateway", 42, alive, state, "", 1000, 60.0, 0)

    leaked = orphans_cause([orphan("in_flight", True), orphan("leaked", False)], "/dev/shm")
    assert leaked is not None
    assert (leaked.code, leaked.fix_cmd) == ("segments_leaked", ["smgshm", "gc", "--delete", "--shm-dir", "/dev/shm"])
    assert leaked.fix == "remove them with gc", "the words introduce the command: never a second command run into it"
    stranded = orphans_cause([orphan("stale", True), orphan("held", True)], "/dev/shm")
    assert stranded is not None
    assert stranded.code == "segments_stranded"
    assert "1 orphan(s) stranded by live producer pid(s) 42 (1000 B)" in stranded.message
    assert orphans_cause([orphan("held", True), orphan("unjudged", None)], "/dev/shm") is None


def test_watch_under_assume_dead_names_the_flag_and_when_gc_reaps() -> None:
    from smgshm.core.causes import CATALOGUE, Cause
    from smgshm.core.watch.figures import Orphan
    from smgshm.core.watch.orphans import orphans_cause

    leaked = [Orphan("smg-tokenspeed-7-1-0", "gateway", 7, False, "leaked", "", 4096, 60.0, 0)]
    cause = orphans_cause(leaked, "/tmp/d", assume_dead=True)
    assert cause is not None
    assert cause.fix_cmd == ["smgshm", "gc", "--delete", "--shm-dir", "/tmp/d", "--assume-dead"]
    assert "the youngest in 9 min at the latest" in cause.message  # the case's words; the fix is the catalogue's
    assert cause.fix == CATALOGUE[Cause.SEGMENTS_LEAKED].fix
