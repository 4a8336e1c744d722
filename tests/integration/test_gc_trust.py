"""Pid-namespace trust is decided by the filesystem: a producer that sees the tmpfs at another path counts.

The "container" is ``unshare --pid --fork --mount``: a private mount namespace in which the
scratch tmpfs dir is bind-mounted at another path and /dev/shm is a fresh tmpfs, so neither
``/proc/P/root/<dir>`` nor ``/proc/P/root/dev/shm`` shows the shared filesystem; only its
mount table does. Its producer's pid is made equal to a pid that is dead on the host
(``ns_last_pid``), so a gc that trusted pids would judge its live segment leaked and delete it.
The core checks pass ``pids`` so that other processes on this shared machine cannot decide them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from smgshm.core.host.mounts import mount_of, parse_mounts, read_mounts
from smgshm.core.host.pidtrust import judge_trust
from tests.conftest import Children, proc_state, run_cli, wait_for
from tests.support.cli_gc import WRITER, dead_pid, deletions, first_line, kill_and_reap, segs
from tests.support.gc_trust import gc_keeps

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"),
    pytest.mark.timeout(60),
    pytest.mark.trust,
]


def _container(children: Children, shared: str, at: str | None, pid: int) -> tuple[int, str]:
    """A producer in its own pid and mount namespace with its pid set to ``pid``; (its host pid, its segment).

    ``at``: where it bind-mounts ``shared`` (None: it writes into its own private /dev/shm).
    """
    where = at or "/dev/shm"
    steps = [f"mount --bind {shared} {at}"] if at else []
    steps += [
        # A procfs of its own pid namespace, and the host's gone, as a container has: the host's
        # would lead it to every filesystem (tests/test_gc_procfs.py).
        "umount -l /proc",
        "mount -t proc proc /proc",
        # Its own /dev/shm (the host's unmounted there, not just shadowed): the old /proc/P/root
        # checks find nothing, and only the bind mount shows the shared tmpfs.
        "umount -l /dev/shm",
        "mount -t tmpfs -o size=1m tmpfs /dev/shm",
        f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid",  # the next fork in this pid namespace gets pid
        f"{sys.executable} -c '{WRITER}' {where}",  # a child, not exec: pid 1 would read as the host's init
    ]
    argv = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "sh", "-c", " && ".join(steps)]
    p, name = first_line(children, argv)
    assert int(name.split("-")[2]) == pid, f"the producer got pid {name.split('-')[2]} in its namespace, not {pid}"

    def producer() -> int | None:
        kids = psutil.Process(p.pid).children(recursive=True)
        return next((k.pid for k in kids if k.name().startswith("python")), None)

    return wait_for(producer, what="the producer's host pid"), name


@pytest.mark.slow
def test_a_producer_seeing_the_tmpfs_at_another_path_makes_pids_untrusted(
    children: Children,
    tmpfs_dir: str,
    tmp_path: Path,
) -> None:
    at = tmp_path / "host-shm"
    at.mkdir()
    host_pid, name = _container(children, tmpfs_dir, str(at), dead_pid(children))
    path = os.path.join(tmpfs_dir, name)
    assert os.path.exists(path), "the bind mount shares the scratch tmpfs"
    assert not psutil.pid_exists(int(name.split("-")[2])), "its pid in its own namespace is dead here"

    # The core, judged by that one process: its mount table shows the shared tmpfs at the other path.
    trust = judge_trust(tmpfs_dir, pids=[host_pid])
    assert trust.trusted is False
    assert str(at) in trust.note
    assert judge_trust(tmpfs_dir, pids=[os.getpid()]).trusted is True, "this namespace alone is trusted"

    # The command: unknown, and --delete keeps the live segment.
    doc = run_cli("--json", "gc", "--shm-dir", tmpfs_dir).json
    assert doc["result"]["liveness_trusted"] is False
    assert "another pid namespace" in doc["result"]["liveness_note"]
    assert segs(doc)[name]["state"] == "unknown"
    doc = run_cli("--json", "gc", "--shm-dir", tmpfs_dir, "--delete", "--min-age", "0", "--yes").json
    assert name not in deletions(doc)
    assert os.path.exists(path), "gc deleted a live producer's segment"


def test_a_container_with_its_own_tmpfs_does_not_count(children: Children, tmpfs_dir: str) -> None:
    host_pid, name = _container(children, tmpfs_dir, None, dead_pid(children))
    assert name not in os.listdir("/dev/shm"), "its /dev/shm is a tmpfs of its own"
    for d in (tmpfs_dir, "/dev/shm"):
        trust = judge_trust(d, pids=[host_pid])
        assert trust.trusted is True, trust.note
    # Its root filesystem is this one's: a dir there could be written by it, so that is untrusted.
    assert judge_trust(os.path.dirname(os.path.abspath(__file__)), pids=[host_pid]).trusted is False


def test_mount_tables_are_read_by_device_and_paths_unescaped() -> None:
    dev = os.makedev(0, 27)
    table = b"22 1 0:5 / /dev rw - devtmpfs udev rw\n30 22 0:27 /smgshm-x /host\\040shm rw,relatime - tmpfs tmpfs rw\n"
    found = mount_of(parse_mounts(table), dev)
    assert found is not None
    assert found.point == "/host shm"
    assert mount_of(parse_mounts(table), os.makedev(0, 28)) is None
    assert mount_of(parse_mounts(b"garbage\n\n"), dev) is None


# A producer that keeps the filesystem without mounting it: it enters the dir, lazily unmounts it
# in its own mount namespace (its mount table then shows nothing), writes its segment, and keeps
# the device only through its cwd, an open dir fd (cwd moved to /) or a mapped file (fd closed).
DETACHED = """
import ctypes, os, signal, subprocess, sys, time
d, how, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.chdir(d)
subprocess.run(["umount", "-l", d], check=True)
name = f"smg-tokenspeed-{pid}-{time.time_ns()}-0"
fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, b"y" * 65536)
os.close(fd)
if how == "fd":
    keep = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    os.chdir("/")
