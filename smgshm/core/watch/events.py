"""What happens in the shm dir, as inotify tells it: the event type shared by watcher and tracker."""

from __future__ import annotations

from typing import NamedTuple

from smgshm.core.closed import Closed


class EventKind(Closed):
    """What an event says happened (``ShmEvent.kind``). "rescanned" closes the synthetic "created" events
    of a listing (at start, after an overflow, after a re-watch): whatever the tracker holds that the
    listing did not show is gone."""

    CREATED = "created"
    OPENED = "opened"
    CLOSED = "closed"
    # A read-only descriptor closed (IN_CLOSE_NOWRITE): a reader's, never its creator's, which
    # opened it to write. It survives what hides a reader's IN_OPEN: the kernel drops an event
    # identical to the last one queued, so a reader's open right behind its creator's (its
    # close still pending) is no event of its own.
    CLOSED_NOWRITE = "closed_nowrite"
    REMOVED = "removed"
    OVERFLOW = "overflow"
    RESCANNED = "rescanned"
    DIR_GONE = "dir_gone"


# The watch's own events, not a segment's: what watch --jsonl writes as records of their own.
OF_THE_WATCH = (EventKind.OVERFLOW, EventKind.RESCANNED, EventKind.DIR_GONE)

# The members by their short names, for the hot loops that compare each event's kind.
CREATED, OPENED, CLOSED, REMOVED = EventKind.CREATED, EventKind.OPENED, EventKind.CLOSED, EventKind.REMOVED
CLOSED_NOWRITE = EventKind.CLOSED_NOWRITE
OVERFLOW, RESCANNED, DIR_GONE = EventKind.OVERFLOW, EventKind.RESCANNED, EventKind.DIR_GONE


class ShmEvent(NamedTuple):
    """One thing that happened in the shm dir, as far as inotify tells it.

    Immutable; a NamedTuple rather than a dataclass because a busy host makes tens of
    thousands a second and a tuple is built in a third of the time.
    """

    kind: EventKind
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


__all__ = [
    "CLOSED",
    "CLOSED_NOWRITE",
    "CREATED",
    "DIR_GONE",
    "OF_THE_WATCH",
    "OPENED",
    "OVERFLOW",
    "REMOVED",
    "RESCANNED",
    "EventKind",
    "ShmEvent",
]
