"""Names in a dir that something is mounted on, in any mount namespace: what gc must never unlink or rename.

A bind-mounted file shares the dir's st_dev when it comes from the same filesystem, and one mounted in
another mount namespace shows nothing here at all; Linux refuses unlink and rename with EBUSY only for
this namespace's mounts, so a name mounted on elsewhere would be detached. The dir's own mount is found
as ``place_of`` finds it (through /proc/PID/root, in PID's namespace), never by a path resolved as text.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Mapping

from smgshm.core.host.mounts import Mount, below, namespace_tables, read_mounts
from smgshm.core.host.place import place_of
from smgshm.core.host.proc import live_pids


def mount_points(dir_path: str, pids: Iterable[int] | None = None) -> dict[str, str]:
    """Names directly in ``dir_path`` that something is mounted on, in this mount namespace ("")
    or in another one (which, and a pid in it). A bind-mounted file shares the dir's st_dev when
    it comes from the same filesystem, and one mounted in another namespace shows nothing here
    at all; unlinking or renaming the name here would detach that namespace's mount (Linux does
    not refuse it with EBUSY: only this namespace's mounts count), so it is never touched.

    ``dir_path`` is the dir the kernel finds: through /proc/PID/root, PID's (``place_of``), whose
    namespace's table is read whether or not ``pids`` has a process in it. Reads each process's
    mount namespace (one readlink each) and each namespace's table once."""
    return mount_points_of([dir_path], pids)[dir_path]


def _mounted_in(table: list[Mount], wanted: Mapping[int, list[tuple[str, str]]]) -> Iterator[tuple[str, str]]:
    """(dir, name) for each mount in ``table`` over a name directly in a ``wanted`` dir (device ->
    (the dir, the dir in its filesystem)), whichever mount of that filesystem it is reached by."""
    by_id = {m.mount_id: m for m in table}
    for m in table:
        up = by_id.get(m.parent_id)
        if up is None or up.dev not in wanted or (rel := below(m.point, up.point)) is None:
            continue
        at = os.path.normpath(os.path.join(up.root, rel))
        for d, inside in wanted[up.dev]:
            if at != inside and os.path.dirname(at) == inside:
                yield d, os.path.basename(at)


def mount_points_of(
    dirs: Iterable[str], pids: Iterable[int] | None = None, read: Mapping[str, list[Mount]] | None = None
) -> dict[str, dict[str, str]]:
    """``mount_points`` of each of ``dirs``, every namespace's table read once for all of them (a
    node's tmpfs: one read per namespace, not one per namespace and tmpfs); ``read``: tables read
    already, by mount namespace (``namespace_tables``)."""
    out: dict[str, dict[str, str]] = {d: {} for d in dirs}
    try:
        ours = read_mounts()
        mine = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return out

    theirs_of: dict[int, list[Mount]] = {}

    def table_of(pid: int | None) -> list[Mount]:
        """PID's own table, read once (not ``read``'s for its namespace: mountinfo's paths are relative to the
        root of the process read, and PID's root may be another's than the one a walk read it through)."""
        if pid is None:
            return ours
        if pid not in theirs_of:
            theirs_of[pid] = read_mounts(f"/proc/{pid}/mountinfo")
        return theirs_of[pid]

    wanted: dict[int, list[tuple[str, str]]] = {}  # a dir's device -> (the dir, the dir in its filesystem)
    holding: list[int] = []  # a process of each namespace that holds a dir through /proc/PID/root
    under: dict[str, list[str]] = {}  # a dir -> the names in it something is mounted on here, in one pass
    for m in ours:
        parent, name = os.path.split(m.point)
        if name:
            under.setdefault(parent, []).append(name)
    for d in out:
        try:
            # The dir's own mount, in the table of the namespace that holds it: never a path resolved as text,
            # which takes /proc/PID/root/dev/shm for this namespace's /dev/shm.
            place = place_of(d, table_of)
        except OSError:
            continue
        if place.pid is None:
            out[d] = dict.fromkeys(under.get(place.path, ()), "")
        else:
            holding.append(place.pid)
        if place.mount is not None:
            inside = os.path.join(place.mount.root, below(place.path, place.mount.point) or "")
            wanted.setdefault(place.dev, []).append((d, os.path.normpath(inside)))
    if not wanted:
        return out
    # This namespace's mounts over those names, reached by any mount of their filesystem: unlink gets EBUSY here.
    for d, name in _mounted_in(ours, wanted):
        out[d].setdefault(name, "")
    live = live_pids() if pids is None else pids
    for ns, pid, theirs in namespace_tables(itertools.chain(holding, live), {mine}, read):
        for d, name in _mounted_in(theirs, wanted):
            out[d].setdefault(name, f"mount namespace {ns}, e.g. pid {pid}")
    return out


def mounted_names(dir_path: str) -> frozenset[str]:
    """Names directly in ``dir_path`` that something is mounted on, per this process's mount table."""
    return frozenset(n for n, where in mount_points(dir_path, pids=()).items() if not where)


__all__ = ["mount_points", "mount_points_of", "mounted_names"]
