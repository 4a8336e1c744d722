"""The schemas' closed sets are the code's enums, member for member (schemas/generate.py reads them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.causes import Cause
from smgshm.core.client.probe import ProbeVerdict
from smgshm.core.closed import Closed
from smgshm.core.e2e.verdict import TensorPath
from smgshm.core.gateway.mode import Verdict
from smgshm.core.gateway.running import Inspect
from smgshm.core.gateway.setting import Mode
from smgshm.core.host.namespace import Sharing
from smgshm.core.names import KINDS
from smgshm.core.outcomes import Status
from smgshm.core.segments.judge import FileType, State

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _at(schema: str, *path: str) -> Any:
    node = json.loads((SCHEMAS / schema).read_text())
    for key in path:
        node = node[key]
    return node


@pytest.mark.parametrize(
    ("schema", "path", "values"),
    [
        ("common.schema.json", ("$defs", "cause_code"), [c.value for c in Cause]),
        ("common.schema.json", ("$defs", "segment_state"), [s.value for s in State]),
        ("common.schema.json", ("$defs", "segment_kind"), list(KINDS)),
        ("gc.schema.json", ("$defs", "segment", "properties", "file_type"), [t.value for t in FileType]),
        ("doctor.schema.json", ("$defs", "Check", "properties", "status"), [s.value for s in Status]),
        ("doctor.schema.json", ("$defs", "GatewayProcess", "properties", "inspect"), [i.value for i in Inspect]),
        ("probe.schema.json", ("$defs", "WorkerReport", "properties", "verdict"), [v.value for v in ProbeVerdict]),
        ("e2e.schema.json", ("$defs", "GatewayRun", "properties", "path"), [p.value for p in TensorPath]),
        ("doctor.schema.json", ("$defs", "ModeFinding", "properties", "verdict"), [v.value for v in Verdict]),
        ("doctor.schema.json", ("$defs", "ModeFinding", "properties", "status"), [s.value for s in Status]),
        ("doctor.schema.json", ("$defs", "TransportConfig", "properties", "mode"), [m.value for m in Mode]),
    ],
)
def test_a_schemas_closed_set_is_the_enums_values(schema: str, path: tuple[str, ...], values: list[str]) -> None:
    assert _at(schema, *path)["enum"] == values


def test_gcs_age_is_described_as_judge_computes_it() -> None:
    """age_s is now minus the mtime (judge.py), not the later of the name's time and mtime (liveness uses that)."""
    assert _at("gc.schema.json", "$defs", "segment", "properties", "age_s")["description"] == (
        "seconds since its mtime (wall clock)"
    )


def test_a_closed_member_is_its_value_wherever_it_is_shown() -> None:
    assert FileType.CHAR_DEVICE == "char_device"
    assert f"{FileType.CHAR_DEVICE}" == str(FileType.CHAR_DEVICE) == "char_device"
    assert {"fifo": 1}[FileType.FIFO] == 1
    assert json.dumps([Status.WARN]) == '["warn"]'
    assert isinstance(Inspect.GONE, Closed)


def test_every_namespace_verdict_is_a_probe_verdict() -> None:
    assert {s.value for s in Sharing} <= {v.value for v in ProbeVerdict}
