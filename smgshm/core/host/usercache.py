"""Files smgshm keeps in the user's own cache dir: private to that user, and read as untrusted.

The dir is ``$XDG_CACHE_HOME/smgshm`` (``~/.cache/smgshm`` when that is unset or not absolute, as the
XDG spec says), made 0700; files in it are written whole (a 0600 temp file renamed over), never
through a link. A file is read only when it is a regular file of this user's, writable by no one
else, in a dir that is the same, and no bigger than asked: anything else reads as absent. Nothing
here raises: a cache is an aid, and a command never fails for want of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_CHUNK = 1 << 16  # read past what fstat said, a chunk at a time


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "smgshm")


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & _OTHERS_WRITE


def refusal(path: str) -> str | None:
    """Why the existing dir ``path`` is no place for this user's private files (not a dir, a link, another
    user's, or one others may write in: a shared 1777 dir such as /tmp or /dev/shm); None when it is one,
    or is absent (it is then made, 0700)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this user (uid {os.geteuid()})"
    if st.st_mode & _OTHERS_WRITE:
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if st.st_mode & bit)
        return f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _open_dir(path: str, create: bool) -> int | None:
    """An fd on the dir ``path`` when it is this user's and no one else may write in it (not through
    a link); None otherwise. ``create``: make it (0700) if missing. Only a dir made here has its mode
    set; an existing one is never changed, only refused (a shared 1777 dir named as the state dir made
    0755 would shut every other user out of it: /dev/shm so, every non-root gateway's SHM)."""
    made = False
    if create:
        with contextlib.suppress(OSError):
            parent = os.path.dirname(path.rstrip("/"))
            if parent:
                os.makedirs(parent, exist_ok=True)
            os.mkdir(path, 0o700)
            made = True
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if made and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # ours, just made: exactly 0700, whatever the umask
            st = os.fstat(fd)
        if _private(st):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_private(name: str, max_bytes: int, directory: str | None = None) -> bytes | None:
    """The bytes of cache file ``name`` (in ``directory``, the cache dir by default); None when it is
    absent, not this user's own private regular file, bigger than ``max_bytes`` or unreadable."""
    dfd = _open_dir(directory or cache_dir(), create=False)
    if dfd is None:
        return None
    try:
        # O_NONBLOCK: a FIFO put in its place must not hang the read (it is refused below).
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > max_bytes:
            return None
        # What fstat said, and a chunk more for a file grown since: never a buffer of ``max_bytes`` a read (os.read
        # allocates what it is asked for: 48 MiB for a sightings store of a few KiB, twice a read).
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(max_bytes + 1 - total, max(st.st_size - total, 0) + _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks) if total <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def write_private(name: str, data: bytes, directory: str | None = None) -> bool:
    """Put ``data`` in cache file ``name`` (0600, atomically: a reader sees the old file or the new
    one whole); False when it could not be written."""
    dfd = _open_dir(directory or cache_dir(), create=True)
    if dfd is None:
        return False
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        return False
    finally:
        os.close(dfd)


def _flock(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        except OSError:
            return False


class LockWaits:
    """This run's waits for smgshm's locks: one bounded wait per run. A lock another process holds would
    otherwise cost its wait once per store (a second per tmpfs: gc --node over 30 pods, 30 s, past NPD's
    timeout); once a wait has run out, later locks of the run are tried without waiting, and skipped
    when held. A CLI invocation is one run (the root command starts it: ``new_run``)."""

    def __init__(self) -> None:
        self.ran_out = 0  # waits that ended without the lock (at most one a run, bar threads racing to it)
        self.skipped = 0  # locks then found held and not waited for
        self.where = ""  # the dir of the first wait that ran out

    @property
    def exhausted(self) -> bool:
        return self.ran_out > 0


_waits = LockWaits()


def new_run() -> LockWaits:
    """Start a run: its one bounded wait is still to be had. The run's ``LockWaits``."""
    global _waits
    _waits = LockWaits()
    return _waits


def lock_waits() -> LockWaits:
    """This run's waits so far."""
    return _waits


@contextlib.contextmanager
def locked(directory: str | None = None, wait_s: float = 1.0) -> Iterator[bool]:
    """Hold smgshm's lock of the private dir ``directory`` (made if missing) while a read-modify-write
    of a file in it runs: an exclusive flock on the dir itself, taken by every such writer of this
    user's. Yields False when the dir is not private or the lock was not had within ``wait_s``
    (bounded: a process of this user's that holds it forever stalls no one), or at once once this
    run's one wait has run out (``LockWaits``)."""
    path = directory or cache_dir()
    dfd = _open_dir(path, create=True)
    if dfd is None:
        yield False
        return
    try:
        run = _waits
        wait = 0.0 if run.exhausted else wait_s
        got = _flock(dfd, wait)
        if not got and wait > 0:
            run.ran_out += 1
            run.where = run.where or path
        elif not got:
            run.skipped += 1
        yield got
    finally:
        os.close(dfd)  # which releases the lock


__all__ = ["LockWaits", "cache_dir", "lock_waits", "locked", "new_run", "read_private", "refusal", "write_private"]
