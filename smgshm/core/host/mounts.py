r"""The mount table (/proc/P/mountinfo), read one way everywhere: the one parser, and the queries on it.

The kernel writes a line per mount (proc_pid_mountinfo(5))::

    36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    id parent  root  mount point options    optional  fs type source  super options

and octal-escapes a space, tab, newline and backslash (``\040 \011 \012 \134``) in the root, the
mount point, the fs type and the source. Every other byte stands as it is: a carriage return, and
bytes that are not UTF-8. So a table is split into lines at b"\n" only and into fields at b" ",
the escapes are decoded from the bytes, and the paths' str forms are ``os.fsdecode``'d
(surrogateescape), which ``os.fsencode`` turns back into the very bytes: a path compares equal to
what ``os.listdir`` or ``os.path.realpath`` says of the same directory. Options stay as the kernel
wrote them: a comma inside an option's value is escaped there (``\054``), so splitting them at ","
stays sound. A line that does not read as a mount (a garbled or truncated one) is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from smgshm.core.host.proc import live_pids, mount_ns, statx

SELF_MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(rb"\\([0-3][0-7]{2})")  # one byte: \000 to \377


class Mount(NamedTuple):
    """One line of a mount table. A NamedTuple, not a frozen dataclass: a node's walk reads a table per
    mount namespace, some 15,000 lines for 100 pods, and a frozen dataclass costs ten times as much to make."""

    mount_id: int
    parent_id: int
    dev: int  # os.makedev(major, minor): the st_dev of files there (for most filesystems; not btrfs)
    root: str  # the part of the filesystem mounted: "/" for all of it, "mnt:[...]" for a namespace file
    point: str  # where, as the table's owner sees it
    options: str  # the mount's own (rw, nosuid, ...)
    optional: tuple[str, ...]  # shared:N, master:N, propagate_from:N, unbindable
    fstype: str
    source: str
    super_options: str  # the filesystem's (size=, huge=, ...)

    @property
    def root_bytes(self) -> bytes:
        return os.fsencode(self.root)

    @property
    def point_bytes(self) -> bytes:
        return os.fsencode(self.point)

    @property
    def source_bytes(self) -> bytes:
        return os.fsencode(self.source)


def _unescape(field: bytes) -> str:
    if b"\\" in field:
        field = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), field)
    return os.fsdecode(field)


def _parse_line(line: bytes) -> Mount | None:
    f = line.split(b" ")
    try:
        sep = f.index(b"-", 6)  # after the optional fields, of which there may be none
    except ValueError:
        return None
    major, colon, minor = f[2].partition(b":")
    if (
        len(f) < sep + 4
        or not (f[0].isdigit() and f[1].isdigit() and colon and major.isdigit() and minor.isdigit())
        or not f[4].startswith(b"/")
    ):
        return None
    return Mount(
        int(f[0]),
        int(f[1]),
        os.makedev(int(major), int(minor)),
        _unescape(f[3]),
        _unescape(f[4]),
        os.fsdecode(f[5]),
        tuple(map(os.fsdecode, f[6:sep])),
        _unescape(f[sep + 1]),
        _unescape(f[sep + 2]),
        os.fsdecode(f[sep + 3]),
    )


# os.fsdecode is UTF-8 with surrogateescape (every Linux locale Python runs in UTF-8 mode or with a UTF-8 codeset):
# then decoding a whole table once and splitting it is decoding each field (b"\n" and b" " are never inside a
# character, and surrogateescape maps each undecodable byte alone).
_UTF8 = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()) == ("utf-8", "surrogateescape")
_new = tuple.__new__


def _parse_plain(text: str) -> list[Mount]:
    """``_parse_line`` of each line of a decoded table with no escape in it, with no call per field: the same
    fields, the same lines skipped."""
    out: list[Mount] = []
    makedev = os.makedev
    for line in text.split("\n"):
        f = line.split(" ")
        if len(f) < 10:  # six fields, "-", three: an empty line, or no mount
            continue
        try:
            sep = f.index("-", 6)
        except ValueError:
            continue
        major, colon, minor = f[2].partition(":")
        if (
            len(f) < sep + 4
            or not (f[0].isdigit() and f[1].isdigit() and colon and major.isdigit() and minor.isdigit())
            or not (f[0] + f[1] + f[2]).isascii()  # str.isdigit takes other scripts' digits; bytes' does not
            or not f[4].startswith("/")
        ):
            continue
        out.append(
            _new(
                Mount,
                (
                    int(f[0]),
                    int(f[1]),
                    makedev(int(major), int(minor)),
                    f[3],
                    f[4],
                    f[5],
                    tuple(f[6:sep]),
                    f[sep + 1],
                    f[sep + 2],
                    f[sep + 3],
                ),
            )
        )
    return out


def parse_mounts(table: bytes) -> list[Mount]:
    """The mounts of a mount table's text, in its order; lines that are no mount are skipped."""
    if _UTF8 and b"\\" not in table:  # the common table: no escaped path, decoded at once
        return _parse_plain(table.decode("utf-8", "surrogateescape"))
    return [m for line in table.split(b"\n") if line and (m := _parse_line(line)) is not None]