elif how == "map":
    fd = os.open("keep.dat", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"k" * 4096)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    assert libc.mmap(None, 4096, 1, 1, fd, 0) not in (None, ctypes.c_void_p(-1).value)
    os.close(fd)
    os.chdir("/")
print(name, flush=True)
signal.pause()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cwd", "fd", "map"])
def test_a_producer_that_unmounted_the_tmpfs_but_keeps_it_makes_pids_untrusted(
    children: Children, tmp_path: Path, how: str
) -> None:
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        dead = dead_pid(children)
        argv = [
            "unshare",
            "--pid",
            "--fork",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            DETACHED,
            d,
            how,
            str(dead),
        ]
        p, name = first_line(children, argv)
        path = os.path.join(d, name)
        assert os.path.exists(path), "the host still mounts the tmpfs it wrote into"
        kids = psutil.Process(p.pid).children(recursive=True)
        host_pid = next(k.pid for k in [psutil.Process(p.pid), *kids] if k.name().startswith("python"))
        table = read_mounts(f"/proc/{host_pid}/mountinfo")
        assert mount_of(table, os.stat(d).st_dev) is None, "its mount table no longer shows the tmpfs"

        trust = judge_trust(d, pids=[host_pid])
        assert trust.trusted is False, trust.note
        assert {"cwd": "cwd", "fd": "open fd", "map": "mapped file"}[how] in trust.note

        gc_keeps(d, name)
        kill_and_reap(p)  # its group: the namespace's init too, before the tmpfs is unmounted


