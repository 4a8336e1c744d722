"""e2e's judgement on synthetic evidence: the path from agreeing sources, the cause from transport.decide."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from smgshm.core.causes import Cause, found
from smgshm.core.e2e import verdict
from smgshm.core.e2e.evidence import MetricsEvidence, ReceiptEvidence, ReceiptSeen, SegmentSeen, ShmDirEvidence
from smgshm.core.e2e.verdict import Context, judge
from smgshm.core.gateway.setting import Mode
from smgshm.core.transport.decision import decide

NS = "5ef74ec3-1111-4000-8000-000000000000:27"
FOREIGN = "00000000-0000-4000-8000-000000000000:1"
PIX = 4816896


def ctx(mode: str = "", worker_ns: str = NS, failed: int = 0, requests: int = 1) -> Context:
    return Context(mode, None, "vllm", NS, worker_ns, True, requests, failed)


def metrics(shm: int = 0, inline: int = 0, failures: int = 0, **kw: object) -> MetricsEvidence:
    tensors = {k: v for k, v in (("shm", shm), ("inline", inline)) if v}
    nbytes = {k: v for k, v in (("shm", shm * PIX), ("inline", inline * 16 if shm else inline * PIX)) if v}
    return MetricsEvidence("http://gw/metrics", True, tensors=tensors, nbytes=nbytes, shm_write_failures=failures, **kw)


def segs(*ends: str) -> ShmDirEvidence:
    seen = [SegmentSeen(f"smg-tokenspeed-42-1-{i}", PIX, 3.0, e) for i, e in enumerate(ends)]
    return ShmDirEvidence(True, gateway_pid=42, segments=seen)


NO_DIR = ShmDirEvidence(False, "not on this host")
NO_RECEIPTS = ReceiptEvidence(False, "not a smgshm serve")


def test_shm_when_metrics_and_segments_agree() -> None:
    v = judge(ctx("shm"), metrics(shm=1, inline=2), segs("consumed"), NO_RECEIPTS)
    assert (v.path, v.agree) == ("shm", True)
    assert v.counts == {"metrics": 1, "shm dir": 1}
    assert v.cause.startswith("SHM: 1 tensor(s) 4.6 MiB via shm, consumed in 3.00 ms")
    assert "below shm_min_bytes 64.0 KiB" in v.cause


def test_sources_that_disagree_are_undetermined() -> None:
    v = judge(ctx("shm"), metrics(shm=1, inline=2), segs(), NO_RECEIPTS)
    assert v.path == "undetermined"
    assert v.agree is False
    assert "metrics 1, shm dir 0" in v.cause


def test_no_source_is_undetermined() -> None:
    m = MetricsEvidence("http://gw/metrics", False, "no smg_mm_* counters")
    v = judge(ctx(), m, NO_DIR, NO_RECEIPTS)
    assert v.path == "undetermined"
    assert v.cause.startswith("no evidence")


def test_inline_causes_in_order() -> None:
    assert "write failures +1" in judge(ctx("shm"), metrics(inline=3, failures=1), segs(), NO_RECEIPTS).cause
    probe = ShmDirEvidence(True, gateway_pid=42, probe_file_left="smg-tokenspeed-probe-42")
    assert "probe file is left over" in judge(ctx("auto"), metrics(inline=3), probe, NO_RECEIPTS).cause
    assert judge(ctx("inline"), metrics(inline=3), segs(), NO_RECEIPTS).cause == "inline: mode is inline"
    v = judge(ctx("auto", worker_ns=FOREIGN), metrics(inline=3), segs(), NO_RECEIPTS)
    assert "another namespace id" in v.cause


def test_failed_writes_seen_in_the_shm_dir_are_not_shm_tensors() -> None:
    """A failed write shows as a segment the gateway created and removed unread (its partial file):
    as many as the metrics count failures are attempts; one more is an SHM tensor, and disagrees."""
    v = judge(ctx(""), metrics(inline=6, failures=2), segs("cleaned", "cleaned"), NO_RECEIPTS)
    assert (v.path, v.agree, v.counts) == ("inline", True, {"metrics": 0, "shm dir": 0})
    assert v.cause == "inline: SHM writes are failing (write failures +2)"
    v = judge(ctx(""), metrics(inline=6, failures=1), segs("cleaned", "cleaned"), NO_RECEIPTS)
    assert (v.path, v.counts) == ("undetermined", {"metrics": 0, "shm dir": 1})
    read = ShmDirEvidence(True, gateway_pid=42, segments=[SegmentSeen("smg-tokenspeed-42-1-0", PIX, 3.0, "cleaned", 1)])
    assert judge(ctx(""), metrics(inline=6, failures=1), read, NO_RECEIPTS).path == "undetermined"  # it was read


def test_remote_gateway_with_a_matching_id_means_mode_inline() -> None:
    v = judge(ctx(""), metrics(inline=3), NO_DIR, NO_RECEIPTS)
    assert v.path == "inline"
    assert v.cause.startswith("inline: mode is inline (the worker's id matches")


def test_gateway_breaking_its_own_rule_is_undetermined() -> None:
    v = judge(ctx("shm"), metrics(inline=3), segs(), NO_RECEIPTS)  # mode shm, writable, big: rule says shm
    assert v.path == "undetermined"
    assert "its rule says shm" in v.cause


def test_consumed_handle_retry_class_and_partial_receipts_not_counted() -> None:
    missing = ReceiptSeen("b", "pixel_values", "shm", PIX, "smg-tokenspeed-42-1-0", error_code="missing")
    r = ReceiptEvidence(True, "a: connection refused", ["b"], [missing], partial=True)
    v = judge(ctx("shm", failed=1), metrics(shm=1, inline=2), segs("consumed"), r)
    assert v.failure_class == "consumed_handle_retried"
    assert "receipts" not in v.counts
    assert v.path == "shm"


def test_left_behind_segment_is_its_own_class() -> None:
    v = judge(ctx("shm", failed=1), metrics(shm=1, inline=2), segs("left_behind"), NO_RECEIPTS)
    assert v.failure_class == "segment_left_behind"


def test_worker_side_processing_means_no_tensors() -> None:
    m = MetricsEvidence("http://gw/metrics", True, processing={"worker": 1})
    v = judge(ctx(), m, segs(), NO_RECEIPTS)
    assert v.path == "none"
    assert "--mm-processing worker" in v.cause


PRIVATE = NS.rsplit(":", 1)[0] + ":43"  # same boot id, another tmpfs


def test_shm_a_worker_cannot_open_names_the_namespace_and_says_never_read() -> None:
    """Configured shm, the worker on another tmpfs: the gateway sends SHM, the worker finds no such segment
    and the request fails. The path is shm by every account, but nothing was read: the cause is the
    worker's tmpfs (namespace_private_tmpfs), and a refused receipt is never "read ... after the write"."""
    missing = ReceiptSeen("w", "pixel_values", "shm", 0, "smg-tokenspeed-42-1-0", age_ms=7.0, error_code="missing")
    inline = [ReceiptSeen("w", f"t{i}", "inline", 16) for i in range(2)]
    r = ReceiptEvidence(True, "", ["w"], [missing, *inline])
    v = judge(ctx("shm", worker_ns=PRIVATE, failed=1), metrics(shm=1, inline=2), segs("cleaned"), r)
    assert (v.path, v.failure_class) == ("shm", "request_failed")
    assert v.code is not None
    assert v.code.value == "namespace_private_tmpfs"
    assert "never read: the worker refused 1 of 1 (missing)" in v.cause
    assert "after the write" not in v.cause
    assert "the worker cannot open them: same host, but" in v.cause
    # Without the shm dir's view, a worker that cannot see the tmpfs retried no consumed handle.
    v = judge(ctx("shm", worker_ns=PRIVATE, failed=1), metrics(shm=1, inline=2), NO_DIR, r)
    assert v.failure_class == "request_failed"
    assert v.code is not None
    # Ids that say the worker can open them: no namespace cause is guessed.
    assert judge(ctx("shm", failed=1), metrics(shm=1, inline=2), segs("cleaned"), r).code is None


