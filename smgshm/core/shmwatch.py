"""Following the shm dir with inotify: segment events, and each segment's life from create to unlink.

inotify says what happened to a name, never who did it, so how a life ended is read
from the order of events (``SegmentLife.end``):

- ``consumed``: someone opened the file after its creator did, then it was unlinked.
  The creator's ``open(O_CREAT)`` is the first IN_OPEN after IN_CREATE; every reader
  SMG has (mm_shm, the Rust servicer, TokenSpeed's SharedMemory attach, smgshm's
  receiver) must open the file to read it.
- ``cleaned``: unlinked with no open but its creator's: nobody read it. SMG's gateway
  cleans up this way when a request fails before a worker reads it, and its
  writability probe always does.
- ``unknown``: the watch missed part of the life: it existed before the watch started,
  events were lost to a queue overflow, it was renamed, or the shm dir went away.

A queue overflow (IN_Q_OVERFLOW) is reported and followed by a rescan of the
directory; the shm dir deleted, moved, unmounted or mounted over is reported as
``dir_gone`` and watched again once the path is a directory again.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import select
import struct
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from inotify_simple import flags as _F  # noqa: N812 - a short name for the hot-loop constants below

from smgshm.core.errors import HostError
from smgshm.core.leaks import parse_name
from smgshm.core.paths import DEFAULT_SHM_DIR, SMG_FAMILY_PREFIX

# Event kinds. "rescanned" closes the synthetic "created" events of a listing (at start,
# after an overflow, after a re-watch): whatever the tracker holds that the listing did
# not show is gone.
CREATED, OPENED, CLOSED, REMOVED = "created", "opened", "closed", "removed"
OVERFLOW, RESCANNED, DIR_GONE = "overflow", "rescanned", "dir_gone"

CONSUMED, CLEANED, UNKNOWN = "consumed", "cleaned", "unknown"

_DIR_CHECK_S = 1.0  # how often the path is re-stat'ed: a mount over it sends no event
_READ_BYTES = 1 << 20  # per read(): the kernel returns whole events only, up to this much

# struct inotify_event {int wd; uint32 mask, cookie, len; char name[len];} (inotify(7)),
# with the library's flag values as plain ints for the hot loop.
_EVENT_HEADER = struct.Struct("iIII")
_IN_OPEN, _IN_CLOSE_WRITE, _IN_CREATE, _IN_DELETE = int(_F.OPEN), int(_F.CLOSE_WRITE), int(_F.CREATE), int(_F.DELETE)
_IN_MOVED_FROM, _IN_MOVED_TO = int(_F.MOVED_FROM), int(_F.MOVED_TO)
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_UNMOUNT = int(_F.DELETE_SELF), int(_F.MOVE_SELF), int(_F.UNMOUNT)
_IN_Q_OVERFLOW, _IN_IGNORED = int(_F.Q_OVERFLOW), int(_F.IGNORED)
_IN_SELF_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT | _IN_IGNORED
_IN_MOVED = _IN_MOVED_FROM | _IN_MOVED_TO
_IN_CHILD_EVENTS = _IN_OPEN | _IN_CLOSE_WRITE | _IN_CREATE | _IN_DELETE | _IN_MOVED
_KIND_OF = {_IN_CREATE: "created", _IN_OPEN: "opened", _IN_CLOSE_WRITE: "closed", _IN_DELETE: "removed",
            _IN_MOVED_FROM: "removed", _IN_MOVED_TO: "created"}  # fmt: skip
_FS_ENCODING = sys.getfilesystemencoding()


def _self_gone_detail(mask: int) -> str:
    if mask & _IN_UNMOUNT:
        return "unmounted"
    if mask & _IN_MOVE_SELF:
        return "moved"
    return "deleted" if mask & _IN_DELETE_SELF else "ignored"


class ShmEvent(NamedTuple):
    """One thing that happened in the shm dir, as far as inotify tells it.

    Immutable; a NamedTuple rather than a dataclass because a busy host makes tens of
    thousands a second and a tuple is built in a third of the time.
    """

    kind: str  # created | opened | closed | removed | overflow | rescanned | dir_gone
    name: str  # os.fsdecode form (lossless: undecodable bytes as surrogates); "" for dir events
    t_ns: int  # time.time_ns() when the event was read (not when it happened)
    nbytes: int | None = None  # size at close-after-write, or at a listing, where known
    rescan: bool = False  # a "created" made from a directory listing, not seen happen
    mtime_ns: int | None = None  # with rescan: the entry's mtime
    # dir_gone: deleted | moved | unmounted | remounted; rescanned: start | overflow | rewatch;
    # a removed or created made by a rename: moved
    detail: str = ""
    # The previous read: the event happened after it (0 when unknown). Events read together
    # share t_ns, so this bounds when within the batch it happened.
    since_ns: int = 0


@dataclass(frozen=True, slots=True)
class SegmentLife:
    """One segment from creation to unlink (``removed_ns`` None while in flight)."""

    name: str
    kind: str  # gateway | gateway_probe | smgshm | smgshm_probe | other (leaks.parse_name)
    producer_pid: int | None
    created_ns: int
    nbytes: int | None
    removed_ns: int | None
    in_flight_ns: int  # removed (or now, while in flight) minus created
    end: str | None = None  # consumed | cleaned | unknown; None while in flight
    reads: int = 0  # opens after the creator's
    first_read_ns: int | None = None
    observed: bool = True  # its creation was seen (not found by a listing)
    note: str = ""  # why the end is unknown


def _mask() -> int:
    f = _F
    return int(
        f.CREATE | f.OPEN | f.CLOSE_WRITE | f.DELETE | f.MOVED_FROM | f.MOVED_TO | f.DELETE_SELF | f.MOVE_SELF
        | f.ONLYDIR
    )  # fmt: skip


def _watch_error(err: OSError, shm_dir: str) -> HostError:
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return HostError("shm dir does not exist", path=shm_dir, hint="mount a tmpfs at /dev/shm")
    if err.errno in (errno.EACCES, errno.EPERM):
        return HostError("permission denied watching the shm dir", path=shm_dir, uid=os.getuid())
    if err.errno == errno.ENOSPC:
        return HostError("inotify watch limit reached", path=shm_dir,
                         hint="raise it: sysctl fs.inotify.max_user_watches=524288")  # fmt: skip
    if err.errno == errno.EMFILE:
        return HostError("too many inotify instances for this user", path=shm_dir,
                         hint="raise it: sysctl fs.inotify.max_user_instances=1024")  # fmt: skip
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
            out.append(ShmEvent(DIR_GONE, "", time.time_ns(), detail="remounted" if os.path.isdir(self.shm_dir)
                                else "deleted"))  # fmt: skip
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
        for e in events:
            if e.kind == CLOSED and e.name not in gone:
                try:
                    size: int | None = os.lstat(os.path.join(self.shm_dir, e.name)).st_size
                except OSError:
                    size = None
                e = e._replace(nbytes=size)
            out.append(e)
        return out


class _Live:
    """The tracker's mutable record of one segment in flight."""

    __slots__ = ("created_ns", "creator_open", "first_read_ns", "kind", "lost", "name", "nbytes", "note",
                 "observed", "orphaned", "pid", "reads")  # fmt: skip

    def __init__(self, name: str, created_ns: int, observed: bool, nbytes: int | None, note: str = "",
                 parsed: tuple[str, int | None, int | None] | None = None) -> None:  # fmt: skip
        self.name = name
        self.kind, self.pid, _ = parsed or parse_name(name)
        self.created_ns = created_ns
        self.observed = observed
        self.lost = not observed  # part of its life happened unseen
        self.creator_open = observed  # the next IN_OPEN is its creator's
        self.nbytes = nbytes
        self.reads = 0
        self.orphaned = False
        self.first_read_ns: int | None = None
        self.note = note if note or observed else "found by a directory listing: its creation was not seen"

    def life(self, removed_ns: int | None, now_ns: int, end: str | None, note: str = "") -> SegmentLife:
        stop = removed_ns if removed_ns is not None else now_ns
        return SegmentLife(self.name, self.kind, self.pid, self.created_ns, self.nbytes, removed_ns,
                           max(0, stop - self.created_ns), end, self.reads, self.first_read_ns, self.observed,
                           note or self.note)  # fmt: skip


