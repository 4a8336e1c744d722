"""Whether a dead-looking producer pid proves a dead producer, decided by the filesystem itself.

A segment's name carries its producer's pid *in the producer's pid namespace*. gc can read
that pid only in its own namespace, so the verdict is trusted only when no process in any
other pid namespace can reach the same filesystem. Where that process sees it does not
matter (``-v /dev/shm:/host-shm``, a bind mount of a subdirectory, another tmpfs path): the
test is the device, as each other mount namespace's /proc/P/mountinfo reports it, and, since
a process keeps a filesystem it no longer mounts (``cd D; umount -l D`` leaves D its cwd),
the device of each such process's cwd, root, open fds and mapped files. What cannot be read
is doubt: a process whose namespaces this user may not read puts its uid's
segments in doubt, and unreadable mounts of another pid namespace make the verdict untrusted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from smgshm.core.holders import live_pids

INIT_PID_NS = "pid:[4026531836]"  # PROC_PID_INIT_INO: the host's initial pid namespace
_ASSUME = "pass --assume-dead to judge by this namespace's pids anyway"


@dataclass(frozen=True)
class Trust:
    trusted: bool
    note: str
    # uids owning processes whose namespaces gc could not read: their segments stay unknown
    doubt_uids: frozenset[int] = field(default_factory=frozenset)


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ns_pids(pid: int, proc: str = "/proc") -> list[int]:
    """``pid`` as each pid namespace from this one down to its own sees it: the NSpid line of
    /proc/P/status (readable by anyone, unlike /proc/P/ns). [] on a kernel without NSpid (< 4.1);
    OSError when the process is gone."""
    with open(f"{proc}/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"NSpid:"):
                fields = line.split()[1:]
                return [int(x) for x in fields] if all(x.isdigit() for x in fields) else []
    return []


def innermost_pid(pid: int, proc: str = "/proc") -> int | None:
    """The pid ``pid`` has in its own pid namespace (a container's pid 1): what its getpid() says,
    so the pid SMG's gateway puts in its segment and probe-file names. None when the kernel does
    not say (no NSpid); OSError when the process is gone."""
    ns = ns_pids(pid, proc)
    return ns[-1] if ns else None


def _nested(pid: int) -> bool | None:
    """Whether ``pid`` lives in a pid namespace below this one (None: the ns links decide)."""
    ns = ns_pids(pid)
    return len(ns) > 1 if ns else None


def _readlink_or(path: str, default: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return default


def _unescape(path: bytes) -> str:
    """mountinfo octal-escapes space, tab, newline and backslash in paths."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), path))


def mount_of(mountinfo: bytes, dev: int) -> str | None:
    """Where a mount table (/proc/P/mountinfo) mounts the filesystem of ``dev``, if anywhere."""
    tag = f"{os.major(dev)}:{os.minor(dev)}".encode()
    for line in mountinfo.splitlines():
        parts = line.split(b" ", 5)
        if len(parts) >= 5 and parts[2] == tag:
            return _unescape(parts[4])
    return None


def mounted_names(dir_path: str) -> frozenset[str]:
    """Names directly in ``dir_path`` that something is mounted on, per this process's mount table
    (a bind-mounted file shares the dir's st_dev when it comes from the same filesystem)."""
    real = os.path.realpath(dir_path)
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            table = f.read()
    except OSError:
        return frozenset()
    out = set()
    for line in table.splitlines():
        parts = line.split(b" ", 5)
        if len(parts) >= 5:
            where = _unescape(parts[4])
            if os.path.dirname(where) == real and where != real:
                out.add(os.path.basename(where))
    return frozenset(out)


def _reaches(pid: int, dev: int) -> str | None:
    """How ``pid`` reaches the filesystem of ``dev`` without mounting it, if it does: its cwd or
    root, an open fd or a mapped file there. OSError when its /proc entries cannot be read."""
    for what in ("cwd", "root"):
        if os.stat(f"/proc/{pid}/{what}").st_dev == dev:  # the magic link: works on a detached mount
            return what
    with os.scandir(f"/proc/{pid}/fd") as fds:
        for fd in fds:
            try:
                if os.readlink(fd.path).startswith("/") and os.stat(fd.path).st_dev == dev:
                    return f"open fd {fd.name}"
            except FileNotFoundError:
                continue  # closed mid-walk
    tag = f"{os.major(dev):02x}:{os.minor(dev):02x}".encode()
    with open(f"/proc/{pid}/maps", "rb") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) >= 5 and parts[3] == tag and parts[4] != b"0":
                return "mapped file"
    return None


def judge_trust(shm_dir: str, pids: Iterable[int] | None = None) -> Trust:
    """Whether pid liveness can be trusted for segments in ``shm_dir`` (``pids``: whom to look at)."""
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
    seen_mnt: set[str] = set()
    doubt: set[int] = set()
    for pid in live_pids() if pids is None else pids:
        try:
            nested = _nested(pid)
            if nested is False:
                continue  # a member of this pid namespace: its pids are the ones gc reads
            pidns = _readlink_or(f"/proc/{pid}/ns/pid", "") if nested else os.readlink(f"/proc/{pid}/ns/pid")
            if pidns == mine:
                continue
            mntns = os.readlink(f"/proc/{pid}/ns/mnt")
            table = None
            if mntns not in seen_mnt:  # one mount table per mount namespace
                with open(f"/proc/{pid}/mountinfo", "rb") as f:
                    table = f.read()
            via = _reaches(pid, dev)  # per process: a cwd or fd is its own, whatever its mount table says
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited mid-walk: it produces nothing any more
        except OSError:
            uid = _uid_of(pid)
            if uid is not None:
                doubt.add(uid)
            continue
        where = None
        if table is not None:
            seen_mnt.add(mntns)
            where = mount_of(table, dev)
        if where is not None:
            return Trust(False, (
                f"processes in another pid namespace ({pidns or 'unreadable'}, e.g. pid {pid}) see this filesystem "
                f"at {where}: "
                f"their pids mean nothing here ({_ASSUME})"
            ))  # fmt: skip
        if via is not None:
            return Trust(False, (
                f"pid {pid}, in another pid namespace ({pidns or 'unreadable'}), reaches this filesystem through its "
                f"{via} although its mounts do not show it: its pids mean nothing here ({_ASSUME})"
            ))  # fmt: skip
    note = "gc sees every pid namespace that shares this filesystem"
    if doubt:
        note += f"; the namespaces of uid(s) {', '.join(map(str, sorted(doubt)))} could not be read"
    return Trust(True, note, frozenset(doubt))


__all__ = ["INIT_PID_NS", "Trust", "judge_trust", "mount_of", "mounted_names"]
