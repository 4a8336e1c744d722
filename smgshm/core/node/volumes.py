"""The pid namespaces that judge a tmpfs, and what it holds unseen.

Which processes reach each tmpfs is core/node/reach.py's rule; here, per pid namespace found there,
which process has which pid in it (``/proc/P/status`` NSpid; a process of a namespace nested below
counts too, found by NS_GET_PARENT), one pass over /proc for every tmpfs.

Hidden bytes: a file created, mapped and unlinked (vLLM #52596's pattern) frees nothing while it
is mapped, and no listing shows it. Its mappings show as ``(deleted)`` lines in /proc/P/maps with
the tmpfs's device; the file extents mapped, counted once per inode however many map them, are
a lower bound of what it holds (the unmapped rest of such a file, and one only held open, are not
seen).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from smgshm.core.host.bounded import StuckReadError, bounded
from smgshm.core.host.proc import live_pids, ns_pids, readlink_or

MAX_MAPS_BYTES = 16 << 20  # one process's maps: 65530 mappings (vm.max_map_count) of ~100 bytes fit
NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2), linux/nsfs.h


class ShmUser(NamedTuple):
    """A process that reaches a given tmpfs (core/node/reach.py: its /dev/shm, a mount, a cwd, an fd, ...)."""

    pid: int
    pidns: str  # "pid:[...]"
    depth: int  # how many pid namespaces deep, from this one (len of NSpid)
    uid: int
    pod_uid: str | None
    how: str = "its /dev/shm"  # how it reaches the tmpfs (core/node/reach.py): a mount at P, its cwd, ...
    # Its only way may not be one: a view of the host's / (the host's own mount, or a way in), a dir on a detached
    # mount; its pid namespace judges weakly (reach.py)
    maybe_host: bool = False


@dataclass
class PidSpace:
    """One pid namespace that uses a tmpfs: which host pid has each of its pids."""

    ns: str
    depth: int
    host_pid: dict[int, int] = field(default_factory=dict)  # its pid -> the pid here
    unsure: set[int] = field(default_factory=set)  # its pids held by a process whose namespace could not be placed


class Unread(NamedTuple):
    """A process that could not be read (another user namespace's, an LSM's): which tmpfs it reaches
    cannot be told (core/node/reach.py says which it is counted against)."""

    pid: int
    uid: int
    pod_uid: str | None  # its cgroup's pod ("" for none); None when its cgroup could not be read either
    pidns: str | None  # this one when NSpid says so (one level deep); else None: not known


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


def _read_maps(pid: int) -> bytes:
    with open(f"/proc/{pid}/maps", "rb") as f:
        return f.read(MAX_MAPS_BYTES + 1)


def hidden_bytes(
    devs: Iterable[int], pids: Iterable[int] | None = None, maps: dict[int, bytes] | None = None
) -> dict[int, Hidden]:
    """Per device of ``devs``: the bytes of unlinked files still mapped there, from every /proc/P/maps (those in
    ``maps`` as read already: the holder walk's of this look, host/holders.py)."""
    tags = {f"{os.major(d):02x}:{os.minor(d):02x}".encode(): d for d in devs}
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    complete = True
    for pid in live_pids() if pids is None else pids:
        try:
            data = (  # its mmap_lock, which a stuck fault holds
                maps[pid][: MAX_MAPS_BYTES + 1]
                if maps is not None and pid in maps
                else bounded(f"/proc/{pid}/maps", _read_maps, pid)
            )
        except StuckReadError:
            complete = False  # what it maps cannot be told: a lower bound still, said incomplete
            continue
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
    "hidden_bytes",
    "pid_spaces",
    "pidns_of_self",
]
