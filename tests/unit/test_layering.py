"""smgshm is layered: ground < domains < jobs < the CLI, never an arrow upward, never a circle.

Every module under ``smgshm/core`` and ``smgshm/cli`` is read as an AST (sub-packages included, so a new
package cannot slip past the checks). Each import, lazy ones inside functions too, is an arrow.

The core (a pure library):
- ground: the top-level modules of ``smgshm/core`` (errors, paths, names, causes, units, address, ...),
  the vocabulary every layer speaks. They import only each other.
- domains: the packages that know one thing: ``host`` (this machine: /proc, mounts, namespaces),
  ``segments`` (files in the shm dir), ``transport`` (the worker's gRPC wire), ``gateway`` (SMG's
  gateway over HTTP). They import the ground and each other only down the steps below.
- jobs: the packages that do one thing with the domains: ``watch``, ``receiver`` (serve), ``client``
  (probe, send, bench), ``e2e``, ``doctor``, ``node``. They import the ground, the domains and each
  other only down the steps below.

Inside a layer, packages of the same step are peers: they never import each other. Where a package of
a layer builds on another of the same layer, that is a real ordering of the code, kept as a step
(``RANKS``: (layer, step)) rather than hidden: a package's step is exactly the longest chain of
imports below it inside its layer (``test_steps_are_the_longest_chain``), so no step is raised
"just in case" and a new import between peers fails until the table says why. The steps today:

- domains: ``host`` is the floor every other domain reads the machine through (step 0);
  ``segments`` are judged by host facts (holders, pid trust, the boot clock) and ``gateway`` finds
  SMG's gateways among host's processes and reads the shm dir's space (step 1, peers); ``transport``
  carries segments on the wire (``segments.io.ShmRef``), compares namespace ids and decides by SMG's
  transport setting (``gateway.setting``) (step 2).
- jobs: ``watch``, ``receiver`` and ``client`` each do one job, peers (step 0); ``e2e`` runs the
  real gateway against a receiver, with client's bench floor and watch's segment tracker as its
  evidence (step 1); ``doctor``'s checks run client's probe and send, a receiver, and e2e (step 2);
  ``node`` runs doctor's checks per pod tmpfs (step 3).

The CLI (``smgshm/cli``): the root group (``smgshm/cli/__init__.py``) loads each command's module by
name; a command's modules (``gc.py`` and its views ``gc_view.py``, ``gc_node_view.py``: a view belongs
to the command its name starts with) import the core, the shared helpers and their own command's
modules, never another command's; the shared helpers import only each other and the core.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "smgshm" / "core"
CLI = ROOT / "smgshm" / "cli"
BANNED = ("click", "rich", "smgshm.cli")

# (layer, step), bottom up; the module docstring says why each step is what it is. A module may
# import its own package, the ground, and packages of a lower rank: a lower layer, or a lower step
# of its own layer. Packages of equal rank are peers that must not import each other.
GROUND, DOMAINS, JOBS = 0, 1, 2
RANKS: dict[str, tuple[int, int]] = {
    "host": (DOMAINS, 0),
    "segments": (DOMAINS, 1),
    "gateway": (DOMAINS, 1),
    "transport": (DOMAINS, 2),
    "watch": (JOBS, 0),
    "receiver": (JOBS, 0),
    "client": (JOBS, 0),
    "e2e": (JOBS, 1),
    "doctor": (JOBS, 2),
    "node": (JOBS, 3),
}
# The CLI's shared helpers: the App, output (fmt, jsonout), exit codes, option types (params), signals,
# node-problem-detector lines (npd) and the optional extras a command needs (extras). Every other module
# of smgshm/cli is a command's (its name is in the root's _COMMANDS table) or a view of one (``<command>_view``,
# ``<command>_<what>_view``).
CLI_SHARED = {"app", "fmt", "jsonout", "exitcodes", "params", "signals", "npd", "extras"}
# "A handful": the rest lives in packages. The ninth is address.py, read by transport and gateway
# alike (and by the receiver, watch's exporter and the CLI): it is below both, so it is ground. The
# tenth is closed.py, the base of every closed set (states, kinds, verdicts) in every layer. The eleventh
# is fanout.py: work fanned out to threads and waited for so that a signal still stops the run, used by
# domains (gateway) and jobs (client, doctor, e2e) alike.
MAX_GROUND_MODULES = 11


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


def _rank(module: str) -> tuple[tuple[int, int], str]:
    """((layer, step), package) of a core module; the ground's package is ""."""
    parts = module.split(".")
    if len(parts) < 3 or not (CORE / parts[2]).is_dir():  # smgshm.core.<module>: the ground
        return (GROUND, 0), ""
    package = parts[2]
    assert package in RANKS, f"{module}: core package {package!r} has no place in RANKS"
    return RANKS[package], package


