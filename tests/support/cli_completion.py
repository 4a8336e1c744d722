"""Shared by the tests of cli_completion (moved out of tests/test_cli_completion.py)."""

from __future__ import annotations

import sys
from pathlib import Path

SMGSHM = Path(sys.executable).parent / "smgshm"


MAN_DIR = Path(__file__).resolve().parents[2] / "smgshm" / "man" / "man1"


COMMANDS = {"bench", "completion", "doctor", "gc", "ns", "probe", "send", "serve", "watch"}


def man_pages() -> list[Path]:
    return sorted(MAN_DIR.glob("*.1"))
