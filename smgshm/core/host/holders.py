"""Who holds a file open or mapped, found by inode (st_dev, st_ino) whatever name it was opened by.

A segment may be held through another name (a hard link outside SMG's names, a bind mount,
a rename): matching /proc/P/fd links or /proc/P/maps paths against SMG's prefix misses
those, so holders are found by the device and inode the kernel reports. One walk of /proc
indexes every file of one device that any process has open or mapped; looking a segment
up is then a dict access, whatever the size of the listing.

Threads count: a thread that called unshare(CLONE_FILES) has an fd table of its own that
/proc/P/fd does not show, and once a process's leader thread exits (a zombie leader) its
/proc/P/fd and /proc/P/maps read empty while its other threads still hold and map. One
stat of /proc/P/task says how many threads a process has; only a process with more than one
has its threads looked at (kcmp(2) says which share the leader's fd table).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from smgshm.core.closed import Closed
from smgshm.core.host.bounded import StuckReadError, bounded, bounded_calls, bounded_groups
from smgshm.core.host.mounts import mount_aliases
from smgshm.core.host.proc import comm, live_pids, thread_views

Key = tuple[int, int]  # (st_dev, st_ino)


class How(Closed):
    """How a process holds a file: open (an fd, of any of its threads) or mapped (a map outlives the fd)."""

    FD = "fd"
    MAP = "map"


@dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    how: How


def _maps(pid: int, base: str | None = None) -> bytes:
    """``pid``'s maps (a live thread's when the leader's read empty: a zombie leader); b"" if unreadable."""
    path = f"{base or f'/proc/{pid}'}/maps"
    try:
        data = bounded(path, _read, path)  # its mmap_lock, which a page fault stuck on a stalled FUSE file holds
    except StuckReadError:
        raise  # not "nothing mapped": the caller says which process could not be read
    except OSError:
        return b""
    if not data and base is None:
        _extra, other = thread_views(pid)  # empty maps: a kernel thread, or a zombie leader
        return _maps(pid, other) if other else b""
    return data


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _mapped_in(data: bytes, devtag: bytes, dev: int) -> set[Key]:
    if devtag not in data:  # the cheap test first: most processes map nothing of this device
        return set()
    out: set[Key] = set()
    for line in data.splitlines():
        parts = line.split(None, 5)
        if len(parts) >= 5 and parts[3] == devtag.strip() and parts[4] != b"0":
            out.add((dev, int(parts[4])))
    return out


def _reads_of(pid: int, names: frozenset[str] | None = None) -> list[tuple[str, Callable[[], object]]]:
    """The reads of ``pid``'s holds that may stall, in turn: the stat of each fd of its fd tables (the leader's,
    and its threads' own) that names a path (one of ``names``, when given), then its maps (its mmap_lock).
    Naming the fds is procfs's own (its links): done here, inline."""
    base = f"/proc/{pid}"
    paths = _fd_paths(base, names)
    for view in thread_views(pid)[0]:
        paths += _fd_paths(view, names)
    return [*((p, partial(os.stat, p)) for p in paths), (f"{base}/maps", partial(_read, f"{base}/maps"))]


def _taken(pid: int, got: list[object], maps: dict[int, bytes] | None) -> tuple[list[os.stat_result], bytes]:
    """``_reads_of``'s answers as what ``pid`` holds: the stats of its fds, and its maps (a live thread's when the
    leader's read empty: a zombie leader); ``maps`` keeps the leader's as read."""
    data = got.pop()
    if not isinstance(data, bytes):
        data = b""  # gone, or not ours: nothing mapped that we can see
    else:
        if maps is not None:
            maps[pid] = data  # the leader's, as read (empty too: the node's hidden bytes read the leader's)
        if not data:  # a kernel thread, or a zombie leader: then a live thread's (``_maps``)
            other = thread_views(pid)[1]
            data = _maps(pid, other) if other else b""
    return [st for st in got if isinstance(st, os.stat_result)], data


def _process_reads(
    pid: int, names: frozenset[str] | None = None, maps: dict[int, bytes] | None = None
) -> tuple[list[os.stat_result], bytes]:
    """What ``pid`` holds (``_reads_of``, ``_taken``), its reads that may stall in ONE hand-off (host/bounded.py):
    StuckReadError when one does not answer. ``maps`` keeps the leader's maps as read."""
    return _taken(pid, bounded_calls(_reads_of(pid, names)), maps)


