"""The gateway's transport established from evidence: its start-up log line, its metrics, the judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smgshm.cli.exitcodes import for_outcome
from smgshm.core.causes import Cause
from smgshm.core.gateway.log import TransportConfig, parse_transport_line, read_transport_config
from smgshm.core.gateway.metrics import mm_traffic, parse_metrics
from smgshm.core.gateway.mode import judge
from smgshm.core.gateway.setting import Mode


def test_transport_line_parsing_text_ansi_and_json() -> None:
    text = (
        "2026-12-03 15:02:08  \x1b[32mINFO\x1b[0m smg::routers::grpc::multimodal::transport: x.rs:635: "
        "Multimodal tensor transport configured mode=shm shm_min_bytes=65536 dev_writable=true"
    )
    assert parse_transport_line(text) == ("shm", 65536, True)
    js = json.dumps(
        {
            "level": "INFO",
            "fields": {
                "message": "Multimodal tensor transport configured",
                "mode": "auto",
                "shm_min_bytes": 1024,
                "dev_writable": False,
            },
        }
    )
    assert parse_transport_line(js) == ("auto", 1024, False)
    assert parse_transport_line("Multimodal tensor transport configured") is None
    assert parse_transport_line("mode=shm") is None


def test_a_log_appended_across_restarts_gives_the_last_start(tmp_path: Path) -> None:
    log = tmp_path / "smg.log"
    line = (
        "2026-12-0{d} 10:00:00  INFO t: Multimodal tensor transport configured mode={m} shm_min_bytes={b} "
        "dev_writable=true\n"
    )
    log.write_text(line.format(d=1, m="inline", b=65536) + "noise\n" * 3 + line.format(d=2, m="auto", b=1048576))
    c = read_transport_config(str(log))
    assert c is not None
    assert (c.mode, c.shm_min_bytes, c.starts, c.line_no) == ("auto", 1048576, 2, 5)
    assert c.timestamp == "2026-12-02 10:00:00"


def _traffic(text: str) -> Any:
    return mm_traffic(parse_metrics(text))


def test_inference_from_metrics_alone() -> None:
    """The metrics rules, on exposition text shaped as SMG 1.13.0 writes it (smg-facts §6)."""
    inline = _traffic(
        'smg_mm_tensors_total{runtime="vllm",path="inline"} 3120\n'
        'smg_mm_tensor_bytes_total{runtime="vllm",path="inline"} 14352000000\n'
    )
    f = judge("gateway pid 4242", None, inline, "http://127.0.0.1:29000/metrics")
    assert f.verdict == "off_or_failing"
    assert f.summary == (
        "gateway pid 4242: multimodal tensors went inline since start (3,120 tensors, mean 4.4 MiB): "
        "SHM is off (the default is inline) or failing"
    )
    assert "--multimodal-tensor-transport auto" in f.fix
    assert [e.source for e in f.evidence] == ["metrics http://127.0.0.1:29000/metrics"]
    failing = _traffic(
        'smg_mm_tensors_total{runtime="vllm",path="inline"} 3\nsmg_mm_shm_write_failures_total{runtime="vllm"} 1\n'
    )
    assert judge("g", None, failing).verdict == "failing"
    assert for_outcome(judge("g", None, failing).code) == 3
    small = _traffic(
        'smg_mm_tensors_total{runtime="vllm",path="inline"} 2\nsmg_mm_tensor_bytes_total{runtime="vllm",'
        'path="inline"} 32\n'
    )
    assert judge("g", None, small).verdict == "unknown", "tiny tensors say nothing about the setting"


def test_nothing_that_shows_the_setting_is_inconclusive_never_a_pass() -> None:
    """No log, and metrics with no multimodal tensor (or tensors too small to say), or nothing at all: the
    check judged nothing, so it fails as undetermined (exit 6), with the fix that gets the evidence."""
    small = _traffic(
        'smg_mm_tensors_total{runtime="vllm",path="inline"} 2\nsmg_mm_tensor_bytes_total{runtime="vllm",'
        'path="inline"} 32\n'
    )
    none = _traffic("smg_http_requests_total 4\n")
    hint = "smgshm e2e --gateway http://127.0.0.1:30000"
    for traffic in (none, small, None):
        f = judge("g", None, traffic, e2e_hint=hint)
        assert (f.verdict, f.status, for_outcome(f.code)) == ("unknown", "unknown", 6), traffic
        assert f.summary.endswith("its transport setting is unknown")
        assert f.fix == f"pass the log it wrote at its start: smgshm doctor --gateway-log FILE; for certainty: {hint}"
    assert (
        "mean 16 B: below shm_min_bytes 64.0 KiB, inline by design whatever" in judge("g", None, small).summary
    )  # sizes for people
    # With the log, the setting is known: tiny tensors or none yet are no failure.
    logged = TransportConfig("/var/log/smg.log", 3, Mode.AUTO, 65536, True, "")
    assert judge("g", logged, small).status == "ok"
    assert (judge("g", logged, none).verdict, judge("g", logged, none).status) == ("no_traffic", "ok")


def test_shm_written_but_every_chat_request_failed_is_a_failure_not_in_use() -> None:
    shm = (
        'smg_mm_tensors_total{runtime="vllm",path="shm"} 2\n'
        'smg_mm_tensors_total{runtime="vllm",path="inline"} 4\n'
        'smg_http_responses_total{path="/workers",status_code="200",error_code=""} 3\n'
    )
    failed = 'smg_http_responses_total{path="/v1/chat/completions",status_code="400",error_code="x"} 2\n'
    f = judge("gateway pid 4242", None, _traffic(shm + failed))
    assert (f.verdict, f.status, for_outcome(f.code)) == ("failing", "fail", 3)
    assert "every one of its 2 chat request(s) failed" in f.summary
    assert "SHM in use" not in f.summary
    one_ok = 'smg_http_responses_total{path="/v1/chat/completions",status_code="200",error_code=""} 1\n'
    assert judge("g", None, _traffic(shm + failed + one_ok)).status == "ok"  # one got through: in use
    assert judge("g", None, _traffic(shm)).status == "ok"  # no chat answer counted: nothing says it failed


def test_probe_failed_fix_names_the_probe_file_by_the_pid_in_its_namespace() -> None:
    """dev_writable=false: the fix names smg-tokenspeed-probe-<its pid in its own pid namespace>."""
    config = TransportConfig("/var/log/smg.log", 3, Mode.SHM, 65536, False, "")
    f = judge("gateway pid 4242", config, None, name_pid=1)
    assert (f.verdict, for_outcome(f.code), f.cause) == ("probe_failed", 5, Cause.GATEWAY_PROBE_FAILED)
    assert f.fix.startswith("a leftover smg-tokenspeed-probe-1 (the gateway removes it as its probe fails")
    assert "smg-tokenspeed-probe-<pid>" in judge("gateway pid 4242", config, None).fix


def test_configured_shm_whose_tensors_all_went_inline_is_a_failure() -> None:
    """A configured SHM path that does not happen (no write failed, yet every large tensor went inline) fails
    as SHM not used (exit 3), naming where to look; it was a warning, exit 0."""
    big = _traffic(
        'smg_mm_tensors_total{runtime="vllm",path="inline"} 10\n'
        'smg_mm_tensor_bytes_total{runtime="vllm",path="inline"} 10000000\n'
    )
    logged = TransportConfig("/var/log/smg.log", 3, Mode.SHM, 65536, True, "")
    f = judge("g", logged, big, http_url="http://127.0.0.1:30000")
    assert (f.verdict, f.status, for_outcome(f.code)) == ("inline", "fail", 3)
    assert "configured shm (log) yet all 10 tensors since start went inline" in f.summary
    assert f.fix.endswith("smgshm probe --from-gateway http://127.0.0.1:30000")
