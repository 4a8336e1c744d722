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
that sees the filesystem, or to one gc cannot read, makes the verdict untrusted too. Handles
to pid namespaces do not: see ``judge_trust``. What cannot be read is doubt: a process whose
namespaces this user may not read puts its uid's segments in doubt, and unreadable mounts of
another pid namespace make the verdict untrusted.

What this cannot see: a producer in another pid namespace that reached the filesystem only
for a while (an fd passed to it and since closed, a setns(2) in and back out without keeping
a handle) and keeps nothing of it now; one holding only an fd to another process's /proc/X
directory (openat(fd, "ns/mnt") then setns); and anything that starts after the look (a new
container, a join), whose segments ``--min-age`` keeps since they are younger than the look.
Names mounted on in any mount namespace are listed by ``mounts.mount_points``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from smgshm.core.host.mounts import Mount, mount_of, nsfs_mounts, read_mounts
from smgshm.core.host.proc import (
    in_nested_pid_ns,
    live_pids,
    readlink_or,
    same_fd_table,
    thread_lives,
    uid_of,
)

INIT_PID_NS = "pid:[4026531836]"  # PROC_PID_INIT_INO: the host's initial pid namespace
_ASSUME = "pass --assume-dead to judge by this namespace's pids anyway"


@dataclass(frozen=True)
class Trust:
    trusted: bool
    note: str
    # uids owning processes whose namespaces gc could not read: their segments stay unknown
    doubt_uids: frozenset[int] = field(default_factory=frozenset)


class _Walk:
    """One look at the processes of other pid namespaces: how one reaches the filesystem of
    ``dev``, and which mount namespaces they hold a handle to (an nsfs fd or a bind-mounted
    namespace file they see), with every mount table read once per mount namespace."""

    def __init__(self, dev: int) -> None:
        self.dev = dev
        self.tables: dict[str, list[Mount]] = {}
        self.handles: dict[str, tuple[int, str]] = {}  # mount namespace -> (pid, how it holds it)

    def _table(self, mntns: str, path: str) -> list[Mount] | None:
        """The mount table of ``mntns`` read at ``path`` the first time it is seen, else None."""
        if mntns in self.tables:
            return None
        self.tables[mntns] = table = read_mounts(path)
        return table

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
        mntns = os.readlink(f"{base}/ns/mnt")
        table = self._table(mntns, f"{base}/mountinfo")
        if table is not None:
            where = mount_of(table, self.dev)
            if where is not None:
                return "mount", where.point
            for m in nsfs_mounts(table):
                self.handles.setdefault(m.root, (pid, f"a bind-mounted namespace file at {m.point}"))
        for what in ("cwd", "root"):
            if os.stat(f"{base}/{what}").st_dev == self.dev:  # the magic link: works on a detached mount
                return "reach", f"{whose} {what}"
        if not any(same_fd_table(t, tid) for t in fd_tids):  # threads sharing one fd table: walk it once
            fd_tids.append(tid)
            with os.scandir(f"{base}/fd") as fds:
                for fd in fds:
                    try:
                        link = os.readlink(fd.path)
                        if link.startswith("mnt:["):
                            self.handles.setdefault(link, (pid, f"{whose} open fd {fd.name}"))
                        elif link == "anon_inode:[pidfd]" or link.startswith("pidfd:["):
                            self._pidfd(pid, f"{base}/fdinfo/{fd.name}", f"{whose} pidfd {fd.name}")
                        elif link.startswith("/") and os.stat(fd.path).st_dev == self.dev:
                            return "reach", f"{whose} open fd {fd.name}"
                    except FileNotFoundError:
                        continue  # closed mid-walk
        if mapped:
            return True  # one address space for all threads
        tag = f"{os.major(self.dev):02x}:{os.minor(self.dev):02x}".encode()
        with open(f"{base}/maps", "rb") as f:
            data = f.read()
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
        with contextlib.suppress(OSError):
            self.tables.setdefault(os.readlink("/proc/self/ns/mnt"), read_mounts())
        where_is: dict[str, int] | None = None  # mount namespace -> a pid in it, indexed when needed
        todo, done = list(self.handles.items()), set()
        while todo:
            ns, (pid, how) = todo.pop()
            if ns in done:
                continue
            done.add(ns)
            table = self.tables.get(ns)
            if table is None:
                if where_is is None:
                    where_is = {}
                    for q in pids:
                        where_is.setdefault(readlink_or(f"/proc/{q}/ns/mnt", ""), q)
                try:
                    table = self.tables[ns] = read_mounts(f"/proc/{where_is[ns]}/mountinfo")
                except (KeyError, OSError):
                    return (
                        f"pid {pid}, in another pid namespace, holds {how}, a handle to mount namespace {ns}, "
                        "whose mounts gc cannot read (no process it can look at lives there)"
                    )
            where = mount_of(table, self.dev)
            if where is not None:
                return (
                    f"pid {pid}, in another pid namespace, holds {how}, a handle to mount namespace {ns}, "
                    f"which sees this filesystem at {where.point}: it can join it and write there at any time"
                )
            todo += [(m.root, (pid, f"{how}, then a namespace file at {m.point} there")) for m in nsfs_mounts(table)]
        return None


