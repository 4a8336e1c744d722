"""`smgshm completion` and the man pages: what a shell and `man` really do with them.

The completion protocol is exercised through the installed console script (the entry point a
shell calls), and each script is loaded by the real shell: bash (with bash-completion) and zsh
run interactively on a pty and list what a key press offers; fish answers `complete -C`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import click

from tests.conftest import run_cli
from tests.support.cli_completion import COMMANDS, SMGSHM, man_pages


def test_unknown_shell_is_a_usage_error() -> None:
    res = run_cli("completion", "tcsh", exit=2)
    assert "tcsh" in res.stderr
    assert res.stdout == ""
    run_cli("completion", exit=2)  # the shell is required


def test_console_script_is_installed() -> None:
    assert SMGSHM.is_file(), SMGSHM
    assert os.access(SMGSHM, os.X_OK)


# ---------------------------------------------------------------------------------------------
# man pages


def test_man_pages_exist() -> None:
    names = {p.name for p in man_pages()}
    assert "smgshm.1" in names
    assert {"smgshm-completion.1", "smgshm-doctor.1"} <= names


# ---------------------------------------------------------------------------------------------
# values: paths, pids and the root options after the subcommand


def _options() -> Iterator[tuple[str, click.Command, click.Option]]:
    from smgshm.cli import cli

    def walk(path: str, cmd: click.Command) -> Iterator[tuple[str, click.Command, click.Option]]:
        for p in cmd.params:
            if isinstance(p, click.Option):
                yield path, cmd, p
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(f"{path} {name}".strip(), sub)

    yield from walk("", cli)


def _path_kind(opt: click.Option) -> str | None:
    """The kind of path ("dir" or "file") an option's value is, None when it is not a path."""
    if isinstance(opt.type, click.Path):
        return "dir" if not opt.type.file_okay else "file"
    meta = (opt.metavar or "").split("|")[0]
    if meta == "DIR" or (opt.name or "").endswith("_dir"):
        return "dir"
    if meta == "FILE":
        return "file"
    return None


def test_every_path_option_completes_paths() -> None:
    seen = set()
    for path, cmd, opt in _options():
        kind = _path_kind(opt)
        if kind is None:
            continue
        items = opt.shell_complete(click.Context(cmd), "/tm")
        assert [(i.type, i.value) for i in items] == [(kind, "/tm")], f"{path} {opt.opts[-1]}"
        seen.add(f"{path} {opt.opts[-1]}")
    assert {
        "serve --model-dir",
        "serve --log-receipts",
        "gc --shm-dir",
        "e2e --model-dir",
        "e2e --gateway-log-dir",
        "doctor --gateway-log",
        "gc --prometheus",
    } <= seen
    assert {c for c in COMMANDS if c != "completion"} <= {s.split()[0] for s in seen if s.endswith("--shm-dir")}


# --- the real shells ---------------------------------------------------------------------------


def test_every_pid_option_completes_pids() -> None:
    """Any option taking a pid (its name ends in pid) offers this process among the live pids."""
    me = str(os.getpid())
    seen = set()
    for path, cmd, opt in _options():
        if (opt.name or "").rstrip("s").endswith("pid"):
            items = opt.shell_complete(click.Context(cmd), me)
            assert me in [i.value for i in items], f"{path} {opt.opts[-1]}"
            seen.add(f"{path} {opt.opts[-1]}")
    assert {"doctor --gateway-pid", "e2e --gateway-pid", "ns --pid"} <= seen, seen
