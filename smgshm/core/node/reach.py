"""Which processes reach each tmpfs of a node, and so in which pid namespaces its SMG names are judged:
the one rule of the node view (gc --node, doctor --node, watch --node and its exporter all judge by it).

SMG names a segment by its producer's pid in the producer's pid namespace, and a producer writes only
where it reaches. So every process that reaches a tmpfs now contributes its pid namespace, whatever the
way: its /dev/shm, a mount of that tmpfs anywhere in its mount namespace (a sidecar's emptyDir at
/cache; each mount namespace's table is read once), its cwd or root, an open fd or a mapped file there
(host/holders.py's index by device), or a dir handle (a cwd or root, one thread's included, an open dir fd)
on a mount of another mount namespace where the tmpfs is mounted, at any place (host/dirhandle.py): ``..``
walks that namespace's mounts, so an fd to the host's /etc leaked into a container (runc's CVE-2024-21626)
writes into every pod's tmpfs, at the kubelet's path, with ``openat(fd, "../...")`` and its own pids. What
the rule assumes, and why:

- **The host's own mounts write no SMG name.** The kubelet mounts a pod's emptyDir at its path under
  ``var/lib/kubelet/pods``, the runtime its sandbox shm under its state dir; the host's processes (the
  kubelet's disk accounting, a node agent, smgshm itself) reach every tmpfs that way. So a process in
  the host's mount namespace (pid 1's, and this process's own) counts only through its /dev/shm (the
  host's own /dev/shm is judged in the host's pid namespace), and a mount at the tmpfs's own place
  (as the host names it, or as this process does: a copy of the host's mount, in a namespace made
  from the host's) is the host's for the processes of that namespace. This is the one assumption: SMG
  writes through its own /dev/shm. It is about who holds a way, not about mounts: a process outside the
  host's mount namespace holding a dir handle into it (or into any namespace other than its own) is no
  host process, and reaches every tmpfs mounted there, its own place included. A handle on a mount in no
  table this process can read (detached: ``umount -l``, ``open_tree``) may lead anywhere: what lies under
  it cannot be told from here, so it counts as a route to every tmpfs, and its holder's pid namespace
  judges each, weakly as below (it may not reach it: a pid alive only there is unknown, never alive);
  host/pidtrust.py, by the same rule, calls it doubt (host/dirhandle.py's ``handle_ways``).
- **A view of the host's / is the host's mount, or a way in: it cannot be told.** A process of another
  mount namespace with the tmpfs mounted at its own place under some prefix
  (``<prefix>/var/lib/kubelet/pods/...``, the place as a view of the host's / names it: a node agent's
  hostPath / at /host/root, and the host itself when its mount namespace cannot be read, /proc/1/ns/mnt
  refused, with a / that is not the node root) reaches it as the host does, and could write through it
  too. Its pid namespace judges there only weakly (``ShmUser.maybe_host``; judge.py): a pid alive only
  in such namespaces is unknown, never alive; one dead in all of them is dead either way. When the
  host's mount namespace was not read, ``Reach.host_mnt`` says so (sight.py reports it).
- **A sandbox's infra (pause) container is no producer.** containerd gives it the sandbox shm as its
  /dev/shm, and with the kubelet's default it is pid 1 of a pid namespace of its own, where a dead
  gateway's ``smg-tokenspeed-1-*`` would read alive. It is told by proof, not by name: its cgroup leaf
  is the very sandbox id that names the shm dir (cgroupfs: ``.../pod<uid>/<id>``; systemd:
  ``cri-containerd-<id>.scope``). Its pid namespace still judges when another process in it reaches
  the tmpfs (``shareProcessNamespace``).
- **A process that cannot be read** (its namespaces or links refuse this process: another user
  namespace's, an LSM's) may reach any tmpfs the runtime gave its pod: the runtime mounts a pod's tmpfs
  (an emptyDir, the sandbox shm) into that pod's containers only, and puts each of their processes in
  the pod's cgroup, which /proc/P/cgroup shows to anyone. So it puts the segments of its uid in doubt on
  the tmpfs of its own pod (or on every tmpfs when its cgroup cannot be read either, or names no pod, or
  the tmpfs's pod is not known), and on no other. A process of no pod may be the host's, which reaches a
  pod's tmpfs only as the host does, or a container of another kind (or a hand-made one) that mounts it:
  whose, its mount namespace would tell, and that is what could not be read.
  Its pid namespace, when it is one already judging there, adds nothing (its pids are counted anyway).

No process reaching a tmpfs is a judgement too, not a shrug: its names were written by processes that
have all gone (scan.py's judge calls them leaked; one seen before this look is proven so by order).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from smgshm.core.host.bounded import bounded_calls, bounded_each, bounded_groups
from smgshm.core.host.dirhandle import dir_mount, handle_ways
from smgshm.core.host.holders import Holder
from smgshm.core.host.mounts import Mount, read_mounts
from smgshm.core.host.pidtrust import INIT_PID_NS
from smgshm.core.host.proc import is_kernel_thread, ns_pids, thread_views, uid_of
from smgshm.core.node.layout import Place
from smgshm.core.node.pods import MAX_CGROUP_BYTES, pod_uid_in
from smgshm.core.node.volumes import ShmUser, Unread, pidns_of_self

_LEAF = re.compile(rb"^[0-9]+:[^:\n]*:(/[^\n]*)$", re.MULTILINE)  # a cgroup line's path


def cgroup_leaves(cgroup: bytes) -> set[str]:
    """The last component of each hierarchy's path in a /proc/P/cgroup text ("/" lines left out)."""
    return {os.fsdecode(p.rstrip(b"/").rpartition(b"/")[2]) for p in _LEAF.findall(cgroup) if p.strip(b"/")}


