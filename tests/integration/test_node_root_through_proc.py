"""A node root reached through another process's root (``--node-root /proc/PID/root/...``, a DaemonSet that
sees the host through pid 1) and a shm dir seen the same way: what is found, and what a fix names, is that
process's, never this process's own by the same path (``os.path.realpath`` reads /proc/PID/root as "/")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from smgshm.core.host.facts import read_host_facts
from tests.conftest import Children, run_cli
from tests.support.node import needs_root_and_unshare

# makes a mount namespace whose tmpfs no other test's pid judgement may see (tests/conftest.py)
pytestmark = [needs_root_and_unshare, pytest.mark.pidns]

UID = "dddddddd-0000-4000-8000-00000000000d"
VOLUME = ("var", "lib", "kubelet", "pods", UID, "volumes", "kubernetes.io~empty-dir", "dshm")
PROBE = "smg-tokenspeed-probe-9"


@pytest.fixture
def hidden_node(tmp_path: Path, children: Children) -> tuple[int, Path]:
    """A node root whose pod tmpfs is mounted only in a mount namespace of its own, held by one process: from
    here the pod's dir is an empty dir, and the tmpfs is reached only through /proc/PID/root."""
    root = tmp_path / "node"
    vol = root.joinpath(*VOLUME)
    vol.mkdir(parents=True)
    script = (
        # Other runs' mounts under /tmp detached first: none is reached from here (as tests/support/e2e_causes.py).
        'findmnt -rn -o TARGET | grep \'^/tmp/\' | sort -r | while read -r m; do umount -l "$(printf %b "$m")"; '
        f'done; mount -t tmpfs -o size=8m tmpfs "$1" && : > "$1/{PROBE}" && echo ready && exec cat'
    )
    holder = children.spawn(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", script, "bash", str(vol)], stdin=subprocess.PIPE
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready", holder.stderr.read() if holder.stderr else "holder exited"
    assert os.listdir(vol) == []  # not mounted here
    return holder.pid, root


@pytest.mark.slow
def test_a_node_root_through_proc_pid_root_finds_that_namespaces_tmpfs(hidden_node: tuple[int, Path]) -> None:
    pid, root = hidden_node
    through = f"/proc/{pid}/root{root}"
    doc = run_cli("--json", "gc", "--node", "--node-root", through).json["result"]
    (found,) = [t for t in doc["tmpfs"] if t["kind"] == "empty_dir"]  # realpath found none: this root's dir
    assert found["pod_uid"] == UID
    assert found["shm_total_bytes"] == 8 << 20
    assert found["path"] == f"{through}/{'/'.join(VOLUME)}"


@pytest.mark.slow
def test_doctor_node_fixes_name_paths_as_the_node_sees_them(hidden_node: tuple[int, Path]) -> None:
    pid, root = hidden_node
    through = f"/proc/{pid}/root{root}"
    res = run_cli("--json", "doctor", "--node", "--no-gateways", "--node-root", through, exit=3).json["result"]
    (block,) = [t for t in res["tmpfs"] if t["pod_uid"] == UID]
    probe = {c["name"]: c for c in block["checks"]}["probe files"]
    assert probe["cause"] == "probe_file_left"
    # Pasted on the node it removes that very file: no --node-root prefix (a path no node has), no realpath.
    assert probe["fix_cmd"] == ["rm", "--", "/" + "/".join((*VOLUME, PROBE))]
    cap = {c["name"]: c for c in block["checks"]}["capacity"]
    assert cap["fix_cmd"] is None  # a pod's tmpfs is sized in its spec: no command is safe to run blind


def test_host_facts_are_about_the_very_dir_not_the_path_resolved(hidden_node: tuple[int, Path]) -> None:
    pid, root = hidden_node
    mine = str(root.joinpath(*VOLUME))
    facts = read_host_facts(mine)
    assert facts.about(mine)
    assert facts.about(mine + "/.")
    # The same path through the holder's root is its tmpfs, another directory: realpath called it this one.
    assert not facts.about(f"/proc/{pid}/root{mine}")
