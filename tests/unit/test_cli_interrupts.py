"""An interrupt's exit code is its signal's, found through the core's Interrupted; doctor --node says in one
line that it stopped (the real signals on real children: tests/integration/test_cli_signals_e2e_doctor.py)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.signals import Terminated, interrupt_code
from smgshm.core.errors import Interrupted
from tests.conftest import run_cli


def _raised_from(cause: BaseException) -> Interrupted:
    try:
        try:
            raise cause
        except KeyboardInterrupt as err:
            raise Interrupted("stopped it") from err
    except Interrupted as said:
        return said


def test_the_exit_code_is_the_signals_through_the_cores_line() -> None:
    assert interrupt_code(KeyboardInterrupt()) == ExitCode.INTERRUPTED
    assert interrupt_code(_raised_from(KeyboardInterrupt())) == ExitCode.INTERRUPTED
    assert interrupt_code(_raised_from(Terminated(signal.SIGTERM))) == ExitCode.TERMINATED
    assert interrupt_code(_raised_from(Terminated(signal.SIGHUP))) == ExitCode.HANGUP


def test_doctor_node_stopped_says_it_changed_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def stopped(*_a: Any, **_k: Any) -> Any:
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr("smgshm.core.node.doctor.run_node_doctor", stopped)
    res = run_cli("doctor", "--node", exit=143)
    assert res.stderr.strip().splitlines()[-1] == (
        "interrupted: doctor --node stopped while judging the node's tmpfs; it had changed nothing"
    )


def test_under_json_an_interrupt_is_one_error_document_of_kind_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    def stopped(*_a: Any, **_k: Any) -> Any:
        raise Terminated(signal.SIGHUP)

    monkeypatch.setattr("smgshm.core.node.doctor.run_node_doctor", stopped)
    doc = run_cli("--json", "doctor", "--node", exit=129).json  # its schema checked by run_cli
    assert doc["ok"] is False
    assert doc["error"]["kind"] == "interrupted"
    assert doc["error"]["message"].startswith("doctor --node stopped while judging")


def test_a_signal_a_del_swallows_is_kept_for_the_exit_code() -> None:
    """SIGTERM handled while an object's __del__ runs raises there, where Python prints and drops it: the run
    would end 0 as if nothing had come. unwind_on_signals keeps it (quietly) for the exit code (143)."""
    import gc as collector
    import os
    import signal

    from smgshm.cli import signals
    from smgshm.cli.exitcodes import ExitCode

    class Dies:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside __del__
            for _ in range(1000):  # a few bytecodes: the pending handler runs in this frame
                pass

    signals._SWALLOWED.clear()
    try:
        with signals.unwind_on_signals():
            d = Dies()
            del d
            collector.collect()
        assert signals.swallowed_code() is ExitCode.TERMINATED
    finally:
        signals._SWALLOWED.clear()