def sandbox_of(cgroup: bytes, sandboxes: Iterable[str]) -> str | None:
    """The sandbox whose infra container this process is: every cgroup leaf it has is that very sandbox
    id (the cgroupfs driver's leaf, or the systemd driver's ``<runtime>-<id>.scope``); else None."""
    leaves = cgroup_leaves(cgroup)
    if not leaves:
        return None
    for sid in sandboxes:
        if all(leaf == sid or leaf.endswith(f"-{sid}.scope") for leaf in leaves):
            return sid
    return None


@dataclass
class Reach:
    """Who reaches each tmpfs (by st_dev), who could not be read, and each sandbox's pod (its pause's cgroup)."""

    by_dev: dict[int, list[ShmUser]] = field(default_factory=dict)
    unread: list[Unread] = field(default_factory=list)
    sandbox_pod: dict[str, str] = field(default_factory=dict)  # sandbox id -> pod uid, proven by its pause
    pause: dict[int, str] = field(default_factory=dict)  # pid -> the sandbox it is the infra container of
    host_mnt: str = ""  # what could not be read of the host's mount namespace, when a reach depended on it
    tables: dict[str, list[Mount]] = field(default_factory=dict)  # the mount tables read (namespace -> table)

    def doubtful(self, pod_uid: str | None, judged_in: Iterable[str]) -> list[Unread]:
        """The unread processes that put a tmpfs's names in doubt (the module says which): of its pod
        ``pod_uid``, of no pod (a process outside every pod, whose mount namespace could not be read, may be
        a container of another kind as well as the host's), or with no cgroup read; none whose pid namespace
        judges there."""
        known = set(judged_in)
        return [
            u for u in self.unread if u.pidns not in known and (pod_uid is None or u.pod_uid in (None, "", pod_uid))
        ]


def _bases(pid: int) -> list[str]:
    """/proc/P, and each other thread's dir when it has more than one: a thread that unshared CLONE_FS has a
    cwd, root and even mount namespace of its own, and a zombie leader's links read as gone while its
    other threads live on."""
    base = f"/proc/{pid}"
    try:
        if os.stat(f"{base}/task").st_nlink <= 3:  # 2 + the number of threads
            return [base]
        return [base, *(f"{base}/task/{t.name}" for t in os.scandir(f"{base}/task") if t.name != str(pid))]
    except OSError:
        return [base]


