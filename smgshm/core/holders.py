"""Who holds a file open or mapped, found by inode (st_dev, st_ino) whatever name it was opened by.

A segment may be held through another name (a hard link outside SMG's names, a bind mount,
a rename): matching /proc/P/fd links or /proc/P/maps paths against SMG's prefix misses
those, so holders are found by the device and inode the kernel reports. One walk of /proc
indexes every file of one device that any process has open or mapped; looking a segment
up is then a dict access, whatever the size of the listing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

Key = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    how: str  # fd | map


def live_pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode("utf-8", "replace")  # the process names itself: never trusted
    except OSError:
        return ""


def _mapped(pid: int, devtag: bytes, dev: int) -> set[Key]:
    """Inodes of ``dev`` mapped by ``pid``; the fd may be long closed (a map outlives it)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:
        return set()
    if devtag not in data:  # the cheap test first: most processes map nothing of this device
        return set()
    out: set[Key] = set()
    for line in data.splitlines():
        parts = line.split(None, 5)
        if len(parts) >= 5 and parts[3] == devtag.strip() and parts[4] != b"0":
            out.add((dev, int(parts[4])))
    return out


def _opened(pid: int, dev: int, names: frozenset[str] | None) -> set[Key] | None:
    """Inodes of ``dev`` open in ``pid`` (None when its fds cannot be read: gone or not ours)."""
    out: set[Key] = set()
    try:
        fds = os.scandir(f"/proc/{pid}/fd")
    except OSError:
        return None
    with fds:
        for fd in fds:
            try:
                link = os.readlink(fd.path)
                if not link.startswith("/"):
                    continue  # socket:, pipe:, anon_inode: never live on a tmpfs
                if names is not None and link.removesuffix(" (deleted)").rpartition("/")[2] not in names:
                    continue
                st = os.stat(fd.path)  # the magic link: the very inode, whatever its path
            except OSError:
                continue
            if st.st_dev == dev:
                out.add((dev, st.st_ino))
    return out


def holder_index(
    dev: int, pids: Iterable[int] | None = None, names: Iterable[str] | None = None
) -> dict[Key, list[Holder]]:
    """Every (dev, ino) of device ``dev`` that a process has open or mapped, with who and how.

    ``names``: only files whose one name is among these are wanted. A file with a single
    link has a single dentry, and an fd's /proc link shows that dentry's current name (a
    rename included), so fds under other names need no stat. Only for single-link files:
    a hard link is another dentry. Survives processes exiting mid-walk. Processes whose
    /proc entries this user may not read are skipped (as lsof does): their holds are not seen.
    """
    wanted = None if names is None else frozenset(names)
    devtag = f" {os.major(dev):02x}:{os.minor(dev):02x} ".encode()
    found: dict[Key, list[Holder]] = {}
    for pid in live_pids() if pids is None else pids:
        hits = [(key, "fd") for key in _opened(pid, dev, wanted) or ()]
        hits += [(key, "map") for key in _mapped(pid, devtag, dev)]
        if hits:
            comm = _comm(pid)
            for key, how in hits:
                found.setdefault(key, []).append(Holder(pid, comm, how))
    return found


__all__ = ["Holder", "Key", "holder_index", "live_pids"]
