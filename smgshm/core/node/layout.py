"""Where the kubelet and the container runtime put each pod's /dev/shm under a node root.

A memory emptyDir is a tmpfs the kubelet mounts at
``var/lib/kubelet/pods/<pod-uid>/volumes/kubernetes.io~empty-dir/<volume>``; containerd's default
/dev/shm is a tmpfs per sandbox at ``run/containerd/io.containerd.grpc.v1.cri/sandboxes/<id>/shm``;
and the host has its own ``dev/shm``. Everything under the node root is read as hostile: each
path component is opened relative to its parent's fd with O_NOFOLLOW, so no symlink leads out of
the root, listings are bounded, and a place counts only when the ONE mount-table parser
(host/mounts.py) says a tmpfs is mounted right there (its mount is not its parent dir's).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from smgshm.core.closed import Closed
from smgshm.core.errors import HostError
from smgshm.core.host.mounts import Mount, read_mounts
from smgshm.core.host.proc import fd_mount_id

KUBELET_PODS = ("var", "lib", "kubelet", "pods")
EMPTY_DIRS = ("volumes", "kubernetes.io~empty-dir")
SANDBOXES = ("run", "containerd", "io.containerd.grpc.v1.cri", "sandboxes")
HOST_SHM = ("dev", "shm")
POD_LOGS = ("var", "log", "pods")
MAX_PODS = 4096  # a node runs at most a few hundred (kubelet's default max-pods is 110)
MAX_VOLUMES = 256  # emptyDirs per pod
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PlaceKind(Closed):
    """Where a tmpfs of the node lives."""

    EMPTY_DIR = "empty_dir"  # a pod's memory emptyDir (the kubelet's path names the pod)
    SANDBOX_SHM = "sandbox_shm"  # a runtime's sandbox /dev/shm (containerd)
    HOST = "host"  # the host's own /dev/shm


@dataclass(frozen=True)
class Place:
    """One tmpfs found where a pod's (or the host's) /dev/shm lives."""

    kind: PlaceKind
    path: str  # as this process sees it: the node root joined with the components opened
    pod_uid: str | None  # from the kubelet's path (empty_dir); a sandbox's comes from its processes
    volume: str | None  # the emptyDir's name, the sandbox id; None for the host's
    dev: int
    mount_id: int


def open_dir(parent: int, names: tuple[str, ...]) -> int:
    """The dir at ``names`` below the dir open at ``parent``, one component at a time, never
    following a symlink (ELOOP/ENOTDIR then); OSError when it is not there."""
    fd = os.dup(parent)
    try:
        for name in names:
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def list_dirs(fd: int, limit: int) -> list[str]:
    """The names of the first ``limit`` entries of the dir at ``fd`` that are dirs (not links)."""
    out: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    out.append(entry.name)
                    if len(out) >= limit:
                        break
    return sorted(out)


class NodeRoot:
    """The node root, open: places under it are found by fd, paths are only for showing and reaping."""

    def __init__(self, root: str) -> None:
        try:  # the operator's choice of root may be a link (one it may not read: EACCES); nothing below it
            self.path = os.path.realpath(root)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise HostError(f"cannot open the node root: {err.strerror}", path=root) from err
        try:
            self.mounts: dict[int, Mount] = {m.mount_id: m for m in read_mounts()}
        except OSError as err:
            os.close(self.fd)
            raise HostError(f"cannot read this process's mount table: {err.strerror}", path=root) from err

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> NodeRoot:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def join(self, *names: str) -> str:
        return os.path.join(self.path, *names)

    def tmpfs_at(self, parent: int, name: str) -> tuple[int, int] | None:
        """(st_dev, mount id) when a tmpfs is mounted right at ``name`` in the dir at ``parent``."""
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except OSError:
            return None
        try:
            mid, up = fd_mount_id(fd), fd_mount_id(parent)
            m = self.mounts.get(mid) if mid is not None else None
            # A mount of its own (not the parent dir's), a tmpfs per the mount table, the very device.
            if m is None or mid == up or m.fstype != "tmpfs" or m.dev != os.fstat(fd).st_dev:
                return None
            return m.dev, m.mount_id
        except OSError:
            return None
        finally:
            os.close(fd)

    def places(self) -> Iterator[Place]:
        """Every tmpfs where a pod's or the host's /dev/shm lives, in that order."""
        with contextlib.suppress(OSError):
            pods = open_dir(self.fd, KUBELET_PODS)
            try:
                for uid in list_dirs(pods, MAX_PODS):
                    try:
                        vols = open_dir(pods, (uid, *EMPTY_DIRS))
                    except OSError:
                        continue  # a pod without emptyDirs
                    try:
                        for vol in list_dirs(vols, MAX_VOLUMES):
                            if (got := self.tmpfs_at(vols, vol)) is not None:
                                path = self.join(*KUBELET_PODS, uid, *EMPTY_DIRS, vol)
                                yield Place(PlaceKind.EMPTY_DIR, path, uid, vol, *got)
                    finally:
                        os.close(vols)
            finally:
                os.close(pods)
        with contextlib.suppress(OSError):
            boxes = open_dir(self.fd, SANDBOXES)
            try:
                for box in list_dirs(boxes, MAX_PODS):
                    try:
                        fd = open_dir(boxes, (box,))
                    except OSError:
                        continue
                    try:
                        if (got := self.tmpfs_at(fd, "shm")) is not None:
                            yield Place(PlaceKind.SANDBOX_SHM, self.join(*SANDBOXES, box, "shm"), None, box, *got)
                    finally:
                        os.close(fd)
            finally:
                os.close(boxes)
        with contextlib.suppress(OSError):
            dev = open_dir(self.fd, HOST_SHM[:1])
            try:
                if (got := self.tmpfs_at(dev, HOST_SHM[1])) is not None:
                    yield Place(PlaceKind.HOST, self.join(*HOST_SHM), None, None, *got)
            finally:
                os.close(dev)


__all__ = ["POD_LOGS", "NodeRoot", "Place", "list_dirs", "open_dir"]
