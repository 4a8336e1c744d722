"""`smgshm ns`, `ns --pid` and `ns compare` against the real host and real children."""

from __future__ import annotations

import os
import shutil

import pytest

from smgshm.core.host.namespace import read_namespace_id
from tests.conftest import Children, run_cli, wait_for
from tests.support.cli_ns import A  # noqa: F401


def test_ns_pid_of_self_child(children: Children) -> None:
    p = children.spawn(["sleep", "30"])
    doc = run_cli("--json", "ns", "--pid", str(p.pid)).json
    assert doc["result"]["namespace_id"] == read_namespace_id()
    assert doc["result"]["pid"] == p.pid


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_ns_pid_private_tmpfs(children: Children) -> None:
    """A child in its own mount namespace with its own tmpfs over /dev/shm: st_dev differs."""
    script = "mount -t tmpfs -o size=1m tmpfs /dev/shm && echo ready && exec sleep 30"
    p = children.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    if line != "ready":
        pytest.skip(f"cannot mount a private tmpfs here: {p.stderr.read() if p.stderr else ''}")
    # The shell exec'd sleep, so p.pid now runs in the private mount namespace.
    wait_for(lambda: os.readlink(f"/proc/{p.pid}/exe").endswith("sleep"), what="exec sleep")
    theirs = run_cli("--json", "ns", "--pid", str(p.pid)).json["result"]
    assert theirs["shm_dev"] != os.stat("/dev/shm").st_dev
    assert theirs["shm_total_bytes"] == 1024 * 1024
    res = run_cli("--json", "ns", "compare", theirs["namespace_id"], exit=3).json
    assert res["result"]["sharing"] == "private_tmpfs"
