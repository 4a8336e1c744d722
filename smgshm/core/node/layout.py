"""Where the kubelet and the container runtimes put each pod's /dev/shm under a node root.

A memory emptyDir is a tmpfs the kubelet mounts at
``var/lib/kubelet/pods/<pod-uid>/volumes/kubernetes.io~empty-dir/<volume>``. A pod without one gets
its runtime's tmpfs per sandbox: containerd's at ``<state>/io.containerd.grpc.v1.cri/sandboxes/<id>/shm``
(state ``run/containerd``; k3s and RKE2 ``run/k3s/containerd``; k0s ``run/k0s/containerd``), CRI-O's
at ``<runroot>/<storage driver>-containers/<sandbox id>/userdata/shm`` (read in CRI-O's source: its
SetupShm mounts a tmpfs at ``shm`` in the sandbox container's run dir, containers/storage's
ContainerRunDirectory; runroot ``run/containers/storage`` by default). The host has its own
``dev/shm``. A custom state dir (``--runtime-state-dir``) is read both ways.

Everything under the node root is read as hostile: each path component is opened relative to its
parent's fd with O_NOFOLLOW, so no symlink leads out of the root, and a place counts only when the
ONE mount-table parser (host/mounts.py) says a tmpfs is mounted right there (its mount is not its
parent dir's). Listings stream (os.scandir: getdents' buffer at a time), with no cut: a node with
thousands of stale pod dirs is read whole, its memory bounded by the tmpfs found, not the dirs.
Which layout dirs were there is kept (``NodeRoot.found``): a root with none of them is a wrong root.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from smgshm.core.closed import Closed
from smgshm.core.errors import HostError
from smgshm.core.host.mounts import Mount, read_mounts
from smgshm.core.host.proc import fd_mount_id

KUBELET_PODS = ("var", "lib", "kubelet", "pods")
EMPTY_DIRS = ("volumes", "kubernetes.io~empty-dir")
CRI_SANDBOXES = ("io.containerd.grpc.v1.cri", "sandboxes")  # under a containerd state dir
CONTAINERD_STATES = (("run", "containerd"), ("run", "k3s", "containerd"), ("run", "k0s", "containerd"))
CRIO_RUN_ROOTS = (("run", "containers", "storage"),)  # containers/storage's runroot, CRI-O's default
CRIO_SHM = ("userdata", "shm")  # under <runroot>/<driver>-containers/<sandbox id>
HOST_SHM = ("dev", "shm")
POD_LOGS = ("var", "log", "pods")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TmpfsKind(Closed):
    """Where a tmpfs was found: a pod's memory emptyDir, a runtime's sandbox shm, the host's /dev/shm."""

    EMPTY_DIR = "empty_dir"
    SANDBOX_SHM = "sandbox_shm"  # containerd's (k3s, RKE2, k0s) or CRI-O's: the same thing, a sandbox's default
    HOST = "host"


@dataclass(frozen=True)
class Place:
    """One tmpfs found where a pod's (or the host's) /dev/shm lives."""

    kind: TmpfsKind
    path: str  # as this process sees it: the node root joined with the components opened
    pod_uid: str | None  # from the kubelet's path (empty_dir); a sandbox's comes from its processes
    volume: str | None  # the emptyDir's name, the sandbox id; None for the host's
    dev: int
    mount_id: int


def state_dir_parts(text: str) -> tuple[str, ...]:
    """A runtime state dir as given (``/run/foo/containerd``: relative to the node root, a leading / or
    not) as path components; ValueError for one that is empty or climbs (``..``)."""
    parts = tuple(p for p in text.split("/") if p not in ("", "."))
    if not parts or ".." in parts:
        raise ValueError(f"{text!r}: a dir under the node root, without '..'")
    return parts


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


def each_dir(fd: int) -> Iterator[str]:
    """The names of the entries of the dir at ``fd`` that are dirs (not links), as the kernel lists them:
    streamed, never held (a dir of millions costs getdents' buffer, not a list)."""
    with os.scandir(fd) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    yield entry.name


_THROUGH_ROOT = re.compile(r"^/proc/([0-9]+)/root(?:/|$)")


def _mount_tables(root: str) -> list[Mount]:
    """The mounts a root reached through ``/proc/PID/root`` may hold (PID's table: another mount namespace's
    tmpfs is in no table of this one), then this process's. Mount ids are the kernel's, one space for every
    namespace, so the two tables merge by id."""
    m = _THROUGH_ROOT.match(root)
    theirs = read_mounts(f"/proc/{m.group(1)}/mountinfo") if m is not None else []
    return [*theirs, *read_mounts()]


