"""gc does not trust pids when another pid namespace holds a way into this pid namespace's procfs.

A producer in its own pid and mount namespace drops the shared tmpfs from its mounts and the
host's procfs from its /proc (a procfs of its own namespace there), keeps one way into the host's
procfs, and writes its segment *through* that way, under a pid that no process has on the host:
an inherited dir fd to a host /proc/<pid> or to the host's /proc itself, the same held as its cwd
or only in one thread's fd table, the host's /proc (or only its /proc/<pid>) bind-mounted
somewhere, or an fd to a mount namespace that has the host's /proc. Nothing of the tmpfs is in
its mounts, cwd, root, fds or maps, yet ``openat(fd, "root/<dir>/...")`` writes there: gc must
leave the segment unknown. The controls hold only their own procfs (whole, or the read-only
binds of /proc/sys, /proc/bus, /proc/irq and /proc/sysrq-trigger a container runtime makes, or a
bound /proc/<pid> of their own): they change nothing, and gc judges as it always did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from smgshm.core.host.mounts import mount_of, read_mounts
from smgshm.core.host.pidtrust import judge_trust
from tests.conftest import Children, mounted_tmpfs, run_cli
from tests.support.cli_gc import dead_pid, deletions, first_line, kill_and_reap, segs
from tests.support.gc_trust import gc_keeps

Proc = subprocess.Popen[str]

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"),
    pytest.mark.timeout(60),
    pytest.mark.trust,
]

# argv: the shared dir, how it keeps a way in, the pid to name its segment with, the host pid whose
# /proc dir leads back to the dir (this test's), two spare dirs, the inherited fd (-1: none).
PRODUCER = r"""
import ctypes, os, signal, subprocess, sys, threading, time
d, how, pid, host, spot, aux, keep = sys.argv[1:3] + [int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6],
                                                       int(sys.argv[7])]
libc = ctypes.CDLL(None, use_errno=True)
name = f"smg-tokenspeed-{pid}-{time.time_ns()}-0"

def sh(*argv):
    subprocess.run(argv, check=True)

def write(path, dir_fd=None):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
    os.write(fd, b"y" * 65536)
    os.close(fd)

control = how.startswith("own")
if control:
    write(os.path.join(d, name))  # while it still can: nothing leads back once the tmpfs is gone
if how == "mount":
    sh("mount", "--bind", "/proc", spot)
elif how == "part":
    sh("mount", "--bind", f"/proc/{host}", spot)
sh("umount", "-l", d)  # the shared tmpfs leaves its mounts
sh("umount", "-l", "/proc")  # the host's procfs too: a procfs of its own pid namespace at /proc
sh("mount", "-t", "proc", "proc", "/proc")
if how == "own-binds":  # what container runtimes make of /proc, and a dir of it held
    for part in ("sys", "bus", "irq", "sysrq-trigger"):
        if os.path.exists(f"/proc/{part}"):
            sh("mount", "--bind", f"/proc/{part}", f"/proc/{part}")
            sh("mount", "-o", "remount,bind,ro", f"/proc/{part}")
    keep = os.open("/proc/1", os.O_RDONLY | os.O_DIRECTORY)
    os.chdir("/proc/sys/kernel")
elif how == "own-part":  # a /proc/<pid> of its own namespace bound without the whole: ns/pid tells
    sh("mount", "-t", "proc", "proc", aux)
    sh("mount", "--bind", f"{aux}/1", spot)
    sh("umount", aux)
    os.chdir(f"{spot}/task")

if how in ("fd", "thread-fd"):
    write(f"root{d}/{name}", dir_fd=keep)  # the host /proc/<pid> dir: its root, and the tmpfs there
elif how == "fd-root":
    write(f"{host}/root{d}/{name}", dir_fd=keep)  # the host's /proc itself
elif how == "cwd":
    os.fchdir(keep)
    os.close(keep)
    write(f"root{d}/{name}")
elif how == "mount":
    write(f"{spot}/{host}/root{d}/{name}")
elif how == "part":
    write(f"{spot}/root{d}/{name}")
elif how == "handle":  # join the mount namespace that has the host's /proc, write, leave
    child = os.fork()
    if child == 0:
        code = 1
        try:
            assert libc.setns(keep, 0x00020000) == 0, ctypes.get_errno()  # CLONE_NEWNS
            write(f"/proc/{host}/root{d}/{name}")
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(child, 0)[1] == 0, "the join did not write"
if how == "thread-fd":  # only a thread's own fd table keeps it
    ready = threading.Event()
    def hold():
        assert libc.unshare(0x400) == 0, ctypes.get_errno()  # CLONE_FILES: a copy, with the fd
        ready.set()
        while True:
            time.sleep(3600)
    threading.Thread(target=hold, daemon=True).start()
    ready.wait()
    os.close(keep)
