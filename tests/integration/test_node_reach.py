"""The node view's one rule for which pid namespaces judge a tmpfs (core/node/reach.py), on hand-made pods
(tests/support/node.py): a process that reaches a pod's tmpfs any way but its /dev/shm (a mount elsewhere,
its cwd, an open fd) judges its names too; a tmpfs no process reaches is leaked; a process that cannot be
read keeps its own pod's names unknown, and only its pod's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from smgshm.core.host.mounts import mount_of, read_mounts
from smgshm.core.host.proc import ns_pids
from tests.conftest import Children, run_cli, smgshm_argv, wait_for
from tests.support.node import POD_A, POD_B, blocks, dshm, in_pod_cgroup, needs_root_and_unshare, two_pods

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = [needs_root_and_unshare, pytest.mark.trust]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with two_pods(tmp_path / "node") as pods:
        yield pods


# A sidecar of pod B in pid and mount namespaces of its own, the pod's tmpfs bound at /mnt (not its
# /dev/shm). It burns a few pids, so its writer's pid is one pod B's namespace does not have; the writer
# writes a segment under /mnt, then keeps the tmpfs as its mode says: "mount" (bound there), "cwd" (its
# cwd, the mount lazily detached), "fd" (an open dir fd, detached too) or "thread" (one thread's own cwd,
# detached too), and prints "<pid> <name>".
SIDECAR = r"""
import os, subprocess, sys, time
mode = sys.argv[1]
for _ in range(5):
    if os.fork() == 0:
        os._exit(0)
    os.wait()
if os.fork() == 0:
    name = f"smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0"
    with open("/mnt/" + name, "wb") as f:
        f.write(b"s" * 8192)
    if mode == "cwd":
        os.chdir("/mnt")
    elif mode == "fd":
        keep = os.open("/mnt", os.O_RDONLY | os.O_DIRECTORY)
    elif mode == "thread":  # a thread with a cwd of its own (unshare CLONE_FS) there; the leader's is /
        import ctypes, threading
        libc, ready = ctypes.CDLL(None, use_errno=True), threading.Event()
        def hold():
            assert libc.unshare(0x200) == 0, ctypes.get_errno()
            os.chdir("/mnt")
            ready.set()
            threading.Event().wait()
        threading.Thread(target=hold, daemon=True).start()
        ready.wait()
    if mode != "mount":
        subprocess.run(["umount", "-l", "/mnt"], check=True, cwd="/")
    print(os.getpid(), name, flush=True)
    sys.stdin.read()
    os._exit(0)
os.wait()
"""


def _sidecar(reg: Children, tmpfs: Path, mode: str) -> tuple[int, str]:
    script = 'mount --bind "$0" /mnt && mount -t proc proc /proc && exec "$1" -c "$2" "$3"'
    argv = ["unshare", "--pid", "--fork", "unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    p = reg.spawn([*argv, str(tmpfs), sys.executable, SIDECAR, mode], stdin=subprocess.PIPE)
    assert p.stdout is not None
    line = p.stdout.readline().split()
    assert len(line) == 2, (line, p.stderr.read() if p.poll() is not None and p.stderr else "")
    return int(line[0]), line[1]


@pytest.mark.parametrize("mode", ["mount", "cwd", "fd", "thread"])
def test_a_producer_reaching_the_tmpfs_elsewhere_judges_it_and_is_never_deleted(
    node: dict[str, Any], mode: str
) -> None:
    root = node["root"]
    tmpfs = dshm(Path(root), POD_B[2])
    reg = Children()
    try:
        pid, name = _sidecar(reg, tmpfs, mode)
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
        assert (tmpfs / name).exists(), "a live producer's segment was deleted"
    finally:
        reg.reap()
    b = blocks(doc)[POD_B[2]]
    assert pid > 1
    assert len(b["pid_namespaces"]) == 2  # pod B's pid 1 and the sidecar's
    (seg,) = [s for s in b["segments"] if s["name"] == name]
    assert seg["state"] == "unknown", seg  # alive in the sidecar's namespace, absent in B's: kept
    assert b["deleted"] == []


# A producer in pid and mount namespaces of its own, its own /proc, pod B's tmpfs lazily unmounted from its
# table, holding an inherited fd to a dir of the host's mount namespace (runc's CVE-2024-21626 leak). It
# burns a few pids (its writer's pid is one pod B's namespace does not have), and its writer writes a
# segment into pod B's tmpfs through openat(fd, "../<path>"), keeps the fd, and prints "<pid> <name>".
ESCAPE = r"""
import os, subprocess, sys, time
d, fd = sys.argv[1], int(sys.argv[2])
subprocess.run(["umount", "-l", d], check=True, cwd="/")
for _ in range(5):
    if os.fork() == 0:
        os._exit(0)
    os.wait()
