"""gc's node_exporter textfile: checked writable before anything is done, written atomically.

A cron line runs ``gc --delete --prometheus FILE``: a FILE that cannot be written must stop
the run (exit 5, the local environment) *before* anything is deleted, not fail after it. The
check is the real thing, not os.access (which passes for root, even in /proc): a file is
created O_CREAT|O_EXCL beside FILE and removed. The file is replaced by a rename, and a
rename replaces whatever entry has the name: an existing FILE that is not a regular file (a
device node, a FIFO, a symlink, a directory) is refused, both up front and just before it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from smgshm.core.errors import HostError

_TYPES = {stat.S_IFLNK: "a symlink", stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}  # fmt: skip


def _check_target(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise HostError(f"cannot inspect the --prometheus path: {err.strerror}", path=path) from err
    if not stat.S_ISREG(st.st_mode):
        what = _TYPES.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise HostError(f"the --prometheus path is {what}, not a regular file: it would be replaced", path=path)


def _create_beside(path: str) -> tuple[int, str]:
    """A new private file in ``path``'s directory (O_EXCL, never through a symlink): (fd, its path)."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(6)}.tmp"  # not *.prom: node_exporter skips it
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise HostError(f"the --prometheus file's directory does not take a new file: {err.strerror}",
                        path=os.path.dirname(tmp) or ".", uid=os.getuid()) from err  # fmt: skip
    return fd, tmp


def check_writable(path: str) -> None:
    """Raise HostError unless ``path`` can be (re)written atomically: its directory takes a new file
    and ``path`` is absent or a regular file."""
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    if not os.path.isdir(parent):
        raise HostError("the --prometheus file's directory does not exist", path=parent)
    _check_target(path)
    fd, tmp = _create_beside(path)
    os.close(fd)
    os.unlink(tmp)


def write_gc_textfile(
    path: str, dir_label: str, counts: dict[str, int], bytes_by_state: dict[str, int], free_bytes: int
) -> None:
    """Counts and bytes per state and the free bytes; ``dir_label`` is the shm dir, already escaped."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    labels = ["shm_dir", "state"]
    count = Gauge("smgshm_segments", "SMG segments in the shm dir, by state", labels, registry=reg)
    size = Gauge("smgshm_segment_bytes", "Allocated bytes of SMG segments, by state", labels, registry=reg)
    free = Gauge("smgshm_shm_free_bytes", "Free bytes in the shm dir", ["shm_dir"], registry=reg)
    for state, n in counts.items():
        count.labels(dir_label, state).set(n)
        size.labels(dir_label, state).set(bytes_by_state[state])
    free.labels(dir_label).set(free_bytes)
    fd, tmp = _create_beside(path)
    try:
        try:
            os.fchmod(fd, 0o644)  # node_exporter often runs as another user
            data = memoryview(generate_latest(reg))
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        _check_target(path)  # again, just before the rename: it may have been replaced since the start
        os.rename(tmp, path)
    except OSError as err:
        raise HostError(f"cannot write the --prometheus file: {err.strerror}", path=path, uid=os.getuid()) from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # gone after a rename; left only by a failure


__all__ = ["check_writable", "write_gc_textfile"]