def judge_trust(shm_dir: str, pids: Iterable[int] | None = None) -> Trust:
    """Whether pid liveness can be trusted for segments in ``shm_dir`` (``pids``: whom to look at).

    Pid namespace handles (an fd to ``pid:[...]``, a bind-mounted one, a process's
    ``pid_for_children``) change nothing, and that is sound: a producer hosted in another pid
    namespace and live now is a process in it, visible in /proc from here (gc is in the initial
    pid namespace) and looked at like every other, whatever way it got there. A namespace with
    no process has no live producer: either its init died (nothing can ever be forked into it
    again: ENOMEM) or none was ever forked (no segment can carry its pids yet). A producer that
    joins after this look writes a segment younger than the look, which ``--min-age`` keeps.
    Mount namespace handles are another matter (see ``_Walk.handle_hazard``): they hide a live
    producer's reach, not its existence.
    """
    shm_dir = os.path.abspath(shm_dir)
    try:
        mine = os.readlink("/proc/self/ns/pid")
        dev = os.stat(shm_dir).st_dev
    except OSError as err:
        return Trust(False, f"cannot read this process's pid namespace or shm dir: {err.strerror}")
    if mine != INIT_PID_NS:
        return Trust(False, (
            "gc runs in a container's pid namespace: a producer in another namespace sharing this "
            "filesystem would look dead (pass --assume-dead if this namespace is the only writer)"
        ))  # fmt: skip
    m = re.match(r"/proc/(\d+)/root(/|$)", shm_dir)
    if m:  # another process's view of its shm dir: its names carry that process's pids
        try:
            theirs = os.readlink(f"/proc/{m.group(1)}/ns/pid")
        except OSError:
            theirs = ""
        if theirs != mine:
            return Trust(False, (
                f"{shm_dir} is seen through pid {m.group(1)}, whose pid namespace ({theirs or 'unknown'}) is "
                f"not this one: the pids in its segment names mean nothing here ({_ASSUME})"
            ))  # fmt: skip
    walk = _Walk(dev)
    doubt: set[int] = set()
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
        except OSError:
            uid = uid_of(pid)
            if uid is not None:
                doubt.add(uid)
            continue
        if via is not None and via[0] == "mount":
            return Trust(False, (
                f"processes in another pid namespace ({pidns or 'unreadable'}, e.g. pid {pid}) see this filesystem "
                f"at {via[1]}: "
                f"their pids mean nothing here ({_ASSUME})"
            ))  # fmt: skip
        if via is not None:
            return Trust(False, (
                f"pid {pid}, in another pid namespace ({pidns or 'unreadable'}), reaches this filesystem through "
                f"{via[1]} although its mounts do not show it: its pids mean nothing here ({_ASSUME})"
            ))  # fmt: skip
    hazard = walk.handle_hazard(live_pids() if pids is None else everyone)
    if hazard is not None:
        return Trust(False, f"{hazard}: its pids mean nothing here ({_ASSUME})")
    note = "gc sees every pid namespace that shares this filesystem"
    if doubt:
        note += f"; the namespaces of uid(s) {', '.join(map(str, sorted(doubt)))} could not be read"
    return Trust(True, note, frozenset(doubt))


__all__ = ["INIT_PID_NS", "Trust", "judge_trust"]
