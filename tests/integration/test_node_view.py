"""gc --node on a node laid out under a private root: two pods' memory emptyDirs as real tmpfs mounts
where the kubelet puts them, their pod log dirs, and each pod's processes in their own mount and pid
namespaces (unshare), with the pod's tmpfs bound at their /dev/shm. Each pod's segment names a pid
of ITS namespace (1 or 2), which on the host is some unrelated process: only a judgement in the
pod's own namespace is right."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, run_cli, smgshm_argv, wait_for
from tests.support.cli_gc import asked_on_a_terminal
from tests.support.node import HIDDEN, POD_A, POD_B, dshm, needs_root_and_unshare, start_pod, two_pods
from tests.support.node import blocks as pod_blocks

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = [needs_root_and_unshare, pytest.mark.trust]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with two_pods(tmp_path / "node") as pods:
        yield pods


@pytest.mark.slow
def test_each_pod_is_named_and_judged_in_its_own_pid_namespace(node: dict[str, Any]) -> None:
    root = node["root"]
    doc = run_cli("--json", "gc", "--node", "--node-root", root).json
    blocks = pod_blocks(doc)
    a, b = blocks[POD_A[2]], blocks[POD_B[2]]
    assert (a["namespace"], a["pod"], a["kind"], a["volume"]) == ("team-a", "engine-0", "empty_dir", "dshm")
    assert (b["namespace"], b["pod"]) == ("team-b", "gateway-0")
    assert a["shm_total_bytes"] == 16 << 20
    assert a["liveness_trusted"]
    assert len(a["pid_namespaces"]) == 1
    assert a["pid_namespaces"] != b["pid_namespaces"]
    # Pod A: its producer was a child of A's pid 1 and is gone there; that pid lives here.
    (seg_a,) = a["segments"]
    # (after sh's two mounts: a small pid, which the host's kernel threads hold here)
    assert seg_a["producer_pid"] < 10
    assert os.path.exists(f"/proc/{seg_a['producer_pid']}")
    assert seg_a["state"] == "leaked"
    assert seg_a["producer_alive"] is False
    assert "in its pod's pid namespace" in seg_a["reason"]
    assert a["other_families"] == [{"family": "sem", "count": 1, "nbytes": 4096}]
    # Pod B: pid 1 of B's namespace wrote it and lives: in flight, whatever pid 1 is here.
    (seg_b,) = b["segments"]
    assert seg_b["producer_pid"] == 1
    assert seg_b["state"] == "in_flight"
    assert seg_b["producer_alive"] is True
    assert b["hidden_bytes"] == HIDDEN
    assert b["hidden_files"] == 1
    assert a["hidden_bytes"] == 0
    assert doc["result"]["counts"]["leaked"] == 1

    # The host's view of A's tmpfs, forced to judge by the host's pids, gets it wrong: pid 2 lives here.
    host = run_cli("--json", "gc", "--shm-dir", a["path"], "--assume-dead").json
    assert host["result"]["segments"][0]["state"] != "leaked"

    text = run_cli("gc", "--node", "--node-root", root).stdout
    assert "pod team-a/engine-0 (uid aaaaaaaa-0000-4000-8000-00000000000a), emptyDir dshm" in text
    assert "pod team-b/gateway-0" in text
    assert "hidden 1.0 MiB (1 unlinked file(s) still mapped)" in text
    raw = run_cli("gc", "--node", "--node-root", root, "--raw").stdout.splitlines()
    assert sorted(line.split()[:3] for line in raw) == [
        ["team-a/engine-0", "empty_dir:dshm", "leaked"],
        ["team-b/gateway-0", "empty_dir:dshm", "in_flight"],
    ]
    run_cli("gc", "--node", "--node-root", root, "--check", exit=3)


def test_delete_reaps_the_dead_producers_segment_and_keeps_the_live_one(node: dict[str, Any]) -> None:
    root = node["root"]
    doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
    a, b = pod_blocks(doc)[POD_A[2]], pod_blocks(doc)[POD_B[2]]
    assert [d["deleted"] for d in a["deleted"]] == [True]
    assert a["remaining_counts"]["leaked"] == 0
    assert b["deleted"] == []
    assert b["remaining_counts"]["in_flight"] == 1
    left_a = sorted(os.listdir(dshm(Path(root), POD_A[2])))
    left_b = [n for n in os.listdir(dshm(Path(root), POD_B[2])) if n.startswith("smg-")]
    assert left_a == ["sem.mp-other"]
    assert len(left_b) == 1
    run_cli("gc", "--node", "--node-root", root, "--check")


def test_a_tmpfs_no_process_reaches_is_leaked_and_proven_so_by_order(node: dict[str, Any]) -> None:
    """Pod A's container exits (between restarts): no process reaches its tmpfs, so every name there was
    written by a process now gone: leaked. Reaped at any age only when a listing saw it before the walk
    that found nobody (the second run's look follows the first run's sighting)."""
    root = node["root"]
    node["a"].stdin.close()  # pod A's container exits: no process reaches its tmpfs any more
    wait_for(lambda: node["a"].poll() is not None, what="pod A's pid 1 to exit")
    first = pod_blocks(run_cli("--json", "gc", "--node", "--node-root", root).json)[POD_A[2]]
    assert first["liveness_trusted"]
    assert "no process reaches this tmpfs" in first["liveness_note"]
    assert first["pid_namespaces"] == []
    (seg,) = first["segments"]
    assert (seg["state"], seg["producer_alive"]) == ("leaked", False)
    assert "no process reaches this tmpfs" in seg["reason"]
    # the default --min-age (10m): only a leak proven by order (listed before the look) is reaped
    doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--yes").json
    a = pod_blocks(doc)[POD_A[2]]
    assert [d["deleted"] for d in a["deleted"]] == [True]
    assert sorted(os.listdir(dshm(Path(root), POD_A[2]))) == ["sem.mp-other"]
    run_cli("gc", "--node", "--node-root", root, "--check")


@pytest.mark.slow
def test_check_of_a_node_whose_every_segment_is_unknown_is_inconclusive(node: dict[str, Any]) -> None:
    """Pod A's tmpfs is reached by two pid namespaces that cannot agree on its name (a second container has
    the dead producer's pid), pod B's holds no SMG name: nothing can be judged by pid, so a --check judged
    nothing: exit 6 with the reason (2 under --npd), never "check passed"."""
    root = node["root"]
    for name in os.listdir(dshm(Path(root), POD_B[2])):
        if name.startswith("smg-"):
            os.unlink(dshm(Path(root), POD_B[2]) / name)
    (name,) = [n for n in os.listdir(dshm(Path(root), POD_A[2])) if n.startswith("smg-")]
    reg = Children()
    try:
        start_pod(reg, dshm(Path(root), POD_A[2]), f"hold={name.split('-')[2]}")
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--check", exit=6).json
        head = run_cli("gc", "--node", "--node-root", root, "--check", exit=6).stdout.splitlines()[0]
        run_cli("gc", "--node", "--node-root", root, "--check", "--npd", exit=2)
    finally:
        reg.reap()
    assert doc["ok"] is False
    assert {s["state"] for t in doc["result"]["tmpfs"] for s in t["segments"]} == {"unknown"}
    assert any(w.startswith("check inconclusive: all 1 SMG segment(s) unknown") for w in doc["warnings"])
    assert head.startswith("check inconclusive: node "), head


def test_a_symlink_in_the_kubelet_dir_is_not_followed_out_of_the_root(node: dict[str, Any], tmp_path: Path) -> None:
    pods = Path(node["root"]) / "var/lib/kubelet/pods"
    (pods / "cccccccc-0000-4000-8000-00000000000c").symlink_to("/")  # would reach /volumes/... on the host
    os.makedirs(pods / "dddddddd-0000-4000-8000-00000000000d/volumes")
    (pods / "dddddddd-0000-4000-8000-00000000000d/volumes/kubernetes.io~empty-dir").symlink_to("/dev")
    doc = run_cli("--json", "gc", "--node", "--node-root", node["root"]).json
    assert sorted(t["pod_uid"] for t in doc["result"]["tmpfs"]) == [POD_A[2], POD_B[2]]


def test_a_pod_log_dir_that_is_no_kubelet_name_never_names_a_pod(node: dict[str, Any]) -> None:
    """Pod log dir names are hostile: one that cannot be a Kubernetes namespace and pod name never names
    a pod (it would sort before the real one), and two that claim one uid leave it unnamed, not guessed."""
    logs = Path(node["root"]) / "var/log/pods"
    (logs / f"a\nb\x1b[1m_.._{POD_B[2]}").mkdir()  # sorts before team-b_gateway-0_<uid>
    (logs / f"aaa_impostor_{POD_A[2]}").mkdir()  # a well-formed second claim on pod A's uid
    blocks = pod_blocks(run_cli("--json", "gc", "--node", "--node-root", node["root"]).json)
    assert (blocks[POD_B[2]]["namespace"], blocks[POD_B[2]]["pod"]) == ("team-b", "gateway-0")
    assert (blocks[POD_A[2]]["namespace"], blocks[POD_A[2]]["pod"]) == (None, None)


def test_node_refuses_options_it_does_not_combine_with() -> None:
    run_cli("gc", "--node", "--assume-dead", exit=2)
    run_cli("gc", "--node", "--watch", "1s", exit=2)


@pytest.mark.parametrize("command", ["gc", "doctor"])
def test_a_node_root_whose_link_cannot_be_read_is_exit_5_not_a_bug(command: str) -> None:
    """/proc/1/root is a link nobody may read: the root cannot be resolved, a host error (exit 5), never 70."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv(1) is not installed")
    argv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        *smgshm_argv(command, "--node", "--node-root", "/proc/1/root"),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "80"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert r.returncode == 5, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr
    assert "/proc/1/root" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_namespaces_sharing_a_tmpfs_must_agree(node: dict[str, Any], tmp_path: Path) -> None:
    """A second container of pod A (its own pid namespace, the same tmpfs) in which the dead
    producer's pid is alive: which namespace wrote the name cannot be told, so it is unknown and kept."""
    root = node["root"]
    # The pid from the name itself: a scan now would record a sighting, and a process started after one is
    # proven not to be the producer (the next test).
    (name,) = [n for n in os.listdir(dshm(Path(root), POD_A[2])) if n.startswith("smg-")]
    pid = int(name.split("-")[2])
    reg = Children()
    try:
        start_pod(reg, dshm(Path(root), POD_A[2]), f"hold={pid}")
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
    finally:
        reg.reap()
    a = pod_blocks(doc)[POD_A[2]]
    assert len(a["pid_namespaces"]) == 2
    (seg,) = a["segments"]
    assert seg["state"] == "unknown"
    assert "which one wrote the name cannot be told" in seg["reason"]
    assert a["deleted"] == []


