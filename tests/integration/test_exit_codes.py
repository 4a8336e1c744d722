"""One scenario per documented exit code, through the real root group."""

from __future__ import annotations

from smgshm.cli.exitcodes import ExitCode


def test_141_stdout_closed_by_its_reader() -> None:
    """A real pipe whose reader left before the first write (more in tests/test_closed_pipe.py)."""
    from tests.support.closed_pipe import run_closed_first

    res = run_closed_first(["ns"])
    assert (res.returncode, res.stderr) == (ExitCode.CLOSED_PIPE, "")
