"""Ctrl-C on e2e says in one line what it stopped, and removes the gateway logs it made in the temp dir."""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import Children, smgshm_argv


@pytest.mark.slow
@pytest.mark.gateway
def test_ctrl_c_on_e2e_says_what_it_stopped_and_removes_its_gateway_logs(children: Children, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "200"}  # the gateways' logs are made here
    p = children.spawn(smgshm_argv("e2e"), env=env)
    assert p.stderr is not None
    said, deadline = b"", time.monotonic() + 60
    while b"started 3 gateways" not in said:
        assert time.monotonic() < deadline, f"e2e never started its gateways: {said!r}"
        if select.select([p.stderr], [], [], 1.0)[0]:
            chunk = os.read(p.stderr.fileno(), 4096)
            assert chunk, f"e2e ended first (exit {p.wait(timeout=10)}): {said!r}"
            said += chunk
    assert [n for n in os.listdir(tmp_path) if n.endswith(".log")], "the gateways' logs are in the temp dir"
    os.kill(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines, "Ctrl-C said nothing"
    last = lines[-1]
    assert last.startswith("interrupted: stopped 3 gateway(s) (shm, auto, inline) and their receivers"), err
    assert last.endswith("; removed their 3 log(s)"), err
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".log")], "no gateway log left behind"
