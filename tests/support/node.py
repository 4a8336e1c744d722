"""A node laid out under a private root, as the kubelet lays it out, for the node view's tests (gc --node,
doctor --node): pods' memory emptyDirs as real tmpfs mounts, their pod log dirs, and each pod's processes in
their own mount and pid namespaces (unshare), with the pod's tmpfs bound at their /dev/shm."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, mounted_tmpfs

needs_root_and_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1) for mounts and namespaces"
)

POD_A = ("team-a", "engine-0", "aaaaaaaa-0000-4000-8000-00000000000a")  # its producer died
POD_B = ("team-b", "gateway-0", "bbbbbbbb-0000-4000-8000-00000000000b")  # its producer lives
HIDDEN = 1 << 20

# Runs as pid 1 of the pod's pid namespace, with the pod's tmpfs at /dev/shm. "dead": a child (a small
# pid there) writes its segment and exits. "live": pid 1 writes its own segment, then maps a file on the
# tmpfs and unlinks it (hidden bytes). "gateway": pid 1 titles itself as SMG's gateway does and writes nothing.
# "hold=N": a child alive with pid N there. Then it says ready and waits for stdin to close.
POD_MAIN = r"""
import mmap, os, sys, time
def segment():
    name = f"/dev/shm/smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0"
    with open(name, "wb") as f:
        f.write(b"\x5a" * 8192)
    return name
if sys.argv[1] == "dead":
    child = os.fork()
    if child == 0:
        segment()
        os._exit(0)
    os.waitpid(child, 0)
    with open("/dev/shm/sem.mp-other", "wb") as f:
        f.write(b"x" * 4096)
elif sys.argv[1].startswith("hold="):  # a child alive with that pid here (forks until one has it)
    want = int(sys.argv[1][5:])
    for _ in range(200):
        child = os.fork()
        if child == 0:
            if os.getpid() == want:
                sys.stdin.read()
            os._exit(0)
        if child == want:
            break
        os.waitpid(child, 0)
elif sys.argv[1] == "gateway":  # SMG's gateway retitles itself smg::router (setproctitle sets comm too)
    with open("/proc/self/comm", "w") as f:
        f.write("smg::router")
else:
    segment()
    fd = os.open("/dev/shm/torch_hidden", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, HIDDEN)
    m = mmap.mmap(fd, HIDDEN)
    m[:] = b"\x01" * HIDDEN
    os.close(fd)
    os.unlink("/dev/shm/torch_hidden")
print(os.getpid(), flush=True)
sys.stdin.read()
""".replace("HIDDEN", str(HIDDEN))


def dshm(root: Path, uid: str) -> Path:
    return root / "var/lib/kubelet/pods" / uid / "volumes/kubernetes.io~empty-dir/dshm"


def start_pod(children: Children, dshm: Path, mode: str) -> subprocess.Popen[str]:
    """The pod's pid 1 in new pid and mount namespaces, its /dev/shm the pod's tmpfs. The mount
    namespace is made inside the new pid namespace (a second unshare, as its pid 1), so the first
    unshare, left in the host's pid namespace as a runtime's shim is, keeps the host's mounts: had
    it the pod's /dev/shm, the host's namespace would use the tmpfs too, and the view would rightly
    call every pid that both namespaces have unknown."""
    script = 'mount --bind "$0" /dev/shm && mount -t proc proc /proc && exec "$1" -c "$2" "$3"'
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
        str(dshm),
        sys.executable,
        POD_MAIN,
        mode,
    ]
    p = children.spawn(argv, stdin=subprocess.PIPE)
    assert p.stdout is not None
    line = p.stdout.readline()  # its pid inside: 1
    assert line.strip() == "1", (line, p.stderr.read() if p.poll() is not None else "")  # type: ignore[union-attr]
    return p


@contextlib.contextmanager
def laid_out(
    root: Path, pods: list[tuple[tuple[str, str, str], str, str]]
) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Pods under the node ``root``, each ``((namespace, name, uid), tmpfs size, its pid 1's mode)``: their
    emptyDir ``dshm`` mounted, their log dir made, their pid 1 started (``POD_MAIN``'s modes); yields each
    pod's pid 1 by uid. Every process, mount and dir is gone at the end."""
    reg = Children()
    with contextlib.ExitStack() as stack:
        for (ns, name, uid), size, _mode in pods:
            stack.enter_context(mounted_tmpfs(dshm(root, uid), size))
            (root / "var/log/pods" / f"{ns}_{name}_{uid}").mkdir(parents=True)
        stack.callback(reg.reap)  # before the unmounts: no process keeps a tmpfs busy
        yield {uid: start_pod(reg, dshm(root, uid), mode) for (_ns, _name, uid), _size, mode in pods}
    shutil.rmtree(root)


def blocks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """gc --node --json's tmpfs blocks of pods, by pod uid."""
    return {t["pod_uid"]: t for t in doc["result"]["tmpfs"] if t["pod_uid"]}


@contextlib.contextmanager
def two_pods(root: Path) -> Iterator[dict[str, Any]]:
    """Pod A (its producer died) and pod B (pid 1 lives, its own segment) under the private node ``root``;
    every mount, process and dir gone at the end."""
    with laid_out(root, [(POD_A, "16m", "dead"), (POD_B, "16m", "live")]) as pods:
        yield {"root": str(root), "a": pods[POD_A[2]], "b": pods[POD_B[2]]}


@contextlib.contextmanager
def in_pod_cgroup(pid: int, pod_uid: str, top_name: str) -> Iterator[None]:
    """``pid`` in a cgroup of the pod (cgroupfs driver's path, pids hierarchy, below ``top_name``: one per test
    module, so concurrent modules never share it), back at the root at the end."""
    top = Path("/sys/fs/cgroup/pids") / top_name
    leaf = top / f"pod{pod_uid}" / "c0"
    leaf.mkdir(parents=True)
    try:
        (leaf / "cgroup.procs").write_text(f"{pid}\n")
        yield
    finally:
        with contextlib.suppress(OSError):
            Path("/sys/fs/cgroup/pids/cgroup.procs").write_text(f"{pid}\n")
        for d in (leaf, leaf.parent, top):
            with contextlib.suppress(OSError):
                d.rmdir()


def _pid1_unreadable() -> bool:
    """This VM's own pid 1 lives outside our user namespace: even root cannot read its root (EACCES)."""
    try:
        os.readlink("/proc/1/root")
    except PermissionError:
        return True
    except OSError:
        return False
    return False


PID1_UNREADABLE = _pid1_unreadable()
