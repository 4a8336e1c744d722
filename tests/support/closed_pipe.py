"""Shared by the tests of closed_pipe (moved out of tests/test_closed_pipe.py)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from tests.conftest import smgshm_argv

ENV = {**os.environ, "COLUMNS": "80"}


def run_closed_first(argv: list[str], stderr: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with stdout (or stderr) on a pipe whose reader closed before the child started:
    its very first write there fails, whatever the amount."""
    r, w = os.pipe()
    os.close(r)
    try:
        where: dict[str, Any] = (
            {"stderr": w, "stdout": subprocess.PIPE} if stderr else {"stdout": w, "stderr": subprocess.PIPE}
        )
        return subprocess.run(smgshm_argv(*argv), text=True, timeout=120, env=ENV, check=False, **where)
    finally:
        os.close(w)
