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
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from tests.conftest import Children, run_cli, wait_for
from tests.support.cli_completion import COMMANDS, SMGSHM, man_pages

SHELLS = ["bash", "zsh", "fish"]


def complete(protocol: str, words: str, cword: str) -> subprocess.CompletedProcess[str]:
    """Run the console script the way a shell's completion function does."""
    env = {**os.environ, "_SMGSHM_COMPLETE": protocol, "COMP_WORDS": words, "COMP_CWORD": cword}
    return subprocess.run([str(SMGSHM)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("shell", SHELLS)
def test_completion_script(shell: str) -> None:
    res = run_cli("completion", shell)
    out = res.stdout
    assert "_SMGSHM_COMPLETE" in out
    assert f"{shell}_complete" in out, "the script asks for its own shell's protocol"
    assert "smgshm" in out
    assert res.stderr == ""


def test_completion_scripts_differ_per_shell() -> None:
    scripts = {sh: run_cli("completion", sh).stdout for sh in SHELLS}
    assert len(set(scripts.values())) == len(SHELLS)
    assert "complete -o nosort -F _smgshm_completion smgshm" in scripts["bash"]
    assert "#compdef smgshm" in scripts["zsh"]
    assert "complete --no-files --command smgshm" in scripts["fish"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_script_bash_syntax() -> None:
    script = run_cli("completion", "bash").stdout
    res = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_other_shells_script_syntax(shell: str) -> None:
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"needs {shell}")
    script = run_cli("completion", shell).stdout
    res = subprocess.run([exe, "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_bash_complete_protocol_completes_gc() -> None:
    res = complete("bash_complete", "smgshm g", "1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "plain,gc" in lines, lines
    assert all(ln.split(",", 1)[1].startswith("g") for ln in lines), "only commands starting with g"


def test_bash_complete_protocol_lists_every_command() -> None:
    res = complete("bash_complete", "smgshm ", "1")
    assert res.returncode == 0, res.stderr
    got = {ln.split(",", 1)[1] for ln in res.stdout.splitlines()}
    assert got >= COMMANDS, COMMANDS - got


@pytest.mark.slow
def test_bash_complete_protocol_completes_options_and_choices() -> None:
    opts = complete("bash_complete", "smgshm doctor --", "2")
    assert opts.returncode == 0, opts.stderr
    got = {ln.split(",", 1)[1] for ln in opts.stdout.splitlines()}
    assert {"--worker", "--from-gateway", "--timeout", "--shm-dir"} <= got, got
    watch = complete("bash_complete", "smgshm watch --", "2")
    assert {"--interval", "--orphan-after", "--metrics", "--serve-metrics", "--jsonl", "--check"} <= {
        ln.split(",", 1)[1] for ln in watch.stdout.splitlines()
    }
    shells = complete("bash_complete", "smgshm completion ", "2")
    assert {ln.split(",", 1)[1] for ln in shells.stdout.splitlines()} == set(SHELLS)


def test_zsh_complete_protocol_completes_gc() -> None:
    res = complete("zsh_complete", "smgshm g", "1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    # zsh_complete prints triples: type, value, help.
    assert "gc" in lines, lines
    i = lines.index("gc")
    assert lines[i - 1] == "plain"
    assert lines[i + 1], "a command's help is shown as its description"


def test_fish_complete_protocol_completes_gc() -> None:
    res = complete("fish_complete", "smgshm g", "g")
    assert res.returncode == 0, res.stderr
    assert any(ln.startswith("plain,gc") for ln in res.stdout.splitlines()), res.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sourced_bash_script_fills_compreply() -> None:
    script = run_cli("completion", "bash").stdout
    driver = (
        script + '\nCOMP_WORDS=(smgshm g); COMP_CWORD=1; _smgshm_completion smgshm; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{SMGSHM.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(["bash", "-c", driver], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["gc"], res.stdout


# ---------------------------------------------------------------------------------------------
# man pages


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man(1)")
@pytest.mark.parametrize("page", man_pages(), ids=lambda p: p.name)
def test_man_page_renders_without_warnings(page: Path) -> None:
    env = {**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat", "LC_ALL": "C.UTF-8"}
    res = subprocess.run(["man", "--warnings", "-l", str(page)], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
    assert "EXIT STATUS" in res.stdout
    assert "NAME" in res.stdout
    stem = page.stem  # smgshm-doctor -> "smgshm-doctor" appears in its NAME section
    assert stem in res.stdout


# ---------------------------------------------------------------------------------------------
# values: paths, pids and the root options after the subcommand


@pytest.fixture
def named_child(children: Children, tmp_path: Path) -> int:
    """A live child whose process name (comm) is ``smgshm-pidtest``: sleep run through a link of that name."""
    link = tmp_path / "smgshm-pidtest"
    sleep = shutil.which("sleep")
    assert sleep is not None
    link.symlink_to(sleep)
    pid = children.spawn([str(link), "300"]).pid
    wait_for(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "smgshm-pidtest", 30, "the child's exec")
    return pid


@pytest.mark.slow
@pytest.mark.parametrize("words", ["smgshm doctor --gateway-pid", "smgshm e2e --gateway-pid", "smgshm ns --pid"])
def test_pid_options_complete_live_pids_named(named_child: int, words: str) -> None:
    res = complete("zsh_complete", f"{words} {named_child}", str(len(words.split())))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    triples = {(lines[i + 1], lines[i + 2]) for i in range(0, len(lines) - 2, 3) if lines[i] == "plain"}
    assert (str(named_child), "smgshm-pidtest") in triples, lines
    assert all(v.startswith(str(named_child)) and v.isdigit() for v, _ in triples)


def test_a_hostile_process_name_is_escaped_in_pid_completion(children: Children) -> None:
    """A process names itself: its escape sequences and newline never reach the shell's protocol raw."""
    code = "import time; open('/proc/self/comm', 'w').write('ev\\x1b[31m\\nil'); time.sleep(300)"
    pid = children.spawn([sys.executable, "-c", code]).pid
    wait_for(lambda: "\x1b" in Path(f"/proc/{pid}/comm").read_text(), 30, "the child naming itself")
    res = complete("zsh_complete", f"smgshm doctor --gateway-pid {pid}", "3")
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout
    lines = res.stdout.splitlines()
    i = lines.index(str(pid))
    assert lines[i + 1] == "ev\\x1b[31m\\nil"


@pytest.mark.slow
def test_root_options_complete_after_the_subcommand_but_stay_out_of_its_help() -> None:
    res = complete("bash_complete", "smgshm gc --", "2")
    got = {ln.split(",", 1)[1] for ln in res.stdout.splitlines()}
    assert {"--json", "--no-color", "--quiet", "--traceback"} <= got, got
    assert "-q" in {ln.split(",", 1)[1] for ln in complete("bash_complete", "smgshm ns compare -", "3").stdout.split()}
    options = run_cli("gc", "--help").stdout.split("Options:", 1)[1]
    assert not re.search(r"^\s+(--json|--no-color|-q, --quiet|--traceback)\b", options, re.M), options


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


def fish_complete(line: str, home: Path) -> list[tuple[str, str]]:
    """What fish offers for ``line`` (``complete -C``), as (value, description) pairs."""
    exe = shutil.which("fish")
    if exe is None:
        pytest.skip("needs fish")
    env = {**os.environ, "HOME": str(home), "PATH": f"{SMGSHM.parent}:{os.environ['PATH']}"}
    script = f"smgshm completion fish | source; complete -C {shlex.quote(line)}"
    res = subprocess.run([exe, "--no-config", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [(*ln.split("\t", 1), "")[:2] for ln in res.stdout.splitlines()]  # type: ignore[misc]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Two directories (one with a comma in its name) and a file."""
    t = tmp_path / "t"
    (t / "alpha_dir").mkdir(parents=True)
    (t / "gamma,comma_dir").mkdir()
    (t / "beta_file").write_text("")
    return t


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


def offered(sh: PtyShell | None, line: str, home: Path, until: str) -> str:
    """The text a shell shows for the choices after ``line`` (waiting for ``until`` in bash and zsh)."""
    if sh is None:
        return "\n".join("\t".join(pair) for pair in fish_complete(line, home))
    return sh.listing(line, until)


@pytest.mark.slow
def test_real_shells_complete_directories_for_dir_options(shell: PtyShell | None, tree: Path) -> None:
    home = tree.parent / "home"
    for line in (f"smgshm serve --model-dir {tree}/", f"smgshm gc --shm-dir {tree}/"):
        text = offered(shell, line, home, "alpha_dir/")
        assert "alpha_dir/" in text, text
        assert "gamma,comma_dir/" in text, text  # whole: fish once split every line at its commas
        assert "beta_file" not in text, text


@pytest.mark.slow
def test_real_shells_complete_files_for_log_receipts(shell: PtyShell | None, tree: Path) -> None:
    text = offered(shell, f"smgshm serve --log-receipts {tree}/", tree.parent / "home", "beta_file")
    assert "beta_file" in text, text
    assert "alpha_dir/" in text, text


@pytest.mark.slow
def test_real_shells_complete_gateway_pids_with_their_names(
    shell: PtyShell | None, named_child: int, tmp_path: Path
) -> None:
    text = offered(shell, f"smgshm doctor --gateway-pid {named_child}", tmp_path / "home", rf"^{named_child}\b")
    rows = [ln for ln in text.splitlines() if re.search(rf"(^|\s){named_child}(\s|$)", ln)]
    assert rows, text
    if shell is None or shell.list_key == "\x04":  # fish and zsh show descriptions; bash has none
        assert any("smgshm-pidtest" in r for r in rows), rows


@pytest.mark.slow
def test_real_shells_offer_root_options_after_the_subcommand(shell: PtyShell | None, tmp_path: Path) -> None:
    home = tmp_path / "home"
    text = offered(shell, "smgshm gc --", home, r"--traceback")
    for opt in ("--json", "--no-color", "--quiet", "--traceback", "--delete"):
        assert re.search(rf"(^|\s){opt}(\s|$)", text, re.M), f"{opt} not offered:\n{text}"
    if shell is None:
        json_help = "Write one JSON document to stdout (schema_version 1)."
        assert ("--json", json_help) in fish_complete("smgshm gc --js", home)
    else:
        shell.tab("smgshm gc --js", r"smgshm gc --json ")  # TAB completes --json in place


@pytest.mark.slow
def test_fish_descriptions_keep_their_commas(tmp_path: Path) -> None:
    """click's fish script split each line at every comma: "Time inline ..., find..." lost its tail."""
    got = dict(fish_complete("smgshm b", tmp_path))
    assert got["bench"].startswith("Time inline against SHM across sizes, find"), got
    got = dict(fish_complete("smgshm gc --al", tmp_path))
    assert "counts, bytes, and the entries" in got["--all"], got