if os.fork() == 0:
    name = f"smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0"
    up = "../" * 32  # past the host's root: .. stays there
    w = os.open(up + d.lstrip("/") + "/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd)
    os.write(w, b"e" * 8192)
    os.close(w)
    print(os.getpid(), name, flush=True)
    sys.stdin.read()
    os._exit(0)
os.wait()
"""


def test_a_dir_handle_into_the_hosts_mount_namespace_judges_and_is_never_deleted(node: dict[str, Any]) -> None:
    """Its table, its /dev/shm, its cwd and root show nothing of pod B's tmpfs: only the fd, on a mount of the
    host's mount namespace (where every pod's tmpfs is mounted at the kubelet's path), leads there. Its pid
    namespace judges the tmpfs too, so its segment is unknown (its writer lives there), never deleted."""
    root = node["root"]
    tmpfs = dshm(Path(root), POD_B[2])
    reg = Children()
    etc = os.open("/etc", os.O_RDONLY | os.O_DIRECTORY)  # a dir of this (the host's) mount namespace
    try:
        inner, name, _writer = _hidden_writer(reg, tmpfs, ESCAPE, str(etc), pass_fds=(etc,))
        os.close(etc)
        etc = -1
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
        assert (tmpfs / name).exists(), "a live producer's segment was deleted"
    finally:
        if etc >= 0:
            os.close(etc)
        reg.reap()
    b = blocks(doc)[POD_B[2]]
    assert inner > 1
    assert os.readlink(f"/proc/{os.getpid()}/ns/pid") not in b["pid_namespaces"]
    assert len(b["pid_namespaces"]) == 2, b["pid_namespaces"]  # pod B's pid 1 and the producer's
    (seg,) = [s for s in b["segments"] if s["name"] == name]
    assert seg["state"] == "unknown", seg  # alive in the producer's namespace, absent in B's: kept
    assert b["deleted"] == []


def _hidden_writer(
    reg: Children, tmpfs: Path, code: str, *args: str, pass_fds: tuple[int, ...] = ()
) -> tuple[int, str, int]:
    """A producer in a pid and mount namespace of its own (``code`` run by Python there, with ``args``) that
    writes a segment into ``tmpfs`` by a way its mount table, /dev/shm, cwd and root do not show (asserted):
    (its pid there, the segment's name, its pid here)."""
    dev = os.stat(tmpfs).st_dev
    # The first unshare stays in the host's mount namespace (a runtime's shim); the second, pid 1 of the new
    # pid namespace, makes the mount namespace.
    script = 'mount -t proc proc /proc && exec "$1" -c "$2" "$0" "$3"'
    argv = ["unshare", "--pid", "--fork", "unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    p = reg.spawn([*argv, str(tmpfs), sys.executable, code, *args], stdin=subprocess.PIPE, pass_fds=pass_fds)
    assert p.stdout is not None
    line = p.stdout.readline().split()
    assert len(line) == 2, (line, p.stderr.read() if p.poll() is not None and p.stderr else "")
    inner, name = int(line[0]), line[1]
    assert (tmpfs / name).exists(), "it wrote into the tmpfs"
    writer = wait_for(lambda: _host_pid_of(p.pid, inner), what="the writer's pid here")
    assert mount_of(read_mounts(f"/proc/{writer}/mountinfo"), dev) is None, "its table shows no tmpfs"
    for what in ("cwd", "root", "root/dev/shm"):
        assert os.stat(f"/proc/{writer}/{what}").st_dev != dev
    return inner, name, writer


def _host_pid_of(top: int, inner: int) -> int | None:
    """The pid here of the process under ``top`` whose pid in its own namespace is ``inner``."""
    for k in psutil.Process(top).children(recursive=True):
        with contextlib.suppress(OSError):
            if ns_pids(k.pid)[-1:] == [inner]:
                return k.pid
    return None


def _gc_without_ptrace(root: str) -> dict[str, Any]:
    """gc --node as root without CAP_SYS_PTRACE: another uid's processes cannot be read."""
    argv = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(
        [*argv, *smgshm_argv("--json", "gc", "--node", "--node-root", root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_an_unreadable_process_keeps_only_its_own_pods_names_unknown(node: dict[str, Any]) -> None:
    """Pod A's container is gone (nobody reaches its tmpfs) and its segment is uid 65534's. A process of
    uid 65534 that smgshm cannot read, in pod A's cgroup, may reach it: unknown, said why. Out of any
    pod's cgroup it may be the host's or a container of another kind (its mount namespace, which would
    tell, is what cannot be read): unknown still. In another pod's cgroup it reaches pod A's tmpfs not
    at all: the segment is leaked."""
    root = node["root"]
    tmpfs = dshm(Path(root), POD_A[2])
    (name,) = [n for n in os.listdir(tmpfs) if n.startswith("smg-")]
    os.chown(tmpfs / name, 65534, 65534)
    node["a"].stdin.close()
    wait_for(lambda: node["a"].poll() is not None, what="pod A's pid 1 to exit")
    reg = Children()
    try:
        other = reg.spawn(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "600"])
        with in_pod_cgroup(other.pid, POD_A[2], "smgshm-test-kubepods"):
            doc = _gc_without_ptrace(root)
        a = blocks(doc)[POD_A[2]]
        (seg,) = [s for s in a["segments"] if s["name"] == name]
        assert seg["state"] == "unknown", seg
        assert "uid 65534" in seg["reason"]
        assert "65534's processes could not be read" in a["liveness_note"], a["liveness_note"]
        # the same process out of every pod's cgroup: it may be anywhere, so still in doubt
        a = blocks(_gc_without_ptrace(root))[POD_A[2]]
        (seg,) = [s for s in a["segments"] if s["name"] == name]
        assert seg["state"] == "unknown", seg
        # in another pod's cgroup: it reaches no tmpfs of pod A's
        with in_pod_cgroup(other.pid, POD_B[2], "smgshm-test-kubepods"):
            a = blocks(_gc_without_ptrace(root))[POD_A[2]]
    finally:
        reg.reap()
    (seg,) = [s for s in a["segments"] if s["name"] == name]
    assert seg["state"] == "leaked", seg


def test_smgshms_own_names_are_judged_in_the_hosts_pid_namespace_too(node: dict[str, Any]) -> None:
    """smgshm writes its own names wherever --shm-dir says, from the host too: one carrying this (live)
    process's pid, which pod B's namespace has not, is never called dead; one of a dead host pid is leaked."""
    from smgshm.core.names import new_segment_name, payload_name

    root = node["root"]
    tmpfs = dshm(Path(root), POD_B[2])
    live = tmpfs / new_segment_name()
    live.write_bytes(b"o" * 4096)
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    dead = tmpfs / payload_name(int(gone.stdout), time.time_ns(), 0)
    dead.write_bytes(b"o" * 4096)
    try:
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
        assert live.exists(), "a live host process's segment was deleted"
    finally:
        live.unlink(missing_ok=True)
    segs = {s["name"]: s for s in blocks(doc)[POD_B[2]]["segments"]}
    assert segs[live.name]["state"] == "unknown", segs[live.name]
    assert segs[dead.name]["state"] == "leaked", segs[dead.name]
    assert not dead.exists()


# A producer in pid and mount namespaces of its own, its own /proc, holding an open_tree(2) fd of its whole
# tree (OPEN_TREE_CLONE | AT_RECURSIVE): a detached copy, in no mount namespace's table, that keeps a copy of
# pod B's tmpfs mount after it is lazily unmounted from its own table. It burns a few pids (its writer's pid
# is one pod B's namespace does not have), and its writer writes a segment into pod B's tmpfs through that fd
# only, keeps it, and prints "<pid> <name>".
DETACHED = r"""
import ctypes, os, subprocess, sys, time
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
tree = libc.syscall(428, -100, b"/", 1 | 0o2000000 | 0x8000)  # open_tree(AT_FDCWD, "/", CLONE|CLOEXEC|RECURSIVE)
assert tree >= 0, os.strerror(ctypes.get_errno())
subprocess.run(["umount", "-l", d], check=True, cwd="/")
for _ in range(5):
    if os.fork() == 0:
        os._exit(0)
    os.wait()
if os.fork() == 0:
    name = f"smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0"
    w = os.open(d.lstrip("/") + "/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=tree)
    os.write(w, b"d" * 8192)
    os.close(w)
    print(os.getpid(), name, flush=True)
    sys.stdin.read()
    os._exit(0)
os.wait()
"""


@pytest.mark.pidns
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="open_tree(2)'s number is x86_64's here")
def test_a_dir_handle_on_a_detached_mount_judges_every_tmpfs_and_is_never_deleted(node: dict[str, Any]) -> None:
    """Issue #31 item 1, the node view: the producer's table, /dev/shm, cwd and root show nothing of pod B's
    tmpfs, and the mount its fd is on is in no table (detached), so where ``..`` from it leads cannot be told
    from the tables. It counts as a way into every tmpfs (host/dirhandle.py's handle_ways, the host walk's
    rule too): its pid namespace judges pod B's tmpfs, where its live writer's segment is unknown, not leaked,
    and gc --node --delete keeps it (it was called leaked and deleted)."""
    root = node["root"]
    tmpfs = dshm(Path(root), POD_B[2])
    reg = Children()
    try:
        inner, name, writer = _hidden_writer(reg, tmpfs, DETACHED)
        producer_ns = os.readlink(f"/proc/{writer}/ns/pid")
        doc = run_cli("--json", "gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes").json
        assert (tmpfs / name).exists(), "a live producer's segment was deleted"
    finally:
        reg.reap()
    b = blocks(doc)[POD_B[2]]
    assert inner > 1
    assert producer_ns in b["pid_namespaces"], b["pid_namespaces"]
    (seg,) = [s for s in b["segments"] if s["name"] == name]
    assert seg["state"] == "unknown", seg  # alive in the producer's namespace, absent in B's: kept
    assert "a dir on a detached mount" in seg["reason"], seg  # its namespace may not reach B: judged weakly
    assert "leaked" not in json.dumps(seg)
    assert b["deleted"] == []
    assert producer_ns in blocks(doc)[POD_A[2]]["pid_namespaces"]  # what it reaches cannot be told: every tmpfs
