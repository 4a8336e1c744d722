"""Where the node view looks, and that it never passes what it could not see (issue #30, items 3 and 5).

Each runtime's sandbox shm as a real tmpfs where that runtime mounts it (containerd's default state dir,
k3s/RKE2's, k0s', CRI-O's storage run root, a custom ``--runtime-state-dir``); thousands of stale pod
dirs with one real leak beyond the 4096 the view used to read; a root with no kubelet or runtime dir;
a view from outside the host's pid namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.node import metrics
from smgshm.core.node.follow import NodeWatch, NodeWatchOptions
from tests.conftest import mounted_tmpfs, run_cli, smgshm_argv
from tests.support.node import laid_out, needs_root_and_unshare

SANDBOX = "5a" * 32  # a sandbox id as runtimes make them: 64 hex digits
# (the layout, the sandbox shm's path under the node root)
RUNTIMES = [
    ("containerd", f"run/containerd/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/shm"),
    ("k3s", f"run/k3s/containerd/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/shm"),
    ("k0s", f"run/k0s/containerd/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/shm"),
    # CRI-O: SetupShm mounts it in the sandbox container's run dir, <runroot>/<driver>-containers/<id>/userdata
    ("cri-o", f"run/containers/storage/overlay-containers/{SANDBOX}/userdata/shm"),
]


def _tmpfs(doc: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return sorted((t["kind"], t["path"], t["volume"]) for t in doc["result"]["tmpfs"])


@needs_root_and_unshare
@pytest.mark.parametrize(("runtime", "rel"), RUNTIMES, ids=[r for r, _ in RUNTIMES])
def test_each_runtimes_sandbox_shm_is_found(tmp_path: Path, runtime: str, rel: str) -> None:
    root = tmp_path / "node"
    with mounted_tmpfs(root / rel, "4m"):
        doc = run_cli("--json", "gc", "--node", "--node-root", str(root)).json
        assert _tmpfs(doc) == [("sandbox_shm", str(root / rel), SANDBOX)], runtime
        assert doc["result"]["unseen"] == []  # the runtime's dir is a layout: the root is a node's


@needs_root_and_unshare
def test_a_custom_runtime_state_dir_is_read_as_containerds_and_as_cri_os(tmp_path: Path) -> None:
    """--runtime-state-dir (repeatable, under the node root): a containerd state dir and a CRI-O runroot
    elsewhere are found only when given; one given that is not there makes the view unknown (exit 6)."""
    root = tmp_path / "node"
    cd = root / f"opt/ctr/state/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/shm"
    crio = root / f"var/crio/run/vfs-containers/{SANDBOX}/userdata/shm"
    (root / "var/lib/kubelet/pods").mkdir(parents=True)
    with mounted_tmpfs(cd, "4m"), mounted_tmpfs(crio, "4m"):
        plain = run_cli("--json", "gc", "--node", "--node-root", str(root)).json
        assert _tmpfs(plain) == []
        args = ("--runtime-state-dir", "/opt/ctr/state", "--runtime-state-dir", "var/crio/run")
        doc = run_cli("--json", "gc", "--node", "--node-root", str(root), *args, "--check").json
        assert _tmpfs(doc) == [("sandbox_shm", str(cd), SANDBOX), ("sandbox_shm", str(crio), SANDBOX)]
        assert doc["result"]["unseen"] == []
        for command in ("doctor", "watch"):  # the same flag on each node command
            run_cli(command, "--help").stdout.index("--runtime-state-dir")
        gone = run_cli(
            "--json", "gc", "--node", "--node-root", str(root), "--runtime-state-dir", "/run/nope", "--check", exit=6
        ).json
        (u,) = gone["result"]["unseen"]
        assert u["reason"] == "runtime_state_dir"
        assert "run/nope" in u["message"]
    run_cli("gc", "--node", "--runtime-state-dir", "../etc", exit=2)


def _plain_dirs(parent: Path, n: int, name: str) -> list[str]:
    """``n`` empty dirs named by ``name(i)`` in ``parent``; their names in the order the kernel lists them."""
    parent.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (parent / name(i)).mkdir()
    return [e.name for e in os.scandir(parent)]


def _uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


@needs_root_and_unshare
@pytest.mark.trust
def test_a_leak_beyond_4096_stale_pod_dirs_is_found_and_named(tmp_path: Path) -> None:
    """6,000 stale pod dirs (the kubelet's known accumulation) and as many log dirs: the view reads them all
    (it read the first 4096 and said "check passed ... 0 tmpfs"). One pod beyond the old cut, in the order
    the kernel lists the dir, has a real tmpfs with a leaked name: found, named from its log dir, leaked."""
    root = tmp_path / "node"
    listed = _plain_dirs(root / "var/lib/kubelet/pods", 6000, _uid)
    uid = listed[5000]  # past the first 4096 read before
    logs = _plain_dirs(root / "var/log/pods", 6000, lambda i: f"stale_pod-{i}_{_uid(10_000 + i)}")
    assert len(logs) == 6000
    with laid_out(root, [(("team-z", "engine-9", uid), "4m", "dead")]):
        doc = run_cli("--json", "gc", "--node", "--node-root", str(root), "--check", exit=3).json
    (t,) = [t for t in doc["result"]["tmpfs"] if t["pod_uid"] == uid]
    assert (t["namespace"], t["pod"], t["kind"]) == ("team-z", "engine-9", "empty_dir")
    assert [s["state"] for s in t["segments"]] == ["leaked"]
    assert doc["result"]["pods_known"] == 6001


def test_a_root_with_no_kubelet_or_runtime_dir_is_unknown_everywhere(tmp_path: Path) -> None:
    """An empty --node-root (a DaemonSet whose hostPath is wrong): never "0 tmpfs, none", exit 0, NPD OK."""
    root = tmp_path / "empty"
    root.mkdir()
    doc = run_cli("--json", "gc", "--node", "--node-root", str(root), "--check", exit=6).json  # schema-checked
    assert doc["result"]["tmpfs"] == []
    (u,) = doc["result"]["unseen"]
    assert u["reason"] == "node_root"
    assert "var/lib/kubelet/pods" in u["message"]
    assert "run/containers/storage" in u["message"]
    head = run_cli("gc", "--node", "--node-root", str(root), "--check", exit=6).stdout.splitlines()[0]
    assert head.startswith("check inconclusive: node "), head
    npd = run_cli("gc", "--node", "--node-root", str(root), "--check", "--npd", exit=2).stdout
    assert npd == "gc: node view unknown: no kubelet/runtime dir under --node-root\n"
    # doctor warns (a check of the node's own), and --json says it
    dj = run_cli("--json", "doctor", "--node", "--node-root", str(root)).json["result"]
    assert dj["verdict"] == "warn"
    assert [(c["name"], c["status"]) for c in dj["node_checks"]] == [("node view", "warn")]
    text = run_cli("doctor", "--node", "--node-root", str(root)).stdout
    assert "[warn] node view: unknown: node root" in text, text
    # the exporter's series, in the textfile and served, and a log line naming the mount (under -q too)
    prom = tmp_path / "node.prom"
    run_cli("gc", "--node", "--node-root", str(root), "--prometheus", str(prom))
    assert 'smgshm_node_view_unknown{reason="node_root"} 1.0' in prom.read_text()
    assert 'smgshm_node_view_unknown{reason="host_pid"} 0.0' in prom.read_text()
    with NodeWatch(NodeWatchOptions(root=str(root))) as nw:
        served = metrics.exposition(*nw.figures()).decode()
    assert 'smgshm_node_view_unknown{reason="node_root"} 1.0' in served
    log = run_cli("-q", "watch", "--node", "--node-root", str(root), "--count", "1").stderr
    assert "warning: node view unknown (node_root): node root " in log, log
    assert "a mount is missing" in log


def test_a_node_with_a_kubelet_dir_and_no_pods_yet_is_seen_whole(tmp_path: Path) -> None:
    root = tmp_path / "node"
    (root / "var/lib/kubelet/pods").mkdir(parents=True)
    doc = run_cli("--json", "gc", "--node", "--node-root", str(root), "--check").json
    assert doc["result"]["unseen"] == []
    assert doc["warnings"] == []


# A new pid namespace with its own /proc: the node as a DaemonSet without hostPID sees it.
OUTSIDE_HOST_PIDNS = ["unshare", "--pid", "--fork", "--mount-proc"]


@needs_root_and_unshare
@pytest.mark.pidns
def test_a_view_without_the_hosts_pid_namespace_is_unknown_and_says_hostpid(tmp_path: Path) -> None:
    root = tmp_path / "node"
    (root / "var/lib/kubelet/pods").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "400"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*OUTSIDE_HOST_PIDNS, *smgshm_argv(*args)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd="/")

    r = run("--json", "gc", "--node", "--node-root", str(root), "--check")
    assert r.returncode == 6, r.stderr
    (u,) = json.loads(r.stdout)["result"]["unseen"]
    assert u["reason"] == "host_pid"
    assert "hostPID: true" in u["hint"]
    r = run("gc", "--node", "--node-root", str(root), "--check", "--npd")
    assert (r.returncode, r.stdout) == (2, "gc: node view unknown: no hostPID\n"), r.stderr
    r = run("doctor", "--node", "--node-root", str(root))
    assert "[warn] node view: unknown: smgshm runs outside the host's pid namespace" in r.stdout, r.stdout
    prom = tmp_path / "node.prom"
    r = run("gc", "--node", "--node-root", str(root), "--prometheus", str(prom))
    assert 'smgshm_node_view_unknown{reason="host_pid"} 1.0' in prom.read_text(), r.stderr
    r = run("-q", "watch", "--node", "--node-root", str(root), "--count", "1")
    assert "warning: node view unknown (host_pid): smgshm runs outside the host's pid namespace" in r.stderr
    assert "hostPID: true" in r.stderr


@needs_root_and_unshare
@pytest.mark.parametrize(
    ("box_dir", "shm"),
    [
        ("run/containerd/io.containerd.grpc.v1.cri/sandboxes/5b5b", "shm"),
        ("run/containers/storage/overlay-containers/5c5c", "userdata/shm"),
    ],
    ids=["containerd", "cri-o"],
)
def test_a_sandbox_dir_it_may_not_list_is_said_not_skipped(tmp_path: Path, box_dir: str, shm: str) -> None:
    """A runtime's sandbox dir (another uid's, 0700) that this process may not list (no DAC capability:
    root with them cut from its bounding set) hides the sandbox's /dev/shm: the view says so (unseen
    `unreadable`, naming the dir) instead of leaving the tmpfs out unsaid."""
    root = tmp_path / "node"
    box = root / box_dir
    with mounted_tmpfs(box / shm, "1m"):
        os.chown(box, 1000, 1000)
        os.chmod(box, 0o700)
        argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
        r = subprocess.run(
            [*argv, *smgshm_argv("--json", "gc", "--node", "--node-root", str(root))],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            cwd="/",
        )
    doc = json.loads(r.stdout)
    (u,) = [u for u in doc["result"]["unseen"] if u["reason"] == "unreadable"]
    assert box_dir in u["message"], u
    assert doc["result"]["tmpfs"] == []
