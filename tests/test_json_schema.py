"""The JSON interface is pinned: key sets per command, within schema_version 1."""

from __future__ import annotations

from typing import Any

from tests.conftest import run_cli

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