def test_a_sighting_before_the_other_namespaces_process_started_proves_the_leak(node: dict[str, Any]) -> None:
    """As above, but a scan saw the segment before the second container's process with that pid started:
    that process is not the producer (a producer exists before its segment), and in pod A's first
    namespace no process has the pid: dead in both, proven on the boot clock, so leaked and reaped."""
    root = node["root"]
    first = pod_blocks(run_cli("--json", "gc", "--node", "--node-root", root).json)[POD_A[2]]  # the sighting
    pid = first["segments"][0]["producer_pid"]
    reg = Children()
    try:
        start_pod(reg, dshm(Path(root), POD_A[2]), f"hold={pid}")
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
    finally:
        reg.reap()
    a = pod_blocks(doc)[POD_A[2]]
    assert len(a["pid_namespaces"]) == 2
    (seg,) = a["segments"]
    assert seg["state"] == "leaked"
    assert "reused" in seg["reason"]
    assert [d["deleted"] for d in a["deleted"]] == [True]


# A container whose /dev/shm is a symlink into its own /dev (to the pod's tmpfs, bound there): a child
# (pid 2 there, which pod B's namespace has not) writes a segment, says "<pid> <name>", and lives on.
LINKED = r"""
import os, sys, time
child = os.fork()
if child == 0:
    name = f"smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0"
    with open("/dev/shm/" + name, "wb") as f:
        f.write(b"z" * 8192)
    print(os.getpid(), name, flush=True)
    sys.stdin.read()
    os._exit(0)
os.waitpid(child, 0)
"""


