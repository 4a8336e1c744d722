"""The core is a layered library: ground < domains < jobs, never an arrow upward, never a circle.

Every module under ``smgshm/core`` is read as an AST (sub-packages included, so a new package cannot
slip past the checks). Each import, lazy ones inside functions too, is an arrow; an arrow may point
only to the same layer or below, and the arrows between smgshm's own modules make no circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "smgshm" / "core"
BANNED = ("click", "rich", "smgshm.cli")

# Bottom up. The top-level modules of core are the ground; each package has its rank. A module may
# import its own package, the ground, and packages of a lower rank. Packages of equal rank are peers
# that must not import each other.
GROUND = 0
RANKS = {
    "host": 1,
    "segments": 2,
    "transport": 3,
    "gateway": 4,
    "watch": 5,
    "receiver": 6,
    "client": 7,
    "e2e": 8,
    "doctor": 9,
    "node": 10,
}
MAX_GROUND_MODULES = 9  # "a handful": the rest lives in packages


def _modules(top: Path, prefix: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(top.rglob("*.py")):
        rel = path.relative_to(top).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([prefix, *parts])] = path
    return found


CORE_MODULES = _modules(CORE, "smgshm.core")


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # `from pkg import mod` names a module too.
            yield from (f"{base}.{a.name}" for a in node.names)


def _internal_arrows(modules: dict[str, Path]) -> dict[str, set[str]]:
    known = set(modules)
    arrows: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        targets = {t for t in _imports(tree, name, path.name == "__init__.py") if t in known and t != name}
        arrows[name] = targets
    return arrows


def _rank(module: str) -> tuple[int, str]:
    parts = module.split(".")
    if len(parts) < 3 or not (CORE / parts[2]).is_dir():  # smgshm.core.<module>: the ground
        return GROUND, ""
    package = parts[2]
    assert package in RANKS, f"{module}: core package {package!r} has no place in RANKS"
    return RANKS[package], package


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_is_pure(path: Path) -> None:
    tree = ast.parse(path.read_text())
    names = list(_imports(tree, "smgshm.core.x", False))
    bad = [n for n in names if any(n == b or n.startswith(b + ".") for b in BANNED)]
    assert not bad, f"{path.name} imports {bad}"
    calls = [
        n.func.id if isinstance(n.func, ast.Name) else n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name | ast.Attribute)
    ]
    assert "print" not in calls
    assert "exit" not in calls, f"{path.name} calls exit(): the CLI owns exit codes"


def test_every_core_package_has_a_rank() -> None:
    packages = {p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages, "core has no packages: the layering checks would pass vacuously"
    assert packages <= set(RANKS), f"unranked core packages: {sorted(packages - set(RANKS))}"
    stray = [p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__" and p.name not in packages]
    assert not stray, f"folders in core without __init__.py: {stray}"


def test_core_has_a_handful_of_top_level_modules() -> None:
    ground = sorted(p.name for p in CORE.glob("*.py") if p.name != "__init__.py")
    assert {"errors.py", "paths.py"} <= set(ground)
    assert len(ground) <= MAX_GROUND_MODULES, ground


def test_no_arrow_runs_up_a_layer() -> None:
    upward: list[str] = []
    for source, targets in _internal_arrows(CORE_MODULES).items():
        src_rank, src_pkg = _rank(source)
        for target in targets:
            dst_rank, dst_pkg = _rank(target)
            if dst_pkg == src_pkg:
                continue
            if dst_rank >= src_rank:
                upward.append(f"{source} -> {target}")
    assert not upward, "imports that run up (or sideways) a layer:\n" + "\n".join(sorted(upward))


def _circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in arrows.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(arrows):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_smgshm() -> None:
    modules = {
        name: path for name, path in _modules(ROOT / "smgshm", "smgshm").items() if not name.startswith("smgshm.rpc")
    }
    # A package's __init__ is loaded before its modules: `a.b -> a` is no circle of the code's making.
    arrows = {
        src: {t for t in targets if not src.startswith(t + ".")} for src, targets in _internal_arrows(modules).items()
    }
    assert _circles(arrows) == []


def test_the_checks_see_a_planted_violation() -> None:
    """The checks are not vacuous: an upward arrow and a circle, built by hand, are both caught."""
    assert _rank("smgshm.core.host.identity") < _rank("smgshm.core.doctor.run")
    assert _circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_package_inits_hold_a_docstring_only() -> None:
    """No re-exports: importing a package must not import its modules (start-up stays lazy)."""
    for init in sorted(CORE.rglob("__init__.py")):
        body = ast.parse(init.read_text()).body
        assert len(body) == 1, f"{init.relative_to(ROOT)} holds more than its docstring"
        assert isinstance(body[0], ast.Expr), init
        assert isinstance(body[0].value, ast.Constant), init
