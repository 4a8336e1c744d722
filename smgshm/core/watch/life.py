"""Each segment's life from creation to unlink, folded from ShmEvents in bounded memory.

inotify says what happened to a name, never who did it, so how a life ended is read
from the order of events (``SegmentLife.end``):

- ``consumed``: someone opened the file after its creator did, or closed a read-only
  descriptor of it, before it was unlinked. The creator's ``open(O_CREAT)`` is the first
  IN_OPEN after IN_CREATE; every reader SMG has (mm_shm, the Rust servicer, TokenSpeed's
  SharedMemory attach, smgshm's receiver) must open the file to read it. The kernel drops
  an event identical to the last one queued, so a reader's IN_OPEN right behind its
  creator's (the creator's close still pending: its descriptor or map still open, or its
  last reference held a moment by anyone reading ``/proc/PID/fd``) is no event of its own;
  the reader's IN_CLOSE_NOWRITE still says it (the creator opened to write: its close is
  IN_CLOSE_WRITE). A reader that opens read-write (SharedMemory) has no such second word.
- ``cleaned``: unlinked with no open but its creator's: nobody read it. SMG's gateway
  cleans up this way when a request fails before a worker reads it, and its
  writability probe always does.
- ``unknown``: the watch missed part of the life: it existed before the watch started,
  events were lost to a queue overflow, it was renamed, or the shm dir went away.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from dataclasses import dataclass

from smgshm.core.closed import Closed
from smgshm.core.names import Kind, ParsedName, parse_name
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


class End(Closed):
    """How a segment's life ended, as the order of its events tells."""

    CONSUMED = "consumed"  # another process opened it before it was unlinked
    CLEANED = "cleaned"  # unlinked with no reader's open seen
    UNKNOWN = "unknown"  # events were lost, or it left the dir another way


CONSUMED, CLEANED, UNKNOWN = End.CONSUMED, End.CLEANED, End.UNKNOWN
ENDS = tuple(End)


@dataclass(frozen=True, slots=True)
class SegmentLife:
    """One segment from creation to unlink (``removed_ns`` None while in flight)."""

    name: str
    kind: Kind  # names.parse_name
    producer_pid: int | None
    created_ns: int
    nbytes: int | None
    removed_ns: int | None
    in_flight_ns: int  # removed (or now, while in flight) minus created
    end: End | None = None  # null while in flight
    reads: int = 0  # opens after the creator's (at least its read-only closes: the kernel merges identical opens)
    first_read_ns: int | None = None
    observed: bool = True  # its creation was seen (not found by a listing)
    note: str = ""  # why the end is unknown


class _Live:
    """The tracker's mutable record of one segment in flight."""

    __slots__ = (
        "created_ns",
        "creator_open",
        "first_read_ns",
        "kind",
        "lost",
        "name",
        "nbytes",
        "note",
        "observed",
        "orphaned",
        "pid",
        "reads",
        "ro_closes",
    )

    def __init__(
        self,
        name: str,
        created_ns: int,
        observed: bool,
        nbytes: int | None,
        note: str = "",
        parsed: ParsedName | None = None,
    ) -> None:
        self.name = name
        self.kind, self.pid, _ = parsed or parse_name(name)
        self.created_ns = created_ns
        self.observed = observed
        self.lost = not observed  # part of its life happened unseen
        self.creator_open = observed  # the next IN_OPEN is its creator's
        self.nbytes = nbytes
        self.reads = 0
        self.ro_closes = 0  # read-only descriptors closed: readers, whatever became of their IN_OPEN
        self.orphaned = False
        self.first_read_ns: int | None = None
        self.note = note if note or observed else "found by a directory listing: its creation was not seen"

    def life(self, removed_ns: int | None, now_ns: int, end: End | None, note: str = "") -> SegmentLife:
        stop = removed_ns if removed_ns is not None else now_ns
        return SegmentLife(
            self.name,
            self.kind,
            self.pid,
            self.created_ns,
            self.nbytes,
            removed_ns,
            max(0, stop - self.created_ns),
            end,
            max(self.reads, self.ro_closes),
            self.first_read_ns,
            self.observed,
            note or self.note,
        )


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
        self.created_bytes_by_kind: dict[str, int] = {}  # the same, per producer kind
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
                    self._opened(lv, e)
            elif kind == CLOSED_NOWRITE:
                lv = live.get(e.name)
                if lv is not None:
                    lv.ro_closes += 1
                    if lv.first_read_ns is None:
                        lv.first_read_ns = e.t_ns  # read by then: its IN_OPEN was merged into the creator's
            elif kind == CLOSED:
                lv = live.get(e.name)
                if lv is not None and e.nbytes is not None:
                    self._closed(lv, e.nbytes)
            elif kind == REMOVED:
                lv = self._pop(e.name)
                if lv is not None:
                    done.append(self._end(lv, e))
            elif kind == OVERFLOW:
                self._overflow()
            elif kind == RESCANNED:
                self._rescanned(e, done)
            elif kind == DIR_GONE:
                self._dir_gone(e, done)
        return done

    @staticmethod
    def _opened(lv: _Live, e: ShmEvent) -> None:
        if lv.creator_open:
            lv.creator_open = False
        else:
            lv.reads += 1
            if lv.first_read_ns is None:
                lv.first_read_ns = e.t_ns

    def _closed(self, lv: _Live, nbytes: int) -> None:
        """A close after a write: the size is known now."""
        if lv.nbytes is None and lv.observed:
            self.created_bytes += nbytes
            self.created_bytes_by_kind[lv.kind] = self.created_bytes_by_kind.get(lv.kind, 0) + nbytes
        self._resize(lv, nbytes)

    def _overflow(self) -> None:
        for lv in self._live.values():
            lv.lost = True
            lv.note = "events were lost to an inotify queue overflow"
        self._listed = set()

    def _rescanned(self, e: ShmEvent, done: list[SegmentLife]) -> None:
        if self._listed is not None:
            # Only a life the loss spanned can have ended unseen: one whose IN_CREATE was
            # read after the overflow is followed whole, its unlink still to be read.
            for n in [n for n, lv in self._live.items() if lv.lost and n not in self._listed]:
                lv = self._pop(n)
                done.append(lv.life(e.t_ns, e.t_ns, UNKNOWN, "unlinked while events were lost"))  # type: ignore[union-attr]
        self._listed = None

    def _dir_gone(self, e: ShmEvent, done: list[SegmentLife]) -> None:
        for lv in self._live.values():
            done.append(lv.life(e.t_ns, e.t_ns, UNKNOWN, f"the shm dir went away ({e.detail})"))
        self._live.clear()
        self.in_flight_bytes = 0
        self._listed = set()  # the re-watch listing starts from nothing

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
            nanos = parse_name(e.name).nanos
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
        if e.since_ns and parsed.nanos is not None and e.since_ns <= parsed.nanos <= e.t_ns:
            born = parsed.nanos
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
        return lv.life(e.t_ns, e.t_ns, CONSUMED if lv.reads or lv.ro_closes else CLEANED, "")


__all__ = ["CLEANED", "CONSUMED", "ENDS", "UNKNOWN", "End", "SegmentLife", "SegmentTracker"]