# A producer whose reach is one thread's only. It writes its segment, sets a thread up to keep the
# filesystem (its own cwd or root after unshare(CLONE_FS), its own fd table after
# unshare(CLONE_FILES) with the dir open, or the shared cwd while the leader thread exits and
# leaves a zombie leader whose /proc/P links read as gone), then lazily unmounts the tmpfs in its
# mount namespace: only /proc/P/task/T shows the device.
THREADED = """
import ctypes, os, signal, subprocess, sys, threading, time
d, how, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
name = f"smg-tokenspeed-{pid}-{time.time_ns()}-0"
fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, b"y" * 65536)
os.close(fd)
ready = threading.Event()
def keep():
    if how in ("cwd", "root", "fd"):
        assert libc.unshare(0x400 if how == "fd" else 0x200) == 0, ctypes.get_errno()  # CLONE_FILES / CLONE_FS
    if how == "root":
        os.chroot(d)
    elif how == "fd":
        kept = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    else:
        os.chdir(d)
    ready.set()
    while True:
        time.sleep(3600)
threading.Thread(target=keep, daemon=True).start()
ready.wait()
subprocess.run(["umount", "-l", d], check=True)
print(name, flush=True)
if how == "zombie-leader":
    libc.pthread_exit(None)
signal.pause()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cwd", "root", "fd", "zombie-leader"])
def test_a_thread_that_alone_keeps_the_tmpfs_makes_pids_untrusted(children: Children, tmp_path: Path, how: str) -> None:
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        dev = os.stat(d).st_dev
        argv = [
            "unshare",
            "--pid",
            "--fork",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            THREADED,
            d,
            how,
            str(dead_pid(children)),
        ]
        p, name = first_line(children, argv)
        path = os.path.join(d, name)
        assert os.path.exists(path), "the host still mounts the tmpfs it wrote into"
        kids = psutil.Process(p.pid).children(recursive=True)
        host_pid = next(k.pid for k in [psutil.Process(p.pid), *kids] if k.name().startswith("python"))
        task = f"/proc/{host_pid}/task"
        keeper = next(t for t in os.listdir(task) if int(t) != host_pid)
        if how == "zombie-leader":
            wait_for(
                lambda: not os.path.lexists(f"/proc/{host_pid}/cwd") or proc_state(host_pid) == "Z",
                what="the leader thread to exit",
            )
            with pytest.raises(FileNotFoundError):
                os.stat(f"/proc/{host_pid}/cwd")  # the process's own links are gone
        else:
            assert os.stat(f"/proc/{host_pid}/cwd").st_dev != dev
            assert os.stat(f"/proc/{host_pid}/root").st_dev != dev
            held = [f for f in os.listdir(f"/proc/{host_pid}/fd") if _dev_of(f"/proc/{host_pid}/fd/{f}") == dev]
            assert not held, "the process's own fd table holds nothing there"
        # The thread is what keeps it: its cwd/root or its own fd table.
        what = "fd" if how == "fd" else "root" if how == "root" else "cwd"
        if what == "fd":
            assert any(_dev_of(f"{task}/{keeper}/fd/{f}") == dev for f in os.listdir(f"{task}/{keeper}/fd"))
        else:
            assert os.stat(f"{task}/{keeper}/{what}").st_dev == dev

        trust = judge_trust(d, pids=[host_pid])
        assert trust.trusted is False, trust.note
        assert f"thread {keeper}'s {'open fd' if what == 'fd' else what}" in trust.note

        gc_keeps(d, name)
        kill_and_reap(p)


def _dev_of(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


# A producer that keeps only a handle to a mount namespace that sees the tmpfs: it writes its
# segment, then unmounts the tmpfs from its own namespace (nothing of it there: no mount, cwd,
# fd or map), keeping an open fd to this test's mount namespace (inherited: "fd"), a pidfd of
# this test's process (inherited: "pidfd"; setns(pidfd, CLONE_NEWNS) joins its namespace) or a
# namespace file bind-mounted in its own namespace of one it made while the tmpfs was still
# there, whose only process then exits ("nsfs"). With setns(2) it can go back and write at
# any time, under a pid of its own namespace.
HANDLE = """
import os, signal, subprocess, sys, time
d, how, pid, spot = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
name = f"smg-tokenspeed-{pid}-{time.time_ns()}-0"
fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, b"y" * 65536)
os.close(fd)
if how == "nsfs":
    # Linux binds a namespace file only into a namespace with a lower id than the one it names
    # (no loops), and ids are handed out in per-CPU batches, so a newer namespace may have a lower
    # one: try a few, and say so (exit 75) if none would do, for the test to start over.
    for _ in range(20):
        s = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
        while open(f"/proc/{s.pid}/comm").read().strip() != "sleep":  # unshare(1) done: its namespace is set up
            time.sleep(0.01)
        bound = subprocess.run(["mount", "--bind", f"/proc/{s.pid}/ns/mnt", spot], capture_output=True).returncode == 0
        s.kill()
        s.wait()
        if bound:
            break
    else:
        sys.exit(75)