print(name, flush=True)
signal.pause()
"""

WAYS = ["fd", "fd-root", "cwd", "thread-fd", "mount", "part", "handle"]
CONTROLS = ["own", "own-binds", "own-part"]


def _produce(children: Children, d: str, tmp_path: Path, how: str) -> tuple[int, str, list[int], list[Proc]]:
    """The producer's host pid, its segment, the pids gc's core is to look at, and what to kill."""
    spot, aux = tmp_path / "spot", tmp_path / "aux"
    spot.mkdir()
    aux.mkdir()
    look: list[int] = []
    spawned: list[Proc] = []
    keep = -1
    if how in ("fd", "cwd", "thread-fd"):
        keep = os.open(f"/proc/{os.getpid()}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    elif how == "fd-root":
        keep = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    elif how == "handle":
        # A mount namespace of this pid namespace with the host's /proc and without the tmpfs: the
        # walk skips its process (its pids are gc's), and its table shows nothing of the tmpfs.
        helper, _ = first_line(
            children,
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"umount -l {d} && echo ready && exec sleep 600",
            ],
        )
        spawned.append(helper)
        keep = os.open(f"/proc/{helper.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        look.append(helper.pid)
    try:
        argv = [
            "unshare",
            "--pid",
            "--fork",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            PRODUCER,
            d,
            how,
            str(dead_pid(children)),
            str(os.getpid()),
            str(spot),
            str(aux),
            str(keep),
        ]
        p = children.spawn(argv, pass_fds=(keep,) if keep >= 0 else ())
    finally:
        if keep >= 0:
            os.close(keep)
    spawned.append(p)
    assert p.stdout is not None
    name = p.stdout.readline().strip()
    assert name, f"the producer exited {p.wait(timeout=10)}: {p.stderr.read() if p.stderr else ''}"
    host_pid = next(k.pid for k in psutil.Process(p.pid).children(recursive=True) if k.name().startswith("python"))
    return host_pid, name, [host_pid, *look], spawned


def _nothing_of_it_in_view(host_pid: int, d: str) -> None:
    """The producer's mounts, cwd, root and fds show neither the tmpfs nor the host's procfs."""
    dev, proc_dev = os.stat(d).st_dev, os.stat("/proc").st_dev
    table = read_mounts(f"/proc/{host_pid}/mountinfo")
    assert mount_of(table, dev) is None, "its mount table no longer shows the tmpfs"
    for what in ("cwd", "root"):
        assert os.stat(f"/proc/{host_pid}/{what}").st_dev != dev
    for fd in os.listdir(f"/proc/{host_pid}/fd"):
        assert os.stat(f"/proc/{host_pid}/fd/{fd}").st_dev != dev
    own = [m for m in table if m.point == "/proc"]
    assert own, "it mounts a procfs at /proc"
    assert own[-1].dev != proc_dev, "its /proc is a procfs of its own"


@pytest.mark.slow
@pytest.mark.parametrize("how", WAYS)
def test_a_way_into_this_pid_namespaces_procfs_makes_pids_untrusted(
    children: Children, tmp_path: Path, how: str
) -> None:
    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        host_pid, name, look, spawned = _produce(children, d, tmp_path, how)
        path = os.path.join(d, name)
        assert os.path.exists(path), "it wrote its segment through its way into the host's procfs"
        assert not psutil.pid_exists(int(name.split("-")[2])), "its segment's pid is dead here"
        _nothing_of_it_in_view(host_pid, d)

        trust = judge_trust(d, pids=look)
        assert trust.trusted is False, trust.note
        assert "a procfs of this pid namespace" in trust.note
        assert f"pid {host_pid}, in another pid namespace" in trust.note

        gc_keeps(d, name)
        for p in spawned:
            kill_and_reap(p)  # the namespace's init too, before the tmpfs is unmounted


@pytest.mark.parametrize("how", CONTROLS)
def test_a_containers_own_procfs_changes_nothing(children: Children, tmp_path: Path, how: str) -> None:
    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        host_pid, name, look, spawned = _produce(children, d, tmp_path, how)
        path = os.path.join(d, name)
        _nothing_of_it_in_view(host_pid, d)
        if how == "own-binds":
            table = read_mounts(f"/proc/{host_pid}/mountinfo")
            assert any(m.point == "/proc/sys" and m.root == "/sys" and "ro" in m.options.split(",") for m in table)
            assert os.readlink(f"/proc/{host_pid}/cwd") == "/proc/sys/kernel"
        elif how == "own-part":
            assert any(m.root == "/1" and m.fstype == "proc" for m in read_mounts(f"/proc/{host_pid}/mountinfo"))

        trust = judge_trust(d, pids=look)
        assert trust.trusted is True, trust.note

        # As before: its segment's pid is dead here and nothing else can write there, so it is
        # leaked and deleted (unless another job's container on this machine makes gc doubt).
        doc = run_cli("--json", "gc", "--shm-dir", d, "--delete", "--min-age", "0", "--yes").json
        if doc["result"]["liveness_trusted"]:
            assert segs(doc)[name]["state"] == "leaked"
            assert deletions(doc)[name]["deleted"]
            assert not os.path.exists(path)
        else:
            assert f"pid {host_pid}," not in doc["result"]["liveness_note"]
        for p in spawned:
            kill_and_reap(p)
