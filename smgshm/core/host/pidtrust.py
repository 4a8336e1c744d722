"""Whether a dead-looking producer pid proves a dead producer, decided by the filesystem itself.

A segment's name carries its producer's pid *in the producer's pid namespace*. gc can read
that pid only in its own namespace, so the verdict is trusted only when no process in any
other pid namespace can reach the same filesystem. Where that process sees it does not
matter (``-v /dev/shm:/host-shm``, a bind mount of a subdirectory, another tmpfs path): the
test is the device, as each other mount namespace's /proc/P/mountinfo reports it, and, since
a process keeps a filesystem it no longer mounts (``cd D; umount -l D`` leaves D its cwd),
the device of each such process's cwd, root, open fds and mapped files, thread by thread (a
thread may have its own cwd, root, fd table and mount namespace, and a process whose leader
thread exited shows none of them at /proc/P). A process that holds a handle to a mount
namespace (an open ``mnt:[...]`` fd, a pidfd of a process in it, or a bind-mounted namespace
file in its mount table) can setns(2) into it and write there at any time, so a handle to one
that sees the filesystem, or to one gc cannot read, makes the verdict untrusted too (handles
to pid namespaces do not: see ``judge_trust``). So does a way into a procfs of gc's own pid
namespace (the initial one): one in its mount table (all of it, even under another mount, as
``unshare --mount-proc`` leaves the host's, or a bound part holding process dirs of that
namespace), a cwd, root or open dir there, or a handle to a mount namespace that has one. Its
/proc/X dirs lead to every process's root, cwd, fds and mount namespace, so to every
filesystem: ``openat(fd, "root/dev/shm/...")`` writes to this one with nothing of it in the
holder's own mounts. A container's own procfs (its pid namespace's) and the parts of it bound
read-only (/proc/sys, /proc/bus, /proc/irq, /proc/sysrq-trigger) do not count: see
``_Procfs``. Any dir handle too (a cwd, root or open dir fd, an ``open_tree`` fd) on a mount of
a mount namespace that sees the filesystem, its holder's own or not: ``..`` walks that namespace's
mounts, so ``openat(fd, "../<path>/smg-...")`` from an inherited fd to the host's /etc writes there
(runc's CVE-2024-21626); one on a mount in no table gc can read (detached) is doubt. What cannot
be read is doubt: a process whose namespaces this user may not read puts its uid's segments in
doubt, and unreadable mounts of another pid namespace, or a procfs that cannot be told from gc's
namespace's, make the verdict untrusted.

What this cannot see: a producer in another pid namespace that reached the filesystem only
for a while (an fd passed to it and since closed, a setns(2) in and back out without keeping
a handle) and keeps nothing of it now; an fd kept only where no fd table shows it (in flight
in a unix socket's queue, registered with io_uring); mounts outside a chrooted process's root,
which its mountinfo leaves out; and anything that starts after the look (a new container, a join),
whose segments no sighting from before the look (``Trust.since_ns``) can cover, so ``--min-age``
keeps them. Names mounted on in any mount namespace are listed by ``mountpoints.mount_points``.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from smgshm.core.host import clock
from smgshm.core.host.bounded import StuckReadError, bounded, within
from smgshm.core.host.dirhandle import dir_mount, handle_ways
from smgshm.core.host.mounts import Mount, mount_of, nsfs_mounts, read_mounts
from smgshm.core.host.proc import (
    PROC_ROOT_INO,
    PROC_SUPER_MAGIC,
    fd_mount_id,
    fs_magic,
    in_nested_pid_ns,
    live_pids,
    readlink_or,
    same_fd_table,
    thread_lives,
    uid_of,
)

WALK_S = 30.0  # one walk's reads in all (bounded.py): a stuck one costs bounded.READ_S, many no more than this
INIT_PID_NS = "pid:[4026531836]"  # PROC_PID_INIT_INO: the host's initial pid namespace
_ASSUME = "pass --assume-dead to judge by this namespace's pids anyway"


@dataclass(frozen=True)
class Trust:
    trusted: bool
    note: str
    # uids owning processes whose namespaces gc could not read: their segments stay unknown
    doubt_uids: frozenset[int] = field(default_factory=frozenset)
    # When the look that decided it began (boot clock, ns; 0: not known). It says nothing of a segment
    # written after it, which a process that joined since may have named by its own pid: only one seen
    # before it (segments/sightings.py) has a trusted pid verdict that needs no age to reap on.
    since_ns: int = 0


def _holds_processes(root: str) -> bool:
    """Whether the part of a procfs a mount shows (its root there) holds process dirs: all of it,
    or a part of a /proc/<pid>. The rest (sys, bus, irq, sysrq-trigger, ...) holds none, and a
    bind mount reaches nothing above its own root (``..`` leaves the mount there)."""
    first = root.lstrip("/").split("/", 1)[0]
    return not first or first[0].isdigit() or first in ("self", "thread-self")


class _Procfs:
    """Whether what a process holds (a mount, a cwd or root, a dir fd) leads into a procfs of gc's
    pid namespace. From there every process of that namespace is in reach, and through their
    root, cwd, fd and ns/mnt links every filesystem they see: whoever holds one reaches this
    filesystem whatever its own mounts show.

    Whose procfs: at its root, readlinkat("self") resolves only in a procfs of a pid namespace gc
    has a pid in (gc's: it is in the initial one) and says ENOENT in a descendant's; a superblock
    is one pid namespace's, so the answer is kept per st_dev. A dir is followed up (``..``) to that
    root, as its holder can; a bind mount of a part stops it at the part's root, and then the
    part counts only when it holds process dirs of gc's pid namespace (a process of another pid
    namespace is looked at on its own). A file or symlink there leads to no filesystem (an open
    /proc/X/mem is a way into a process, not counted). What cannot be told is doubt: None, never
    False."""

    _DEPTH = 16  # deeper than any procfs dir

    def __init__(self, mine: str, tables: dict[str, list[Mount]]) -> None:
        self.mine = mine
        self.tables = tables  # the walk's, to name the mount a bound part is
        self.ours: dict[int, bool] = {}  # st_dev -> a procfs of gc's pid namespace (False: another's, or no procfs)
        with contextlib.suppress(OSError):
            self.held("/proc")  # gc's own: then a bind of it, even one covered by another mount, is told at once

    def mount(self, m: Mount, base: str) -> bool | None:
        """Whether mount ``m`` of the table read at ``base`` (/proc/P or /proc/P/task/T) leads in;
        OSError when it cannot be looked at."""
        if m.fstype != "proc" or not _holds_processes(m.root) or self.ours.get(m.dev) is False:
            return False
        if m.root == "/" and self.ours.get(m.dev):
            return True
        fds = [os.open(f"{base}/root{m.point}", os.O_PATH)]  # through the holder's root: its mounts
        try:
            if fd_mount_id(fds[0]) != m.mount_id:
                return None  # another mount covers it (or it moved): not the one to tell
            return self._follow(fds)
        finally:
            for fd in fds:
                os.close(fd)

    def held(self, path: str) -> bool | None:
        """Whether the dir at ``path`` (a magic link: a thread's cwd or root, or an fd) leads in;
        FileNotFoundError when it is gone, another OSError when it cannot be looked at."""
        fds = [os.open(path, os.O_PATH)]  # the very dir, on the very mount, the holder has
        try:
            return self._follow(fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _follow(self, fds: list[int]) -> bool | None:
        """Up from the dir open at ``fds[-1]`` (fds opened on the way are appended, to be closed)."""
        here = os.fstat(fds[-1])
        dev = here.st_dev
        if not stat.S_ISDIR(here.st_mode) or self.ours.get(dev) is False:
            return False
        if dev not in self.ours and (os.major(dev) != 0 or fs_magic(fds[-1]) != PROC_SUPER_MAGIC):
            self.ours[dev] = False  # a procfs is always on an anonymous device: no statfs for the rest
            return False
        for _ in range(self._DEPTH):
            if here.st_ino == PROC_ROOT_INO and self._is_root(fds[-1]):
                if dev not in self.ours:
                    try:
                        os.readlink("self", dir_fd=fds[-1])
                        self.ours[dev] = True
                    except FileNotFoundError:
                        self.ours[dev] = False  # a descendant pid namespace's: gc has no pid there
                return self.ours[dev]
            fds.append(os.open("..", os.O_PATH | os.O_DIRECTORY, dir_fd=fds[-1]))
            up = os.fstat(fds[-1])
            if up.st_dev != dev or up.st_ino == here.st_ino:
                return self._part(fds[-2])  # left the mount (or stuck at a detached one's root)
            here = up
        return None

    @staticmethod
    def _is_root(fd: int) -> bool:
        try:
            return stat.S_ISLNK(os.stat("self", dir_fd=fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return False

    def _part(self, top: int) -> bool | None:
        """A bound part of a procfs, its root open at ``top``: it leads in when it holds process dirs
        of gc's pid namespace. Those of a /proc/<pid> or a task/<tid> there say it (ns/pid; ns's
        pid); any other part holding process dirs cannot be traced: doubt."""
        mid = fd_mount_id(top)
        m = next((m for table in self.tables.values() for m in table if m.mount_id == mid), None)
        if m is not None and not _holds_processes(m.root):
            return False
        for link in ("ns/pid", "pid"):
            try:
                return os.readlink(link, dir_fd=top) == self.mine
            except FileNotFoundError:
                continue
        return None


class _Walk:
    """One look at the processes of other pid namespaces: how one reaches the filesystem of
    ``dev``, and which mount namespaces they hold a handle to (an nsfs fd or a bind-mounted
    namespace file they see), with every mount table read once per mount namespace."""

    def __init__(self, dev: int, mine: str) -> None:
        self.dev = dev
        self.tables: dict[str, list[Mount]] = {}
        self.handles: dict[str, tuple[int, str]] = {}  # mount namespace -> (pid, how it holds it)
        self.procfs = _Procfs(mine, self.tables)
        # The first way into a procfs of gc's pid namespace seen (or one that cannot be told from
        # such a way): told only when nothing reaches the filesystem more directly.
        self.procfs_way: str | None = None
        # Every dir handle (cwd, root, an open dir fd) of a process of another pid namespace, by the mount
        # it is on (the first holder of each): ``..`` from it walks that mount's namespace, so a handle on
        # a mount of a namespace that sees the filesystem is a way in (runc's CVE-2024-21626). Told last
        # (``dir_way``): one entry per mount, so the work is bounded by the mounts, not the fds.
        self.dirs: dict[int, tuple[int, str]] = {}

    def _table(self, mntns: str, base: str) -> list[Mount] | None:
        """The mount table of ``mntns`` read at ``base`` (a process's or thread's /proc dir) the first
        time it is seen, else None."""
        if mntns in self.tables:
            return None
        self.tables[mntns] = table = read_mounts(f"{base}/mountinfo")
        return table

    def _procfs_mounts(self, table: list[Mount], base: str) -> str | None:
        """The first mount in ``table`` (read at ``base``) that leads into a procfs of gc's pid
        namespace, or that cannot be told from one, as a phrase; FileNotFoundError when ``base``'s
        thread has gone."""
        for m in table:
            try:
                verdict = bounded(f"{base}/root{m.point}", self.procfs.mount, m, base)
                why = "another mount covers it, or a part of it cannot be traced"
            except OSError as err:
                if not thread_lives(base):
                    raise FileNotFoundError(base) from err
                verdict, why = None, err.strerror or str(err)
            if verdict:
                return f"a procfs of this pid namespace mounted at {m.point}"
            if verdict is None:
                return f"a procfs mounted at {m.point} that gc cannot tell from one of this pid namespace ({why})"
        return None

    def _held(self, pid: int, path: str, st: os.stat_result, how: str) -> None:
        """Note ``how`` (a cwd, root or fd of ``pid``, at the magic link ``path``, ``st`` its stat) when
        it is a dir leading into a procfs of gc's pid namespace, or one that cannot be told from it."""
        if self.procfs_way is not None or not stat.S_ISDIR(st.st_mode) or self.procfs.ours.get(st.st_dev) is False:
            return  # the usual case, at no cost: a dir on a filesystem already told
        try:
            verdict = bounded(path, self.procfs.held, path)  # through its filesystem: it may stall
        except FileNotFoundError:
            return  # closed, or the thread gone, mid-walk
        except OSError as err:
            verdict, how = None, f"{how} ({err.strerror or err})"
        if verdict:
            self.procfs_way = f"pid {pid}, in another pid namespace: {how} is a dir in a procfs of this pid namespace"
        elif verdict is None:
            self.procfs_way = (
                f"pid {pid}, in another pid namespace: {how} is a dir in a procfs gc cannot tell from one of this "
                "pid namespace"
            )

    def reaches(self, pid: int) -> tuple[str, str] | None:
        """How ``pid`` reaches the filesystem, if it does: a mount, or (without one: ``cd D; umount
        -l D``) a cwd or root, an open fd or a mapped file there. Every thread is looked at: a thread
        that called unshare(CLONE_FS) has a cwd, root and even mount namespace of its own, one that
        unshared CLONE_FILES its own fds, and once the leader thread exits (a zombie leader) the
        process's own links read as gone while its other threads live on. ("mount", where) or
        ("reach", how); FileNotFoundError when no thread of it lives any more; another OSError
        when its /proc entries cannot be read."""
        tids = sorted(int(t.name) for t in os.scandir(f"/proc/{pid}/task"))
        alive, mapped, fd_tids = 0, False, list[int]()
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                via = self._thread(pid, tid, base, fd_tids, mapped)
            except (FileNotFoundError, ProcessLookupError):
                continue  # this thread exited (or is the zombie leader): the others decide
            except OSError:
                if not thread_lives(base):
                    continue  # exited while read (a dying thread's mountinfo says EINVAL)
                raise
            alive += 1
            if isinstance(via, tuple):
                return via
            mapped = mapped or via
        if not alive:
            raise FileNotFoundError(f"/proc/{pid}: no live thread")
        return None

    def _thread(self, pid: int, tid: int, base: str, fd_tids: list[int], mapped: bool) -> tuple[str, str] | bool:
        """One thread's reach (a pair, as ``reaches`` says), else whether its maps were read (they are
        the process's: one address space for all threads)."""
        whose = "its" if tid == pid else f"its thread {tid}'s"
        via = self._mount_reach(pid, base) or self._link_reach(pid, base, whose)
        # Threads sharing one fd table: it is walked once.
        if via is None and not any(same_fd_table(t, tid) for t in fd_tids):
            fd_tids.append(tid)
            via = self._fd_reach(pid, base, whose)
        if via is not None:
            return via
        if mapped:
            return True  # one address space for all threads
        return self._maps_reach(base)

    def _mount_reach(self, pid: int, base: str) -> tuple[str, str] | None:
        """The filesystem mounted in the thread's mount namespace; on the way, the namespace handles
        bind-mounted there and a procfs of another pid namespace are noted."""
        mntns = os.readlink(f"{base}/ns/mnt")
        table = self._table(mntns, base)
        if table is None:
            return None
        where = mount_of(table, self.dev)
        if where is not None:
            return "mount", where.point
        for m in nsfs_mounts(table):
            self.handles.setdefault(m.root, (pid, f"a bind-mounted namespace file at {m.point}"))
        if self.procfs_way is None and (way := self._procfs_mounts(table, base)) is not None:
            self.procfs_way = f"pid {pid}, in another pid namespace, sees {way}"
        return None

    def _link_reach(self, pid: int, base: str, whose: str) -> tuple[str, str] | None:
        for what in ("cwd", "root"):
            st = bounded(f"{base}/{what}", os.stat, f"{base}/{what}")  # the magic link: works on a detached mount
            if st.st_dev == self.dev:
                return "reach", f"{whose} {what}"
            self._held(pid, f"{base}/{what}", st, f"{whose} {what}")
            self._dir(pid, f"{base}/{what}", None, st, f"{whose} {what}")
        return None

    def _dir(self, pid: int, path: str, fdinfo: str | None, st: os.stat_result, how: str) -> None:
        """Note the mount a dir handle is on (dirhandle.py), for ``dir_way``."""
        try:
            mid = dir_mount(path, fdinfo, st)
        except FileNotFoundError:
            return  # closed, or the thread gone, mid-walk
        if mid is not None:
            self.dirs.setdefault(mid, (pid, how))

    def _fd_reach(self, pid: int, base: str, whose: str) -> tuple[str, str] | None:
        """An open fd on the filesystem; on the way, the namespace handles and pidfds held are noted."""
        with os.scandir(f"{base}/fd") as fds:
            for fd in fds:
                try:
                    link = os.readlink(fd.path)
                    if link.startswith("mnt:["):
                        self.handles.setdefault(link, (pid, f"{whose} open fd {fd.name}"))
                    elif link == "anon_inode:[pidfd]" or link.startswith("pidfd:["):
                        self._pidfd(pid, f"{base}/fdinfo/{fd.name}", f"{whose} pidfd {fd.name}")
                    elif link.startswith("/"):
                        st = bounded(fd.path, os.stat, fd.path)  # its filesystem's getattr: it may stall
                        if st.st_dev == self.dev:
                            return "reach", f"{whose} open fd {fd.name}"
                        self._held(pid, fd.path, st, f"{whose} open fd {fd.name}")
                        self._dir(pid, fd.path, f"{base}/fdinfo/{fd.name}", st, f"{whose} open fd {fd.name}")
                except FileNotFoundError:
                    continue  # closed mid-walk
        return None

    def _maps_reach(self, base: str) -> tuple[str, str] | bool:
        """A mapped file on the filesystem, else whether the maps were read at all."""
        tag = f"{os.major(self.dev):02x}:{os.minor(self.dev):02x}".encode()
        data = bounded(f"{base}/maps", _read, f"{base}/maps")  # its mmap_lock, which a stuck fault holds
        for line in data.splitlines():
            parts = line.split(None, 5)
            if len(parts) >= 5 and parts[3] == tag and parts[4] != b"0":
                return "reach", "a mapped file"
        return bool(data)  # a zombie leader's maps read empty: the next thread's then

    def _pidfd(self, pid: int, fdinfo: str, how: str) -> None:
        """A pidfd is a handle to its process's mount namespace too: setns(pidfd, CLONE_NEWNS) joins
        it (Linux 5.8+). The process it names, by its pid here (fdinfo's Pid: -1 once it exited)."""
        with open(fdinfo, "rb") as f:
            target = next((line[4:].strip() for line in f if line.startswith(b"Pid:")), b"")
        if not target.isdigit() or int(target) <= 0:
            return  # an exited process's: there is nothing to join
        try:
            ns = os.readlink(f"/proc/{int(target)}/ns/mnt")
        except (FileNotFoundError, ProcessLookupError):
            return
        except OSError:
            ns = f"mnt:[of pid {int(target)}, unreadable]"  # no table: handle_hazard calls it unreadable
        self.handles.setdefault(ns, (pid, f"{how} (of pid {int(target)})"))

    def handle_hazard(self, pids: Iterable[int]) -> str | None:
        """Whether a held mount namespace handle leads to one that sees the filesystem (or to one gc
        cannot read): the holder can setns(2) into it and write there under a pid of its namespace
        at any time, and may well have done so and left (an open fd to the namespace is all it
        keeps). Bind-mounted namespace files seen in a namespace reached so are followed too."""
        fresh: dict[str, str] = {}  # namespaces the walk did not read -> where read here (their procfs is told here)
        with contextlib.suppress(OSError):
            own = os.readlink("/proc/self/ns/mnt")
            if own not in self.tables:
                self.tables[own], fresh[own] = read_mounts(), "/proc/self"
        where_is: dict[str, int] | None = None  # mount namespace -> a pid in it, indexed when needed
        todo, done = list(self.handles.items()), set()
        while todo:
            ns, (pid, how) = todo.pop()
            if ns in done:
                continue
            done.add(ns)
            held = f"pid {pid}, in another pid namespace, holds {how}, a handle to mount namespace {ns}, "
            table = self.tables.get(ns)
            if table is None:
                if where_is is None:
                    where_is = {}
                    for q in pids:
                        where_is.setdefault(readlink_or(f"/proc/{q}/ns/mnt", ""), q)
                try:
                    fresh[ns] = f"/proc/{where_is[ns]}"
                    table = self.tables[ns] = read_mounts(f"{fresh[ns]}/mountinfo")
                except (KeyError, OSError):
                    return f"{held}whose mounts gc cannot read (no process it can look at lives there)"
            where = mount_of(table, self.dev)
            if where is not None:
                return f"{held}which sees this filesystem at {where.point}: it can join it and write there at any time"
            if ns in fresh and self.procfs_way is None:
                try:
                    way = self._procfs_mounts(table, fresh[ns])
                except FileNotFoundError:
                    way = "mounts gc could not look at (the process it read them through has gone)"
                if way is not None:
                    self.procfs_way = f"{held}which has {way}: it can join it at any time"
            todo += [(m.root, (pid, f"{how}, then a namespace file at {m.point} there")) for m in nsfs_mounts(table)]
        return None

    def dir_way(self, pids: Iterable[int]) -> str | None:
        """Whether a dir handle noted (``dirs``) is on a mount of a mount namespace that sees the
        filesystem: ``openat(fd, "../<path>")`` walks that namespace's mounts from it, whatever the
        holder's own table shows. A mount found in no table gc can read (detached: ``umount -l``,
        ``open_tree(OPEN_TREE_CLONE)``, ``fsmount``) is doubt: what it has under it cannot be told.
        Each mount namespace's table is read once: those the walk read, then gc's own, then those of
        ``pids`` (a mount of a namespace no process is in any more is detached too)."""
        if not self.dirs:
            return None
        ways = handle_ways(self.dirs.keys(), self.tables, pids, {self.dev})  # the one rule (dirhandle.py)
        doubt = None
        for mid, (pid, how) in sorted(self.dirs.items()):
            held = f"pid {pid}, in another pid namespace, holds {how}, a dir on mount {mid}"
            way = ways[mid]
            if way is None:
                doubt = doubt or (
                    f"{held} that is in no mount table gc can read (detached, or of a namespace it cannot look "
                    "at): what can be reached from it cannot be told"
                )
                continue
            ns, points = way
            if self.dev in points:
                return (
                    f"{held} of mount namespace {ns}, which sees this filesystem at {points[self.dev]}: "
                    'openat(fd, "../...") from it reaches it whatever its own mounts show'
                )
        return doubt


