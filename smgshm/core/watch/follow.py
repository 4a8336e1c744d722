"""Following the shm dir with inotify: ShmWatcher turns the kernel's records into ShmEvents.

A queue overflow (IN_Q_OVERFLOW) is reported and followed by a rescan of the
directory; the shm dir deleted, moved, unmounted or mounted over is reported as
``dir_gone`` and watched again once the path is a directory again. The events'
consumer is ``SegmentTracker`` (segmentlife.py), re-exported here with them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import struct
import sys
import time
from typing import Any

from inotify_simple import flags as _F  # noqa: N812 - a short name for the hot-loop constants below

from smgshm.core.errors import HostError
from smgshm.core.names import SMG_FAMILY_PREFIX
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.watch.events import (
    CLOSED,
    CLOSED_NOWRITE,
    CREATED,
    DIR_GONE,
    OPENED,
    OVERFLOW,
    REMOVED,
    RESCANNED,
    ShmEvent,
)
from smgshm.core.watch.life import CLEANED, CONSUMED, UNKNOWN, SegmentLife, SegmentTracker

_DIR_CHECK_S = 1.0  # how often the path is re-stat'ed: a mount over it sends no event
_READ_BYTES = 1 << 20  # per read(): the kernel returns whole events only, up to this much

# struct inotify_event {int wd; uint32 mask, cookie, len; char name[len];} (inotify(7)),
# with the library's flag values as plain ints for the hot loop.
_EVENT_HEADER = struct.Struct("iIII")
_IN_OPEN, _IN_CLOSE_WRITE, _IN_CREATE, _IN_DELETE = int(_F.OPEN), int(_F.CLOSE_WRITE), int(_F.CREATE), int(_F.DELETE)
_IN_CLOSE_NOWRITE = int(_F.CLOSE_NOWRITE)
_IN_MOVED_FROM, _IN_MOVED_TO = int(_F.MOVED_FROM), int(_F.MOVED_TO)
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_UNMOUNT = int(_F.DELETE_SELF), int(_F.MOVE_SELF), int(_F.UNMOUNT)
_IN_Q_OVERFLOW, _IN_IGNORED = int(_F.Q_OVERFLOW), int(_F.IGNORED)
_IN_SELF_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT | _IN_IGNORED
_IN_MOVED = _IN_MOVED_FROM | _IN_MOVED_TO
_IN_CHILD_EVENTS = _IN_OPEN | _IN_CLOSE_WRITE | _IN_CLOSE_NOWRITE | _IN_CREATE | _IN_DELETE | _IN_MOVED
_KIND_OF = {
    _IN_CREATE: CREATED,
    _IN_OPEN: OPENED,
    _IN_CLOSE_WRITE: CLOSED,
    _IN_CLOSE_NOWRITE: CLOSED_NOWRITE,
    _IN_DELETE: REMOVED,
    _IN_MOVED_FROM: REMOVED,
    _IN_MOVED_TO: CREATED,
}
_FS_ENCODING = sys.getfilesystemencoding()


def _self_gone_detail(mask: int) -> str:
    if mask & _IN_UNMOUNT:
        return "unmounted"
    if mask & _IN_MOVE_SELF:
        return "moved"
    return "deleted" if mask & _IN_DELETE_SELF else "ignored"


def _mask() -> int:
    f = _F
    return int(
        f.CREATE
        | f.OPEN
        | f.CLOSE_WRITE
        | f.CLOSE_NOWRITE
        | f.DELETE
        | f.MOVED_FROM
        | f.MOVED_TO
        | f.DELETE_SELF
        | f.MOVE_SELF
        | f.ONLYDIR
    )


def _watch_error(err: OSError, shm_dir: str) -> HostError:
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return HostError("shm dir does not exist", path=shm_dir, hint="mount a tmpfs at /dev/shm")
    if err.errno in (errno.EACCES, errno.EPERM):
        return HostError("permission denied watching the shm dir", path=shm_dir, uid=os.getuid())
    if err.errno == errno.ENOSPC:
        return HostError(
            "inotify watch limit reached", path=shm_dir, hint="raise it: sysctl fs.inotify.max_user_watches=524288"
        )
    if err.errno == errno.EMFILE:
        return HostError(
            "too many inotify instances for this user",
            path=shm_dir,
            hint="raise it: sysctl fs.inotify.max_user_instances=1024",
        )
    return HostError(f"cannot watch the shm dir: {err.strerror}", path=shm_dir)


class ShmWatcher:
    """inotify on one directory, turned into ``ShmEvent``s for names with ``prefix``.

    ``events(timeout_s)`` returns what is queued at once, or waits at most
    ``timeout_s`` for something. The first call also returns a listing of what
    was already there (``rescan`` "created" events, then "rescanned").
    """

    def __init__(self, shm_dir: str = DEFAULT_SHM_DIR, prefix: str = SMG_FAMILY_PREFIX, *, listing: bool = True):
        self.shm_dir = shm_dir
        self.prefix = prefix
        self.listing = listing
        self.overflows = 0
        self.dir_gone = 0
        self.events_read = 0
        self._ino: Any = None
        self._wd: int | None = None
        self._dir_id: tuple[int, int] | None = None
        self._pending: list[ShmEvent] = []
        self._next_dir_check = 0.0
        self._bprefix = os.fsencode(prefix)
        self._last_read_ns = 0
        self._poller: Any = None
        # The lstat of each close-after-write of the last batch (by name), for whoever needs more than
        # the size (watch/witness.py): one lstat a segment serves both.
        self.closed_stats: dict[str, os.stat_result] = {}

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> ShmWatcher:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Start watching; a HostError when the dir cannot be watched."""
        import inotify_simple

        try:
            self._ino = inotify_simple.INotify(nonblocking=True)
        except OSError as err:
            raise _watch_error(err, self.shm_dir) from err
        self._poller = select.poll()
        self._poller.register(self._ino.fileno(), select.POLLIN)
        self._add_watch(raise_errors=True)
        if self.listing:
            self._pending.extend(self._list("start"))

    def close(self) -> None:
        if self._ino is not None:
            self._ino.close()
            self._ino = None
        self._wd = None

    @property
    def watching(self) -> bool:
        """False between a dir_gone and the re-watch."""
        return self._wd is not None

    def _add_watch(self, raise_errors: bool) -> bool:
        try:
            st = os.stat(self.shm_dir)
            self._wd = self._ino.add_watch(self.shm_dir, _mask())
        except OSError as err:
            if raise_errors:
                raise _watch_error(err, self.shm_dir) from err
            return False
        self._dir_id = (st.st_dev, st.st_ino)
        self._next_dir_check = time.monotonic() + _DIR_CHECK_S
        return True

    def _list(self, why: str) -> list[ShmEvent]:
        """What the directory holds now, as rescan "created" events and a closing "rescanned"."""
        now = time.time_ns()
        out: list[ShmEvent] = []
        try:
            with os.scandir(self.shm_dir) as it:
                for entry in it:
                    if not entry.name.startswith(self.prefix):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone since the listing
                    out.append(ShmEvent(CREATED, entry.name, now, st.st_size, True, st.st_mtime_ns))
        except OSError:
            pass  # gone again: the next events() says dir_gone
        out.append(ShmEvent(RESCANNED, "", now, detail=why))
        return out

    # -- reading -------------------------------------------------------------------------

    def events(self, timeout_s: float) -> list[ShmEvent]:
        """Events queued now, or within ``timeout_s``; never waits longer than that."""
        if self._ino is None:
            raise HostError("the watcher is not open", path=self.shm_dir)
        deadline = time.monotonic() + max(0.0, timeout_s)
        out, self._pending = self._pending, []
        while True:
            if self._wd is None:
                if self._add_watch(raise_errors=False):
                    out.extend(self._list("rewatch"))
            else:
                self._check_dir(out)
            if self._wd is not None:
                wait = 0 if out else max(0, int((deadline - time.monotonic()) * 1000))
                out.extend(self._convert(self._read(wait)))
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            if self._wd is None:
                time.sleep(min(0.1, left))  # waiting for the dir to come back

    def _check_dir(self, out: list[ShmEvent]) -> None:
        """A tmpfs mounted over the path sends the old watch nothing: compare identities."""
        now = time.monotonic()
        if now < self._next_dir_check:
            return
        self._next_dir_check = now + _DIR_CHECK_S
        try:
            st = os.stat(self.shm_dir)
            same = (st.st_dev, st.st_ino) == self._dir_id
        except OSError:
            same = False
        if not same:
            self._drop_watch()
            out.append(
                ShmEvent(DIR_GONE, "", time.time_ns(), detail="remounted" if os.path.isdir(self.shm_dir) else "deleted")
            )
            self.dir_gone += 1

    def _drop_watch(self) -> None:
        if self._wd is not None:
            with contextlib.suppress(OSError):  # already removed by the kernel (IN_IGNORED)
                self._ino.rm_watch(self._wd)
        self._wd = None

    def _read(self, timeout_ms: int) -> bytes:
        """Whatever the kernel has queued, waiting at most ``timeout_ms`` for the first event."""
        try:
            if not self._poller.poll(timeout_ms):
                return b""
            return os.read(self._ino.fileno(), _READ_BYTES)
        except BlockingIOError:
            return b""
        except OSError as err:
            raise HostError(f"cannot read inotify events: {err.strerror}", path=self.shm_dir) from err

    def _convert(self, data: bytes) -> list[ShmEvent]:
        """Kernel inotify records (struct inotify_event) to ShmEvents, in one pass.

        Decoded here rather than by inotify_simple.parse_events, which builds a tuple and
        decodes every name first: at 50,000 events a second that was a third of watch's
        CPU (benchmarks/watch_rate.py). Names outside ``prefix`` are skipped undecoded.
        """
        now, since = time.time_ns(), self._last_read_ns
        self._last_read_ns = now
        out: list[ShmEvent] = []
        append = out.append
        overflow = False
        wd, bprefix, enc = self._wd, self._bprefix, _FS_ENCODING
        unpack, pos, end, n = _EVENT_HEADER.unpack_from, 0, len(data), 0
        while pos < end:
            ev_wd, mask, _cookie, size = unpack(data, pos)
            pos += _EVENT_HEADER.size
            raw = data[pos : pos + size]
            pos += size
            n += 1
            if ev_wd != wd:
                if mask & _IN_Q_OVERFLOW:
                    overflow = True
                    self.overflows += 1
                    append(ShmEvent(OVERFLOW, "", now))
                continue  # otherwise a watch dropped on a remount, still draining its old events
            if mask & _IN_SELF_GONE:
                if self._wd is not None:
                    self._drop_watch()
                    self.dir_gone += 1
                    append(ShmEvent(DIR_GONE, "", now, detail=_self_gone_detail(mask)))
                wd = None
                continue
            if not raw.startswith(bprefix):
                continue
            kind = _KIND_OF.get(mask & _IN_CHILD_EVENTS)
            if kind is None:
                continue
            name = raw.rstrip(b"\0").decode(enc, "surrogateescape")  # os.fsdecode, without its checks
            if mask & _IN_MOVED:
                append(ShmEvent(kind, name, now, detail="moved", since_ns=since))
            else:
                append(ShmEvent(kind, name, now, None, False, None, "", since))
        self.events_read += n
        out = self._sizes(out)
        if overflow and self._wd is not None:
            # After the batch: the listing then already reflects every event read with it.
            out.extend(self._list("overflow"))
        return out

    def _sizes(self, events: list[ShmEvent]) -> list[ShmEvent]:
        """Give each close-after-write the file's size, unless the same batch unlinks it
        (then the stat would fail anyway: at high rates that saves most of them)."""
        gone = {e.name for e in events if e.kind == REMOVED}
        out: list[ShmEvent] = []
        self.closed_stats = stats = {}
        for e in events:
            if e.kind == CLOSED and e.name not in gone:
                try:
                    st = stats[e.name] = os.lstat(os.path.join(self.shm_dir, e.name))
                    size: int | None = st.st_size
                except OSError:
                    size = None
                e = e._replace(nbytes=size)
            out.append(e)
        return out


# Callers import the events, the lives and the tracker from here too.
__all__ = [
    "CLEANED",
    "CLOSED",
    "CLOSED_NOWRITE",
    "CONSUMED",
    "CREATED",
    "DIR_GONE",
    "OPENED",
    "OVERFLOW",
    "REMOVED",
    "RESCANNED",
    "UNKNOWN",
    "SegmentLife",
    "SegmentTracker",
    "ShmEvent",
    "ShmWatcher",
]
