"""gc's node_exporter textfile: checked writable before anything is done, written atomically.

A cron line runs ``gc --delete --prometheus FILE``: a FILE that cannot be written must stop
the run (exit 5, the local environment) *before* anything is deleted, not fail after it. The
check is the real thing, not os.access (which passes for root, even in /proc): a file is
created O_CREAT|O_EXCL beside FILE and removed.
"""

from __future__ import annotations

import os
import secrets

from smgshm.core.errors import HostError


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
    """Raise HostError unless ``path`` can be (re)written atomically: its directory takes a new file."""
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    if os.path.isdir(path):
        raise HostError("the --prometheus path is a directory", path=path)
    if not os.path.isdir(parent):
        raise HostError("the --prometheus file's directory does not exist", path=parent)
    # prometheus_client writes PATH.<pid>.<tid> beside PATH and renames it over PATH.
    fd, tmp = _create_beside(path)
    os.close(fd)
    os.unlink(tmp)


def write_gc_textfile(
    path: str, dir_label: str, counts: dict[str, int], bytes_by_state: dict[str, int], free_bytes: int
) -> None:
    """Counts and bytes per state and the free bytes; ``dir_label`` is the shm dir, already escaped."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    labels = ["shm_dir", "state"]
    count = Gauge("smgshm_segments", "SMG segments in the shm dir, by state", labels, registry=reg)
    size = Gauge("smgshm_segment_bytes", "Allocated bytes of SMG segments, by state", labels, registry=reg)
    free = Gauge("smgshm_shm_free_bytes", "Free bytes in the shm dir", ["shm_dir"], registry=reg)
    for state, n in counts.items():
        count.labels(dir_label, state).set(n)
        size.labels(dir_label, state).set(bytes_by_state[state])
    free.labels(dir_label).set(free_bytes)
    try:
        write_to_textfile(path, reg)
    except OSError as err:
        raise HostError(f"cannot write the --prometheus file: {err.strerror}", path=path, uid=os.getuid()) from err


__all__ = ["check_writable", "write_gc_textfile"]