def read_mounts(path: str = SELF_MOUNTINFO) -> list[Mount]:
    """The mount table at ``path`` (/proc/P/mountinfo); OSError when it cannot be read."""
    with open(path, "rb") as f:
        return parse_mounts(f.read())


def mount_of(mounts: Iterable[Mount], dev: int) -> Mount | None:
    """The first mount of (a part of) the filesystem of ``dev``, if the table has one."""
    return next((m for m in mounts if m.dev == dev), None)


def nsfs_mounts(mounts: Iterable[Mount]) -> list[Mount]:
    """The mount namespace files bind-mounted in a table (root "mnt:[...]"): whoever sees one there
    (and may setns) can join that namespace."""
    return [m for m in mounts if m.fstype == "nsfs" and m.root.startswith("mnt:[")]


def below(path: str, top: str) -> str | None:
    """``path`` relative to ``top`` ("" for itself), None when it is not at or below it."""
    if path == top:
        return ""
    head = top.rstrip("/") + "/"
    return path[len(head) :] if path.startswith(head) else None


def mount_holding(mounts: Iterable[Mount], path: str, dev: int | None = None) -> Mount | None:
    """The mount ``path`` lies in (of device ``dev`` only, if given): the one at ``path`` or at its
    nearest ancestor, the last listed of those at one place (the one on top). ``path`` absolute,
    as the table's owner sees it."""
    best: Mount | None = None
    for m in mounts:
        under = (dev is None or m.dev == dev) and below(path, m.point) is not None
        if under and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


_STATX_MNT_ID_UNIQUE = 0x4000  # linux/stat.h, Linux 6.8+


def unique_mount_id(path: str) -> int | None:
    """The unique id of the mount ``path`` lies in (statx STATX_MNT_ID_UNIQUE): unlike the ids mount
    tables show, which the next mount takes again once one is gone, never given twice in a boot.
    None where the kernel (before 6.8) or the C library does not give it."""
    got = statx(path, _STATX_MNT_ID_UNIQUE)
    if got is None or not got[0] & _STATX_MNT_ID_UNIQUE:
        return None
    return int.from_bytes(got[1][144:152], sys.byteorder)  # stx_mnt_id


def namespace_tables(
    pids: Iterable[int], seen: set[str], read: Mapping[str, list[Mount]] | None = None
) -> Iterator[tuple[str, int, list[Mount]]]:
    """(mount namespace, a pid in it, its mount table) for each mount namespace of ``pids`` not in
    ``seen`` (which gains each), every table read once. A table that cannot be read (its process
    exited, or is not ours to look at) is left out, and another pid of that namespace tried. ``read``:
    tables read already (mount namespace -> table), taken as they are (the node view's look read them)."""
    for pid in pids:
        ns = mount_ns(pid)
        if ns is None or ns[0] in seen:
            continue
        try:
            mounts = read[ns[0]] if read is not None and ns[0] in read else read_mounts(ns[1])
        except OSError:
            continue
        seen.add(ns[0])
        yield ns[0], pid, mounts


def _aliases(mounts: Iterable[Mount], dev: int) -> set[str]:
    return {os.path.basename(m.point) for m in mounts if m.dev == dev and m.root != "/"}


def mount_aliases(dev: int, pids: Iterable[int] | None = None) -> frozenset[str]:
    """Last components of the mount points of every bind mount of a part of device ``dev`` (its
    root inside the filesystem is not "/": a file or a subdirectory), in every mount namespace
    this process can read. An fd opened through a file's bind mount shows the mount point's
    path, not the file's name, so a holder walk that matches fds by name must match these too."""
    out: set[str] = set()
    seen: set[str] = set()
    with contextlib.suppress(OSError):
        seen.add(os.readlink("/proc/self/ns/mnt"))
    with contextlib.suppress(OSError):
        out |= _aliases(read_mounts(), dev)
    for _ns, _pid, mounts in namespace_tables(live_pids() if pids is None else pids, seen):
        out |= _aliases(mounts, dev)
    return frozenset(out)


__all__ = [
    "SELF_MOUNTINFO",
    "Mount",
    "below",
    "mount_aliases",
    "mount_holding",
    "mount_of",
    "namespace_tables",
    "nsfs_mounts",
    "parse_mounts",
    "read_mounts",
    "unique_mount_id",
]
