"""Shared by the tests of cli_gc (moved out of tests/test_cli_gc.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.conftest import Children, run_cli

PY = sys.executable


SHM = "/dev/shm"


# gc trusts a dead-looking pid only when no other pid namespace can reach the filesystem; on a
# machine other jobs share, any of their containers (an `unshare --pid` test) can see the root fs
# or /dev/shm at any moment. So the judgement tests judge by this namespace's pids, and the trust
# decision has tests of its own (the pid-namespace tests below, tests/test_gc_trust.py), which call
# gc without JUDGE (``gc_trusting``).
JUDGE: tuple[str, ...] = ("--assume-dead",)


# A producer: writes one gateway-named segment for its own pid, closes it, says its name, waits.
WRITER = """
import os, signal, sys, time
d = sys.argv[1]
name = f"smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0"
fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, b"\\0" * 4096)
os.close(fd)
print(name, flush=True)
signal.pause()
"""


# A holder: keeps an existing segment open (fd) or only mapped (its fd closed), then waits.
# The mapping goes through libc: Python's mmap.mmap keeps a dup of the fd (before 3.13's trackfd).
HOLDER = """
import ctypes, os, signal, sys
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
if how == "map":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, os.fstat(fd).st_size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    os.close(fd)
    assert not [f for f in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{f}") == path]
print("ready", flush=True)
signal.pause()
"""


SLEEPER = "import signal; signal.pause()"


def gc(d: str, *args: str, exit: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = run_cli("--json", "gc", "--shm-dir", d, *JUDGE, *args, exit=exit).json
    return doc


def segs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in doc["result"]["segments"]}


def deletions(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in doc["result"]["deleted"]}


def first_line(children: Children, argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Spawn a child and read the one line it prints once it is ready (EOF if it died)."""
    p = children.spawn(argv)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    if not line:
        p.wait(timeout=10)
        err = p.stderr.read() if p.stderr else ""
        raise AssertionError(f"child {argv[:4]} exited {p.returncode} before it was ready: {err}")
    return p, line


def kill_and_reap(p: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)


def dead_pid(children: Children) -> int:
    """The pid of a child that has exited and been reaped: no process has it now."""
    p = children.spawn([PY, "-c", ""])
    p.wait(timeout=30)
    assert not psutil.pid_exists(p.pid)
    return p.pid


def seg_name(pid: int, nanos: int | None = None, seq: int = 0) -> str:
    return f"smg-tokenspeed-{pid}-{time.time_ns() if nanos is None else nanos}-{seq}"


def unique() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex}"


@pytest.fixture
def tmpfs_dir() -> Iterator[str]:
    """A scratch dir on the real /dev/shm tmpfs, not named smg-*, removed whatever happens."""
    d = os.path.join(SHM, f"smgshm-test-{unique()}")
    os.mkdir(d, 0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def trusting(monkeypatch: pytest.MonkeyPatch) -> None:
    """gc's pid-namespace look (segments/scan.py's, in this process: run_cli), at this test's own process
    only: on a shared machine another job's container can reach every filesystem at any moment (a procfs
    of the host's), and gc then rightly trusts no pid; whether it does is tests/integration/test_gc_trust.py's
    to show, not the tests that need a verdict by pid."""
    from smgshm.core.host import pidtrust
    from smgshm.core.segments import scan

    monkeypatch.setattr(scan, "judge_trust", lambda d: pidtrust.judge_trust(d, pids=[os.getpid()]))


def asked_on_a_terminal(children: Children, argv: list[str]) -> tuple[subprocess.Popen[str], int, str]:
    """``argv`` (a gc that deletes) with a pty for stdin, returned once it has asked (the pty's master
    end, and what stderr said up to the question)."""
    import pty
    import select

    master, slave = pty.openpty()
    try:
        p = children.spawn(argv, stdin=slave, env={**os.environ, "COLUMNS": "200"})
    finally:
        os.close(slave)
    assert p.stderr is not None
    said, deadline = b"", time.monotonic() + 60
    while b"[y/N]: " not in said:
        assert time.monotonic() < deadline, f"gc never asked: {said!r}"
        if select.select([p.stderr], [], [], 1.0)[0]:
            chunk = os.read(p.stderr.fileno(), 4096)
            assert chunk, f"gc ended without asking (exit {p.wait(timeout=10)}): {said!r}"
            said += chunk
    return p, master, said.decode()
