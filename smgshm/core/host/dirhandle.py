"""Directory handles and the mount namespaces they lead into, for the host's trust walk (pidtrust.py) and
the node view's rule (node/reach.py) alike.

``..`` from a dir handle (a cwd, a root, an open dir fd, an ``open_tree`` fd) walks the mounts of the mount
namespace its mount belongs to, whatever its holder's own table shows: ``openat(fd, "../<path>/smg-...")``
from an fd to the host's /etc, inherited into a container, writes into any tmpfs the host mounts (runc's
CVE-2024-21626). So a handle is placed by its mount's id (an fd's from its holder's fdinfo, a cwd's or
root's by opening the magic link here, which calls no filesystem), and the id by the table that lists it:
mount ids are one space for every mount namespace. A mount in no table that can be read is detached
(``umount -l``, ``open_tree(OPEN_TREE_CLONE)``, ``fsmount``) or of a namespace that cannot be looked at.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Collection, Iterable

from smgshm.core.host.mounts import Mount, read_mounts
from smgshm.core.host.proc import fd_mount_id, fdinfo_mount_id, mount_ns

UNKNOWN_MOUNT = -1  # a dir handle whose mount fdinfo does not say


def dir_mount(path: str, fdinfo: str | None, st: os.stat_result) -> int | None:
    """The id of the mount the dir at the magic link ``path`` (a thread's cwd or root, or an fd, ``st`` its
    stat) is on: an fd's by its holder's ``fdinfo``, else by opening the link here with O_PATH (no call
    to its filesystem); ``UNKNOWN_MOUNT`` when fdinfo does not say. None: it is no dir. FileNotFoundError
    when it is gone (closed, or the thread exited)."""
    if not stat.S_ISDIR(st.st_mode):
        return None
    if fdinfo is not None:
        mid = fdinfo_mount_id(fdinfo)
    else:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            mid = fd_mount_id(fd)
        finally:
            os.close(fd)
    return UNKNOWN_MOUNT if mid is None else mid


def mount_namespaces(mids: Collection[int], tables: dict[str, list[Mount]], pids: Iterable[int]) -> dict[int, str]:
    """The mount namespace of each mount of ``mids`` found in a table (those not found are left out):
    ``tables`` (mount namespace -> its table, extended in place: each is read once), then this process's
    own, then those of the namespaces of ``pids`` (procfs reads only), until every one is found."""
    with contextlib.suppress(OSError):
        own = os.readlink("/proc/self/ns/mnt")
        if own not in tables:
            tables[own] = read_mounts()
    where = {m.mount_id: ns for ns, table in tables.items() for m in table}
    want = set(mids)
    if not want <= where.keys():
        for q in pids:
            if want <= where.keys():
                break
            found = mount_ns(q)
            if found is None or found[0] in tables:
                continue
            try:
                tables[found[0]] = table = read_mounts(found[1])
            except OSError:
                continue  # gone, or not this process's to read: its mounts are no one's handle's then
            where.update((m.mount_id, found[0]) for m in table)
    return {mid: where[mid] for mid in want if mid in where}


Way = tuple[str, dict[int, str]] | None  # a dir handle's mount namespace and the filesystems it reaches; None: doubt


def handle_ways(
    mids: Collection[int], tables: dict[str, list[Mount]], pids: Iterable[int], devs: Collection[int]
) -> dict[int, Way]:
    """The one rule for a dir handle, the host's trust walk's (pidtrust.py) and the node view's (node/reach.py):
    for each mount id of ``mids``, the mount namespace whose table lists it and the filesystems of ``devs``
    mounted there (dev -> its first mount point), each of which ``openat(fd, "../<path>")`` from the handle
    reaches; None for a mount in no table that can be read (``mount_namespaces``' search): detached (``umount
    -l``, ``open_tree(OPEN_TREE_CLONE)``, ``fsmount``) or of a namespace no process that can be read is in.
    What lies under such a mount cannot be told from any table, so it may lead to any of ``devs``: the caller
    counts it as a way to each (the host's walk: doubt; the node view: its holder judges every tmpfs)."""
    where = mount_namespaces(mids, tables, pids)
    seen: dict[str, dict[int, str]] = {}
    for ns in set(where.values()):
        points: dict[int, str] = {}
        for m in tables[ns]:
            if m.dev in devs:
                points.setdefault(m.dev, m.point)
        seen[ns] = points
    return {mid: (where[mid], seen[where[mid]]) if mid in where else None for mid in mids}


__all__ = ["UNKNOWN_MOUNT", "Way", "dir_mount", "handle_ways", "mount_namespaces"]
