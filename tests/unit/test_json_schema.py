"""The JSON interface is pinned: a JSON Schema per command (schemas/), key sets, within schema_version 1.

Every document run_cli sees is validated against its schema (tests/schema_check.py); the tests here
run each command for real once more, explicitly, and check the schemas themselves: fresh, valid
draft 2020-12, enums that follow the code, named in the README.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.support.json_schema import _check_envelope
from tests.support.schema_check import RECEIPTS, SCHEMAS, STREAMS, schema_file, validate_document
from tests.support.scripts import load_script

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


@pytest.mark.slow
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


# -- the schemas themselves ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["ns", "ns compare", "probe", "send", "serve", "gc", "bench", "doctor", "e2e", "watch", "preflight"]
NO_JSON = {"completion"}  # it prints a shell script, never a document


def test_every_command_a_person_can_run_is_in_commands() -> None:
    from tests.support.examples import _leaves

    assert _leaves() - NO_JSON == set(COMMANDS)


def _generator() -> Any:
    return load_script("schemas_generate", SCHEMAS / "generate.py")


def _schemas() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}


@pytest.mark.slow
def test_schemas_are_fresh(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path)
    assert {p.name for p in written} == set(_schemas())
    for p in written:
        stale = f"schemas/{p.name} is stale: run python schemas/generate.py"
        assert p.read_text() == (SCHEMAS / p.name).read_text(), stale


@pytest.mark.slow
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


# -- each command, for real, validated -----------------------------------------------------------


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
