"""`smgshm completion` and the man pages: what a shell and `man` really do with them.

The completion protocol is exercised through the installed console script (the entry point a
shell calls), and the bash script is sourced by a real bash to fill COMPREPLY.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

SMGSHM = Path(sys.executable).parent / "smgshm"
MAN_DIR = Path(__file__).resolve().parent.parent / "smgshm" / "man" / "man1"
SHM = "/dev/shm"
SHELLS = ["bash", "zsh", "fish"]
COMMANDS = {"bench", "completion", "doctor", "gc", "ns", "probe", "send", "serve", "watch"}


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


def test_unknown_shell_is_a_usage_error() -> None:
    res = run_cli("completion", "tcsh", exit=2)
    assert "tcsh" in res.stderr
    assert res.stdout == ""
    run_cli("completion", exit=2)  # the shell is required


def test_console_script_is_installed() -> None:
    assert SMGSHM.is_file(), SMGSHM
    assert os.access(SMGSHM, os.X_OK)


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


def man_pages() -> list[Path]:
    return sorted(MAN_DIR.glob("*.1"))


def test_man_pages_exist() -> None:
    names = {p.name for p in man_pages()}
    assert "smgshm.1" in names
    assert {"smgshm-completion.1", "smgshm-doctor.1"} <= names


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