subprocess.run(["umount", "-l", d], check=True)
print(name, flush=True)
signal.pause()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fd", "pidfd", "nsfs"])
def test_a_handle_to_a_mount_namespace_that_sees_the_tmpfs_makes_pids_untrusted(
    children: Children, tmp_path: Path, how: str
) -> None:
    from tests.conftest import mounted_tmpfs

    spot = tmp_path / "mnt-ns"
    spot.touch()
    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        dev = os.stat(d).st_dev
        ns_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)  # this namespace: it sees d
        pid_fd = os.pidfd_open(os.getpid())  # this process: its mount namespace sees d
        try:
            for _ in range(10):  # a fresh namespace each time while the binding is refused (exit 75)
                # --mount-proc: its /proc shows its own pids (the namespace file it binds is its child's)
                argv = [
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount",
                    "--propagation",
                    "private",
                    "--mount-proc",
                    sys.executable,
                    "-c",
                    HANDLE,
                    d,
                    how,
                    str(dead_pid(children)),
                    str(spot),
                ]
                p = children.spawn(argv, pass_fds={"fd": (ns_fd,), "pidfd": (pid_fd,)}.get(how, ()))
                assert p.stdout is not None
                name = p.stdout.readline().strip()
                if name or p.wait(timeout=30) != 75:
                    break
        finally:
            os.close(ns_fd)
            os.close(pid_fd)
        assert name, f"the producer exited {p.wait(timeout=10)}: {p.stderr.read() if p.stderr else ''}"
        kids = psutil.Process(p.pid).children(recursive=True)
        host_pid = next(k.pid for k in [psutil.Process(p.pid), *kids] if k.name().startswith("python"))
        with open(f"/proc/{host_pid}/mountinfo", "rb") as f:
            table = f.read()
        assert mount_of(parse_mounts(table), dev) is None, "its mount table no longer shows the tmpfs"
        links = [os.readlink(f"/proc/{host_pid}/fd/{f}") for f in os.listdir(f"/proc/{host_pid}/fd")]
        if how == "fd":
            assert os.readlink("/proc/self/ns/mnt") in links, "it holds this mount namespace open"
        elif how == "pidfd":
            assert "anon_inode:[pidfd]" in links or any(x.startswith("pidfd:[") for x in links), "it holds a pidfd"
        else:
            assert f" {spot} ".encode() in table, "a namespace file is bound in its namespace"
            assert b" - nsfs " in table
        assert not any(_dev_of(f"/proc/{host_pid}/{w}") == dev for w in ("cwd", "root"))

        trust = judge_trust(d, pids=[host_pid, os.getpid()])
        assert trust.trusted is False, trust.note
        assert "a handle to mount namespace mnt:[" in trust.note
        if how in ("fd", "pidfd"):
            assert f"which sees this filesystem at {d}" in trust.note
        else:
            assert f"a bind-mounted namespace file at {spot}" in trust.note
            assert "whose mounts gc cannot read" in trust.note  # no process lives in it any more

        gc_keeps(d, name)
        kill_and_reap(p)  # its mount namespace goes with it, and the namespace file's bind mount too


def test_a_pid_namespace_handle_alone_changes_nothing(children: Children, tmp_path: Path) -> None:
    """The documented decision: a handle to another pid namespace (an fd to pid:[...]) is no
    hazard by itself. A producer hosted there and live now is a process there, looked at like
    any other; one that joins later writes a segment younger than the look (--min-age keeps it)."""
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        # A procfs of its own (the host's would lead it back to d: tests/test_gc_procfs.py).
        inner = f"umount -l {d} && umount -l /proc && mount -t proc proc /proc && echo ready && exec sleep 600"
        argv = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "sh", "-c", inner]
        p, _ = first_line(children, argv)
        member = wait_for(
            lambda: next((k.pid for k in psutil.Process(p.pid).children() if k.name() == "sleep"), None),
            what="the pid namespace's process",
        )
        pid_ns = os.open(f"/proc/{member}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        try:
            assert os.readlink(f"/proc/self/fd/{pid_ns}") != os.readlink("/proc/self/ns/pid")
            trust = judge_trust(d, pids=[member, os.getpid()])  # this process holds the other pid namespace
            assert trust.trusted is True, trust.note
        finally:
            os.close(pid_ns)
        kill_and_reap(p)


# judge_trust as another uid: the namespaces of root's processes are not its to read.
AS_NOBODY = """
import os, sys
from smgshm.core.host.pidtrust import judge_trust
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
t = judge_trust(sys.argv[1], pids=[int(sys.argv[2])])
print(t.trusted, sorted(t.doubt_uids), t.note, flush=True)
"""


def test_a_process_whose_namespaces_cannot_be_read_puts_its_uid_in_doubt(children: Children) -> None:
    """Unreadable is doubt, never "exited": a root process in another pid namespace, looked at by
    an unprivileged gc, leaves root's segments unknown (its /proc/P/task/T links say EACCES)."""
    argv = ["unshare", "--pid", "--fork", "sh", "-c", "echo ready && exec sleep 600"]
    p, _ = first_line(children, argv)
    member = wait_for(
        lambda: next((k.pid for k in psutil.Process(p.pid).children() if k.name() == "sleep"), None),
        what="the pid namespace's process",
    )
    d = os.path.dirname(os.path.abspath(__file__))  # a dir uid 65534 may stat
    out = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, d, str(member)], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 2)[:2] == ["True", "[0]"], out.stdout
    kill_and_reap(p)
