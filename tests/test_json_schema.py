"""The JSON interface is pinned: a JSON Schema per command (schemas/), key sets, within schema_version 1.

Every document run_cli sees is validated against its schema (tests/schema_check.py); the tests here
run each command for real once more, explicitly, and check the schemas themselves: fresh, valid
draft 2020-12, enums that follow the code, named in the README.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, run_cli, smgshm_argv, start_serve, tmpfs, wait_for
from tests.e2e_support import model_dir
from tests.schema_check import RECEIPTS, SCHEMAS, STREAMS, schema_file, validate, validate_document

__all__ = ["model_dir"]  # a fixture

ENVELOPE = {"smgshm_version", "schema_version", "command", "ok", "result", "warnings"}
NS_KEYS = {
    "namespace_id",
    "boot_id",
    "shm_dev",
    "shm_dir",
    "uid",
    "gid",
    "pid",
    "pid_namespace",
    "hostname",
    "shm_total_bytes",
    "shm_free_bytes",
    "fstype",
    "mount_options",
}
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
    "shm_dir",
    "prefix",
    "started_unix_s",
    "duration_s",
    "intervals",
    "created",
    "created_bytes",
    "listed",
    "consumed",
    "consumed_bytes",
    "cleaned",
    "unknown",
    "ends_by_kind",
    "flight",
    "in_flight",
    "in_flight_bytes",
    "orphans_seen",
    "orphans",
    "orphan_list",
    "overflows",
    "dir_gone",
    "untracked",
    "events_read",
    "gateway",
    "notes",
    "cause_info",
}
WATCH_INTERVAL_KEYS = {
    "seq",
    "t_unix_s",
    "interval_s",
    "created",
    "created_bytes",
    "consumed",
    "consumed_bytes",
    "cleaned",
    "unknown",
    "created_per_s",
    "created_bytes_per_s",
    "consumed_per_s",
    "consumed_bytes_per_s",
    "created_by_kind",
    "in_flight",
    "in_flight_bytes",
    "flight",
    "orphans",
    "orphan_bytes",
    "orphan_list",
    "overflows",
    "dir_gone",
    "untracked",
    "events_read",
    "watching",
    "gateway",
    "cause_info",
}
WATCH_FLIGHT_KEYS = {"count", "p50_ms", "p90_ms", "p99_ms", "max_ms"}
WATCH_ORPHAN_KEYS = {
    "name",
    "name_hex",
    "kind",
    "producer_pid",
    "producer_alive",
    "state",
    "reason",
    "nbytes",
    "age_s",
    "reads",
}
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


def test_e2e_schema(tmp_path: Any, children: Any, model_dir: str) -> None:
    """Against the real gateway with a smgshm serve worker: every source present, every key pinned."""
    import pytest

    from smgshm.core.gateway.process import GatewayConfig, start_gateway
    from tests.conftest import start_serve
    from tests.e2e_support import HAVE_SMG

    if not HAVE_SMG:
        pytest.skip("SMG gateway (smg) not installed")
    _, ready = start_serve(children, "--model-dir", model_dir)
    cfg = GatewayConfig(
        worker_urls=(ready["result"]["address"],),
        model_path=model_dir,
        transport="shm",
        log_path=str(tmp_path / "gw.log"),
    )
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
    "image_px",
    "pixel_nbytes",
    "requests",
    "failed",
    "inline_p50_ms",
    "shm_p50_ms",
    "speedup",
    "shm_write_ms",
    "worker_read_ms",
    "preprocess_ms",
    "floor_ms",
    "write_floor_fraction",
}


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


# -- the schemas themselves ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ["ns", "ns compare", "probe", "send", "serve", "gc", "bench", "doctor", "e2e", "watch", "preflight"]
NO_JSON = {"completion"}  # it prints a shell script, never a document


def test_every_command_a_person_can_run_is_in_commands() -> None:
    from tests.test_examples import _leaves

    assert _leaves() - NO_JSON == set(COMMANDS)


def _generator() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("schemas_generate", SCHEMAS / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _schemas() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}


def test_schemas_are_fresh(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path)
    assert {p.name for p in written} == set(_schemas())
    for p in written:
        stale = f"schemas/{p.name} is stale: run python schemas/generate.py"
        assert p.read_text() == (SCHEMAS / p.name).read_text(), stale


def test_every_command_has_a_schema_and_every_schema_is_valid_2020_12() -> None:
    from jsonschema import Draft202012Validator

    schemas = _schemas()
    expected = (
        {schema_file(c) for c in COMMANDS}
        | set(STREAMS.values())
        | {"common.schema.json", "error.schema.json", RECEIPTS}
    )
    assert set(schemas) == expected
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)  # against the 2020-12 metaschema
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == name  # so $ref resolves against the directory it is read from
        assert schema["title"]
        assert schema["$comment"].startswith("generated by schemas/generate.py")


def _defs(schema: Any) -> list[dict[str, Any]]:
    """Every object schema in ``schema``, nested ones included."""
    out = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema:
            out.append(schema)
        for v in schema.values():
            out += _defs(v)
    elif isinstance(schema, list):
        for v in schema:
            out += _defs(v)
    return out


def _leaf_types(prop: dict[str, Any]) -> list[str]:
    """The JSON types a field's values take, through nullable, arrays and by-key maps."""
    out: list[str] = []
    for t in [prop.get("type")] if isinstance(prop.get("type"), str) else prop.get("type", []):
        if t == "object" and isinstance(prop.get("additionalProperties"), dict):
            out += _leaf_types(prop["additionalProperties"])
        elif t == "array":
            out += _leaf_types(prop["items"])
        else:
            out.append(t)
    for alt in prop.get("anyOf", []):
        out += _leaf_types(alt)
    return out


