"""Shared by the tests of json_schema (moved out of tests/test_json_schema.py)."""

from __future__ import annotations

from typing import Any

ENVELOPE = {"smgshm_version", "schema_version", "command", "ok", "result", "warnings"}


def _check_envelope(doc: dict[str, Any], command: str) -> None:
    assert set(doc) == ENVELOPE
    assert doc["schema_version"] == 1
    assert doc["command"] == command
    assert isinstance(doc["warnings"], list)


WATCH_SEGMENT_KEYS = {
    "type",
    "schema_version",
    "name",
    "name_hex",
    "kind",
    "producer_pid",
    "created_ns",
    "nbytes",
    "removed_ns",
    "in_flight_ns",
    "end",
    "reads",
    "first_read_ns",
    "observed",
    "note",
}


E2E_KEYS = {
    "embedded",
    "image_bytes",
    "image_size",
    "local_namespace_id",
    "model",
    "processes_left",
    "removed_at_stop",
    "runs",
}


E2E_RUN_KEYS = {
    "agree",
    "as_expected",
    "cause",
    "cause_info",
    "dev_writable",
    "engine",
    "expected",
    "failure",
    "failure_class",
    "gateway_log",
    "gateway_url",
    "label",
    "metrics",
    "metrics_url",
    "mode",
    "p50_ms",
    "path",
    "receipts",
    "requests",
    "setting_source",
    "shm_dir",
    "shm_min_bytes",
    "shm_tensors_by_source",
    "worker_namespace_id",
    "workers",
}


CAUSE_KEYS = {"code", "fix", "fix_cmd", "message"}


E2E_REQUEST_KEYS = {"completion_tokens", "elapsed_ms", "error", "ok", "status", "stream"}


E2E_METRICS_KEYS = {"available", "nbytes", "note", "owner", "processing", "shm_write_failures", "tensors", "url"}


E2E_SHM_DIR_KEYS = {"available", "gateway_pid", "name_pid", "note", "probe_file_left", "segments", "shm_dir"}


E2E_SEGMENT_KEYS = {"end", "in_flight_ms", "name", "nbytes", "reads"}


E2E_RECEIPTS_KEYS = {"available", "note", "partial", "receipts", "workers"}


E2E_RECEIPT_KEYS = {
    "age_ms",
    "error_code",
    "error_message",
    "key",
    "nbytes",
    "payload_kind",
    "read_ms",
    "shm_name",
    "unlinked",
    "worker",
}


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
