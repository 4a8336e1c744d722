"""Shared by the tests of e2e_causes (moved out of tests/test_e2e_causes.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from smgshm.core.gateway.process import RunningGateway
from tests.conftest import Children, smgshm_argv, wait_for

TOOLS = ("unshare", "nsenter", "setpriv", "mount", "findmnt")


class PrivateShm:
    """A mount namespace of its own whose /dev/shm is a fresh tmpfs, held open by one process."""

    def __init__(self, children: Children, size: str) -> None:
        # The namespace starts as a copy of every mount here, other runs' private tmpfs under /tmp
        # too: detached first, so no run's gc sees its tmpfs reached from this test's pid namespace.
        script = (
            'findmnt -rn -o TARGET | grep \'^/tmp/\' | sort -r | while read -r m; do umount -l "$(printf %b "$m")"; '
            "done; "
            f"mount -t tmpfs -o size={size},mode=1777 tmpfs /dev/shm && echo ready && exec cat"
        )
        # stdin is a pipe: if this test process dies, cat sees EOF and the namespace goes with it.
        self.holder = children.spawn(
            ["unshare", "-m", "--propagation", "private", "bash", "-c", script], stdin=subprocess.PIPE
        )
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline()
        assert line.strip() == "ready", self.holder.stderr.read() if self.holder.stderr else "holder exited"
        self.pid = self.holder.pid
        self.shm = f"/proc/{self.pid}/root/dev/shm"  # its /dev/shm as seen from here
        with open(f"/proc/{self.pid}/mountinfo") as f:
            kept = [line.split()[4] for line in f if line.split()[4].startswith("/tmp/")]
        assert kept == [], f"mounts under /tmp still in the test's namespace: {kept}"

    def enter(self, *argv: str) -> list[str]:
        """argv that runs ``argv`` in the namespace (this pid namespace, this /proc)."""
        return ["nsenter", "-t", str(self.pid), "-m", "--", *argv]

    def ls(self) -> list[str]:
        return sorted(os.listdir(self.shm))


@pytest.fixture
def private_shm(children: Children, request: pytest.FixtureRequest) -> PrivateShm:
    """Its holder is one of ``children``: killed at teardown, and the namespace with it."""
    return PrivateShm(children, request.param)


def serve_in(ns: PrivateShm, children: Children, model: str) -> str:
    p = children.spawn(ns.enter(*smgshm_argv("--json", "serve", "--listen", "127.0.0.1:0", "--model-dir", model)))
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, p.stderr.read() if p.stderr else "serve exited"
    return str(json.loads(line)["result"]["address"])


def e2e_in(
    ns: PrivateShm, gw: RunningGateway, *args: str, exit: int, as_uid: str | None = None
) -> subprocess.CompletedProcess[str]:
    uid = ["setpriv", "--reuid", as_uid, "--regid", as_uid, "--clear-groups"] if as_uid is not None else []
    argv = ns.enter(*uid, *smgshm_argv("e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, *args))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "400"})
    assert res.returncode == exit, f"exit {res.returncode} != {exit}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res


def router_pid(gw: RunningGateway) -> int:
    """The gateway process itself (smg::router), the child of the unshare that gw.pid is."""
    import psutil

    kids = wait_for(lambda: psutil.Process(gw.pid).children(recursive=True), what="the gateway under unshare")
    [router] = [k for k in kids if k.name().startswith("smg")]
    return int(router.pid)
