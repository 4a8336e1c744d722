"""The slim install, in-process: ``pip install smgshm`` without extras has no torch, gRPC, numpy or
tokenizers. Here an import blocker on ``sys.meta_path`` makes them (and the other modules of the
extras) unimportable, as they are in such an install, and smgshm is imported afresh under it: the CLI
and the slim commands' modules load, every ``--help`` works, and each command that needs an extra
exits 2 naming it. tests/integration/test_slim_venv.py does the same with a real venv and pip.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
# What the extras bring, by the module names smgshm imports.
BLOCKED = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "google.protobuf",
    "smg_grpc_proto",
    "smg_grpc_servicer",
    "torch",
    "numpy",
    "xxhash",
    "tokenizers",
    "PIL",
    "smg",
)
HEAVY_DISTS = ("torch", "grpcio", "grpcio-health-checking", "grpcio-reflection", "numpy", "tokenizers", "protobuf")
SLIM_MODULES = (
    "smgshm.cli",
    "smgshm.cli.gc",
    "smgshm.cli.gc_view",
    "smgshm.cli.gc_node_view",
    "smgshm.cli.ns",
    "smgshm.cli.ns_view",
    "smgshm.cli.watch",
    "smgshm.cli.watch_view",
    "smgshm.cli.preflight",
    "smgshm.cli.preflight_view",
    "smgshm.cli.doctor",
    "smgshm.cli.doctor_node_view",
    "smgshm.core.segments.scan",
    "smgshm.core.segments.gcrun",
    "smgshm.core.segments.reaping",
    "smgshm.core.segments.textfile",
    "smgshm.core.node.scan",
    "smgshm.core.node.doctor",
    "smgshm.core.node.preflight",
    "smgshm.core.node.follow",
    "smgshm.core.node.metrics",
    "smgshm.core.watch.session",
    "smgshm.core.watch.export",
    "smgshm.core.host.identity",
    "smgshm.core.host.namespace",
)


def _blocked(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)


class _Blocker(importlib.abc.MetaPathFinder):
    """Refuses the extras' modules as an install without them would: ModuleNotFoundError."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if _blocked(fullname):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked: a slim install)", name=fullname)
        return None


@pytest.fixture
def slim() -> Iterator[None]:
    """smgshm imported afresh with the extras' modules unimportable; sys.modules restored afterwards."""
    saved = dict(sys.modules)
    for name in list(sys.modules):
        if _blocked(name) or name == "smgshm" or name.startswith("smgshm."):
            del sys.modules[name]
    blocker = _Blocker()
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.clear()
        sys.modules.update(saved)


def _heavy_loaded() -> list[str]:
    return sorted(m for m in sys.modules if _blocked(m))


def test_the_blocker_blocks() -> None:
    # A guard for the guard: under it, the extras' modules really cannot be imported.
    saved = dict(sys.modules)
    for name in [n for n in sys.modules if _blocked(n)]:
        del sys.modules[name]
    blocker = _Blocker()
    sys.meta_path.insert(0, blocker)
    try:
        with pytest.raises(ImportError):
            importlib.import_module("grpc")
        with pytest.raises(ImportError):
            importlib.import_module("google.protobuf.message")
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.clear()
        sys.modules.update(saved)


def test_the_base_dependencies_carry_no_torch_grpc_numpy_or_tokenizers() -> None:
    import tomllib  # py3.11+: the venv's

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not base & set(HEAVY_DISTS), base & set(HEAVY_DISTS)
    extras = project["optional-dependencies"]
    worker = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower() for d in extras["worker"]}
    assert set(HEAVY_DISTS) <= worker, set(HEAVY_DISTS) - worker
    assert "smgshm[worker]" in extras["gateway"]
    assert any(d.startswith("smg==") for d in extras["gateway"])
    assert "smgshm[gateway]" in extras["test"]  # ./scripts/test installs everything the suite runs


@pytest.mark.usefixtures("slim")
def test_the_cli_and_the_slim_commands_import_without_the_extras() -> None:
    for name in SLIM_MODULES:
        importlib.import_module(name)
    assert _heavy_loaded() == []


@pytest.mark.usefixtures("slim")
def test_every_help_works_without_the_extras() -> None:
    from smgshm.cli import cli

    assert "Commands:" in run_cli("--help").stdout
    for name in sorted(cli.commands):
        assert "Usage: " in run_cli(name, "--help").stdout, name
    assert _heavy_loaded() == []


@pytest.mark.usefixtures("slim")
@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["send", "127.0.0.1:1"], "worker"),
        (["serve", "--listen", "127.0.0.1:0"], "worker"),
        (["probe", "127.0.0.1:1"], "worker"),
        (["bench", "127.0.0.1:1"], "worker"),
        (["doctor", "--no-gateways", "--no-e2e"], "worker"),
        (["e2e", "--gateway", "http://127.0.0.1:1"], "gateway"),
    ],
    ids=["send", "serve", "probe", "bench", "doctor", "e2e"],
)
def test_a_command_without_its_extra_exits_2_naming_it(argv: list[str], extra: str) -> None:
    res = run_cli(*argv, exit=2)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"Error: smgshm {argv[0]} needs the {extra} extra: pip install 'smgshm[{extra}]'"], res.stderr
    doc = run_cli("--json", *argv, exit=2).json
    assert doc["error"]["kind"] == "usage"
    assert f"smgshm[{extra}]" in doc["error"]["message"]


@pytest.mark.usefixtures("slim")
def test_an_extras_module_met_past_the_guards_is_the_same_usage_error_and_any_other_is_a_bug() -> None:
    # The root's net: a path no command's guard foresaw (a module imported deep in a run) still says which
    # extra to install, exit 2; a missing module no extra brings stays what it is, a bug (70).
    import click

    from smgshm.cli import cli

    @click.command("needs-torch")
    def needs_torch() -> None:
        importlib.import_module("torch")

    @click.command("needs-nothing-known")
    def needs_nothing_known() -> None:
        importlib.import_module("smgshm_no_such_module")

    cli.add_command(needs_torch)
    cli.add_command(needs_nothing_known)
    res = run_cli("needs-torch", exit=2)
    assert res.stderr.strip() == "Error: smgshm needs-torch needs the worker extra: pip install 'smgshm[worker]'"
    assert "internal error: ModuleNotFoundError" in run_cli("needs-nothing-known", exit=70).stderr
