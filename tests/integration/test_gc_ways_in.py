"""Every directory handle a process of another pid namespace keeps on a mount of a mount namespace that
sees the tmpfs is a way into it (runc's CVE-2024-21626): ``openat(fd, "../<path>/smg-...")`` from an
inherited fd to the host's /etc writes there, though the producer's own mount table, /proc and /dev/shm
show nothing of it. gc must call its segment unknown and keep it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import psutil
import pytest

from smgshm.core.host.mounts import mount_of, read_mounts
from smgshm.core.host.pidtrust import judge_trust
from tests.conftest import Children, wait_for
from tests.support.cli_gc import dead_pid, first_line, kill_and_reap
from tests.support.gc_trust import gc_keeps

# judges liveness trusted (its control): never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"),
    pytest.mark.timeout(60),
    pytest.mark.trust,
]

CONTAINER = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private"]
# A procfs of its own pid namespace, the host's gone (the host's would lead anywhere: test_gc_procfs.py).
OWN_PROC = "umount -l /proc && mount -t proc proc /proc"

# In its own pid and mount namespace with its own /proc: it lazily unmounts the tmpfs from its table,
# then writes its segment through the inherited fd (to a dir of the host's mount namespace) only.
ESCAPE = """
import os, signal, subprocess, sys, time
d, fd, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
subprocess.run(["umount", "-l", d], check=True)
assert not os.path.exists(os.path.join(d, "x")) and os.listdir(d) == []
name = f"smg-tokenspeed-{pid}-{time.time_ns()}-0"
up = "../" * 8  # past the host's root: .. stays there
w = os.open(up + d.lstrip("/") + "/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd)
os.write(w, b"y" * 4096)
os.close(w)
os.chdir("/")
KEEP
print(name, flush=True)
signal.pause()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fd", "cwd-of-thread"])
def test_a_dir_handle_into_the_hosts_mount_namespace_makes_pids_untrusted(
    children: Children, tmp_path: Path, how: str
) -> None:
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        dev = os.stat(d).st_dev
        etc = os.open("/etc", os.O_RDONLY | os.O_DIRECTORY)  # a dir of this (the host's) mount namespace
        try:
            keep = ""
            if how == "cwd-of-thread":  # the handle kept only as one thread's cwd, the fd closed first
                keep = (
                    "import ctypes, threading\n"
                    "libc, ready = ctypes.CDLL(None, use_errno=True), threading.Event()\n"
                    "def keep():\n"
                    "    assert libc.unshare(0x200) == 0\n"  # CLONE_FS: a cwd of its own
                    "    os.fchdir(fd)\n"
                    "    os.close(fd)\n"
                    "    ready.set()\n"
                    "    signal.pause()\n"
                    "threading.Thread(target=keep, daemon=True).start()\n"
                    "ready.wait()"
                )
            script = ESCAPE.replace("KEEP", keep)
            run = shlex.join([sys.executable, "-c", script, d, str(etc), str(dead_pid(children))])
            argv = [*CONTAINER, "sh", "-c", f"{OWN_PROC} && exec {run}"]
            p = children.spawn(argv, pass_fds=(etc,))  # inherited, as runc leaked its fd
            assert p.stdout is not None
            name = p.stdout.readline().strip()
            assert name, f"the producer exited {p.wait(timeout=10)}: {p.stderr.read() if p.stderr else ''}"
        finally:
            os.close(etc)
        path = os.path.join(d, name)
        assert os.path.exists(path), "it wrote into the host's tmpfs through the inherited fd"
        kids = psutil.Process(p.pid).children(recursive=True)
        host_pid = next(k.pid for k in [psutil.Process(p.pid), *kids] if k.name().startswith("python"))
        assert mount_of(read_mounts(f"/proc/{host_pid}/mountinfo"), dev) is None, "its table shows no tmpfs"
        for t in os.listdir(f"/proc/{host_pid}/task"):
            for what in ("cwd", "root"):
                assert os.stat(f"/proc/{host_pid}/task/{t}/{what}").st_dev != dev

        trust = judge_trust(d, pids=[host_pid, os.getpid()])
        assert trust.trusted is False, trust.note
        assert f"pid {host_pid}" in trust.note
        assert "which sees this filesystem at " + d in trust.note, trust.note
        gc_keeps(d, name)
        kill_and_reap(p)


# open_tree(2) of its whole tree (OPEN_TREE_CLONE | AT_RECURSIVE): a detached copy, in no mount table, that
# keeps a copy of the tmpfs's mount after the tmpfs is lazily unmounted; it writes through that fd only.
DETACHED_TREE = """
import ctypes, os, signal, subprocess, sys, time
d, pid = sys.argv[1], int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(428, -100, b"/", 1 | 0o2000000 | 0x8000)  # open_tree(AT_FDCWD, "/", CLONE | CLOEXEC | RECURSIVE)
assert fd >= 0, os.strerror(ctypes.get_errno())
subprocess.run(["umount", "-l", d], check=True)
name = f"smg-tokenspeed-{pid}-{time.time_ns()}-0"
w = os.open(d.lstrip("/") + "/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd)
os.write(w, b"y" * 4096)
os.close(w)
print(name, flush=True)
signal.pause()
"""


@pytest.mark.slow
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="open_tree(2)'s number is x86_64's here")
def test_a_detached_tree_from_open_tree_is_doubt(children: Children, tmp_path: Path) -> None:
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        dev = os.stat(d).st_dev
        run = shlex.join([sys.executable, "-c", DETACHED_TREE, d, str(dead_pid(children))])
        p, name = first_line(children, [*CONTAINER, "sh", "-c", f"{OWN_PROC} && exec {run}"])
        assert os.path.exists(os.path.join(d, name)), "it wrote into the host's tmpfs through the detached tree"
        kids = psutil.Process(p.pid).children(recursive=True)
        host_pid = next(k.pid for k in [psutil.Process(p.pid), *kids] if k.name().startswith("python"))
        assert mount_of(read_mounts(f"/proc/{host_pid}/mountinfo"), dev) is None, "its table shows no tmpfs"

        trust = judge_trust(d, pids=[host_pid, os.getpid()])
        assert trust.trusted is False, trust.note
        assert f"pid {host_pid}" in trust.note
        assert "in no mount table gc can read" in trust.note, trust.note
        gc_keeps(d, name)
        kill_and_reap(p)


def test_a_dir_handle_in_its_own_mount_namespace_changes_nothing(children: Children, tmp_path: Path) -> None:
    """The control: a dir fd on a mount of its own namespace (which does not see the tmpfs) is no way in."""
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "x", "4m") as d:
        inner = f"{OWN_PROC} && umount -l {d} && exec 7</etc && echo ready && exec sleep 600"  # its own /etc
        p, _ = first_line(children, [*CONTAINER, "sh", "-c", inner])
        member = wait_for(
            lambda: next((k.pid for k in psutil.Process(p.pid).children(recursive=True) if k.name() == "sleep"), None),
            what="its sleep",
        )
        assert os.readlink(f"/proc/{member}/fd/7") == "/etc"
        trust = judge_trust(d, pids=[member, os.getpid()])
        assert trust.trusted is True, trust.note
        kill_and_reap(p)
