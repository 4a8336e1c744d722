"""The JSON interface is pinned: key sets per command, within schema_version 1."""

from __future__ import annotations

import json
import os
from typing import Any

from tests.conftest import run_cli
from tests.e2e_support import model_dir

__all__ = ["model_dir"]  # a fixture

ENVELOPE = {"smgshm_version", "schema_version", "command", "ok", "result", "warnings"}
NS_KEYS = {
    "namespace_id", "boot_id", "shm_dev", "shm_dir", "uid", "gid", "pid", "pid_namespace",
    "hostname", "shm_total_bytes", "shm_free_bytes", "fstype", "mount_options",
}  # fmt: skip
COMPARE_KEYS = {"local", "peer", "sharing", "reason"}


def _check_envelope(doc: dict[str, Any], command: str) -> None:
    assert set(doc) == ENVELOPE
    assert doc["schema_version"] == 1
    assert doc["command"] == command
    assert isinstance(doc["warnings"], list)


def test_ns_schema() -> None:
    doc = run_cli("--json", "ns").json
    _check_envelope(doc, "ns")
    assert set(doc["result"]) == NS_KEYS
    assert isinstance(doc["result"]["shm_total_bytes"], int)


def test_ns_compare_schema() -> None:
    a = "5ef74ec3-1111-4000-8000-000000000000:27"
    doc = run_cli("--json", "ns", "compare", a, a).json
    _check_envelope(doc, "ns compare")
    assert set(doc["result"]) == COMPARE_KEYS
    assert doc["ok"] is True


def test_error_schema() -> None:
    res = run_cli("--json", "ns", "--shm-dir", "/nonexistent-smgshm", exit=5)
    doc = res.json
    assert set(doc) == {"smgshm_version", "schema_version", "command", "ok", "error", "warnings"}
    assert set(doc["error"]) == {"kind", "message", "hint"}
    assert doc["ok"] is False
    assert doc["error"]["kind"] == "host"


WATCH_SUMMARY_KEYS = {
    "shm_dir", "prefix", "started_unix_s", "duration_s", "intervals", "created", "created_bytes", "listed",
    "consumed", "consumed_bytes", "cleaned", "unknown", "ends_by_kind", "flight", "in_flight", "in_flight_bytes",
    "orphans_seen", "orphans", "orphan_list", "overflows", "dir_gone", "untracked", "events_read", "gateway", "notes",
    "cause_info",
}  # fmt: skip
WATCH_INTERVAL_KEYS = {
    "seq", "t_unix_s", "interval_s", "created", "created_bytes", "consumed", "consumed_bytes", "cleaned", "unknown",
    "created_per_s", "created_bytes_per_s", "consumed_per_s", "consumed_bytes_per_s", "created_by_kind", "in_flight",
    "in_flight_bytes", "flight", "orphans", "orphan_bytes", "orphan_list", "overflows", "dir_gone", "untracked",
    "events_read", "watching", "gateway", "cause_info",
}  # fmt: skip
WATCH_FLIGHT_KEYS = {"count", "p50_ms", "p90_ms", "p99_ms", "max_ms"}
WATCH_ORPHAN_KEYS = {"name", "name_hex", "kind", "producer_pid", "producer_alive", "state", "reason", "nbytes",
                     "age_s", "reads"}  # fmt: skip
WATCH_SEGMENT_KEYS = {
    "type", "schema_version", "name", "name_hex", "kind", "producer_pid", "created_ns", "nbytes", "removed_ns",
    "in_flight_ns", "end", "reads", "first_read_ns", "observed", "note",
}  # fmt: skip


def test_watch_schema(tmp_path: Any) -> None:
    d = str(tmp_path)
    name = os.path.join(d, "smg-smgshm-4194305-1-1")  # above any pid_max: an orphan whose producer is dead
    with open(name, "wb") as f:
        f.write(b"x")
    doc = run_cli("--json", "watch", "--shm-dir", d, "--count", "1", "--interval", "0.1", "--orphan-after", "0s").json
    _check_envelope(doc, "watch")
    res = doc["result"]
    assert set(res) == WATCH_SUMMARY_KEYS
    assert set(res["flight"]) == WATCH_FLIGHT_KEYS
    assert set(res["orphan_list"][0]) == WATCH_ORPHAN_KEYS
    out = run_cli("watch", "--jsonl", "--shm-dir", d, "--count", "1", "--interval", "0.1", "--orphan-after", "0s")
    recs = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert all(r["schema_version"] == 1 for r in recs)
    (interval,) = [r for r in recs if r["type"] == "interval"]
    assert set(interval) == WATCH_INTERVAL_KEYS | {"type", "schema_version"}
    (orphan,) = [r for r in recs if r["type"] == "orphan"]
    assert set(orphan) == WATCH_ORPHAN_KEYS | {"type", "schema_version"}
    assert set(recs[-1]) == WATCH_SUMMARY_KEYS | {"type", "schema_version"}
    os.unlink(name)
    # Segment records are pinned in tests/test_cli_watch.py, where real lives end.

