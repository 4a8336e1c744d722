"""What preflight asks before it wraps a command (core/host/runnable.py): would exec'ing it fail? Refused
then, before anything is reclaimed and before its verdict is written (issue #31, item 6)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from smgshm.core.host import runnable


def _exe(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def no_binfmt_misc(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a host whose kernel runs ELF and #! only (binfmt_misc, when it has formats, lets exec decide)."""
    monkeypatch.setattr(runnable, "_binfmt_misc_in_use", lambda: False)


def test_what_runs_is_not_refused(tmp_path: Path) -> None:
    assert runnable.exec_refusal(sys.executable) is None
    assert runnable.exec_refusal(_exe(tmp_path / "script", b"#!/bin/sh\nexit 0\n")) is None
    assert runnable.exec_refusal("sh") is None  # found on PATH, as execvp finds it


@pytest.mark.usefixtures("no_binfmt_misc")
def test_what_exec_would_refuse_is_said(tmp_path: Path) -> None:
    assert runnable.exec_refusal(str(tmp_path / "absent")) == "is not found"
    assert runnable.exec_refusal("smgshm-no-such-command-anywhere") == "is not found"
    plain = tmp_path / "plain"
    plain.write_bytes(b"#!/bin/sh\n")
    plain.chmod(0o644)  # not executable
    assert runnable.exec_refusal(str(plain)) == "is not found"
    garbage = _exe(tmp_path / "garbage", b"\x00\x01 neither ELF nor #!\n")
    assert runnable.exec_refusal(garbage) == "is in no executable format (neither ELF nor #!)"
    shebang = _exe(tmp_path / "shebang", b"#!/nonexistent/interp -x\n")
    assert runnable.exec_refusal(shebang) == "names an interpreter that cannot be run (/nonexistent/interp)"
    with open("/proc/self/exe", "rb") as f:
        head = bytearray(f.read(64))
    head[18:20] = bytes([head[18] ^ 0xFF, head[19] ^ 0xFF])  # e_machine: another machine's
    assert runnable.exec_refusal(_exe(tmp_path / "foreign", bytes(head))) == "is an executable of another machine"


def test_binfmt_misc_leaves_an_unknown_format_to_exec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runnable, "_binfmt_misc_in_use", lambda: True)
    assert runnable.exec_refusal(_exe(tmp_path / "jar", b"PK\x03\x04 a jar, say\n")) is None
    assert os.path.exists(tmp_path / "jar")