def test_a_process_whose_dev_shm_is_a_symlink_is_never_judged_dead_elsewhere(node: dict[str, Any]) -> None:
    """A symlink in a process's root resolves against smgshm's root, not the process's: through
    /proc/P/root its /dev/shm is nowhere (or another tmpfs). Its live producer must not be judged in
    the other container's pid namespace, where its pid is free: doubt, never leaked."""
    root = node["root"]
    script = (
        'mount -t tmpfs tmpfs /dev && mkdir /dev/pod && mount --bind "$0" /dev/pod && '
        'ln -s /dev/pod /dev/shm && mount -t proc proc /proc && exec "$1" -c "$2"'
    )
    argv = [
        "unshare",
        "--pid",
        "--fork",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(dshm(Path(root), POD_B[2])),
        sys.executable,
        LINKED,
    ]
    reg = Children()
    try:
        p = reg.spawn(argv, stdin=subprocess.PIPE)
        assert p.stdout is not None
        pid, name = p.stdout.readline().split()
        assert int(pid) != 1
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
        assert os.path.exists(dshm(Path(root), POD_B[2]) / name), "a live producer's segment was deleted"
    finally:
        reg.reap()
    (seg,) = [s for s in pod_blocks(doc)[POD_B[2]]["segments"] if s["name"] == name]
    assert seg["state"] == "unknown", seg


