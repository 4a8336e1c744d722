"""Who uses each tmpfs as its /dev/shm, in which pid namespaces, and what it holds unseen.

SMG makes its segments with shm_open(3), which always writes under the caller's own /dev/shm, and
names each with the caller's pid *in the caller's pid namespace*. So the names in a tmpfs are the
pids of processes whose /dev/shm is that tmpfs: the processes whose ``/proc/P/root/dev/shm`` has
its st_dev. Processes that reach it another way (the kubelet's own mount, a node agent's hostPath)
write no SMG name there, and are not asked. One pass over /proc serves every tmpfs: one stat per
process, then, per pid namespace found, which process has which pid there (``/proc/P/status``
NSpid; a process of a namespace nested below counts too, found by NS_GET_PARENT).

Hidden bytes: a file created, mapped and unlinked (vLLM #52596's pattern) frees nothing while it
is mapped, and no listing shows it. Its mappings show as ``(deleted)`` lines in /proc/P/maps with
the tmpfs's device; the file extents mapped, counted once per inode however many map them, are
a lower bound of what it holds (the unmapped rest of such a file, and one only held open, are not
seen).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from smgshm.core.host.proc import live_pids, ns_pids, readlink_or, uid_of
from smgshm.core.node.pods import MAX_CGROUP_BYTES, pod_uid_in

MAX_MAPS_BYTES = 16 << 20  # one process's maps: 65530 mappings (vm.max_map_count) of ~100 bytes fit
NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2), linux/nsfs.h


class ShmUser(NamedTuple):
    """A process whose /dev/shm is a given tmpfs."""

    pid: int
    pidns: str  # "pid:[...]"
    depth: int  # how many pid namespaces deep, from this one (len of NSpid)
    uid: int
    pod_uid: str | None


@dataclass
class PidSpace:
    """One pid namespace that uses a tmpfs: which host pid has each of its pids."""

    ns: str
    depth: int
    host_pid: dict[int, int] = field(default_factory=dict)  # its pid -> the pid here
    unsure: set[int] = field(default_factory=set)  # its pids held by a process whose namespace could not be placed


class Unread(NamedTuple):
    """A process whose /dev/shm could not be read (another LSM's, or hidepid's): it may use any tmpfs."""

    pid: int
    uid: int
    pod_uid: str | None  # its cgroup's pod ("" for none); None when its cgroup could not be read either
    pidns: str | None  # this one when NSpid says so (one level deep); else None: not known


@dataclass
class Users:
    """Every process's /dev/shm device, read once."""

    by_dev: dict[int, list[ShmUser]]
    unread: list[Unread]

    def doubt_uids(self, pod_uid: str | None, judged_in: Iterable[str]) -> frozenset[int]:
        """The uids whose segments in a tmpfs cannot be judged: those of unread processes that may use
        it, from a pid namespace it is not judged in (``judged_in``: a member's pids are counted
        anyway). The kubelet mounts a pod's emptyDir into that pod's containers only, and every
        process of a pod is in its pod's cgroup, so for a pod's emptyDir (``pod_uid``) only its own
        pod's unread processes (or ones whose cgroup is unread too) count; for any other tmpfs, all."""
        return frozenset(u.uid for u in self.doubtful(pod_uid, judged_in))

    def doubtful(self, pod_uid: str | None, judged_in: Iterable[str]) -> list[Unread]:
        """The unread processes behind ``doubt_uids`` (their pids name them in the note)."""
        known = set(judged_in)
        return [u for u in self.unread if u.pidns not in known and (pod_uid is None or u.pod_uid in (None, pod_uid))]


