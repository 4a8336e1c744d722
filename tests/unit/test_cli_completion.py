"""`smgshm completion` and the man pages: what a shell and `man` really do with them.

The completion protocol is exercised through the installed console script (the entry point a
shell calls), and each script is loaded by the real shell: bash (with bash-completion) and zsh
run interactively on a pty and list what a key press offers; fish answers `complete -C`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import click
import pytest

from tests.conftest import run_cli
from tests.support.cli_completion import COMMANDS, SMGSHM, man_pages


def complete(protocol: str, words: str, cword: str) -> subprocess.CompletedProcess[str]:
    """Run the console script the way a shell's completion function does."""
    env = {**os.environ, "_SMGSHM_COMPLETE": protocol, "COMP_WORDS": words, "COMP_CWORD": cword}
    return subprocess.run([str(SMGSHM)], env=env, capture_output=True, text=True, timeout=60)


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

PROMPT = "READY> "
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Z0-9]|\x1b[=>]|\x1b\][^\x07]*\x07")


class PtyShell:
    """An interactive bash or zsh on a pty, 200 columns wide: ``listing(line)`` types ``line``, presses
    the shell's list-the-choices key and returns the screen text up to a marker echoed after it."""

    SETUP: ClassVar[dict[str, tuple[list[str], str, list[str]]]] = {
        "bash": (
            ["bash", "--norc", "--noprofile", "-i"],
            "\x1b?",
            [  # M-?: possible-completions
                "[ -r /usr/share/bash-completion/bash_completion ] && "
                "source /usr/share/bash-completion/bash_completion",
                'eval "$(smgshm completion bash)"',
                "bind 'set bell-style none'",
                "bind 'set completion-query-items 100000'",
                "bind 'set page-completions off'",
            ],
        ),
        "zsh": (
            ["zsh", "-f", "-i"],
            "\x04",
            [  # ^D at the end of a line: list-choices
                "autoload -Uz compinit && compinit -u -D",
                'eval "$(smgshm completion zsh)"',
                "LISTMAX=100000",
                "unsetopt BEEP",
                "zstyle ':completion:*' list-prompt ''",
            ],
        ),
    }

    def __init__(self, shell: str, home: Path) -> None:
        argv, self.list_key, setup = self.SETUP[shell]
        bindir = str(SMGSHM.parent)
        env = {**os.environ, "TERM": "xterm", "HOME": str(home), "PATH": f"{bindir}:{os.environ['PATH']}"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes the shell at once
            os.execvpe(argv[0], argv, env)  # noqa: S606 - argv is ours, no shell string
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        self.buf = b""
        self.marks = 0
        for line in [f"PS1='{PROMPT}'", *setup]:
            self.send(line + "\r")
        self.sync()

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def sync(self, timeout: float = 60.0) -> str:
        """Clear the line, echo a marker and return (and forget) all the screen said before it, once
        the next prompt shows: typed before it, ^D and ^U would meet the tty in cooked mode (EOF, KILL)."""
        self.marks += 1
        mark = f"MARK{self.marks}X"
        self.send(f"\x15echo {mark}\r")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):
                    self.buf += os.read(self.fd, 65536)
            text = self._screen()
            echoed = re.search(rf"^{mark}$", text, re.M)
            if echoed and PROMPT in text[echoed.end() :]:
                self.buf = b""
                return text
        raise AssertionError(f"the shell never echoed {mark} and prompted: {self.buf[-3000:]!r}")

    def listing(self, line: str, until: str) -> str:
        """The choices after ``line``, once ``until`` (a regex) shows: keys typed while the completion
        function runs would reach a tty the shell has set back to cooked mode, where ^U is the kernel's."""
        return self._key(line + self.list_key, until)

    def tab(self, line: str, until: str) -> str:
        return self._key(line + "\t", until)

    def _key(self, keys: str, until: str, timeout: float = 60.0) -> str:
        self.send(keys)
        deadline = time.monotonic() + timeout
        while not re.search(until, self._screen(), re.M):
            if time.monotonic() > deadline:
                raise AssertionError(f"{until!r} never showed: {self._screen()[-3000:]}")
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):
                    self.buf += os.read(self.fd, 65536)
        return self.sync()

    def _screen(self) -> str:
        return _ANSI.sub("", self.buf.decode("utf-8", "replace")).replace("\r", "")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture(params=["bash", "zsh", "fish"])
def shell(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PtyShell | None]:
    """The real shell (None for fish, asked through ``complete -C``), skipped where not installed."""
    name = request.param
    if shutil.which(name) is None:
        pytest.skip(f"needs {name}")
    home = tmp_path / "home"
    home.mkdir()
    if name == "fish":
        yield None
        return
    sh = PtyShell(name, home)
    try:
        yield sh
    finally:
        sh.close()


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
