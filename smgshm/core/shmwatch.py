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
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

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


def _flags() -> Any:
    import inotify_simple

    return inotify_simple.flags


def _mask() -> int:
    f = _flags()
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
            self._ino = inotify_simple.INotify()
        except OSError as err:
            raise _watch_error(err, self.shm_dir) from err
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
                try:
                    raw = self._ino.read(timeout=wait)
                except OSError as err:
                    raise HostError(f"cannot read inotify events: {err.strerror}", path=self.shm_dir) from err
                out.extend(self._convert(raw))
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

    def _convert(self, raw: Iterable[Any]) -> list[ShmEvent]:
        f = _flags()
        now = time.time_ns()
        out: list[ShmEvent] = []
        append = out.append
        overflow = False
        prefix, wd = self.prefix, self._wd
        self_gone = int(f.DELETE_SELF | f.MOVE_SELF | f.UNMOUNT | f.IGNORED)
        # Hot loop (four or five events per segment): plain ints, no enum arithmetic.
        q_overflow, create, opened, close_write = int(f.Q_OVERFLOW), int(f.CREATE), int(f.OPEN), int(f.CLOSE_WRITE)
        delete, moved_from, moved_to = int(f.DELETE), int(f.MOVED_FROM), int(f.MOVED_TO)
        n = 0
        for ev_wd, mask, _cookie, name in raw:
            n += 1
            if ev_wd != wd:
                if mask & q_overflow:
                    overflow = True
                    self.overflows += 1
                    append(ShmEvent(OVERFLOW, "", now))
                continue  # otherwise a watch dropped on a remount, still draining its old events
            if mask & self_gone:
                detail = ("unmounted" if mask & f.UNMOUNT else "moved" if mask & f.MOVE_SELF
                          else "deleted" if mask & f.DELETE_SELF else "ignored")  # fmt: skip
                if self._wd is not None:
                    self._drop_watch()
                    self.dir_gone += 1
                    append(ShmEvent(DIR_GONE, "", now, detail=detail))
                wd = None
                continue
            if not name.startswith(prefix):
                continue
            if mask & create:
                append(ShmEvent(CREATED, name, now))
            elif mask & opened:
                append(ShmEvent(OPENED, name, now))
            elif mask & close_write:
                append(ShmEvent(CLOSED, name, now))
            elif mask & delete:
                append(ShmEvent(REMOVED, name, now))
            elif mask & moved_from:
                append(ShmEvent(REMOVED, name, now, detail="moved"))
            elif mask & moved_to:
                append(ShmEvent(CREATED, name, now, detail="moved"))
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
                 "observed", "pid", "reads")  # fmt: skip

    def __init__(self, name: str, created_ns: int, observed: bool, nbytes: int | None, note: str = "") -> None:
        self.name = name
        self.kind, self.pid, _ = parse_name(name)
        self.created_ns = created_ns
        self.observed = observed
        self.lost = not observed  # part of its life happened unseen
        self.creator_open = observed  # the next IN_OPEN is its creator's
        self.nbytes = nbytes
        self.reads = 0
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

    def older_than(self, cutoff_ns: int, now_ns: int | None = None) -> list[SegmentLife]:
        """The lives in flight created before ``cutoff_ns``, oldest first."""
        now = time.time_ns() if now_ns is None else now_ns
        old = [lv for lv in self._live.values() if lv.created_ns < cutoff_ns]
        old.sort(key=lambda lv: lv.created_ns)
        return [lv.life(None, now, None) for lv in old]

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
        lv = _Live(e.name, e.t_ns, True, None, "renamed into the shm dir" if moved else "")
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
