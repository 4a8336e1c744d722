"""The suite's own cleanup: a pytest run stopped by SIGTERM or SIGHUP (a CI timeout, `kill`, a closed
terminal) leaves no tmpfs mounted, nor does a mount its tests' teardowns do not know. Each case runs a
child pytest with this suite's conftest on a test that mounts a tmpfs and waits, stops it, and looks at
this mount table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import Children

pytestmark = [pytest.mark.root, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
WAITER = textwrap.dedent(
    """
    import time
    from tests.conftest import mounted_tmpfs

    def test_mounts_and_waits(tmp_path):
        with mounted_tmpfs(tmp_path / "shm", "1m") as d:
            print("mounted", d, flush=True)
            time.sleep(600)
    """
)


def _mounted(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return any(line.split()[4] == path for line in f)


def _start(children: Children, tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    test = tmp_path / "test_waiter.py"
    test.write_text(WAITER)
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    p = children.spawn([*argv, "--rootdir", str(tmp_path), str(test)], cwd=str(PROJECT))
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("mounted "):
            return p, line.split()[1]
    raise AssertionError(f"the child never mounted: {p.stderr.read() if p.stderr else ''}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_stopped_by_a_signal_unmounts_what_its_tests_mounted(
    children: Children, tmp_path: Path, sig: signal.Signals
) -> None:
    p, where = _start(children, tmp_path)
    assert _mounted(where)
    os.kill(p.pid, sig)
    p.communicate(timeout=60)
    assert not _mounted(where), f"{where} still mounted after {sig.name}"


def test_a_mount_no_teardown_knows_is_unmounted_by_the_sessions_net(children: Children, tmp_path: Path) -> None:
    """A process killed by SIGKILL runs no teardown: an xdist worker's mounts are then below its
    controller's session dir, and pytest_unconfigure's net unmounts whatever is there. Shown with a
    mount made below the child's session dir by no test at all."""
    p, where = _start(children, tmp_path)
    assert _mounted(where)
    # A mount no teardown knows about, below the child's session dir: only the net can take it.
    session = where.split("/pytest-of-")[0]
    stray = Path(session) / "stray"
    stray.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "smgshm-stray", str(stray)], check=True, timeout=30)
    try:
        os.kill(p.pid, signal.SIGTERM)
        p.communicate(timeout=60)
        assert not _mounted(str(stray)), "the session net left a mount below its dir"
    finally:
        if _mounted(str(stray)):
            subprocess.run(["umount", "-l", str(stray)], timeout=30)