def _crossings(arrows: dict[str, set[str]]) -> list[str]:
    """The arrows between core packages that run up a layer, up a step, or sideways to a peer."""
    bad: list[str] = []
    for source, targets in arrows.items():
        src_rank, src_pkg = _rank(source)
        for target in targets:
            dst_rank, dst_pkg = _rank(target)
            if dst_pkg != src_pkg and dst_rank >= src_rank:
                bad.append(f"{source} -> {target}")
    return sorted(bad)


def _package_arrows(arrows: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module arrows folded into arrows between core packages (the ground left out)."""
    out: dict[str, set[str]] = {p: set() for p in RANKS}
    for source, targets in arrows.items():
        src = _rank(source)[1]
        for target in targets:
            dst = _rank(target)[1]
            if src and dst and dst != src:
                out[src].add(dst)
    return out


def _misstated_steps(ranks: dict[str, tuple[int, int]], packages: dict[str, set[str]]) -> list[str]:
    """Packages whose step is not the longest chain of imports below them inside their layer."""
    bad = []
    for name, (layer, step) in sorted(ranks.items()):
        below = [ranks[d][1] for d in packages.get(name, ()) if d in ranks and ranks[d][0] == layer]
        chain = 1 + max(below) if below else 0
        if step != chain:
            bad.append(f"{name}: step {step}, but its imports inside its layer make it {chain}")
    return bad


CLI_MODULES = _modules(CLI, "smgshm.cli")


def _cli_commands() -> dict[str, str]:
    """The root group's ``_COMMANDS`` (command -> module), read from its AST: the commands it loads by name."""
    for node in ast.parse((CLI / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_COMMANDS" for t in node.targets):
            return ast.literal_eval(node.value)  # type: ignore[no-any-return]
    raise AssertionError("smgshm/cli/__init__.py has no _COMMANDS table")


def _cli_owner(module: str) -> str:
    """Whose a CLI module is: "root", "shared", or its command's name (``gc_node_view`` is gc's)."""
    if module == "smgshm.cli":
        return "root"
    name = module.removeprefix("smgshm.cli.")
    if name in CLI_SHARED:
        return "shared"
    return name.split("_")[0] if name.endswith("_view") else name


def _cli_arrows() -> dict[str, set[str]]:
    """Arrows between CLI modules; ``from smgshm.cli import gc_view`` names gc_view, not the root."""
    arrows: dict[str, set[str]] = {}
    for name, path in CLI_MODULES.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in CLI_MODULES)
            elif isinstance(node, ast.ImportFrom) and node.module in CLI_MODULES and not node.level:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    targets.add(sub if sub in CLI_MODULES else node.module)
        arrows[name] = targets - {name}
    return arrows


def _cli_violations(arrows: dict[str, set[str]]) -> list[str]:
    """Arrows to another command's module or to the root; only the shared helpers are everyone's.

    A command's modules import its own modules and the shared helpers; the shared helpers import
    each other; the root imports the shared helpers and loads commands by name, never importing one
    (``smgshm gc`` then does not pay for serve's imports), and nothing imports the root.
    """
    bad = []
    for source, targets in arrows.items():
        src = _cli_owner(source)
        for target in targets:
            dst = _cli_owner(target)
            if dst != "shared" and (dst != src or dst == "root"):
                bad.append(f"{source} -> {target}")
    return sorted(bad)


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


@pytest.mark.slow
def test_no_arrow_runs_up_a_layer() -> None:
    upward = _crossings(_internal_arrows(CORE_MODULES))
    assert not upward, "imports that run up (or sideways) a layer:\n" + "\n".join(upward)


def test_steps_are_the_longest_chain() -> None:
    """A step says how the code is, not how it might be: each is the longest chain of in-layer imports."""
    assert _misstated_steps(RANKS, _package_arrows(_internal_arrows(CORE_MODULES))) == []


def test_layers_are_the_architecture() -> None:
    domains = {p for p, (layer, _) in RANKS.items() if layer == DOMAINS}
    jobs = {p for p, (layer, _) in RANKS.items() if layer == JOBS}
    assert domains == {"host", "segments", "transport", "gateway"}
    assert jobs == {"watch", "receiver", "client", "e2e", "doctor", "node"}


def test_every_cli_module_is_shared_or_a_commands() -> None:
    commands = _cli_commands()
    assert commands == {c: f"smgshm.cli.{c}" for c in commands}, "a command's module is smgshm/cli/<command>.py"
    owners = {m: _cli_owner(m) for m in CLI_MODULES}
    stray = sorted(m for m, o in owners.items() if o not in ("root", "shared", *commands))
    assert not stray, f"CLI modules neither shared nor a command's (nor a view of one): {stray}"
    assert {m.removeprefix("smgshm.cli.") for m in CLI_MODULES} >= CLI_SHARED


def test_shared_cli_helpers_are_shared() -> None:
    """A helper only one command uses is that command's: each shared one is imported by two owners or more."""
    users: dict[str, set[str]] = {m: set() for m in CLI_SHARED}
    for source, targets in _cli_arrows().items():
        for target in targets:
            if _cli_owner(target) == "shared" and _cli_owner(source) != "shared":
                users[target.removeprefix("smgshm.cli.")].add(_cli_owner(source))
    lonely = {m: sorted(u) for m, u in users.items() if len(u) < 2}
    assert not lonely, f"shared helpers with one user (move them to it): {lonely}"


def test_a_command_imports_no_other_commands_module() -> None:
    bad = "\n".join(_cli_violations(_cli_arrows()))
    assert not bad, f"CLI imports across commands (move what they share to a shared helper or the core):\n{bad}"


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


@pytest.mark.slow
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
    """The checks are not vacuous: an upward arrow, an arrow between peers, an overstated step and a
    circle, built by hand, are all caught."""
    assert _crossings({"smgshm.core.host.identity": {"smgshm.core.doctor.run"}}) == [
        "smgshm.core.host.identity -> smgshm.core.doctor.run"
    ]
    assert _crossings({"smgshm.core.segments.io": {"smgshm.core.gateway.http"}}), "peers import each other"
    assert _crossings({"smgshm.core.watch.life": {"smgshm.core.client.send"}}), "peers import each other"
    assert _crossings({"smgshm.core.e2e.run": {"smgshm.core.doctor.run"}}), "up a step"
    assert not _crossings({"smgshm.core.node.doctor": {"smgshm.core.doctor.run", "smgshm.core.host.proc"}})
    raised = {**RANKS, "gateway": (DOMAINS, 2)}  # a step higher than gateway's imports need
    assert _misstated_steps(raised, _package_arrows(_internal_arrows(CORE_MODULES))) == [
        "gateway: step 2, but its imports inside its layer make it 1",
        "transport: step 2, but its imports inside its layer make it 3",  # it reads gateway's setting
    ]
    assert _circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    # The CLI: a view importing another command's view, a helper importing a command, the root
    # importing a command, a command importing the root; a command's own view and a helper are fine.
    planted = {
        "smgshm.cli.probe_view": {"smgshm.cli.ns_view", "smgshm.cli.fmt", "smgshm.cli.exitcodes"},
        "smgshm.cli.fmt": {"smgshm.cli.gc_view"},
        "smgshm.cli": {"smgshm.cli.serve", "smgshm.cli.signals"},
        "smgshm.cli.gc": {"smgshm.cli", "smgshm.cli.gc_view", "smgshm.cli.gc_node_view"},
        "smgshm.cli.gc_node_view": {"smgshm.cli.gc_view", "smgshm.cli.app"},
    }
    assert _cli_violations(planted) == [
        "smgshm.cli -> smgshm.cli.serve",
        "smgshm.cli.fmt -> smgshm.cli.gc_view",
        "smgshm.cli.gc -> smgshm.cli",
        "smgshm.cli.probe_view -> smgshm.cli.ns_view",
    ]


def test_package_inits_hold_a_docstring_only() -> None:
    """No re-exports: importing a package must not import its modules (start-up stays lazy)."""
    for init in sorted(CORE.rglob("__init__.py")):
        body = ast.parse(init.read_text()).body
        assert len(body) == 1, f"{init.relative_to(ROOT)} holds more than its docstring"
        assert isinstance(body[0], ast.Expr), init
        assert isinstance(body[0].value, ast.Constant), init