def test_objects_are_closed_and_units_are_typed() -> None:
    """Every object smgshm owns is closed; a count, byte or ns field is an integer, never a number."""
    for name, schema in _schemas().items():
        for obj in _defs(schema):
            assert obj["additionalProperties"] is False, (name, list(obj["properties"]))
            assert set(obj["required"]) == set(obj["properties"]), (name, list(obj["properties"]))
            for key, prop in obj["properties"].items():
                if key.endswith(("_ns", "_bytes", "nbytes")) and not key.endswith("_per_s"):
                    types = _leaf_types(prop)
                    assert "number" not in str(types), (name, key, prop)
                    assert "integer" in str(types), (name, key, prop)


def test_enums_follow_the_code() -> None:
    from smgshm.core.causes import Cause
    from smgshm.core.names import KINDS
    from smgshm.core.segments.judge import State

    defs = _schemas()["common.schema.json"]["$defs"]
    assert defs["cause_code"]["enum"] == [c.value for c in Cause]
    assert defs["segment_state"]["enum"] == [s.value for s in State]
    assert defs["segment_kind"]["enum"] == list(KINDS)
    assert defs["exit_code"]["enum"] == [0, 1, 3, 4, 5, 6]
    assert {"host", "transport", "usage", "internal", "interrupted"} <= set(defs["error"]["properties"]["kind"]["enum"])


def test_a_wrong_document_is_rejected() -> None:
    """The validator can fail: a float count, an unknown key, an unknown state, a missing field."""
    doc = run_cli("--json", "ns").json
    for bad in (
        {**doc, "result": {**doc["result"], "shm_total_bytes": float(doc["result"]["shm_total_bytes"])}},
        {**doc, "result": {**doc["result"], "extra": 1}},
        {**doc, "schema_version": 2},
        {k: v for k, v in doc.items() if k != "warnings"},
    ):
        with pytest.raises(AssertionError, match=r"does not match schemas/ns\.schema\.json"):
            validate_document(bad)


def test_readme_names_the_schemas() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "schemas/" in readme
    for name in ("common.schema.json", "error.schema.json", "watch-jsonl.schema.json"):
        assert name in readme


# -- one encoding ----------------------------------------------------------------------------------


def _one_line(stdout: str) -> dict[str, Any]:
    """One document, one line, compact and ASCII: what jsonout writes for every command."""
    assert stdout.endswith("\n")
    assert stdout.count("\n") == 1
    doc = json.loads(stdout)
    assert stdout == json.dumps(doc, separators=(",", ":")) + "\n"
    return doc


def test_one_encoding_for_every_document(tmp_path: Path) -> None:
    (tmp_path / "smg-smgshm-4194305-1-1").write_bytes(b"x")
    (tmp_path / "smg-smgshm-4194305-1-\u00e9").write_bytes(b"x")  # non-ASCII: \u escaped like the rest
    for args in (
        ("ns",),
        ("gc", "--shm-dir", str(tmp_path)),
        ("watch", "--shm-dir", str(tmp_path), "--count", "1", "--interval", "0.1"),
    ):
        _one_line(run_cli("--json", *args).stdout)
    _one_line(run_cli("--json", "ns", "--shm-dir", "/nonexistent-smgshm", exit=5).stdout)
    out = run_cli("watch", "--jsonl", "--shm-dir", str(tmp_path), "--count", "1", "--interval", "0.1").stdout
    for line in out.splitlines():
        assert line == json.dumps(json.loads(line), separators=(",", ":"))


# -- each command, for real, validated -----------------------------------------------------------


def test_probe_and_send_against_a_real_serve(children: Children) -> None:
    _, ready = start_serve(children)  # its ready document: validated by start_serve
    addr = ready["result"]["address"]
    doc = run_cli("--json", "probe", addr, "--verify").json
    validate_document(doc)
    assert doc["result"]["workers"][0]["verdict"] == "shared"
    doc = run_cli("--json", "send", addr, "-n", "2", "--shape", "64x64", "--transport", "shm").json
    validate_document(doc)
    assert all(isinstance(p["nbytes"], int) for p in doc["result"]["paths"])