def _read_cgroup(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return f.read(MAX_CGROUP_BYTES)
    except OSError:
        return None


def _shm_dev(base: str) -> int:
    """st_dev of the /dev/shm in the root of the thread at ``base`` (/proc/P or /proc/P/task/T), its components
    opened there without following a link: an absolute link would resolve against this process's root, not
    its (ELOOP/ENOTDIR then)."""
    fd = os.open(f"{base}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in ("dev", "shm"):
            nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


class _Walk:
    """One pass over the processes for every tmpfs at once."""

    def __init__(self, places: Sequence[Place], root: str, holders: dict[tuple[int, int], list[Holder]]) -> None:
        self.devs = {p.dev for p in places}
        # A tmpfs's own places, as this process and as the host name them: a mount there is the host's.
        self.own: dict[int, set[str]] = {}
        self.rel: dict[int, set[str]] = {}  # its places under the node root: "/var/lib/kubelet/pods/..."
        base = os.path.abspath(root)
        for p in places:
            names = self.own.setdefault(p.dev, set())
            names.add(p.path)
            rel = os.path.relpath(p.path, base)
            if not rel.startswith("..") and rel != ".":
                names.add("/" + rel)
                self.rel.setdefault(p.dev, set()).add("/" + rel)
        self.sandboxes = [p.volume for p in places if p.kind == "sandbox_shm" and p.volume]
        self.fds: dict[int, dict[int, str]] = {}  # pid -> dev -> how (an open fd, a mapped file)
        for (dev, _ino), hs in holders.items():
            for h in hs:
                self.fds.setdefault(h.pid, {}).setdefault(dev, "an open fd" if h.how == "fd" else "a mapped file")
        self.tables: dict[str, list[Mount]] = {}  # mount namespace -> its table (read once)
        # mount namespace -> dev -> a mount point of it there, and whether it may be the host's own (the module)
        self.mounted: dict[str, dict[int, tuple[str, bool]]] = {}
        # The dir handles of processes outside the host's mount namespace, told once every table is known
        # (``handles``): each holder's ShmUser but for its route, its own mount namespaces, mount id -> how.
        self.held: list[tuple[ShmUser, set[str], dict[int, str], set[int]]] = []
        self.host_mnt: set[str] = set()
        with contextlib.suppress(OSError):
            self.host_mnt.add(os.readlink("/proc/self/ns/mnt"))
        self.host_unknown = ""  # why pid 1's mount namespace could not be read ("" when it was)
        try:
            self.host_mnt.add(os.readlink("/proc/1/ns/mnt"))
        except OSError as err:
            self.host_unknown = f"/proc/1/ns/mnt: {err.strerror or err}"
        self.mine = pidns_of_self()
        self.out = Reach()
        # Each thread's routes read ahead for many processes at once (``read_ahead``): base -> (its mount
        # namespace, the answers of ``_route_reads``, or the error of the one that stuck)
        self.ahead: dict[str, tuple[str, list[object] | OSError]] = {}
        self.cgroups: dict[int, bytes | None] = {}  # pid -> its cgroup, as read ahead
        # pid -> each fd table's dir, its fds that name a path, and their stats (or the error of one that stuck)
        self.fds_ahead: dict[int, list[tuple[str, list[tuple[str, str]], list[object] | OSError]]] = {}

    def _route_reads(self, base: str, host: bool) -> list[tuple[str, Callable[[], object]]]:
        """The reads of a thread's routes that may stall: its /dev/shm through its root, and (outside the host's
        mount namespace) its cwd's and root's filesystems' getattr."""
        reads: list[tuple[str, Callable[[], object]]] = [(f"{base}/root/dev/shm", partial(_shm_dev, base))]
        if not host:
            reads += [(f"{base}/{what}", partial(os.stat, f"{base}/{what}")) for what in ("cwd", "root")]
        return reads

    def read_ahead(self, pids: Iterable[int]) -> None:
        """The routes reads of every thread of ``pids`` (not a sandbox's pause: ``visit`` reads nothing of it), then
        the dir handles' stats of those outside the host's mount namespace whose routes answered, in few hand-offs
        (host/bounded.py): each a round trip of threads. One group per process, all its threads' reads: a process
        whose read sticks costs one stuck read and is unread, as ``visit``'s own reads made it."""
        procs: list[tuple[int, list[tuple[str, str, int]]]] = []  # pid, each thread's (base, mount namespace, reads)
        groups: list[list[tuple[str, Callable[[], object]]]] = []
        for pid in pids:
            cgroup = self.cgroups[pid] = _read_cgroup(pid)
            if cgroup is not None and self.sandboxes and sandbox_of(cgroup, self.sandboxes) is not None:
                continue
            bases: list[tuple[str, str, int]] = []
            reads: list[tuple[str, Callable[[], object]]] = []
            for base in _bases(pid):
                with contextlib.suppress(OSError):  # gone, or not ours: ``visit`` reads it again and says so
                    mntns = os.readlink(f"{base}/ns/mnt")
                    mine = self._route_reads(base, mntns in self.host_mnt)
                    bases.append((base, mntns, len(mine)))
                    reads += mine
            if bases:
                procs.append((pid, bases))
                groups.append(reads)
        outside: list[int] = []  # answered, and outside the host's mount namespace: its dir handles matter
        for (pid, bases), got in zip(procs, bounded_groups(groups), strict=True):
            at = 0
            for base, mntns, n in bases:
                self.ahead[base] = (mntns, got if isinstance(got, OSError) else got[at : at + n])
                at += n
            if not isinstance(got, OSError) and any(mntns not in self.host_mnt for _b, mntns, _n in bases):
                outside.append(pid)
        tables: list[tuple[int, list[tuple[str, list[tuple[str, str]]]]]] = []
        for pid in outside:
            with contextlib.suppress(OSError):
                tables.append((pid, self._fd_paths(pid)))
        stats = bounded_groups(
            [[(path, partial(os.stat, path)) for _base, paths in fds for path, _ in paths] for _pid, fds in tables]
        )
        for (pid, fds), got in zip(tables, stats, strict=True):
            at, kept = 0, self.fds_ahead.setdefault(pid, [])
            for base, paths in fds:
                kept.append((base, paths, got if isinstance(got, OSError) else got[at : at + len(paths)]))
                at += len(paths)

    def _hostlike(self, dev: int, point: str) -> bool:
        """Whether a mount of ``dev`` at ``point`` is a view of the host's /: its place under the node root,
        under some prefix (the module)."""
        return any(point.endswith(rel) for rel in self.rel.get(dev, ()))

    def _mounted(self, base: str, mntns: str) -> dict[int, tuple[str, bool]]:
        """The tmpfs mounted in the mount namespace ``mntns`` (read at ``base``) other than at their own places,
        each with a mount point and whether every such mount may be the host's own (read once per namespace)."""
        got = self.mounted.get(mntns)
        if got is None:
            table = self.tables.get(mntns)
            if table is None:
                table = self.tables[mntns] = read_mounts(f"{base}/mountinfo")
            got = {}
            for m in table:
                if m.dev in self.devs and m.point not in self.own[m.dev]:
                    hostlike = self._hostlike(m.dev, m.point)
                    if m.dev not in got or (got[m.dev][1] and not hostlike):
                        got[m.dev] = (f"a mount at {m.point}", hostlike)
            self.mounted[mntns] = got
        return got

    def _routes(self, base: str, routes: dict[int, str], own: set[str], dirs: dict[int, str], maybe: set[int]) -> bool:
        """Add every tmpfs the thread at ``base`` reaches to ``routes``, with how (its /dev/shm first), and,
        outside the host's mount namespace, its own mount namespace to ``own`` and the mounts its cwd and root
        are on to ``dirs`` (``handles`` tells them); ``maybe``: the tmpfs it reaches only by a mount that may
        be the host's own (the module). Whether its /dev/shm is a link (which tmpfs that
        reaches cannot be told from here: a link resolves in its root, not this one's). FileNotFoundError
        when the thread is gone (or a zombie leader)."""
        ahead = self.ahead.pop(base, None)
        mntns = os.readlink(f"{base}/ns/mnt")  # (again: a thread that joined another namespace since is read again)
        host = mntns in self.host_mnt
        if ahead is not None and ahead[0] == mntns:  # read ahead with many processes' (``read_ahead``)
            if isinstance(ahead[1], OSError):
                raise ahead[1]  # a read that stuck: the process is unread (``visit``)
            got = ahead[1]
        else:  # a thread begun since, or moved: its reads, each may stall, in one hand-off
            got = bounded_calls(self._route_reads(base, host))
        linked = False
        dev: int | None = None
        if isinstance(got[0], FileNotFoundError):
            if not os.path.exists(f"{base}/root"):
                raise got[0]
            # a root with no /dev/shm
        elif isinstance(got[0], OSError):
            if got[0].errno not in (errno.ELOOP, errno.ENOTDIR):
                raise got[0]
            linked = True
        else:
            dev = cast(int, got[0])
        if dev in self.devs:
            _route(routes, maybe, dev, "its /dev/shm")
        if host:
            return linked  # the host's: only its /dev/shm (the module says why)
        own.add(mntns)
        for d, (how, hostlike) in self._mounted(base, mntns).items():
            _route(routes, maybe, d, how, hostlike)
        whose = "its" if base.count("/") == 2 else f"its thread {base.rpartition('/')[2]}'s"
        for what, st in zip(("cwd", "root"), got[1:], strict=True):
            if isinstance(st, OSError):
                raise st
            st = cast(os.stat_result, st)
            if st.st_dev in self.devs:
                _route(routes, maybe, st.st_dev, f"{whose} {what}")
            else:
                self._dir(f"{base}/{what}", None, st, f"{whose} {what}", dirs)
        return linked

    def _dir(self, path: str, fdinfo: str | None, st: os.stat_result, how: str, dirs: dict[int, str]) -> None:
        """Note the mount the handle at ``path`` is on in ``dirs``, when it is a dir (dirhandle.py)."""
        try:
            mid = dir_mount(path, fdinfo, st)
        except FileNotFoundError:
            return  # closed, or the thread gone, mid-walk
        if mid is not None:
            dirs.setdefault(mid, how)

    @staticmethod
    def _fd_paths(pid: int) -> list[tuple[str, list[tuple[str, str]]]]:
        """Each fd table of ``pid`` (a thread may have its own): its dir, and its fds that name a path (socket:,
        pipe:, anon_inode: are no dir), each (its /proc path, its number). procfs's own reads: inline."""
        out: list[tuple[str, list[tuple[str, str]]]] = []
        for base in (f"/proc/{pid}", *thread_views(pid)[0]):
            try:
                fds = os.scandir(f"{base}/fd")
            except FileNotFoundError:
                continue  # the thread has exited
            paths: list[tuple[str, str]] = []
            with fds:
                for fd in fds:
                    try:
                        if os.readlink(fd.path).startswith("/"):
                            paths.append((fd.path, fd.name))
                    except FileNotFoundError:
                        continue  # closed mid-walk
            out.append((base, paths))
        return out

    def _fd_dirs(self, pid: int, dirs: dict[int, str]) -> None:
        """Note the mounts the open dir fds of ``pid`` are on (each fd table: a thread may have its own)."""
        ahead = self.fds_ahead.pop(pid, None)
        if ahead is None:  # not read ahead: each its filesystem's getattr, which may stall, in one hand-off
            ahead = [(base, paths, bounded_each([p for p, _ in paths], os.stat)) for base, paths in self._fd_paths(pid)]
        for base, paths, stats in ahead:
            if isinstance(stats, OSError):
                raise stats  # a read that stuck: the process is unread (``visit``)
            whose = "its" if base.count("/") == 2 else f"its thread {base.rpartition('/')[2]}'s"
            for (path, name), st in zip(paths, stats, strict=True):
                if isinstance(st, FileNotFoundError):
                    continue  # closed mid-walk
                if isinstance(st, OSError):
                    raise st
                st = cast(os.stat_result, st)
                if st.st_dev not in self.devs:  # one on a tmpfs is the holders' (an open fd)
                    self._dir(path, f"{base}/fdinfo/{name}", st, f"{whose} open fd {name}", dirs)

    def _unread(self, pid: int, cgroup: bytes | None) -> None:
        uid = uid_of(pid)
        if uid is None:
            return  # gone
        try:
            depth = len(ns_pids(pid))
        except OSError:
            return  # gone
        try:
            pidns: str | None = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            pidns = self.mine if depth == 1 else None  # one level deep is this namespace; deeper cannot be placed
        pod = None if cgroup is None else (pod_uid_in(cgroup) or "")
        if pod == "" and ((pid == 1 and pidns == INIT_PID_NS) or is_kernel_thread(pid)):
            # The host's init is in the host's mount namespace by definition (it is the one that names it);
            # a kernel thread has no files and no /dev/shm: neither writes through a pod's tmpfs.
            return
        self.out.unread.append(Unread(pid, uid, pod, pidns))

    def visit(self, pid: int, stuck: bool = False) -> None:
        cgroup = self.cgroups.pop(pid) if pid in self.cgroups else _read_cgroup(pid)
        if cgroup is not None and self.sandboxes and (sid := sandbox_of(cgroup, self.sandboxes)) is not None:
            self.out.pause[pid] = sid  # no producer: never a reacher, never a doubt
            if (pod := pod_uid_in(cgroup)) is not None:
                self.out.sandbox_pod.setdefault(sid, pod)
            return
        if stuck:  # its fds or maps could not be read (a stuck read, bounded.py): it may reach any of its pod's
            self._unread(pid, cgroup)
            return
        routes: dict[int, str] = {}
        maybe: set[int] = set()  # the tmpfs it reaches only by a mount that may be the host's own
        own: set[str] = set()  # its threads' mount namespaces other than the host's
        dirs: dict[int, str] = {}  # mount id -> the first dir handle of it on that mount
        linked, live, pidns = False, "", ""
        try:
            for base in _bases(pid):
                try:
                    linked = self._routes(base, routes, own, dirs, maybe) or linked
                    pidns = pidns or os.readlink(f"{base}/ns/pid")
                    live = live or base
                except (FileNotFoundError, ProcessLookupError):
                    continue  # this thread has exited (or is the zombie leader): the others decide
            if not live:
                return  # gone: it writes nothing any more
            if linked:
                self._unread(pid, cgroup)
            for d, how in self.fds.get(pid, {}).items():
                _route(routes, maybe, d, how)
            if own:  # outside the host's mount namespace: its dir handles may lead into another's
                self._fd_dirs(pid, dirs)
            if not routes and not dirs:
                return
            nspid = ns_pids(pid)
        except (FileNotFoundError, ProcessLookupError):
            return
        except OSError:
            self._unread(pid, cgroup)  # EACCES, EPERM: not this process's to read
            return
        self._add(pid, cgroup, pidns, nspid, routes, own, dirs, maybe)

    def _add(
        self,
        pid: int,
        cgroup: bytes | None,
        pidns: str,
        nspid: list[int],
        routes: dict[int, str],
        own: set[str],
        dirs: dict[int, str],
        maybe: set[int],
    ) -> None:
        """Count ``pid`` among the reachers of each tmpfs of ``routes`` (weakly for those of ``maybe``: the
        module); keep its dir handles for ``handles``."""
        uid = uid_of(pid)
        if uid is None or not nspid:
            return
        pod = pod_uid_in(cgroup) if cgroup is not None else None
        for dev, how in routes.items():
            self.out.by_dev.setdefault(dev, []).append(ShmUser(pid, pidns, len(nspid), uid, pod, how, dev in maybe))
            if dev in maybe and self.host_unknown:
                self.out.host_mnt = self.host_unknown
        if dirs:
            self.held.append((ShmUser(pid, pidns, len(nspid), uid, pod), own, dirs, set(routes)))

    def handles(self, pids: Iterable[int]) -> None:
        """After the walk: each dir handle noted (``held``) on a mount of another mount namespace than its
        holder's own, where a tmpfs is mounted (at any place: the host's namespace has every pod's at the
        kubelet's), is a route to that tmpfs. The holder's own namespaces are left out: a mount there is
        a route already (``_mounted``), or the host's copy (the module says why). A handle on a mount in no
        table this process can read (detached: ``umount -l``, ``open_tree(OPEN_TREE_CLONE)``) may lead to
        any tmpfs (what lies under it cannot be told): it is a route to every one, so its holder's pid
        namespace judges each (its names there are alive or unknown, never leaked). The rule, one for the
        host's walk and this, is host/dirhandle.py's ``handle_ways``."""
        if not self.held:
            return
        ways = handle_ways({mid for _u, _own, dirs, _r in self.held for mid in dirs}, self.tables, pids, self.devs)
        for user, own, dirs, reached in self.held:
            for mid, how in dirs.items():
                way = ways[mid]
                if way is None:
                    for dev in sorted(self.devs - reached):
                        reached.add(dev)
                        why = (
                            f"{how}, a dir on mount {mid}, which is in no mount table this process can read "
                            "(detached: umount -l, open_tree): what it reaches cannot be told, so it may reach "
                            "this tmpfs"
                        )
                        # May reach it, or not: its pid namespace judges weakly (a pid alive only there is unknown).
                        self.out.by_dev.setdefault(dev, []).append(user._replace(how=why, maybe_host=True))
                    continue
                ns, points = way
                if ns in own:
                    continue  # its own: a mount there is a route already, or the host's copy
                for dev, point in points.items():
                    if dev not in reached:
                        reached.add(dev)
                        why = f"{how}, a dir on a mount of mount namespace {ns}, where this tmpfs is mounted at {point}"
                        self.out.by_dev.setdefault(dev, []).append(user._replace(how=why))


def _route(routes: dict[int, str], maybe: set[int], dev: int, how: str, hostlike: bool = False) -> None:
    """Note that a process reaches ``dev`` by ``how``: a way that may be the host's own (``hostlike``) only
    when no other is known; ``maybe`` keeps the tmpfs reached by such ways alone."""
    if dev not in routes:
        routes[dev] = how
        if hostlike:
            maybe.add(dev)
    elif dev in maybe and not hostlike:
        routes[dev] = how
        maybe.discard(dev)


def reachers(
    places: Sequence[Place],
    root: str,
    pids: Iterable[int],
    holders: dict[tuple[int, int], list[Holder]],
    stuck: Iterable[int] = (),
) -> Reach:
    """The module's rule over ``pids``, for every tmpfs of ``places`` (found under the node ``root``), in one pass;
    ``holders``: every tmpfs's open and mapped files (``holder_index_devs``); ``stuck``: the processes whose
    fds or maps it could not read (a read that stuck), counted as unread. A read here that sticks
    (host/bounded.py) makes its process unread too, as one refused."""
    walk = _Walk(places, root, holders)
    unsure = set(stuck)
    everyone = list(pids)
    walk.read_ahead(p for p in everyone if p not in unsure)  # (one whose read stuck: unread, never read again)
    for pid in everyone:
        walk.visit(pid, pid in unsure)
    walk.handles(everyone)
    walk.out.tables = walk.tables
    return walk.out


__all__ = ["Reach", "cgroup_leaves", "reachers", "sandbox_of"]
