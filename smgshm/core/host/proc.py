"""What /proc says about processes and threads: pids, their namespaces, their threads' fd tables.

Primitives only, shared by the holder index (holders.py), the pid-trust walk (pidtrust.py) and the
mount-table queries (mounts.py); verdicts are theirs. Each read survives the process exiting
mid-read where the caller cannot act on the error, and says so in its docstring.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

PROC_SUPER_MAGIC = 0x9FA0  # statfs(2) f_type of a procfs
PROC_ROOT_INO = 1  # the inode number of a procfs's root


def live_pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def comm(pid: int) -> str:
    """The process's name ("" when gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode("utf-8", "replace")  # the process names itself: never trusted
    except OSError:
        return ""


def uid_of(pid: int) -> int | None:
    """The uid owning ``pid`` (None when gone)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


CAP_FOWNER = 3  # linux/capability.h
CAP_SYS_PTRACE = 19


def has_effective_cap(*caps: int) -> bool:
    """Whether this process holds every capability of ``caps`` in its effective set (/proc/self/status CapEff)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    eff = int(line.split()[1], 16)
                    return all(eff >> cap & 1 for cap in caps)
    except (OSError, ValueError, IndexError):
        pass
    return False


def readlink_or(path: str, default: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return default


def dir_entries(path: str) -> list[os.DirEntry[str]]:
    """The entries of ``path``; [] when it cannot be listed (gone, or not ours)."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


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


PF_KTHREAD = 0x00200000  # linux/sched.h: a kernel thread (no files, no /dev/shm of its own)


def is_kernel_thread(pid: int) -> bool:
    """Whether ``pid`` is a kernel thread (its stat's flags say so); False when that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        flags = int(stat[stat.rindex(b")") + 2 :].split()[6])  # field 9, after the comm's closing paren
    except (OSError, ValueError, IndexError):
        return False
    return bool(flags & PF_KTHREAD)


def in_nested_pid_ns(pid: int) -> bool | None:
    """Whether ``pid`` lives in a pid namespace below this one (None: the ns links decide).
    OSError when the process is gone."""
    ns = ns_pids(pid)
    return len(ns) > 1 if ns else None


def mount_ns(pid: int) -> tuple[str, str] | None:
    """(mount namespace, its mountinfo path) of ``pid``: a zombie leader's read as gone, so then a
    live thread's. None when no thread of it can be read."""
    for base in (f"/proc/{pid}", *(e.path for e in dir_entries(f"/proc/{pid}/task"))):
        try:
            return os.readlink(f"{base}/ns/mnt"), f"{base}/mountinfo"
        except OSError:
            continue
    return None


def thread_lives(base: str) -> bool:
    """Whether the thread at ``base`` (/proc/P/task/T) still lives: only its going says no (EACCES
    is doubt)."""
    try:
        os.readlink(f"{base}/ns/mnt")
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    return True


# kcmp(2) per architecture: whether two threads share one fd table (KCMP_FILES). Elsewhere, or
# where it is refused, every thread's table is walked.
_KCMP_NR = {"x86_64": 312, "aarch64": 272, "riscv64": 272}.get(os.uname().machine)
_KCMP_FILES = 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """libc through ctypes; None where ctypes is missing (a trimmed Python, or one whose stdlib this
    user may not read): then nothing that needs it can be told."""
    try:
        import ctypes
    except ImportError:
        return None
    return ctypes.CDLL(None, use_errno=True)


def same_fd_table(a: int, b: int) -> bool:
    """Whether threads ``a`` and ``b`` share one fd table (False when that cannot be told)."""
    libc = _libc()
    return _KCMP_NR is not None and libc is not None and libc.syscall(_KCMP_NR, a, b, _KCMP_FILES, 0, 0) == 0


def fs_magic(fd: int) -> int:
    """The type of the filesystem ``fd`` is open on (statfs(2) f_type; an O_PATH fd will do).
    OSError when it cannot be told."""
    libc = _libc()
    if libc is None:
        raise OSError(errno.ENOSYS, "statfs(2) cannot be called without ctypes")
    import ctypes

    buf = ctypes.create_string_buffer(512)  # a struct statfs (120 bytes on 64-bit): f_type is its first field, a long
    if libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value


_AT_FDCWD = -100


def statx(path: str, mask: int) -> tuple[int, bytes] | None:
    """statx(2) of ``path`` (following links) asking for ``mask``: the mask the kernel filled in and
    the raw struct statx (256 bytes; linux/stat.h gives the offsets). None where the kernel, the C
    library or ctypes does not give it, or ``path`` cannot be stat'ed."""
    libc = _libc()
    if libc is None or not hasattr(libc, "statx"):
        return None
    import ctypes

    buf = ctypes.create_string_buffer(256)
    if libc.statx(_AT_FDCWD, os.fsencode(path), 0, mask, buf) != 0:
        return None
    return int.from_bytes(buf.raw[:4], sys.byteorder), buf.raw


def fd_mount_id(fd: int) -> int | None:
    """The id of the mount this process's ``fd`` is open on (its fdinfo's mnt_id): the ids mount
    tables show, one space for every mount namespace. None when fdinfo does not say (OSError when
    it cannot be read)."""
    return fdinfo_mount_id(f"/proc/self/fdinfo/{fd}")


def fdinfo_mount_id(fdinfo: str) -> int | None:
    """``fd_mount_id`` of any process's fd, by its /proc/P/fdinfo/N (no need to open the fd)."""
    with open(fdinfo, "rb") as f:
        for line in f:
            if line.startswith(b"mnt_id:"):
                value = line[7:].strip()
                return int(value) if value.isdigit() else None
    return None


def thread_views(pid: int) -> tuple[list[str], str | None]:
    """For a process with more than one thread: the /proc/P/task/T dirs whose fd tables the
    leader's /proc/P/fd does not show (an unshared table, or all of them under a zombie
    leader), and one live thread's dir to read the maps from when the leader's read empty."""
    try:
        if os.stat(f"/proc/{pid}/task").st_nlink <= 3:  # 2 + the number of threads
            return [], None
        tids = [int(e.name) for e in os.scandir(f"/proc/{pid}/task") if e.name != str(pid)]
    except OSError:
        return [], None
    walked, extra = [pid], []
    for tid in tids:
        if not any(same_fd_table(t, tid) for t in walked):  # a zombie leader shares no table
            walked.append(tid)
            extra.append(f"/proc/{pid}/task/{tid}")
    return extra, f"/proc/{pid}/task/{tids[0]}" if tids else None


__all__ = [
    "PROC_ROOT_INO",
    "PROC_SUPER_MAGIC",
    "comm",
    "dir_entries",
    "fd_mount_id",
    "fdinfo_mount_id",
    "fs_magic",
    "in_nested_pid_ns",
    "innermost_pid",
    "live_pids",
    "mount_ns",
    "ns_pids",
    "readlink_or",
    "same_fd_table",
    "statx",
    "thread_lives",
    "thread_views",
    "uid_of",
]