def _cgroup_pod(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return pod_uid_in(f.read(MAX_CGROUP_BYTES)) or ""
    except OSError:
        return None


def _shm_dev(pid: int) -> int:
    """st_dev of the /dev/shm in ``pid``'s root, its components opened there without following a link:
    an absolute link would resolve against this process's root, not its (ELOOP/ENOTDIR then)."""
    fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in ("dev", "shm"):
            nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


def shm_users(pids: Iterable[int] | None = None) -> Users:
    """Which processes use which tmpfs as /dev/shm. A process that exits mid-read is left out (it
    writes nothing any more); one whose root cannot be read is listed as unread, and so is one whose
    /dev/shm is a link (which tmpfs it reaches cannot be told from here; out of a pod: any)."""
    by_dev: dict[int, list[ShmUser]] = {}
    unread: list[Unread] = []
    for pid in live_pids() if pids is None else pids:
        try:
            dev = _shm_dev(pid)
            pidns = os.readlink(f"/proc/{pid}/ns/pid")
            nspid = ns_pids(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone, or a root with no /dev/shm: no SMG name from it
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR) and (uid := uid_of(pid)) is not None:
                try:
                    ns: str | None = os.readlink(f"/proc/{pid}/ns/pid")
                except OSError:
                    ns = None
                unread.append(Unread(pid, uid, _cgroup_pod(pid) or None, ns))
                continue
            if err.errno in (errno.EACCES, errno.EPERM) and (uid := uid_of(pid)) is not None:
                try:
                    depth = len(ns_pids(pid))
                except OSError:
                    depth = 0
                unread.append(Unread(pid, uid, _cgroup_pod(pid), pidns_of_self() if depth == 1 else None))
            continue
        uid = uid_of(pid)
        if uid is None or not nspid:
            continue
        by_dev.setdefault(dev, []).append(ShmUser(pid, pidns, len(nspid), uid, _cgroup_pod(pid) or None))
    return Users(by_dev, unread)


def _ancestor(pid: int, up: int) -> str | None:
    """The pid namespace ``up`` levels above ``pid``'s own (NS_GET_PARENT); None when it cannot be told."""
    fds: list[int] = []
    try:
        fds.append(os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC))
        for _ in range(up):
            fds.append(fcntl.ioctl(fds[-1], NS_GET_PARENT))
        return os.readlink(f"/proc/self/fd/{fds[-1]}")
    except OSError:
        return None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def pid_spaces(wanted: dict[str, int], pids: Iterable[int] | None = None) -> dict[str, PidSpace]:
    """For each pid namespace of ``wanted`` (namespace -> its depth), which process here has each
    of its pids: its own members and the members of namespaces nested below it."""
    spaces = {ns: PidSpace(ns, depth) for ns, depth in wanted.items()}
    if not spaces:
        return spaces
    shallowest, mine = min(wanted.values()), pidns_of_self()
    above: dict[tuple[str, int], str | None] = {}  # (a namespace, levels up) -> that ancestor
    for pid in live_pids() if pids is None else pids:
        try:
            nspid = ns_pids(pid)  # /proc/P/status: readable where /proc/P/ns is not
        except OSError:
            continue  # gone
        if len(nspid) < shallowest:
            continue
        try:
            own: str | None = os.readlink(f"/proc/{pid}/ns/pid")
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:  # one level deep is this namespace; deeper cannot be placed
            own = mine if len(nspid) == 1 else None
        for space in spaces.values():
            if len(nspid) < space.depth:
                continue
            theirs = nspid[space.depth - 1]  # its pid in a namespace at that depth
            if own is None:
                space.unsure.add(theirs)
            elif len(nspid) == space.depth:
                if own == space.ns:
                    space.host_pid[theirs] = pid
            else:
                key = (own, len(nspid) - space.depth)
                if key not in above:
                    above[key] = _ancestor(pid, key[1])
                if above[key] is None:
                    space.unsure.add(theirs)
                elif above[key] == space.ns:
                    space.host_pid[theirs] = pid
    return spaces


class Hidden(NamedTuple):
    nbytes: int  # file extents mapped, counted once per inode
    files: int
    complete: bool  # False when a maps file could not be read whole


def _union(spans: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for lo, hi in sorted(spans):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def hidden_bytes(devs: Iterable[int], pids: Iterable[int] | None = None) -> dict[int, Hidden]:
    """Per device of ``devs``: the bytes of unlinked files still mapped there, from every /proc/P/maps."""
    tags = {f"{os.major(d):02x}:{os.minor(d):02x}".encode(): d for d in devs}
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    complete = True
    for pid in live_pids() if pids is None else pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                data = f.read(MAX_MAPS_BYTES + 1)
        except OSError:
            continue  # gone, or a kernel thread's; unreadable ones are no holder we can see
        if len(data) > MAX_MAPS_BYTES:
            complete, data = False, data[: data.rfind(b"\n", 0, MAX_MAPS_BYTES) + 1]
        if b" (deleted)" not in data:
            continue
        for line in data.splitlines():
            if not line.endswith(b" (deleted)"):
                continue
            parts = line.split(None, 5)  # range perms offset dev inode path
            dev = tags.get(parts[3]) if len(parts) == 6 else None
            if dev is None or not parts[4].isdigit():
                continue
            lo, _, hi = parts[0].partition(b"-")
            try:
                length, offset = int(hi, 16) - int(lo, 16), int(parts[2], 16)
            except ValueError:
                continue
            if length > 0:
                spans.setdefault((dev, int(parts[4])), []).append((offset, offset + length))
    out = {d: Hidden(0, 0, complete) for d in tags.values()}
    for (dev, _ino), each in spans.items():
        h = out[dev]
        out[dev] = Hidden(h.nbytes + _union(each), h.files + 1, complete)
    return out


def pidns_of_self() -> str:
    return readlink_or("/proc/self/ns/pid", "")


__all__ = [
    "Hidden",
    "PidSpace",
    "ShmUser",
    "Unread",
    "Users",
    "hidden_bytes",
    "pid_spaces",
    "pidns_of_self",
    "shm_users",
]