class NodeRoot:
    """The node root, open: places under it are found by fd, paths are only for showing and reaping.

    ``state_dirs``: custom runtime state dirs (components under the root), each read as containerd's state
    dir and as CRI-O's storage run root. After ``places()``: ``found`` names the layout dirs that were there
    (the kubelet's pods dir, each runtime's), ``missing`` the custom state dirs that were not, ``unreadable``
    the layout dirs (and pods' dirs) there that this process may not list (EACCES: a privilege missing)."""

    def __init__(self, root: str, state_dirs: Sequence[tuple[str, ...]] = ()) -> None:
        # The operator's choice of root may be a link (nothing below it may be): the kernel follows it as it
        # opens it, magic links too. Its path is kept as given, never resolved as text: realpath reads
        # /proc/PID/root as "/", which would put this process's own / in place of PID's.
        self.path = os.path.normpath(os.path.abspath(root))
        self.state_dirs = list(dict.fromkeys(state_dirs))
        self.found: list[str] = []
        self.missing: list[str] = []
        self.unreadable: list[str] = []
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise HostError(f"cannot open the node root: {err.strerror}", path=root) from err
        try:
            self.mounts: dict[int, Mount] = {m.mount_id: m for m in _mount_tables(self.path)}
        except OSError as err:
            os.close(self.fd)
            raise HostError(f"cannot read the mount table that holds it: {err.strerror}", path=root) from err

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
        """Every tmpfs where a pod's or the host's /dev/shm lives: emptyDirs, sandboxes' shm (containerd's
        state dirs, CRI-O's run roots, then the custom state dirs), the host's; each group sorted by path."""
        self.found, self.missing, self.unreadable = [], [], []
        yield from sorted(self._empty_dirs(), key=_by_path)
        for state in CONTAINERD_STATES:
            yield from sorted(self._cri_sandboxes(state), key=_by_path)
        for runroot in CRIO_RUN_ROOTS:
            yield from sorted(self._crio_sandboxes(runroot), key=_by_path)
        for custom in self.state_dirs:
            try:
                os.close(open_dir(self.fd, custom))
            except OSError:
                self.missing.append("/".join(custom))
                continue
            yield from sorted([*self._cri_sandboxes(custom), *self._crio_sandboxes(custom)], key=_by_path)
        with contextlib.suppress(OSError):
            dev = open_dir(self.fd, HOST_SHM[:1])
            try:
                if (got := self.tmpfs_at(dev, HOST_SHM[1])) is not None:
                    yield Place(TmpfsKind.HOST, self.join(*HOST_SHM), None, None, *got)
            finally:
                os.close(dev)

    def _opened(self, names: tuple[str, ...]) -> int | None:
        """The layout dir at ``names`` (noted as found), or None when it is not there."""
        try:
            fd = open_dir(self.fd, names)
        except PermissionError:  # there, but not ours to list (the kubelet's pods dir is 0750 root)
            self.unreadable.append("/".join(names))
            return None
        except OSError:
            return None
        self.found.append("/".join(names))
        return fd

    def _empty_dirs(self) -> Iterator[Place]:
        if (pods := self._opened(KUBELET_PODS)) is None:
            return
        try:
            for uid in each_dir(pods):
                try:
                    vols = open_dir(pods, (uid, *EMPTY_DIRS))
                except PermissionError:  # each pod's dir is 0750 root too
                    self.unreadable.append("/".join((*KUBELET_PODS, uid)))
                    continue
                except OSError:
                    continue  # a pod without emptyDirs
                try:
                    for vol in each_dir(vols):
                        if (got := self.tmpfs_at(vols, vol)) is not None:
                            path = self.join(*KUBELET_PODS, uid, *EMPTY_DIRS, vol)
                            yield Place(TmpfsKind.EMPTY_DIR, path, uid, vol, *got)
                finally:
                    os.close(vols)
        finally:
            os.close(pods)

    def _cri_sandboxes(self, state: tuple[str, ...]) -> Iterator[Place]:
        """containerd's CRI plugin: ``<state>/io.containerd.grpc.v1.cri/sandboxes/<id>/shm``."""
        if (boxes := self._opened((*state, *CRI_SANDBOXES))) is None:
            return
        try:
            yield from self._shm_in_each(boxes, (*state, *CRI_SANDBOXES), ("shm",))
        finally:
            os.close(boxes)

    def _crio_sandboxes(self, runroot: tuple[str, ...]) -> Iterator[Place]:
        """CRI-O's: ``<runroot>/<driver>-containers/<sandbox id>/userdata/shm`` (overlay's, vfs', ...)."""
        try:
            top = open_dir(self.fd, runroot)
        except OSError:
            return
        try:
            for driver in each_dir(top):
                if not driver.endswith("-containers"):
                    continue
                try:
                    boxes = open_dir(top, (driver,))
                except OSError:
                    continue
                self.found.append("/".join((*runroot, driver)))
                try:
                    yield from self._shm_in_each(boxes, (*runroot, driver), CRIO_SHM)
                finally:
                    os.close(boxes)
        finally:
            os.close(top)

    def _shm_in_each(self, boxes: int, where: tuple[str, ...], below: tuple[str, ...]) -> Iterator[Place]:
        """A sandbox_shm place for each dir of ``boxes`` with a tmpfs at ``below`` in it."""
        for box in each_dir(boxes):
            try:
                fd = open_dir(boxes, (box, *below[:-1]))
            except OSError:
                continue
            try:
                if (got := self.tmpfs_at(fd, below[-1])) is not None:
                    yield Place(TmpfsKind.SANDBOX_SHM, self.join(*where, box, *below), None, box, *got)
            finally:
                os.close(fd)


def _by_path(p: Place) -> str:
    return p.path


def runtime_layouts(state_dirs: Iterable[tuple[str, ...]] = ()) -> list[str]:
    """The runtime layout dirs looked for (for a message): containerd's state dirs, CRI-O's run roots, custom."""
    return ["/".join(d) for d in (*CONTAINERD_STATES, *CRIO_RUN_ROOTS, *state_dirs)]


__all__ = [
    "CONTAINERD_STATES",
    "CRIO_RUN_ROOTS",
    "KUBELET_PODS",
    "POD_LOGS",
    "NodeRoot",
    "Place",
    "TmpfsKind",
    "each_dir",
    "open_dir",
    "runtime_layouts",
    "state_dir_parts",
]
