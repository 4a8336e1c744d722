"""The JSON interface: one document per invocation, schema version 1.

Within a schema version fields are only added, never renamed or retyped;
tests/test_json_schema.py pins the key sets.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from typing import Any, Protocol

from smgshm import __version__
from smgshm.cli.exitcodes import for_outcome
from smgshm.core.outcomes import Outcome


class Invocation(Protocol):
    """What a JSON document needs of the invocation (``cli.app.App`` is one): no import of it, no circle."""

    command: str
    warnings: list[str]

SCHEMA_VERSION = 1


def plain(obj: Any) -> Any:
    """Dataclasses, enums, bytes and tuples as JSON values (bytes as lowercase hex).

    An ``Outcome`` (a check's or finding's ``code``) is written as the exit code it asks for.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, Outcome):
        return int(for_outcome(obj))
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [plain(v) for v in obj]
    return obj


def _write(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, allow_nan=False, sort_keys=False) + "\n")
    sys.stdout.flush()


def envelope(app: Invocation, ok: bool) -> dict[str, Any]:
    return {"smgshm_version": __version__, "schema_version": SCHEMA_VERSION, "command": app.command, "ok": ok}


def write_result(app: Invocation, result: Any, ok: bool = True) -> None:
    doc = envelope(app, ok)
    doc["result"] = plain(result)
    doc["warnings"] = list(app.warnings)
    _write(doc)


def write_error(app: Invocation, kind: str, message: str, hint: str | None) -> None:
    doc = envelope(app, False)
    doc["error"] = {"kind": kind, "message": message, "hint": hint}
    doc["warnings"] = list(app.warnings)
    _write(doc)
