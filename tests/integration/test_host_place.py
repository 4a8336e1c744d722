"""core/host/place.py: a tmpfs seen through another process's root is keyed, labelled and fixed where
it is mounted, never through the path as text (which mount(8) and realpath read as this host's /dev/shm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from smgshm.core.host.capacity import mount_key
from smgshm.core.host.identity import read_host_identity
from smgshm.core.host.mounts import mount_holding, read_mounts
from smgshm.core.host.place import place_of, remount_argv
from tests.conftest import Children

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not (shutil.which("unshare") and shutil.which("nsenter")), reason="needs unshare and nsenter"),
]

MIB = 1 << 20
# A process with a 1 MiB tmpfs of its own at /dev/shm, in a mount namespace of its own (as a container's).
HOLDER = "mount -t tmpfs -o size=1m,mode=1777 smgshm-place /dev/shm && echo up && exec sleep 600"


def _holder(children: Children) -> int:
    p = children.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", HOLDER])
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line == "up", p.stderr.read() if p.stderr else ""
    return p.pid  # unshare and sh exec: this pid is the holder's


def _total(path: str) -> int:
    v = os.statvfs(path)
    return v.f_blocks * v.f_frsize


def _host_shm() -> tuple[int, str]:
    """This namespace's /dev/shm: its size and its mount's options, to show a fix left it alone."""
    m = mount_holding(read_mounts(), "/dev/shm", os.stat("/dev/shm").st_dev)
    assert m is not None
    return _total("/dev/shm"), m.super_options


def test_a_tmpfs_through_proc_root_is_placed_in_its_holders_namespace(children: Children) -> None:
    pid = _holder(children)
    seen = f"/proc/{pid}/root/dev/shm"
    place = place_of(seen)
    assert (place.pid, place.path, place.fstype) == (pid, "/dev/shm", "tmpfs")
    assert place.dev == os.stat(seen).st_dev != os.stat("/dev/shm").st_dev
    # The label and the capacity key are the holder's tmpfs too, not /proc's mount nor this host's tmpfs.
    assert read_host_identity(seen).fstype == "tmpfs"
    key, host_key = mount_key(seen), mount_key("/dev/shm")
    assert key is not None
    assert key.dev == place.dev
    assert key != host_key


def test_the_remount_fix_through_proc_root_resizes_that_tmpfs_and_nothing_else(children: Children) -> None:
    pid = _holder(children)
    seen = f"/proc/{pid}/root/dev/shm"
    host = _host_shm()
    argv = remount_argv(place_of(seen), "size=2m")
    assert argv == ["nsenter", "-t", str(pid), "-m", "-r", "--", "mount", "-o", "remount,size=2m", "/dev/shm"]
    subprocess.run(argv, check=True, timeout=30, capture_output=True)
    assert _total(seen) == 2 * MIB
    assert _host_shm() == host


def test_doctors_capacity_fix_pasted_resizes_the_pods_tmpfs_and_not_the_hosts(children: Children) -> None:
    """The capacity fix doctor prints for a 1 MiB tmpfs seen through /proc/PID/root, run as it stands."""
    pid = _holder(children)
    seen = f"/proc/{pid}/root/dev/shm"
    host = _host_shm()
    argv = [sys.executable, "-m", "smgshm", "--json", "doctor", "--no-gateways", "--shm-dir", seen]
    out = subprocess.run([*argv, "--inflight-bytes", "4MiB"], capture_output=True, text=True, timeout=120)
    checks = {c["name"]: c for c in json.loads(out.stdout)["result"]["checks"]}
    fix = checks["capacity"]["fix_cmd"]
    assert fix[:6] == ["nsenter", "-t", str(pid), "-m", "-r", "--"], checks["capacity"]
    assert fix[-1] == "/dev/shm"
    subprocess.run(fix, check=True, timeout=30, capture_output=True)
    assert _total(seen) >= 4 * MIB  # the pod's tmpfs now holds the need
    assert _host_shm() == host  # and the host's is as it was


def test_a_path_not_on_a_tmpfs_gets_no_remount(tmp_path: os.PathLike[str]) -> None:
    """A dir on another filesystem (a disk): no remount is offered, since none would enlarge a tmpfs."""
    place = place_of(str(tmp_path))
    if place.fstype == "tmpfs":
        pytest.skip("the temp dir is itself on a tmpfs here")
    assert remount_argv(place, "size=1g") == []