class SegmentTracker:
    """Folds ShmEvents into segment lives, holding at most ``max_tracked`` in flight.

    Beyond that, new segments are counted in ``untracked`` and not followed: memory
    stays bounded whatever the traffic. The counters only grow (take deltas for rates).
    """

    def __init__(self, max_tracked: int = 100_000) -> None:
        self.max_tracked = max_tracked
        self.untracked = 0
        self.created = 0  # lives whose creation was seen
        self.created_by_kind: dict[str, int] = {}  # the same, per producer kind (parse_name)
        self.listed = 0  # lives found by a listing (at start, after an overflow or a re-watch)
        self.created_bytes = 0  # sizes of seen creations, once known (at close-after-write)
        self.in_flight_bytes = 0  # known sizes of the lives in flight
        self._live: dict[str, _Live] = {}
        self._listed: set[str] | None = None  # names seen by the listing in progress

    def __len__(self) -> int:
        return len(self._live)

    def in_flight(self, now_ns: int | None = None) -> list[SegmentLife]:
        now = time.time_ns() if now_ns is None else now_ns
        return [lv.life(None, now, None) for lv in self._live.values()]

    def orphans(self, cutoff_ns: int, limit: int, now_ns: int | None = None) -> tuple[int, int, int, list[SegmentLife]]:
        """Lives in flight since before ``cutoff_ns``: (count, known bytes, how many crossed it
        since the last call, the ``limit`` oldest). One pass; only the listed become objects."""
        now = time.time_ns() if now_ns is None else now_ns
        count = nbytes = new = 0
        old: list[_Live] = []
        for lv in self._live.values():
            if lv.created_ns < cutoff_ns:
                count += 1
                nbytes += lv.nbytes or 0
                if not lv.orphaned:
                    lv.orphaned, new = True, new + 1
                old.append(lv)
        oldest = heapq.nsmallest(limit, old, key=lambda lv: lv.created_ns)
        return count, nbytes, new, [lv.life(None, now, None) for lv in oldest]

    def get(self, name: str, now_ns: int | None = None) -> SegmentLife | None:
        lv = self._live.get(name)
        return lv.life(None, time.time_ns() if now_ns is None else now_ns, None) if lv else None

    def feed(self, events: Iterable[ShmEvent]) -> list[SegmentLife]:
        """Apply events in order; return the lives they completed."""
        done: list[SegmentLife] = []
        live = self._live
        for e in events:
            kind = e.kind
            if kind == CREATED:
                self._created(e)
            elif kind == OPENED:
                lv = live.get(e.name)
                if lv is not None:
                    if lv.creator_open:
                        lv.creator_open = False
                    else:
                        lv.reads += 1
                        if lv.first_read_ns is None:
                            lv.first_read_ns = e.t_ns
            elif kind == CLOSED:
                lv = live.get(e.name)
                if lv is not None and e.nbytes is not None:
                    if lv.nbytes is None and lv.observed:
                        self.created_bytes += e.nbytes
                    self._resize(lv, e.nbytes)
            elif kind == REMOVED:
                lv = self._pop(e.name)
                if lv is not None:
                    done.append(self._end(lv, e))
            elif kind == OVERFLOW:
                for lv in live.values():
                    lv.lost = True
                    lv.note = "events were lost to an inotify queue overflow"
                self._listed = set()
            elif kind == RESCANNED:
                if self._listed is not None:
                    for n in [n for n in live if n not in self._listed]:
                        lv = self._pop(n)
                        done.append(lv.life(e.t_ns, e.t_ns, UNKNOWN, "unlinked while events were lost"))  # type: ignore[union-attr]
                self._listed = None
            elif kind == DIR_GONE:
                for lv in live.values():
                    done.append(lv.life(e.t_ns, e.t_ns, UNKNOWN, f"the shm dir went away ({e.detail})"))
                live.clear()
                self.in_flight_bytes = 0
                self._listed = set()  # the re-watch listing starts from nothing
        return done

    def _resize(self, lv: _Live, nbytes: int) -> None:
        self.in_flight_bytes += nbytes - (lv.nbytes or 0)
        lv.nbytes = nbytes

    def _pop(self, name: str) -> _Live | None:
        lv = self._live.pop(name, None)
        if lv is not None and lv.nbytes:
            self.in_flight_bytes -= lv.nbytes
        return lv

    def _created(self, e: ShmEvent) -> None:
        lv = self._live.get(e.name)
        if e.rescan:
            if self._listed is not None:
                self._listed.add(e.name)
            if lv is not None:
                if e.nbytes is not None:
                    self._resize(lv, e.nbytes)
                return
            # The later of the name's time and mtime (as gc judges age), never in the future.
            _, _, nanos = parse_name(e.name)
            born = min(e.t_ns, max(nanos or 0, e.mtime_ns or 0) or e.t_ns)
            self._add(_Live(e.name, born, False, e.nbytes))
            return
        if lv is not None:
            if not lv.observed or lv.lost:
                # A listing found it first and its IN_CREATE was still queued: from here on
                # every event is seen, so the judgement can be trusted again.
                lv.observed, lv.lost, lv.note = True, False, ""
                lv.creator_open = e.detail != "moved"
            return
        moved = e.detail == "moved"
        born, parsed = e.t_ns, parse_name(e.name)
        # Read in a batch: if the name carries a creation time (SMG's and smgshm's do) inside
        # the window the event must have happened in, it is the better clock.
        if e.since_ns and parsed[2] is not None and e.since_ns <= parsed[2] <= e.t_ns:
            born = parsed[2]
        lv = _Live(e.name, born, True, None, "renamed into the shm dir" if moved else "", parsed)
        if moved:  # written elsewhere and renamed in: no creator's open to expect
            lv.creator_open, lv.lost = False, True
        self._add(lv)

    def _add(self, lv: _Live) -> None:
        if len(self._live) >= self.max_tracked:
            self.untracked += 1
            return
        self._live[lv.name] = lv
        if lv.observed:
            self.created += 1
            self.created_by_kind[lv.kind] = self.created_by_kind.get(lv.kind, 0) + 1
        else:
            self.listed += 1
        if lv.nbytes:
            self.in_flight_bytes += lv.nbytes

    @staticmethod
    def _end(lv: _Live, e: ShmEvent) -> SegmentLife:
        if e.detail == "moved":
            return lv.life(e.t_ns, e.t_ns, UNKNOWN, "renamed out of the shm dir")
        if lv.lost:
            return lv.life(e.t_ns, e.t_ns, UNKNOWN)
        return lv.life(e.t_ns, e.t_ns, CONSUMED if lv.reads else CLEANED, "")


__all__ = ["SegmentLife", "SegmentTracker", "ShmEvent", "ShmWatcher"]
