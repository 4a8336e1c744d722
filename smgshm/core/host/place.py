"""Where a shm dir's filesystem is mounted: in whose mount namespace, and at which mount point there.

A path through ``/proc/PID/root/...`` is PID's view of its own filesystems: the kernel follows that
magic link into PID's root, so ``stat`` and ``statvfs`` see PID's tmpfs. Nothing that resolves the
path as text does: ``os.path.realpath`` reads the link as "/" and lands on this namespace's
``/dev/shm``, and so does util-linux's mount(8), which canonicalises its target first.
``mount -o remount,size=1G /proc/PID/root/dev/shm`` therefore resizes the host's tmpfs and leaves
PID's as it was. Whatever keys, labels or fixes a tmpfs goes through ``place_of``: the device from
the kernel, the mount from the table of the namespace that holds it, and a remount that runs there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from smgshm.core.host.mounts import Mount, mount_holding, read_mounts

_THROUGH_ROOT = re.compile(r"^/proc/([0-9]+)/root(/.*)?$")


@dataclass(frozen=True)
class Place:
    """A shm dir as the mount namespace holding it sees it."""

    pid: int | None  # whose mount namespace: None for this process's own
    path: str  # the shm dir as that namespace sees it (from its process's root)
    dev: int  # st_dev, as the kernel reports it through the given path
    mount: Mount | None  # the mount holding it there, of that device; None when it cannot be told

    @property
    def fstype(self) -> str:
        return self.mount.fstype if self.mount else ""


def _same_view(pid: int) -> bool:
    """Whether ``pid`` sees mounts as this process does: the same mount namespace and root."""
    try:
        same_ns = os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
        theirs, mine = os.stat(f"/proc/{pid}/root"), os.stat("/")
        return same_ns and (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino)
    except OSError:
        return False


# A process's mount table (None: this process's own); OSError when it cannot be read.
TableOf = Callable[[int | None], list[Mount]]


def _read_table(pid: int | None) -> list[Mount]:
    return read_mounts() if pid is None else read_mounts(f"/proc/{pid}/mountinfo")


def place_of(shm_dir: str, table_of: TableOf = _read_table) -> Place:
    """Where ``shm_dir`` is mounted; OSError when it cannot be stat'ed (the mount is None when its
    table cannot be read, or no mount of its device holds it there). ``table_of``: where the tables
    come from (read already, by a caller that places many dirs)."""
    given = os.path.abspath(shm_dir)  # lexically: ".." and "//" only, no link followed
    dev = os.stat(given).st_dev  # the kernel follows /proc/PID/root into PID's root
    m = _THROUGH_ROOT.match(given)
    if m is not None and not _same_view(int(m.group(1))):
        pid, inner = int(m.group(1)), m.group(2) or "/"
        try:
            mounts = table_of(pid)  # mount points relative to PID's root
        except OSError:
            return Place(pid, inner, dev, None)
        # A symlink inside PID's root cannot be resolved from here (an absolute one would land in
        # this root): the mount is found only where the path names it as PID's table does.
        return Place(pid, inner, dev, mount_holding(mounts, inner, dev))
    real = os.path.realpath(given)  # this namespace's own path: resolving it is what mount(8) does too
    try:
        mounts = table_of(None)
    except OSError:
        return Place(None, real, dev, None)
    return Place(None, real, dev, mount_holding(mounts, real, dev))


def remount_argv(place: Place, options: str) -> list[str]:
    """The command that remounts the tmpfs at ``place`` with ``options`` (``size=2G``), in the mount
    namespace that holds it and at its mount point there: ``nsenter -t PID -m -r`` for another
    process's, whose own root the mount point is relative to. Empty when the mount is unknown: a
    command that might reach another filesystem is never suggested."""
    if place.mount is None or place.mount.fstype != "tmpfs":
        return []
    argv = ["mount", "-o", f"remount,{options}", place.mount.point]
    if place.pid is None:
        return argv
    return ["nsenter", "-t", str(place.pid), "-m", "-r", "--", *argv]
