"""SIGTERM and SIGHUP during e2e and doctor end as Ctrl-C does: one line of what was stopped, and the
signal's code from cli/exitcodes.py (130 SIGINT, 143 SIGTERM, 129 SIGHUP); never a silent death.

The peer is a loopback socket that accepts and never answers, so the child is known to be blocked
in its run (a request, a probe) when the signal is sent; real children, reaped by ``children``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Children, smgshm_argv, wait_for

CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
SIGS = pytest.mark.parametrize("sig", list(CODES), ids=lambda s: signal.Signals(s).name)


class Stall:
    """A loopback TCP server that accepts every connection and never answers; ``accepted`` counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed at teardown
                return
            self.held.append(conn)

    @property
    def accepted(self) -> int:
        return len(self.held)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def stall() -> Iterator[Stall]:
    s = Stall()
    yield s
    s.close()


def _stopped(children: Children, stall: Stall, sig: int, tmp: Path, *args: str) -> tuple[int, list[str]]:
    """Run smgshm with ``args`` until it has connected to the stalled peer, signal it; (exit code, stderr lines)."""
    env = {**os.environ, "COLUMNS": "200", "TMPDIR": str(tmp)}  # one message, one line; its files made here
    p = children.spawn(smgshm_argv(*args), env=env)
    wait_for(lambda: stall.accepted or p.poll() is not None, 60, "the child to connect to the stalled peer")
    assert p.poll() is None, f"it ended first: {p.communicate(timeout=10)}"
    os.kill(p.pid, sig)
    _, err = p.communicate(timeout=60)
    return p.returncode, err.strip().splitlines()


# (smgshm's arguments, with {peer} the stalled peer's host:port; the one line it must end with, a regex)
CASES = {
    # e2e against a gateway that never answers: how far its requests got, and that it made nothing
    "e2e --gateway": (
        ("e2e", "--gateway", "http://{peer}"),
        r"interrupted: stopped testing http://{peer} with 0 of 3 measured request\(s\) answered; "
        r"it started no gateway and made no log",
    ),
    # doctor outside its e2e part (a worker's probe hangs): after which check
    "doctor, in its checks": (
        ("doctor", "--no-e2e", "--timeout", "2m", "-w", "{peer}"),
        r"interrupted: doctor stopped after \d+ check\(s\) \(the last: [^)]+\); everything it had started is "
        r"stopped, and it made no log",
    ),
    # doctor before any check (--from-gateway's GET /workers hangs)
    "doctor, before its checks": (
        ("doctor", "--timeout", "2m", "--from-gateway", "http://{peer}"),
        r"interrupted: doctor stopped before its checks began; it had started nothing and made no log",
    ),
}


@pytest.mark.slow
@SIGS
@pytest.mark.parametrize("case", list(CASES))
def test_a_signal_ends_e2e_and_doctor_with_one_line_of_what_it_stopped(
    children: Children, stall: Stall, tmp_path: Path, sig: int, case: str
) -> None:
    args, said = CASES[case]
    peer = f"127.0.0.1:{stall.port}"
    code, lines = _stopped(children, stall, sig, tmp_path, *(a.format(peer=peer) for a in args))
    assert code == CODES[sig], lines
    assert lines, "stopped without a word"
    assert re.fullmatch(said.replace("{peer}", re.escape(peer)), lines[-1]), lines
    assert not list(tmp_path.iterdir()), "it made no file"
