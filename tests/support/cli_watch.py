"""Shared by the tests of cli_watch (moved out of tests/test_cli_watch.py)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.conftest import Children, smgshm_argv


def spawn_watch(children: Children, *args: str) -> tuple[subprocess.Popen[str], list[dict[str, Any]]]:
    """``watch --jsonl`` as a child, returned once its start listing is out (it is watching)."""
    p = children.spawn(smgshm_argv("watch", "--jsonl", *args))
    assert p.stdout is not None
    first = json.loads(p.stdout.readline())
    assert first["type"] == "rescanned", first
    return p, [first]


def drain(p: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """The rest of a child's output once it exits. Not communicate(): with two pipes it reads
    the descriptors directly and would lose what readline() already buffered."""
    assert p.stdout is not None
    assert p.stderr is not None
    out = p.stdout.read()  # the child ends (a bounded run or a signal), so this reaches EOF
    err = p.stderr.read()
    p.wait(timeout=timeout)
    return out, err
