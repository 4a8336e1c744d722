"""The schemas' closed sets are the code's enums, member for member (schemas/generate.py reads them)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.causes import Cause
from smgshm.core.client.probe import ProbeVerdict
from smgshm.core.closed import Closed
from smgshm.core.e2e.evidence import Kept
from smgshm.core.e2e.verdict import FailureClass, TensorPath
from smgshm.core.gateway.mode import Verdict
from smgshm.core.gateway.running import Inspect
from smgshm.core.gateway.setting import Mode
from smgshm.core.host.holders import How
from smgshm.core.host.namespace import Sharing
from smgshm.core.names import KINDS
from smgshm.core.node.doctor import VERDICTS
from smgshm.core.node.layout import TmpfsKind
from smgshm.core.outcomes import Status
from smgshm.core.segments.judge import FileType, State
from smgshm.core.transport.verify import ProblemKind
from smgshm.core.watch.figures import Unseen
from smgshm.core.watch.life import End

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
        ("send.schema.json", ("$defs", "Problem", "properties", "kind"), [k.value for k in ProblemKind]),
        ("e2e.schema.json", ("$defs", "GatewayRun", "properties", "failure_class"), [f.value for f in FailureClass]),
        ("e2e.schema.json", ("$defs", "SegmentSeen", "properties", "end"), [*End, *Kept]),
        (
            "gc.schema.json",
            ("$defs", "segment", "properties", "holders", "items", "properties", "how"),
            [h.value for h in How],
        ),
        ("common.schema.json", ("$defs", "Orphan", "properties", "state"), [*State, *Unseen]),
        ("gc.schema.json", ("$defs", "node_tmpfs", "properties", "kind"), [k.value for k in TmpfsKind]),
        ("doctor.schema.json", ("$defs", "node_doctor_tmpfs", "properties", "kind"), [k.value for k in TmpfsKind]),
        ("doctor.schema.json", ("$defs", "node_doctor", "properties", "verdict"), [v.value for v in VERDICTS]),
        ("doctor.schema.json", ("$defs", "node_doctor_tmpfs", "properties", "verdict"), [v.value for v in VERDICTS]),
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


GENERATOR = Path(__file__).resolve().parents[2] / "schemas" / "generate.py"


def _closed_sets() -> dict[str, set[str]]:
    """Every closed set of the core (each ``Closed`` subclass, and the enums of the schemas' $defs), by name."""
    import importlib
    import pkgutil

    import smgshm.core

    for mod in pkgutil.walk_packages(smgshm.core.__path__, "smgshm.core."):
        importlib.import_module(mod.name)
    sets: dict[str, set[str]] = {}
    todo: list[type] = [Closed]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls is not Closed:
            sets[cls.__qualname__] = {m.value for m in cls}  # type: ignore[attr-defined]
    sets["State"] = {s.value for s in State}
    sets["Cause"] = {c.value for c in Cause}
    return sets


def _imported_names(tree: ast.AST) -> dict[str, object]:
    """What each name the generator imports from smgshm stands for (a module, a constant)."""
    import importlib

    out: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("smgshm"):
            base = importlib.import_module(node.module)
            for alias in node.names:
                got = getattr(base, alias.name, None)
                out[alias.asname or alias.name] = (
                    got if got is not None else importlib.import_module(f"{node.module}.{alias.name}")
                )
    return out


def _word(e: ast.expr, names: dict[str, object]) -> object:
    """The string an element of a list stands for: a literal, or a constant named from an import
    (``events.OVERFLOW``), each member of a closed set written out as surely as its value."""
    if isinstance(e, ast.Constant):
        return e.value
    if isinstance(e, ast.Name):
        return names.get(e.id)
    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in names:
        return getattr(names[e.value.id], e.attr, None)
    return None


def test_the_schema_generator_writes_no_closed_set_out_by_hand() -> None:
    """A list of two or more strings in schemas/generate.py (literals, or constants it imports) that are values
    of one of the core's closed sets is a second copy of that set (the generator read Orphan's states, holders'
    how, a node tmpfs's kind and a node verdict from lists of its own): it reads the enum instead."""
    sets = _closed_sets()
    tree = ast.parse(GENERATOR.read_text(encoding="utf-8"))
    names = _imported_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            continue
        words = [w for e in node.elts if isinstance(w := _word(e, names), str)]
        if len(words) < 2:
            continue
        for name, values in sets.items():
            shared = values & set(words)
            assert len(shared) < 2, f"generate.py line {node.lineno}: {sorted(shared)} written out, read {name}"


def test_watchs_event_kinds_are_a_closed_set_the_schema_reads() -> None:
    """watch's event kinds were plain strings, and the generator listed the watch's own three by hand: they are
    an enum now, and the watch --jsonl records of the watch itself take their type from it."""
    from smgshm.core.watch import events

    kinds = [events.CREATED, events.OPENED, events.CLOSED, events.CLOSED_NOWRITE, events.REMOVED]
    kinds += [events.OVERFLOW, events.RESCANNED, events.DIR_GONE]
    assert all(isinstance(k, events.EventKind) for k in kinds)
    assert set(kinds) == set(events.EventKind)
    records = _at("watch-jsonl.schema.json", "oneOf")
    own = [r["properties"]["type"]["enum"] for r in records if "enum" in r["properties"]["type"]]
    assert own == [[k.value for k in events.OF_THE_WATCH]]
