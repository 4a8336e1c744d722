"""The JSON interface is pinned: key sets per command, within schema_version 1."""

from __future__ import annotations

import json
import os
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


WATCH_SUMMARY_KEYS = {
    "shm_dir", "prefix", "started_unix_s", "duration_s", "intervals", "created", "created_bytes", "listed",
    "consumed", "consumed_bytes", "cleaned", "unknown", "ends_by_kind", "flight", "in_flight", "in_flight_bytes",
    "orphans_seen", "orphans", "orphan_list", "overflows", "dir_gone", "untracked", "events_read", "gateway", "notes",
}  # fmt: skip
WATCH_INTERVAL_KEYS = {
    "seq", "t_unix_s", "interval_s", "created", "created_bytes", "consumed", "consumed_bytes", "cleaned", "unknown",
    "created_per_s", "created_bytes_per_s", "consumed_per_s", "consumed_bytes_per_s", "created_by_kind", "in_flight",
    "in_flight_bytes", "flight", "orphans", "orphan_bytes", "orphan_list", "overflows", "dir_gone", "untracked",
    "events_read", "watching", "gateway",
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