@pytest.mark.parametrize(
    ("context", "nbytes", "cause"),
    [
        (ctx("auto", worker_ns=FOREIGN), PIX, Cause.OTHER_HOST),
        (ctx("auto", worker_ns=""), PIX, Cause.NO_NAMESPACE_ID),
        (ctx("", worker_ns=""), PIX, Cause.NO_NAMESPACE_ID),  # a remote gateway: what auto would do
        (ctx("shm"), 100, Cause.BELOW_SHM_MIN_BYTES),
        (replace(ctx("auto"), writable=False), PIX, Cause.SHM_PERMISSION),
        (replace(ctx("auto"), gateway_writable=False), PIX, Cause.GATEWAY_PROBE_FAILED),
        (replace(ctx("auto"), engine="sglang"), PIX, Cause.ENGINE_INLINE_ONLY),
    ],
)
def test_the_cause_is_the_decisions_not_read_back_from_its_prose(
    monkeypatch: pytest.MonkeyPatch, context: Context, nbytes: int, cause: Cause
) -> None:
    """Whatever the gateway's rule says in words, the verdict's code is the cause the rule decided."""

    def reworded(*args: Any, **kw: Any) -> Any:
        return replace(decide(*args, **kw), reason="reworded")

    monkeypatch.setattr(verdict, "decide", reworded)
    m = MetricsEvidence("http://gw/metrics", True, tensors={"inline": 1}, nbytes={"inline": nbytes})
    v = judge(context, m, NO_DIR, NO_RECEIPTS)
    assert v.path == "inline"
    assert v.code is cause
    assert found(v.code, v.cause).code == cause.value  # what e2e's JSON and its "fix:" line carry


def test_a_decision_carries_its_cause() -> None:
    big: dict[str, Any] = {"nbytes": PIX, "engine": "vllm", "local_ns": NS, "worker_ns": NS, "writable": True}
    assert decide(Mode.AUTO, **big).cause is None
    assert decide(Mode.INLINE, **big).cause is Cause.MODE_INLINE
    assert decide(Mode.AUTO, **{**big, "worker_ns": ""}).cause is Cause.NO_NAMESPACE_ID
    assert decide(Mode.AUTO, **{**big, "over_grpc": False}).cause is Cause.NOT_GRPC
