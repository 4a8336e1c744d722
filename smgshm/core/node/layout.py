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

Every open and listing under the root can block (a stalled FUSE or NFS mount where a pod dir is, or a
runtime's dir): each is a bounded read (host/bounded.py), and the caller gives the run one deadline for
them all (``LAYOUT_S``, ``within``), so many slow reads cannot add up without bound either. A dir not read
in time (its read stuck, or the run's time spent) is never dropped: it is kept in ``NodeRoot.unread`` with
the bound it hit, and each tmpfs the mount table shows below it is a place of its own (``unread_places``),
reported ``unknown`` for itself (core/node/scan.py's ``Unscanned``), the node's view ``unknown`` (sight.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from smgshm.core.closed import Closed
from smgshm.core.errors import HostError
from smgshm.core.host.bounded import StuckReadError, bounded, bounded_groups, step
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
LAYOUT_S = 10.0  # a look's opens and listings under the node root, in all (host/bounded.py's ``within``)
_BATCH = 512  # dir entries read per bounded read: a listing streams, each step bounded
_PODS_AT_ONCE = 64  # pods whose volumes are read in one hand-off (each read bounded alone)
_MAX_VOLUMES = 4096  # a pod's emptyDir volume dirs read at most: beyond, the pod is reported not read (unknown)


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


def _open_chain(parent: int, names: tuple[str, ...]) -> int:
    """The dir at ``names`` below ``parent``, opened one component at a time (each fd but the last closed)."""
    fd = os.dup(parent)
    try:
        for name in names:
            step()  # each open bounded on its own (host/bounded.py)
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _path_stat(parent: int, name: str) -> tuple[int, os.stat_result]:
    """``name`` in ``parent`` opened O_PATH (a dir, never a link followed), and its fstat."""
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        step()
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


@dataclass
class _PodVolumes:
    """A pod's emptyDir volumes as one read found them (``_pod_volumes``): no fd kept, so that many pods' reads
    in one hand-off hold none (a node of many pods, each of many volumes, within any fd limit)."""

    mount_id: int  # its volumes dir's (kubernetes.io~empty-dir) mount
    vols: list[tuple[str, tuple[int, os.stat_result] | OSError]]  # each volume dir: its mount, its fstat
    whole: bool  # every one listed (False: more than _MAX_VOLUMES)


def _pod_volumes(pods: int, uid: str) -> _PodVolumes:
    """The emptyDir volumes of the pod ``uid`` in the pods dir ``pods``, in one go: its volumes dir opened (never
    through a link) and listed, each volume dir opened O_PATH for its fstat and mount, and closed. OSError when the
    volumes dir cannot be opened or listed. Every read is through the pod's filesystems: the caller bounds them
    as one read of several steps (``step``: each bounded on its own)."""
    fd = _open_chain(pods, (uid, *EMPTY_DIRS))
    out: list[tuple[str, tuple[int, os.stat_result] | OSError]] = []
    try:
        step()
        with os.scandir(fd) as it:
            names, _end = _dirs_of(it, _MAX_VOLUMES + 1)  # one more than the bound: is there more?
        whole = len(names) <= _MAX_VOLUMES
        del names[_MAX_VOLUMES:]
        up = _mount_of(fd)
        for name in names:
            step()
            try:
                vol, st = _path_stat(fd, name)
            except OSError as err:
                out.append((name, err))
                continue
            try:
                out.append((name, (_mount_of(vol), st)))
            except OSError as err:
                out.append((name, err))
            finally:
                os.close(vol)
    finally:
        os.close(fd)
    return _PodVolumes(up, out, whole)


def _mount_of(fd: int) -> int:
    """The mount ``fd`` is open on, by procfs's own fdinfo; EIO when it cannot be told (a procfs that fails is
    no dir that is not there: the pod is said not read, never skipped)."""
    try:
        mid = fd_mount_id(fd)
    except OSError as err:
        raise OSError(errno.EIO, f"fdinfo of its fd: {err.strerror or err}") from err
    if mid is None:
        raise OSError(errno.EIO, "fdinfo of its fd says no mount id")
    return mid


def _not_there(err: OSError) -> bool:
    """An error that says the dir is not there as a dir: gone, not a dir, or a link (never followed)."""
    return isinstance(err, (FileNotFoundError, NotADirectoryError)) or err.errno == errno.ELOOP


def open_dir(parent: int, names: tuple[str, ...], what: str = "") -> int:
    """The dir at ``names`` below the dir open at ``parent``, one component at a time, never
    following a symlink (ELOOP/ENOTDIR then); OSError when it is not there, ``StuckReadError`` (an
    OSError) when the opens do not answer in time (``what``: the path, for the message). Through
    their filesystems: each may stall, so the chain is one bounded read (one hand-off, not one per
    component), and an fd that comes after we left is closed, not leaked."""
    return bounded(what or "/".join(names), _open_chain, parent, names, late=os.close)


def _dirs_of(it: Iterator[os.DirEntry[str]], n: int) -> tuple[list[str], bool]:
    """Up to ``n`` more names of dirs (not links) from the listing ``it``, and whether it has ended."""
    out: list[str] = []
    for entry in it:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                out.append(entry.name)
        if len(out) >= n:
            return out, False
    return out, True


def each_dir(fd: int, what: str = "") -> Iterator[str]:
    """The names of the entries of the dir at ``fd`` that are dirs (not links), as the kernel lists them:
    streamed, never held (a dir of millions costs a batch of names, not a list); each batch a bounded read
    (``StuckReadError`` when it does not answer in time; ``what``: the dir's path, for the message)."""
    it = os.scandir(fd)  # on a dup of fd
    stuck, ended = False, False
    try:
        while not ended:  # a batch that ends the listing is the last hand-off (a pod's dir: one, not two)
            batch, ended = bounded(what or f"the dir at fd {fd}", _dirs_of, it, _BATCH)
            yield from batch
    except StuckReadError:
        # Never closed here: the worker left to the read is still in readdir(), and a close (rewinddir, then
        # closedir) waits on the lock it holds, for as long as the read stalls. The worker's job keeps a
        # reference: the listing is closed by whichever lets go last, after the read answers, if ever.
        stuck = True
        raise
    finally:
        if not stuck:
            it.close()


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
        self.unread: list[tuple[tuple[str, ...], str]] = []  # dirs not read in time: components, why
        self.unreadable: list[str] = []  # dirs there but not ours to list (no DAC capability)
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

    def _stuck(self, names: tuple[str, ...], err: StuckReadError) -> None:
        """Note the dir at ``names`` (components under the root) as not read, with the bound it hit."""
        self.unread.append((names, err.strerror or str(err)))

    def tmpfs_at(self, parent: int, name: str, what: str = "") -> tuple[int, int] | None:
        """(st_dev, mount id) when a tmpfs is mounted right at ``name`` in the dir at ``parent``; StuckReadError
        when its open or stat does not answer in time."""
        try:  # O_PATH: a tmpfs this process may not list is still found (and reported unscanned, not unseen)
            # The open and the fstat may each stall: one bounded read (late: an fd that comes after we left, closed).
            fd, st = bounded(what or name, _path_stat, parent, name, late=lambda got: os.close(got[0]))
        except StuckReadError:
            raise
        except OSError:
            return None
        try:
            mid, up = fd_mount_id(fd), fd_mount_id(parent)  # (procfs's own: fdinfo, read inline)
        except OSError:
            return None
        finally:
            os.close(fd)
        return self._tmpfs_mounted(mid, up, st)

    def _tmpfs_mounted(self, mid: int | None, up: int | None, st: os.stat_result) -> tuple[int, int] | None:
        """(st_dev, mount id) when a dir on mount ``mid`` (fstat'ed as ``st``) in a dir on mount ``up`` is a tmpfs
        mounted right there: a mount of its own (not the parent dir's), a tmpfs per the mount table, the very
        device."""
        m = self.mounts.get(mid) if mid is not None else None
        if m is None or mid == up or m.fstype != "tmpfs" or m.dev != st.st_dev:
            return None
        return m.dev, m.mount_id

    def places(self) -> Iterator[Place]:
        """Every tmpfs where a pod's or the host's /dev/shm lives: emptyDirs, sandboxes' shm (containerd's
        state dirs, CRI-O's run roots, then the custom state dirs), the host's; each group sorted by path.
        A dir whose read does not answer in time (bounded.py; the caller's ``within`` sets the run's
        deadline) is noted in ``unread`` and the walk goes on (``unread_places`` tells what is under it);
        one this process may not list, in ``unreadable``."""
        self.found, self.missing, self.unread, self.unreadable = [], [], [], []
        yield from sorted(self._empty_dirs(), key=_by_path)
        for state in CONTAINERD_STATES:
            yield from sorted(self._cri_sandboxes(state), key=_by_path)
        for runroot in CRIO_RUN_ROOTS:
            yield from sorted(self._crio_sandboxes(runroot), key=_by_path)
        for custom in self.state_dirs:
            try:
                os.close(open_dir(self.fd, custom, self.join(*custom)))
            except StuckReadError as err:
                self._stuck(custom, err)
                continue
            except OSError:
                self.missing.append("/".join(custom))
                continue
            yield from sorted([*self._cri_sandboxes(custom), *self._crio_sandboxes(custom)], key=_by_path)
        try:
            dev = open_dir(self.fd, HOST_SHM[:1], self.join(*HOST_SHM[:1]))
        except StuckReadError as err:
            self._stuck(HOST_SHM[:1], err)
            return
        except OSError:
            return
        try:
            if (got := self.tmpfs_at(dev, HOST_SHM[1], self.join(*HOST_SHM))) is not None:
                yield Place(TmpfsKind.HOST, self.join(*HOST_SHM), None, None, *got)
        except StuckReadError as err:
            self._stuck(HOST_SHM, err)
        finally:
            os.close(dev)

    def unread_places(self) -> list[Place]:
        """Each tmpfs the mount table shows at a layout place below a dir of ``unread`` (after ``places``):
        not looked at (its path may stall), so its pod is the kubelet path's only. Mount points are matched
        as this process names the root and, through /proc/PID/root, as PID does ("/")."""
        if not self.unread:
            return []
        prefixes = [self.path.rstrip("/")]
        if _THROUGH_ROOT.match(self.path):
            prefixes.append("")
        out: dict[tuple[int, int], Place] = {}
        for m in self.mounts.values():
            if m.fstype != "tmpfs":
                continue
            for pre in prefixes:
                if not m.point.startswith(pre + "/"):
                    continue
                rel = tuple(p for p in m.point[len(pre) + 1 :].split("/") if p)
                if not any(rel[: len(names)] == names for names, _why in self.unread):
                    continue
                kind, uid, vol = _layout_place(rel, self.state_dirs)
                if kind is not None:
                    out.setdefault((m.dev, m.mount_id), Place(kind, self.join(*rel), uid, vol, m.dev, m.mount_id))
        return sorted(out.values(), key=_by_path)

    def _opened(self, names: tuple[str, ...]) -> int | None:
        """The layout dir at ``names`` (noted as found), or None when it is not there (or not read in time:
        noted as found, and unread)."""
        try:
            fd = open_dir(self.fd, names, self.join(*names))
        except StuckReadError as err:
            self.found.append("/".join(names))  # there (no ENOENT), but not read: unread, not missing
            self._stuck(names, err)
            return None
        except PermissionError:  # there, but not ours to list (the kubelet's pods dir is 0750 root)
            self.unreadable.append("/".join(names))
            return None
        except OSError as err:
            if not _not_there(err):  # (EMFILE, EIO: there, maybe, but not read: unread, never taken for missing)
                self.found.append("/".join(names))
                self.unread.append((names, err.strerror or str(err)))
            return None
        self.found.append("/".join(names))
        return fd

    def _empty_dirs(self) -> Iterator[Place]:
        if (pods := self._opened(KUBELET_PODS)) is None:
            return
        try:
            uids: list[str] = []
            for uid in self._listed(pods, KUBELET_PODS):  # streamed: read _PODS_AT_ONCE at a time
                uids.append(uid)
                if len(uids) == _PODS_AT_ONCE:
                    yield from self._pods_volumes(pods, uids)
                    uids = []
            yield from self._pods_volumes(pods, uids)
        finally:
            os.close(pods)

    def _pods_volumes(self, pods: int, uids: list[str]) -> Iterator[Place]:
        """The emptyDir tmpfs of each pod of ``uids``: each pod's volumes read as one bounded read
        (``_pod_volumes``), many pods' in one hand-off (host/bounded.py). A pod whose read does not answer in
        time, or fails otherwise than by its volumes dir not being there, is noted not read (its tmpfs, from the
        mount table, unknown), never skipped; one not ours to list, unreadable."""
        where = [(*KUBELET_PODS, uid, *EMPTY_DIRS) for uid in uids]
        reads = [[(self.join(*w), partial(_pod_volumes, pods, uid))] for w, uid in zip(where, uids, strict=True)]
        for uid, w, got in zip(uids, where, bounded_groups(reads), strict=True):
            answer = got if isinstance(got, OSError) else got[0]  # (a read that stuck, or the run's time spent)
            if isinstance(answer, PermissionError):  # each pod's dir is 0750 root too
                self.unreadable.append("/".join((*KUBELET_PODS, uid)))
                continue
            if isinstance(answer, OSError):
                if not _not_there(answer):  # a pod without emptyDirs is no failure; anything else is
                    self.unread.append(((*KUBELET_PODS, uid), answer.strerror or str(answer)))
                continue
            if not answer.whole:
                self.unread.append((w, f"more than {_MAX_VOLUMES} dirs: not read"))
            for vol, opened in answer.vols:
                if isinstance(opened, OSError):
                    if not _not_there(opened):
                        self.unread.append(((*w, vol), opened.strerror or str(opened)))
                    continue
                if (at := self._tmpfs_mounted(opened[0], answer.mount_id, opened[1])) is not None:
                    yield Place(TmpfsKind.EMPTY_DIR, self.join(*w, vol), uid, vol, *at)

    def _listed(self, fd: int, names: tuple[str, ...]) -> Iterator[str]:
        """``each_dir`` of the dir at ``names``; a listing that does not answer in time, or fails (EMFILE, EIO),
        ends here, noted as not read: what is below it is unknown, never taken for nothing."""
        try:
            yield from each_dir(fd, self.join(*names))
        except OSError as err:  # (StuckReadError is one)
            self.unread.append((names, err.strerror or str(err)))

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
            top = open_dir(self.fd, runroot, self.join(*runroot))
        except StuckReadError as err:
            self._stuck(runroot, err)
            return
        except PermissionError:  # there, but not ours to list: said, never taken for "no CRI-O here"
            self.unreadable.append("/".join(runroot))
            return
        except OSError:
            return
        try:
            for driver in self._listed(top, runroot):
                if not driver.endswith("-containers"):
                    continue
                try:
                    boxes = open_dir(top, (driver,), self.join(*runroot, driver))
                except StuckReadError as err:
                    self._stuck((*runroot, driver), err)
                    continue
                except PermissionError:
                    self.unreadable.append("/".join((*runroot, driver)))
                    continue
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
        for box in self._listed(boxes, where):
            try:
                fd = open_dir(boxes, (box, *below[:-1]), self.join(*where, box, *below[:-1]))
            except StuckReadError as err:
                self._stuck((*where, box), err)
                continue
            except PermissionError:  # a sandbox's dir not ours to list: its shm cannot be seen, said
                self.unreadable.append("/".join((*where, box)))
                continue
            except OSError:
                continue
            try:
                path = self.join(*where, box, *below)
                if (got := self.tmpfs_at(fd, below[-1], path)) is not None:
                    yield Place(TmpfsKind.SANDBOX_SHM, path, None, box, *got)
            except StuckReadError as err:
                self._stuck((*where, box, *below), err)
            finally:
                os.close(fd)


def _layout_place(
    rel: tuple[str, ...], state_dirs: Sequence[tuple[str, ...]]
) -> tuple[TmpfsKind | None, str | None, str | None]:
    """What a tmpfs mounted at ``rel`` (components under the root) is by the layout: (kind, pod uid, volume)."""
    n = len(KUBELET_PODS)
    if len(rel) == n + 4 and rel[:n] == KUBELET_PODS and rel[n + 1 : n + 3] == EMPTY_DIRS:
        return TmpfsKind.EMPTY_DIR, rel[n], rel[-1]
    if rel == HOST_SHM:
        return TmpfsKind.HOST, None, None
    for state in (*CONTAINERD_STATES, *state_dirs):
        k = len(state) + len(CRI_SANDBOXES)
        if len(rel) == k + 2 and rel[:k] == (*state, *CRI_SANDBOXES) and rel[-1] == "shm":
            return TmpfsKind.SANDBOX_SHM, None, rel[k]
    for runroot in (*CRIO_RUN_ROOTS, *state_dirs):
        k = len(runroot)
        crio = len(rel) == k + 2 + len(CRIO_SHM) and rel[:k] == runroot and rel[k].endswith("-containers")
        if crio and rel[k + 2 :] == CRIO_SHM:
            return TmpfsKind.SANDBOX_SHM, None, rel[k + 1]
    return None, None, None


def _by_path(p: Place) -> str:
    return p.path


def runtime_layouts(state_dirs: Iterable[tuple[str, ...]] = ()) -> list[str]:
    """The runtime layout dirs looked for (for a message): containerd's state dirs, CRI-O's run roots, custom."""
    return ["/".join(d) for d in (*CONTAINERD_STATES, *CRIO_RUN_ROOTS, *state_dirs)]


__all__ = [
    "CONTAINERD_STATES",
    "CRIO_RUN_ROOTS",
    "KUBELET_PODS",
    "LAYOUT_S",
    "POD_LOGS",
    "NodeRoot",
    "Place",
    "TmpfsKind",
    "each_dir",
    "open_dir",
    "runtime_layouts",
    "state_dir_parts",
]
