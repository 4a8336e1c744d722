"""Ctrl-C, SIGTERM or SIGHUP on e2e (and on doctor in its e2e part) says in one line what it stopped, and
removes the gateway logs it made in the temp dir; the exit code is the signal's (130, 143, 129)."""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import Children, smgshm_argv

STOPPED = "stopped 3 gateway(s) (shm, auto, inline) and their receivers"


def _stop_once_started(children: Children, tmp_path: Path, sig: int, *args: str) -> tuple[int, str]:
    """Run smgshm until its embedded e2e has started its gateways, then send ``sig``: (exit code, stderr)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "200"}  # the gateways' logs are made here
    p = children.spawn(smgshm_argv(*args), env=env)
    assert p.stderr is not None
    said, deadline = b"", time.monotonic() + 60
    while len([n for n in os.listdir(tmp_path) if n.endswith(".log")]) < 3:  # a log per gateway, made at its launch
        assert time.monotonic() < deadline, f"it never started its gateways: {said!r}"
        if select.select([p.stderr], [], [], 0.2)[0]:
            chunk = os.read(p.stderr.fileno(), 4096)
            assert chunk, f"it ended first (exit {p.wait(timeout=10)}): {said!r}"
            said += chunk
    os.kill(p.pid, sig)
    _, err = p.communicate(timeout=60)
    return p.returncode, said.decode() + err


@pytest.mark.slow
@pytest.mark.gateway
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_e2e_says_what_it_stopped_and_removes_its_gateway_logs(
    children: Children, tmp_path: Path, sig: int, code: int
) -> None:
    rc, err = _stop_once_started(children, tmp_path, sig, "e2e")
    assert rc == code, err
    lines = err.strip().splitlines()
    assert lines, "stopped without a word"
    assert lines[-1].startswith(f"interrupted: {STOPPED}"), err
    assert lines[-1].endswith("; removed their 3 log(s)"), err
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".log")], "no gateway log left behind"


@pytest.mark.slow
@pytest.mark.gateway
def test_doctor_stopped_by_sighup_in_its_e2e_part_says_so_and_removes_the_logs(
    children: Children, tmp_path: Path
) -> None:
    rc, err = _stop_once_started(children, tmp_path, signal.SIGHUP, "doctor", "--no-gateways")
    assert rc == 129, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: doctor stopped at its e2e check after "), err
    assert last.endswith(f": {STOPPED}; removed their 3 log(s)"), err
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".log")], "no gateway log left behind"
