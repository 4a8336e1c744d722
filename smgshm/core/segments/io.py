"""Segments in the shm dir: the writer, the reader and unlinking.

A segment written here looks exactly like one of SMG's gateway's: one file per
tensor, offset 0, mode 0600, created O_CREAT|O_EXCL, space reserved up front.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shlex
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from smgshm.core.causes import CATALOGUE, Cause, no_space
from smgshm.core.errors import HandleError, HostError, NoSpaceError, SegmentError
from smgshm.core.names import new_segment_name, validated_name
from smgshm.core.paths import DEFAULT_SHM_DIR, smgshm_cmd

WriteStrategy = Literal["pwrite", "mmap"]
ReaderMode = Literal["view", "copy"]


@dataclass(frozen=True)
class ShmRef:
    """What a ShmHandle carries, for a segment this process wrote."""

    name: str
    offset: int
    nbytes: int
    owner_id: str
    shm_dir: str

    @property
    def path(self) -> str:
        return os.path.join(self.shm_dir, self.name)


def owner_id() -> str:
    """SMG's owner id format, ``smg:<pid>``."""
    return f"smg:{os.getpid()}"


def _space(shm_dir: str) -> tuple[int | None, int | None]:
    """(total, free) bytes of the shm dir's filesystem; (None, None) when it cannot be read."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None, None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def no_space_error(shm_dir: str, nbytes: int, at_once: int = 0) -> NoSpaceError:
    """ENOSPC writing ``nbytes``, named by its cause: a tmpfs whose total is below what the writer holds at
    once (``at_once``: its segments in flight together, this one's included; 0: this one alone) is too
    small however empty it is (gc frees nothing); one that would hold it empty is full (free space, or
    enlarge it)."""
    total, free = _space(shm_dir)
    need = max(nbytes, at_once)
    cause = no_space(need, total)
    if cause is Cause.SHM_TOO_SMALL:
        what, hint = "shm dir is too small", CATALOGUE[cause].fix
    else:
        what = "shm dir is full"
        hint = (
            f"free space ({shlex.join(smgshm_cmd(shm_dir, 'gc', '--delete'))}) or enlarge the tmpfs "
            "(docker --shm-size, emptyDir sizeLimit)"
        )
    return NoSpaceError(
        what,
        path=shm_dir,
        needed_bytes=nbytes,
        at_once_bytes=need if need > nbytes else None,
        total_bytes=total,
        free_bytes=free,
        hint=hint,
        cause=cause.value,
    )


def _host_error(err: OSError, shm_dir: str, path: str, nbytes: int) -> HostError:
    if err.errno == errno.ENOSPC:
        return no_space_error(shm_dir, nbytes)
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return HostError(
            "cannot create a segment in the shm dir",
            path=path,
            errno=errno.errorcode.get(err.errno or 0, str(err.errno)),
            uid=os.getuid(),
            hint="run as a user that may write the shm dir, or mount it read-write",
        )
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return HostError("shm dir does not exist", path=shm_dir, hint="mount a tmpfs at /dev/shm")
    return HostError(f"cannot write segment: {err.strerror}", path=path, nbytes=nbytes)


def write_segment(
    data: memoryview | bytes | bytearray,
    *,
    shm_dir: str = DEFAULT_SHM_DIR,
    name: str | None = None,
    strategy: WriteStrategy = "pwrite",
) -> ShmRef:
    """Create a new segment holding ``data`` and return its handle fields.

    Never leaves a partial file: on any failure the file is unlinked before the
    typed error is raised.
    """
    view = memoryview(data).cast("B")
    nbytes = view.nbytes
    name = validated_name(name or new_segment_name())
    path = os.path.join(shm_dir, name)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError as err:
        raise SegmentError("segment already exists", code="exists", path=path) from err
    except OSError as err:
        raise _host_error(err, shm_dir, path, nbytes) from err
    try:
        # umask may only narrow 0600, but an inherited ACL default could widen it.
        os.fchmod(fd, 0o600)
        if nbytes:
            # Reserve every page first, as SMG does: a tmpfs that fills up mid-copy
            # would otherwise turn an mmap write into SIGBUS.
            os.posix_fallocate(fd, 0, nbytes)
            _fill(fd, view, strategy)
    except OSError as err:
        _discard(fd, path)
        raise _host_error(err, shm_dir, path, nbytes) from err
    except BaseException:
        _discard(fd, path)
        raise
    os.close(fd)
    return ShmRef(name=name, offset=0, nbytes=nbytes, owner_id=owner_id(), shm_dir=shm_dir)


def _fill(fd: int, view: memoryview, strategy: WriteStrategy) -> None:
    if strategy == "mmap":
        with mmap.mmap(fd, view.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE | mmap.PROT_READ) as mm:
            mm[:] = view
        return
    done = 0
    while done < view.nbytes:  # pwrite may stop short (2 GiB per call on Linux)
        done += os.pwrite(fd, view[done:], done)


def _discard(fd: int, path: str) -> None:
    os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def unlink_segment(name: str, shm_dir: str = DEFAULT_SHM_DIR) -> bool:
    """Unlink a segment by name; ``False`` when it was already gone."""
    try:
        os.unlink(os.path.join(shm_dir, validated_name(name)))
    except FileNotFoundError:
        return False
    return True


@dataclass
class SegmentRead:
    """A payload read from a segment: ``data`` is a private mmap view or a copy."""

    name: str
    nbytes: int
    data: memoryview
    unlinked: bool
    read_ns: int
    mode: ReaderMode
    _mm: mmap.mmap | None = None

    def release(self) -> None:
        """Drop the mapping (a no-op for a copy). Views must be released first."""
        self.data.release()
        if self._mm is not None:
            self._mm.close()
            self._mm = None


def check_handle(offset: int, nbytes: int) -> None:
    """Refuse offsets and sizes no file can satisfy before touching the file."""
    if offset < 0 or nbytes < 0:
        raise HandleError("negative offset or nbytes", offset=offset, nbytes=nbytes)
    if offset + nbytes > 2**63 - 1:
        raise HandleError("offset + nbytes beyond 2^63", offset=offset, nbytes=nbytes)


def read_segment(
    name: str,
    offset: int,
    nbytes: int,
    *,
    shm_dir: str = DEFAULT_SHM_DIR,
    mode: ReaderMode = "view",
    unlink: bool = True,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> SegmentRead:
    """Read ``nbytes`` at ``offset`` from a segment, refusing anything SMG's reader refuses.

    Stricter than SMG's reader where it is unsafe: O_NONBLOCK so a FIFO cannot hang
    the read, a size check before reading, and a refused segment is never unlinked
    (its producer still owns it). A good segment is unlinked after the read when
    ``unlink`` is set, as SMG's ``TOKENSPEED_UNLINK_MM_SHM_AFTER_READ`` does.

    ``view`` maps the segment only under a read lease, so that no one can shrink the
    file under the mapping (which would SIGBUS this process); without one (someone
    still has it open for writing, or it is another uid's) it copies, and ``mode``
    on the result says which read was made.
    """
    t0 = clock()
    clean = validated_name(name)
    check_handle(offset, nbytes)
    path = os.path.join(shm_dir, clean)
    fd = _open_regular(path)
    mm: mmap.mmap | None = None
    try:
        leased = mode == "view" and nbytes > 0 and _read_lease(fd)
        st = os.fstat(fd)  # after the lease: a truncate that beat it shows here
        if offset + nbytes > st.st_size:
            raise SegmentError(
                "segment is shorter than its handle",
                code="short",
                path=path,
                size=st.st_size,
                offset=offset,
                nbytes=nbytes,
            )
        if leased:
            # The mapping holds the open file, and so the lease, until release().
            mm, data = _map(fd, offset, nbytes)
        else:
            data = memoryview(_pread_exact(fd, nbytes, offset, path))
    finally:
        os.close(fd)
    unlinked = False
    if unlink:
        # The mapping survives the unlink; tmpfs frees the pages when it goes.
        try:
            os.unlink(path)
            unlinked = True
        except FileNotFoundError:
            pass
    made: ReaderMode = "copy" if mode == "view" and nbytes and mm is None else mode
    return SegmentRead(clean, nbytes, data, unlinked, clock() - t0, made, mm)


def _read_lease(fd: int) -> bool:
    """Take a read lease: a truncate or open-for-write elsewhere then waits until the lease
    goes (at most /proc/sys/fs/lease-break-time seconds). Refused while anyone has the
    file open for writing, or when it is another uid's and we lack CAP_LEASE."""
    try:
        # A lease break signals its holder, SIGIO by default, which would kill us;
        # SIGURG's default action is to ignore it.
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return False
    return True


def _open_regular(path: str) -> int:
    """Open ``path`` for reading only if it is a regular file, without opening anything else.

    Opening a device node can act on the device and opening a FIFO can block, so the
    entry is first pinned with O_PATH (which opens nothing and follows no link), checked,
    and only then opened for reading through /proc/self/fd: the same inode, no race.
    """
    try:
        pin = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise _open_error(err, path) from err
    try:
        mode = os.fstat(pin).st_mode
        if stat.S_ISLNK(mode):
            raise SegmentError("segment is a symlink", code="symlink", path=path)
        if not stat.S_ISREG(mode):
            raise SegmentError("segment is not a regular file", code="not_regular", path=path, kind=_kind(mode))
        try:
            return os.open(f"/proc/self/fd/{pin}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return _reopen_without_proc(path, os.fstat(pin))
        except OSError as err:
            raise _open_error(err, path) from err
    finally:
        os.close(pin)


def _reopen_without_proc(path: str, pinned: os.stat_result) -> int:
    # No /proc (a minimal container): open by name, then prove it is the inode we checked.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise _open_error(err, path) from err
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (pinned.st_dev, pinned.st_ino):
        os.close(fd)
        raise SegmentError("segment was replaced while being opened", code="replaced", path=path)
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "char_device"),
        (stat.S_ISBLK, "block_device"),
    ):
        if test(mode):
            return name
    return "other"


def _open_error(err: OSError, path: str) -> SegmentError:
    codes = {
        errno.ELOOP: ("segment is a symlink", "symlink"),
        errno.ENOENT: ("segment does not exist", "missing"),
        errno.EACCES: ("permission denied opening segment", "permission"),
        errno.EPERM: ("permission denied opening segment", "permission"),
        errno.ENXIO: ("segment is not a regular file", "not_regular"),  # a socket
        errno.EISDIR: ("segment is not a regular file", "not_regular"),
    }
    what, code = codes.get(err.errno or 0, (f"cannot open segment: {err.strerror}", "open_failed"))
    hint = None
    if code == "permission":
        hint = "segments are 0600: run the reader as the producer's uid"
    return SegmentError(what, code=code, path=path, uid=os.getuid(), hint=hint)


def _map(fd: int, offset: int, nbytes: int) -> tuple[mmap.mmap, memoryview]:
    # mmap offsets must be page aligned; map from the page below and slice.
    base = offset - offset % mmap.ALLOCATIONGRANULARITY
    # MAP_PRIVATE + PROT_WRITE gives torch.frombuffer a writable buffer without a
    # copy; pages are only copied if someone writes to them. (MAP_POPULATE was measured
    # and rejected: on a private writable mapping it prefaults by copying every page.)
    mm = mmap.mmap(
        fd, nbytes + offset - base, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=base
    )
    return mm, memoryview(mm)[offset - base :]


def _pread_exact(fd: int, nbytes: int, offset: int, path: str) -> bytearray:
    buf = bytearray(nbytes)
    view = memoryview(buf)
    done = 0
    while done < nbytes:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:  # the file shrank after fstat
            raise SegmentError("segment shrank while being read", code="short", path=path, got=done, nbytes=nbytes)
        done += n
    return buf