def judge_trust(shm_dir: str, pids: Iterable[int] | None = None) -> Trust:
    """Whether pid liveness can be trusted for segments in ``shm_dir`` (``pids``: whom to look at).

    Pid namespace handles (an fd to ``pid:[...]``, a bind-mounted one, a process's
    ``pid_for_children``) change nothing, and that is sound: a producer hosted in another pid
    namespace and live now is a process in it, visible in /proc from here (gc is in the initial
    pid namespace) and looked at like every other, whatever way it got there. A namespace with
    no process has no live producer: either its init died (nothing can ever be forked into it
    again: ENOMEM) or none was ever forked (no segment can carry its pids yet). A producer that
    joins after this look writes a segment no scan saw before the look (``Trust.since_ns``): ``--min-age``
    keeps it, where a segment seen before the look is reaped at any age (segments/reaping.py).
    Mount namespace handles are another matter (see ``_Walk.handle_hazard``): they hide a live
    producer's reach, not its existence.
    """
    try:
        mine = os.readlink("/proc/self/ns/pid")
    except OSError as err:
        return Trust(False, f"cannot read this process's pid namespace or shm dir: {err.strerror}")
    if mine != INIT_PID_NS:
        return Trust(
            False,
            (
                "gc runs in a container's pid namespace: a producer in another namespace sharing this "
                "filesystem would look dead (pass --assume-dead if this namespace is the only writer)"
            ),
        )
    return judge_visible_trust(shm_dir, pids)  # from the host's pid namespace every process is visible


