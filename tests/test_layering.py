"""The core is a library: no click, rich or smgshm.cli in smgshm/core, and no printing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "smgshm" / "core"
BANNED = ("click", "rich", "smgshm.cli")


def _imports(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_is_pure(path: Path) -> None:
    tree = ast.parse(path.read_text())
    bad = [n for n in _imports(tree) if any(n == b or n.startswith(b + ".") for b in BANNED)]
    assert not bad, f"{path.name} imports {bad}"
    calls = [
        n.func.id if isinstance(n.func, ast.Name) else n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name | ast.Attribute)
    ]
    assert "print" not in calls
    assert "exit" not in calls, f"{path.name} calls exit(): the CLI owns exit codes"


def test_core_has_modules() -> None:
    assert {"namespace.py", "io.py", "wire.py", "receiver.py"} <= {p.name for p in CORE.rglob("*.py")}