@pytest.mark.slow
def test_declining_the_node_wide_delete_deletes_nothing_and_is_no_error(
    node: dict[str, Any], children: Children
) -> None:
    """gc --node asks the one question gc asks, and a "no" is a listing (exit 0), as for gc --delete: never
    click's "Aborted!" and exit 1."""
    root = node["root"]
    before = sorted(os.listdir(dshm(Path(root), POD_A[2])))
    assert any(n.startswith("smg-") for n in before), before
    argv = smgshm_argv("gc", "--node", "--node-root", root, "--delete", "--min-age", "0")
    p, master, said = asked_on_a_terminal(children, argv)
    try:
        assert "delete these" in said
        (line,) = [ln for ln in said.splitlines() if "smg-" in ln]  # the one leaked, in pod A
        assert " in pod team-a/engine-0  " in line, said
        os.write(master, b"n\n")
        _, err = p.communicate(timeout=60)
    finally:
        os.close(master)
    assert p.returncode == 0, err
    assert "nothing deleted: the answer was not yes" in err
    assert "Aborted" not in err
    assert sorted(os.listdir(dshm(Path(root), POD_A[2]))) == before


def test_a_tmpfs_of_no_pod_is_said_so_not_dashed(tmp_path: Path) -> None:
    """Human output has no ``-`` for an unknown figure: the host's /dev/shm is "no pod" (raw keeps its field)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = tmp_path / "node"
    shm = root / "dev" / "shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "smgshm-test", str(shm)], check=True)
    try:
        text = run_cli("gc", "--node", "--node-root", str(root)).stdout
        assert f"no pod, host /dev/shm: {shm}" in text, text
        assert "pod -" not in text
        text = run_cli("doctor", "--node", "--node-root", str(root)).stdout
        assert "no pod, host /dev/shm" in text, text
        assert "pod -" not in text
        for command in ("gc", "doctor"):  # -q and nothing failed: nothing at all (a cron line)
            quiet = run_cli("-q", command, "--node", "--node-root", str(root))
            assert (quiet.stdout, quiet.stderr) == ("", ""), command
    finally:
        subprocess.run(["umount", str(shm)], check=True)


def test_a_tmpfs_that_vanishes_mid_run_is_reported_alone_and_the_others_judged(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pod B's tmpfs is unmounted between the look and its scan (its pod deleted), at every run: it is
    reported for itself, pod A's leak is still judged, and NPD says the problem (1), not the run's failure."""
    from smgshm.core.node import scan

    root = node["root"]
    b_dir = dshm(Path(root), POD_B[2])
    real = scan.look

    def mounted() -> bool:
        return os.stat(b_dir).st_dev != os.stat(b_dir.parent).st_dev

    def look_then_vanish(where: str, pids: Any = None, **kw: Any) -> Any:
        if not mounted():  # a pod B tmpfs again for this run's look
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(b_dir)], check=True, timeout=30)
        seen = real(where, pids, **kw)
        subprocess.run(["umount", "-l", str(b_dir)], check=True, timeout=30)
        return seen

    monkeypatch.setattr(scan, "look", look_then_vanish)
    try:
        doc = run_cli("--json", "gc", "--node", "--node-root", root).json
        npd = run_cli("gc", "--node", "--node-root", root, "--check", "--npd", exit=1).stdout
        text = run_cli("gc", "--node", "--node-root", root).stdout
    finally:
        if not mounted():  # for the fixture's own unmount
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(b_dir)], check=True, timeout=30)
    blocks = pod_blocks(doc)
    a, b = blocks[POD_A[2]], blocks[POD_B[2]]
    assert (a["scan_error"], a["scan_failure"]) == (None, None)
    assert [s["state"] for s in a["segments"]] == ["leaked"]
    assert b["gone"] is True
    assert "changed since the node was looked at" in b["scan_error"], b["scan_error"]
    assert b["scan_failure"] == "changed"  # the cause code, as the exporter's reason label
    assert b["segments"] == []
    assert npd.startswith("gc: 1 leaked"), npd
    assert "gone since the look (unmounted)" in text


