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


@pytest.mark.usefixtures("no_binfmt_misc")
def test_interpreters_are_followed_as_deep_as_the_kernel_does(tmp_path: Path) -> None:
    """A #! interpreter is itself asked of: one in no format (ENOEXEC at exec), one whose own #! names a missing
    interpreter (ENOENT at exec), a chain deeper than BINPRM_MAX_RECURSION (ELOOP)."""
    garbage = _exe(tmp_path / "garbage", b"\x00\x01 not a program\n")
    assert runnable.exec_refusal(_exe(tmp_path / "a", f"#!{garbage}\n".encode())) == (
        f"names an interpreter in no executable format ({garbage})"
    )
    broken = _exe(tmp_path / "broken", b"#!/nonexistent/sh\n")
    assert runnable.exec_refusal(_exe(tmp_path / "b", f"#!{broken}\n".encode())) == (
        "names an interpreter that cannot be run (/nonexistent/sh)"
    )
    chain = "/bin/sh"
    for i in range(runnable.MAX_INTERP_DEPTH):
        chain = _exe(tmp_path / f"c{i}", f"#!{chain}\n".encode())
    assert runnable.exec_refusal(chain) is None  # as deep as the kernel follows: runs
    deeper = _exe(tmp_path / "deeper", f"#!{chain}\n".encode())
    assert "nested deeper than the kernel follows" in (runnable.exec_refusal(deeper) or "")


def test_an_argument_list_over_the_kernels_bound_is_foreseen() -> None:
    """E2BIG: one string over MAX_ARG_STRLEN, or argv and envp together over the kernel's limit."""
    page, arg_max = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_ARG_MAX")
    assert runnable.exec_refusal("true", ["true", "x"]) is None
    one = runnable.exec_refusal("true", ["true", "x" * (32 * page)])
    assert one is not None
    assert one.endswith("(E2BIG)")
    many = runnable.exec_refusal("true", ["true", *(["x" * 1000] * (arg_max // 1000 + 1))], env={})
    assert many is not None
    assert many.endswith("(E2BIG)")
