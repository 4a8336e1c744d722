"""A reader that leaves (``smgshm gc --all | head -1``) ends smgshm quietly with exit 141; a closed
stderr never changes a run's outcome. Real child processes on real pipes, each closed by the test."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, smgshm_argv
from tests.support.closed_pipe import ENV, run_closed_first

CLOSED_PIPE = 141


def crowded(d: Path, n: int) -> str:
    """A scratch shm dir with ``n`` gateway-named entries: more output than any pipe holds."""
    d.mkdir()
    for i in range(n):
        (d / f"smg-tokenspeed-{4000000 + i % 7}-{1796000000000000000 + i}-0").touch()
    return str(d)


def first_line_then_close(children: Children, argv: list[str], limit: int = -1) -> tuple[str, int, str]:
    """Run ``argv`` with stdout on a pipe; read one line (at most ``limit`` characters: gc's JSON
    document is one long line), close the pipe as ``head -1`` does; return it, the exit code, stderr."""
    p = children.spawn(smgshm_argv(*argv), env=ENV)
    assert p.stdout is not None
    assert p.stderr is not None
    line = p.stdout.readline(limit)
    p.stdout.close()
    err = p.stderr.read()
    return line, p.wait(timeout=120), err


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [["gc", "--all"], ["gc", "--raw"], ["--json", "gc"], ["gc", "--all", "--check"]],
    ids=["all", "raw", "json", "check"],
)
def test_gc_with_more_output_than_the_pipe_holds(children: Children, tmp_path: Path, args: list[str]) -> None:
    d = crowded(tmp_path / "shm", 5000)  # 250 KB of rows and more: a pipe holds 64 KiB
    line, code, err = first_line_then_close(children, [*args, "--shm-dir", d, "--assume-dead"], 200)
    assert line.strip(), err
    assert code == CLOSED_PIPE, err
    assert "Traceback" not in err
    assert "Error" not in err
    assert len(os.listdir(d)) == 5000, "a listing deletes nothing"


def test_watch_jsonl_stream(children: Children, tmp_path: Path) -> None:
    """--jsonl streams a record per interval: the first write after the reader left ends it."""
    d = tmp_path / "shm"
    d.mkdir()
    line, code, err = first_line_then_close(children, ["watch", "--jsonl", "--shm-dir", str(d), "--interval", "0.1"])
    assert json.loads(line)["type"] == "rescanned"
    assert code == CLOSED_PIPE, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_bench_jsonl_stops_and_cleans_up(children: Children) -> None:
    """A run with its own receiver and segments: the reader leaves after the first size; bench stops at
    a write, its receiver ended and no segment of it left (the autouse guard checks /dev/shm). 300
    sizes of about 440 bytes of JSON each are more than a pipe holds: the end is never reached."""
    sizes = ",".join(str(4096 + 64 * i) for i in range(300))
    line, code, err = first_line_then_close(
        children, ["bench", "--jsonl", "--sizes", sizes, "--warmup", "0", "-n", "1"]
    )
    assert json.loads(line)["nbytes"] == 4096
    assert code == CLOSED_PIPE, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["ns"], ["--json", "ns"], ["--help"], ["gc", "--help"], ["--version"]], ids=" ".join)
def test_small_outputs_to_a_reader_already_gone(argv: list[str]) -> None:
    res = run_closed_first(argv)
    assert res.returncode == CLOSED_PIPE, res.stderr
    assert res.stderr == ""


def test_an_error_to_a_closed_stderr_keeps_its_exit_code(tmp_path: Path) -> None:
    """stderr's reader gone: the error line is lost, the documented code is not (5 here, not 141)."""
    res = run_closed_first(["ns", "--shm-dir", str(tmp_path / "nope")], stderr=True)
    assert res.returncode == 5
    assert res.stdout == ""
    res = run_closed_first(["--json", "ns", "--shm-dir", str(tmp_path / "nope")], stderr=True)
    assert res.returncode == 5
    assert json.loads(res.stdout)["error"]["kind"] == "host"


def test_warnings_to_a_closed_stderr_leave_the_result_whole(tmp_path: Path) -> None:
    """gc warns on stderr (its hint lines); with stderr gone, stdout still carries the whole result."""
    d = crowded(tmp_path / "shm", 3)
    res = run_closed_first(["gc", "--shm-dir", d, "--assume-dead"], stderr=True)
    assert res.returncode == 0
    assert "3 SMG segment(s)" in res.stdout
    res = run_closed_first(["--json", "gc", "--shm-dir", d, "--assume-dead"], stderr=True)
    assert res.returncode == 0
    assert len(json.loads(res.stdout)["result"]["segments"]) == 3


def run_fd_closed(fd: int, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``smgshm argv`` with ``fd`` (1 or 2) not open at all, as ``2>&-`` leaves it."""
    return subprocess.run(
        smgshm_argv(*argv), text=True, timeout=120, env=ENV, check=False, preexec_fn=lambda: os.close(fd), **kw
    )


@pytest.mark.slow
def test_closed_descriptors(tmp_path: Path) -> None:
    """stderr (or stdout) not open at all (``2>&-``): no traceback, the exit code of the run; nothing
    meant for stderr lands on stdout, and no file smgshm opens becomes fd 2."""
    d = crowded(tmp_path / "shm", 2)
    no_err = {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
    res = run_fd_closed(2, ["gc", "--shm-dir", d, "--assume-dead"], **no_err)
    assert res.returncode == 0
    assert "2 SMG segment(s)" in res.stdout
    assert "hint:" not in res.stdout, "stderr's lines went to stdout"
    prom = tmp_path / "gc.prom"
    res = run_fd_closed(2, ["--json", "gc", "--shm-dir", d, "--assume-dead", "--prometheus", str(prom)], **no_err)
    assert res.returncode == 0
    assert json.loads(res.stdout)["ok"] is True
    text = prom.read_text()
    assert all(ln.startswith(("# HELP ", "# TYPE ", "smgshm_")) for ln in text.splitlines()), text
    res = run_fd_closed(2, ["ns", "--shm-dir", str(tmp_path / "nope")], **no_err)
    assert (res.returncode, res.stdout) == (5, "")
    res = run_fd_closed(1, ["ns"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert (res.returncode, res.stderr) == (0, "")