E2E_KEYS = {"embedded", "image_bytes", "image_size", "local_namespace_id", "model", "processes_left",
            "removed_at_stop", "runs"}  # fmt: skip
E2E_RUN_KEYS = {
    "agree", "as_expected", "cause", "cause_info", "dev_writable", "engine", "expected", "failure", "failure_class",
    "gateway_log", "gateway_url", "label", "metrics", "metrics_url", "mode", "p50_ms", "path", "receipts", "requests",
    "setting_source", "shm_dir", "shm_min_bytes", "shm_tensors_by_source", "worker_namespace_id", "workers",
}  # fmt: skip
CAUSE_KEYS = {"code", "fix", "fix_cmd", "message"}
E2E_REQUEST_KEYS = {"completion_tokens", "elapsed_ms", "error", "ok", "status", "stream"}
E2E_METRICS_KEYS = {"available", "nbytes", "note", "owner", "processing", "shm_write_failures", "tensors",
                    "url"}  # fmt: skip
E2E_SHM_DIR_KEYS = {"available", "gateway_pid", "name_pid", "note", "probe_file_left", "segments", "shm_dir"}
E2E_SEGMENT_KEYS = {"end", "in_flight_ms", "name", "nbytes", "reads"}
E2E_RECEIPTS_KEYS = {"available", "note", "partial", "receipts", "workers"}
E2E_RECEIPT_KEYS = {"age_ms", "error_code", "error_message", "key", "nbytes", "payload_kind", "read_ms", "shm_name",
                    "unlinked", "worker"}  # fmt: skip


def check_e2e_schema(doc: dict[str, Any]) -> None:
    """The e2e document's key sets, at every level (used by the e2e tests too)."""
    _check_envelope(doc, "e2e")
    r = doc["result"]
    assert set(r) == E2E_KEYS
    assert r["runs"]
    for run in r["runs"]:
        assert set(run) == E2E_RUN_KEYS
        assert run["cause_info"] is None or set(run["cause_info"]) == CAUSE_KEYS
        assert all(set(q) == E2E_REQUEST_KEYS for q in run["requests"])
        assert set(run["metrics"]) == E2E_METRICS_KEYS
        assert set(run["shm_dir"]) == E2E_SHM_DIR_KEYS
        assert all(set(s) == E2E_SEGMENT_KEYS for s in run["shm_dir"]["segments"])
        assert set(run["receipts"]) == E2E_RECEIPTS_KEYS
        assert all(set(x) == E2E_RECEIPT_KEYS for x in run["receipts"]["receipts"])


def test_e2e_schema(tmp_path: Any, children: Any, model_dir: str) -> None:
    """Against the real gateway with a smgshm serve worker: every source present, every key pinned."""
    import pytest

    from smgshm.core.gateway.process import GatewayConfig, start_gateway
    from tests.conftest import start_serve
    from tests.e2e_support import HAVE_SMG

    if not HAVE_SMG:
        pytest.skip("SMG gateway (smg) not installed")
    _, ready = start_serve(children, "--model-dir", model_dir)
    cfg = GatewayConfig(worker_urls=(ready["result"]["address"],), model_path=model_dir, transport="shm",
                        log_path=str(tmp_path / "gw.log"))  # fmt: skip
    with start_gateway(cfg) as gw:
        doc = run_cli("--json", "e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1").json
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["shm_dir"]["segments"]
    assert run["receipts"]["receipts"]
    # Size at close-after-write; None when the reader unlinked it before the watcher could stat it.
    assert all(s["nbytes"] is None or isinstance(s["nbytes"], int) for s in run["shm_dir"]["segments"])
    assert isinstance(run["receipts"]["receipts"][0]["nbytes"], int)


E2E_SWEEP_KEYS = {"rows", "fresh_page_gb_per_s", "memcpy_gb_per_s", "model", "gateway_logs"}
E2E_SWEEP_ROW_KEYS = {
    "image_px", "pixel_nbytes", "requests", "failed", "inline_p50_ms", "shm_p50_ms", "speedup", "shm_write_ms",
    "worker_read_ms", "preprocess_ms", "floor_ms", "write_floor_fraction",
}  # fmt: skip


def test_e2e_sizes_schema() -> None:
    """e2e --sizes: the real pair of gateways at one small size; every key pinned."""
    import pytest

    from tests.e2e_support import HAVE_SMG

    if not HAVE_SMG:
        pytest.skip("SMG gateway (smg) not installed")
    doc = run_cli("--json", "e2e", "--sizes", "224", "-n", "1").json
    _check_envelope(doc, "e2e")
    assert set(doc["result"]) == E2E_SWEEP_KEYS
    [row] = doc["result"]["rows"]
    assert set(row) == E2E_SWEEP_ROW_KEYS
    assert row["image_px"] == 224
    assert row["failed"] == 0
    assert row["pixel_nbytes"] == 256 * 1176 * 4  # 224 px: 16x16 patches of 1176 float32
    assert row["shm_write_ms"] is not None  # the gateway logged its SHM write