def test_gc_listing_delete_check_and_watch_on_a_tmpfs(tmp_path: Path) -> None:
    # --assume-dead: another job's pid namespace on the machine would make liveness untrusted
    # (every state unknown); the producer pid is above any pid_max, dead in every namespace.
    with tmpfs(tmp_path / "shm", "4m") as d:
        old = time.time() - 3600  # older than --min-age, by its name and by its mtime
        for i in range(3):
            name = os.path.join(d, f"smg-tokenspeed-4194305-{int(old * 1e9)}-{i}")  # a dead producer's: leaked
            with open(name, "wb") as f:
                f.write(b"x" * 5000)
            os.utime(name, (old, old))
        validate_document(run_cli("--json", "gc", "--shm-dir", d, "--assume-dead").json)
        doc = run_cli("--json", "gc", "--check", "--shm-dir", d, "--assume-dead", exit=3).json
        validate_document(doc)
        assert doc["ok"] is False
        assert doc["result"]["counts"]["leaked"] == 3
        doc = run_cli("--json", "gc", "--delete", "--yes", "--shm-dir", d, "--assume-dead").json
        validate_document(doc)
        assert [x["deleted"] for x in doc["result"]["deleted"]] == [True] * 3
        assert all(isinstance(x["freed_bytes"], int) for x in doc["result"]["deleted"])
        doc = run_cli("--json", "gc", "--watch", "0.05s", "--watch-count", "2", "--shm-dir", d).json
        validate_document(doc)
        assert doc["result"]["scans"] == 2


def test_bench_json_jsonl_and_what_if() -> None:
    doc = run_cli("--json", "bench", "--sizes", "64KiB", "-n", "1", "--warmup", "0").json
    validate_document(doc)
    assert doc["result"]["sizes"][0]["nbytes"] == 65536
    out = run_cli("bench", "--jsonl", "--sizes", "4KiB,64KiB", "-n", "1", "--warmup", "0").stdout
    recs = [json.loads(ln) for ln in out.splitlines()]
    for rec in recs:
        validate(rec, STREAMS["bench"])
    assert [r["nbytes"] for r in recs] == [4096, 65536]
    assert all(isinstance(ns, int) for r in recs for v in r["samples_ns"].values() for ns in v)


@pytest.mark.skipif(os.geteuid() != 0, reason="the what-if mounts a tmpfs: root only")
def test_bench_what_if_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # its figures are kept: keep the test's apart
    doc = run_cli("--json", "bench", "--what-if", "huge-pages", "--sizes", "1MiB", "-n", "1").json
    validate_document(doc)
    assert doc["result"]["sizes"][0]["nbytes"] == 1024 * 1024


def test_doctor_json() -> None:
    doc = run_cli("--json", "doctor", "--no-gateways", "--no-e2e").json
    validate_document(doc)
    assert all(isinstance(c["code"], int) for c in doc["result"]["checks"])


def test_created_ns_round_trips_exactly(tmp_path: Path, children: Children) -> None:
    """A segment's created_ns in watch's JSON is the integer in its name, to the nanosecond (a float
    would lose the last three digits: 2**53 is about 9e15)."""
    nanos = time.time_ns() - 10 * 10**9
    name = f"smg-tokenspeed-{os.getpid()}-{nanos}-0"
    path = tmp_path / name
    path.write_bytes(b"abc")
    os.utime(path, ns=(nanos - 10**9, nanos - 10**9))  # older than its name: the name's time is the birth
    p = children.spawn(
        smgshm_argv("watch", "--jsonl", "--shm-dir", str(tmp_path), "--duration", "30", "--interval", "0.2")
    )
    assert p.stdout is not None
    first = json.loads(p.stdout.readline())
    assert first["type"] == "rescanned"  # the start-up listing is done: the segment is tracked
    path.unlink()
    recs = []
    for line in p.stdout:
        rec = json.loads(line)
        validate(rec, STREAMS["watch"])
        recs.append(rec)
        if rec["type"] == "segment":
            break
    p.terminate()
    wait_for(lambda: p.poll() is not None, 30, "watch to stop")
    seg = recs[-1]
    assert seg["type"] == "segment"
    assert seg["name"] == name
    assert type(seg["created_ns"]) is int
    assert seg["created_ns"] == nanos
    assert str(nanos) in line  # the very digits, whatever parser reads them


def test_the_readmes_validation_snippet_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's Python lines validate a real gc document, run from the repo root as written."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### JSON documents and their schemas") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    doc = run_cli("--json", "gc").json
    monkeypatch.chdir(ROOT)
    exec(code, {"doc": doc})  # noqa: S102 - the README's own lines, to prove they work
    bad = {**doc, "result": {**doc["result"], "shm_total_bytes": "many"}}
    from jsonschema import ValidationError

    with pytest.raises(ValidationError, match="is not valid under any of the given schemas"):  # oneOf: doc | error
        exec(code, {"doc": bad})  # noqa: S102