def judge_visible_trust(shm_dir: str, pids: Iterable[int] | None = None) -> Trust:
    """``judge_trust``'s walk over the processes this one can see, from any pid namespace: in a
    container's it sees its own namespace and those nested in it, never a sibling's (another
    container's). Trusted then means only "no process this one can see, in another pid namespace,
    reaches the filesystem"; whoever calls it must know (or be told) that nothing unseen does."""
    shm_dir = os.path.abspath(shm_dir)
    try:
        mine = os.readlink("/proc/self/ns/pid")
        dev = os.stat(shm_dir).st_dev
    except OSError as err:
        return Trust(False, f"cannot read this process's pid namespace or shm dir: {err.strerror}")
    return _walk_trust(shm_dir, dev, mine, pids)


def first_user(shm_dir: str, pids: Iterable[int]) -> tuple[int, str] | None:
    """The first of ``pids`` that reaches the filesystem of ``shm_dir`` in any way ``_Walk.reaches``
    knows (a mount, a cwd or root, an open fd, a mapped file), whatever its pid namespace, as (pid,
    how); a process whose /proc entries cannot be read counts as one (doubt is no proof of absence).
    None: none of them does."""
    try:
        dev = os.stat(shm_dir).st_dev
        walk = _Walk(dev, os.readlink("/proc/self/ns/pid"))
    except OSError as err:
        return 0, f"this process's pid namespace or the shm dir cannot be read: {err.strerror}"
    for pid in pids:
        try:
            via = walk.reaches(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError as err:
            return pid, f"its /proc entries cannot be read ({err.strerror})"
        if via is not None:
            return pid, f"mounts it at {via[1]}" if via[0] == "mount" else f"reaches it through {via[1]}"
    return None


def _walk_trust(shm_dir: str, dev: int, mine: str, pids: Iterable[int] | None) -> Trust:
    """The walk of ``judge_trust`` over ``pids`` (default: every process visible), relative to the pid
    namespace ``mine``."""
    since = clock.boot_clock_ns()  # before anything is looked at: what is seen before it predates the look
    m = re.match(r"/proc/(\d+)/root(/|$)", shm_dir)
    if m:  # another process's view of its shm dir: its names carry that process's pids
        try:
            theirs = os.readlink(f"/proc/{m.group(1)}/ns/pid")
        except OSError:
            theirs = ""
        if theirs != mine:
            return Trust(
                False,
                (
                    f"{shm_dir} is seen through pid {m.group(1)}, whose pid namespace ({theirs or 'unknown'}) is "
                    f"not this one: the pids in its segment names mean nothing here ({_ASSUME})"
                ),
            )
    with within(WALK_S):
        return _walk(shm_dir, dev, mine, pids, since)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _walk(shm_dir: str, dev: int, mine: str, pids: Iterable[int] | None, since: int) -> Trust:
    walk = _Walk(dev, mine)
    doubt: set[int] = set()
    unread: list[int] = []  # the processes whose namespaces could not be read: named in the note
    everyone = live_pids() if pids is None else list(pids)
    for pid in everyone:
        try:
            nested = in_nested_pid_ns(pid)
            if nested is False:
                continue  # a member of this pid namespace: its pids are the ones gc reads
            pidns = readlink_or(f"/proc/{pid}/ns/pid", "") if nested else os.readlink(f"/proc/{pid}/ns/pid")
            if pidns == mine:
                continue
            via = walk.reaches(pid)  # per thread: a cwd or fd is its own, whatever its mount table says
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited mid-walk: it produces nothing any more
        except StuckReadError as err:
            return Trust(
                False,
                f"pid {pid}, in another pid namespace, cannot be looked at: {err.strerror}; whether it "
                f"reaches this filesystem cannot be told, so its pids mean nothing here ({_ASSUME})",
            )
        except OSError:
            uid = uid_of(pid)
            if uid is not None:
                doubt.add(uid)
                unread.append(pid)
            continue
        if via is not None and via[0] == "mount":
            return Trust(
                False,
                (
                    f"processes in another pid namespace ({pidns or 'unreadable'}, e.g. pid {pid}) see this filesystem "
                    f"at {via[1]}: "
                    f"their pids mean nothing here ({_ASSUME})"
                ),
            )
        if via is not None:
            return Trust(
                False,
                (
                    f"pid {pid}, in another pid namespace ({pidns or 'unreadable'}), reaches this filesystem through "
                    f"{via[1]} although its mounts do not show it: its pids mean nothing here ({_ASSUME})"
                ),
            )
    way = _indirect_way(walk, live_pids() if pids is None else everyone)
    if way is not None:
        return Trust(False, way)
    note = "gc sees every pid namespace that shares this filesystem"
    if doubt:
        uids = ", ".join(map(str, sorted(doubt)))
        note += f"; the namespaces of uid(s) {uids}'s processes could not be read ({name_pids(unread)})"
    return Trust(True, note, frozenset(doubt), since)


def _indirect_way(walk: _Walk, pids: list[int]) -> str | None:
    """After the walk, the ways in that no mount, cwd, root, fd or map on the filesystem shows: a handle
    to a mount namespace that sees it, a way into a procfs of gc's pid namespace, a dir handle on a
    mount of a namespace that sees it; as the verdict's note."""
    hazard = walk.handle_hazard(pids)
    if hazard is not None:
        return f"{hazard}: its pids mean nothing here ({_ASSUME})"
    if walk.procfs_way is not None:
        return (
            f"{walk.procfs_way}: through the process dirs there every filesystem is in reach, this one too, "
            f"whatever its own mounts show, so its pids mean nothing here ({_ASSUME})"
        )
    way = walk.dir_way(pids)
    return None if way is None else f"{way}: its pids mean nothing here ({_ASSUME})"


def unsure_of_holders(trust: Trust, stuck: dict[int, str]) -> Trust:
    """``trust``, made untrusted when some process's open and mapped files could not be read in time
    (``stuck``: pid -> why, from ``holders.holder_index``): whether it holds a segment, so keeps it in use,
    cannot be told, and no pid verdict may reap what it might hold."""
    if not stuck or not trust.trusted:
        return trust
    why = stuck[min(stuck)]
    return Trust(
        False,
        f"the open files of {name_pids(sorted(stuck))} cannot be read ({why}): whether they hold a segment here "
        "cannot be told",
        trust.doubt_uids,
        trust.since_ns,
    )


def name_pids(pids: list[int], most: int = 5) -> str:
    """``pid 12``, ``pids 12, 34``, or the first ``most`` and how many more."""
    shown = ", ".join(map(str, pids[:most]))
    more = f" and {len(pids) - most} more" if len(pids) > most else ""
    return f"pid{'s' if len(pids) > 1 else ''} {shown}{more}"


__all__ = ["INIT_PID_NS", "Trust", "first_user", "judge_trust", "judge_visible_trust", "unsure_of_holders"]