def _fd_paths(base: str, names: frozenset[str] | None = None) -> list[str]:
    """The fds of the fd table at ``base`` (/proc/P or /proc/P/task/T; none when its fds cannot be read: gone
    or not ours) whose links name a path: socket:, pipe:, anon_inode: never live on a tmpfs; with ``names``, a
    path whose last component is one of them (a single-link file's fd shows its one dentry's name)."""
    paths: list[str] = []
    try:
        fds = os.scandir(f"{base}/fd")
    except OSError:
        return paths
    with fds:
        for fd in fds:
            try:
                link = os.readlink(fd.path)
            except OSError:
                continue
            if not link.startswith("/"):
                continue
            if names is not None and link.removesuffix(" (deleted)").rpartition("/")[2] not in names:
                continue
            paths.append(fd.path)
    return paths


def holder_index(
    dev: int,
    pids: Iterable[int] | None = None,
    names: Iterable[str] | None = None,
    stuck: dict[int, str] | None = None,
) -> dict[Key, list[Holder]]:
    """Every (dev, ino) of device ``dev`` that a process has open or mapped, with who and how.

    ``names``: only files whose one name is among these are wanted. A file with a single
    link has a single dentry, and an fd's /proc link shows that dentry's current name (a
    rename included), so fds under other names need no stat. Only for single-link files:
    a hard link is another dentry; and the mount points of bind mounts of the device are
    matched too (a file's bind mount names its fds). Survives processes exiting mid-walk. Processes whose
    /proc entries this user may not read are skipped (as lsof does): their holds are not seen. A process
    one of whose reads sticks (host/bounded.py) is left there, put in ``stuck`` (pid -> why) when given.
    """
    wanted = None
    if names is not None:
        pids = None if pids is None else list(pids)
        # A file bind-mounted elsewhere is open under that mount point's name: match it too.
        wanted = frozenset(names) | mount_aliases(dev, pids)
    devtag = f" {os.major(dev):02x}:{os.minor(dev):02x} ".encode()
    found: dict[Key, list[Holder]] = {}
    for pid in live_pids() if pids is None else pids:
        try:
            stats, data = _process_reads(pid, wanted)
        except StuckReadError as err:
            if stuck is not None:
                stuck[pid] = err.strerror or str(err)
            continue
        hits = [(key, How.FD) for key in {(dev, st.st_ino) for st in stats if st.st_dev == dev}]
        hits += [(key, How.MAP) for key in _mapped_in(data, devtag, dev)]
        if hits:
            name = comm(pid)
            for key, how in hits:
                found.setdefault(key, []).append(Holder(pid, name, how))
    return found


_CHUNK = 256  # processes whose reads share a hand-off (host/bounded.py): a node's, in a few

# A maps line's device field (its 4th): one pass in C finds which devices a process maps at all.
_MAPS_DEV = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ ([0-9a-f]+:[0-9a-f]+) ", re.MULTILINE)


def holder_index_devs(
    devs: Iterable[int],
    pids: Iterable[int] | None = None,
    stuck: dict[int, str] | None = None,
    maps: dict[int, bytes] | None = None,
) -> dict[Key, list[Holder]]:
    """``holder_index`` for several devices in ONE walk of /proc (a node's tmpfs: one walk, not one
    per tmpfs, whose cost grows with the processes times the tmpfs). The same reads and rules; the reads that
    may stall (fds' getattr, maps) of many processes in one hand-off (host/bounded.py), a process whose read
    sticks put in ``stuck``. ``maps``, when
    given, keeps each process's maps as read (the node's hidden bytes read them again otherwise)."""
    want = set(devs)
    bare = {f"{os.major(d):02x}:{os.minor(d):02x}".encode(): d for d in want}  # as maps spells a device
    found: dict[Key, list[Holder]] = {}
    if not want:
        return found
    everyone = list(live_pids() if pids is None else pids)
    for at in range(0, len(everyone), _CHUNK):
        chunk = everyone[at : at + _CHUNK]
        # Many processes' reads in one hand-off (each a round trip of threads); one that sticks fails its own.
        for pid, got in zip(chunk, bounded_groups([_reads_of(pid) for pid in chunk]), strict=True):
            try:
                if isinstance(got, OSError):
                    raise got
                stats, data = _taken(pid, got, maps)  # the maps read once for every device
            except StuckReadError as err:
                if stuck is not None:
                    stuck[pid] = err.strerror or str(err)
                continue
            keys = {(st.st_dev, st.st_ino) for st in stats if st.st_dev in want}
            hits = [(key, How.FD) for key in keys]
            mapped: set[Key] = set()
            for field in set(_MAPS_DEV.findall(data)) & bare.keys() if data else ():
                mapped |= _mapped_in(data, b" " + field + b" ", bare[field])
            hits += [(key, How.MAP) for key in mapped]
            if hits:
                name = comm(pid)
                for key, how in hits:
                    found.setdefault(key, []).append(Holder(pid, name, how))
    return found


__all__ = ["Holder", "Key", "holder_index", "holder_index_devs"]
