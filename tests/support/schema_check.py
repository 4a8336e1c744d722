"""Every ``--json`` document and ``--jsonl`` record the suite's commands write, validated against schemas/.

``run_cli`` (tests/conftest.py) calls ``check_output`` on every invocation: the strongest form of
"every document matches its schema", at the cost of one validation per CLI call. The validator is
the real ``jsonschema`` (draft 2020-12, with its format checker), with one thing stricter than
the spec: an ``integer`` must be written as an integer (``3``, not ``3.0`` or ``1.7e18``), since
a float in a count, byte or ns field is exactly the bug the schemas are there to catch.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
# Which schema a --jsonl stream's records follow, by the command that writes it.
STREAMS = {"watch": "watch-jsonl.schema.json", "bench": "bench-jsonl.schema.json"}
RECEIPTS = "serve-receipts.schema.json"  # serve --log-receipts: one receipt per line


def schema_file(command: str) -> str:
    """``ns compare`` -> ``ns-compare.schema.json``."""
    return command.replace(" ", "-") + ".schema.json"


@functools.cache
def _registry() -> Any:
    from referencing import Registry, Resource

    resources = [(p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.schema.json")]
    return Registry().with_resources(resources)


@functools.cache
def validator(name: str) -> Any:
    from jsonschema import Draft202012Validator, FormatChecker, validators

    strict_int = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)
    )
    cls = validators.extend(Draft202012Validator, type_checker=strict_int)
    schema = _registry().contents(name)
    return cls(schema, registry=_registry(), format_checker=FormatChecker())


def validate(doc: Any, name: str) -> None:
    """Raise AssertionError naming every place ``doc`` breaks schema ``name``."""
    errors = list(validator(name).iter_errors(doc))
    if errors:
        # oneOf (a document or an error document; a result of several shapes) hides the cause
        # under its branches: the leaves deepest in the document say what is wrong.
        leaves = [leaf for e in errors for leaf in _leaves(e)]
        depth = max(len(e.absolute_path) for e in leaves)
        lines = [
            f"  at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
            for e in leaves
            if len(e.absolute_path) == depth
        ][:20]
        raise AssertionError(f"document does not match schemas/{name}:\n" + "\n".join(lines))


def _leaves(err: Any) -> list[Any]:
    return [leaf for c in err.context for leaf in _leaves(c)] if err.context else [err]


def validate_document(doc: Any) -> None:
    assert isinstance(doc, dict), f"not an smgshm document: {doc!r:.200}"
    assert isinstance(doc.get("command"), str), f"not an smgshm document: {doc!r:.200}"
    validate(doc, schema_file(doc["command"]))


def _command(args: tuple[str, ...]) -> str | None:
    from smgshm.cli import _COMMANDS

    return next((a for a in args if a in _COMMANDS), None)


def check_output(args: tuple[str, ...], stdout: str) -> None:
    """What an invocation wrote, if it is JSON: the one document of --json, or each line of --jsonl."""
    if "-h" in args or "--help" in args or not stdout.strip():
        return
    if "--json" in args and "--npd" not in args:  # with --jsonl too: a usage error, as the one document (--npd: a line)
        validate_document(json.loads(stdout))
    elif "--jsonl" in args and (command := _command(args)) in STREAMS:
        for line in stdout.splitlines():
            if line.strip():
                validate(json.loads(line), STREAMS[command])