def test_a_tmpfs_that_cannot_be_read_keeps_the_check_from_passing(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pod B's tmpfs, still mounted, cannot be scanned: reported for itself; pod A's leak still fails the
    check (NPD 1); with no leak elsewhere the check is inconclusive (6; NPD 2), never a pass."""
    from smgshm.core.errors import HostError
    from smgshm.core.node import scan

    root = node["root"]
    b_dir = str(dshm(Path(root), POD_B[2]))
    real = scan.TmpfsScan.make_judge

    def refused(self: Any) -> Any:
        if self.tmpfs.place.path == b_dir:
            self.close()
            raise HostError("permission denied listing the shm dir", path=b_dir)
        return real(self)

    monkeypatch.setattr(scan.TmpfsScan, "make_judge", refused)
    b = pod_blocks(run_cli("--json", "gc", "--node", "--node-root", root, "--check", exit=3).json)[POD_B[2]]
    assert (b["gone"], b["segments"]) == (False, [])
    assert "permission denied" in b["scan_error"]
    assert run_cli("gc", "--node", "--node-root", root, "--check", "--npd", exit=1).stdout.startswith("gc: 1 leaked")
    run_cli("gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes")  # pod A's leak reaped
    doc = run_cli("--json", "gc", "--node", "--node-root", root, "--check", exit=6).json
    assert any("could not be scanned" in w for w in doc["warnings"]), doc["warnings"]
    npd = run_cli("gc", "--node", "--node-root", root, "--check", "--npd", exit=2).stdout
    assert "could not be scanned" in npd
