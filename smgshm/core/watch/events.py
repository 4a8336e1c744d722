"""What happens in the shm dir, as inotify tells it: the event type shared by watcher and tracker."""

from __future__ import annotations

from typing import NamedTuple

# Event kinds. "rescanned" closes the synthetic "created" events of a listing (at start,
# after an overflow, after a re-watch): whatever the tracker holds that the listing did
# not show is gone.
CREATED, OPENED, CLOSED, REMOVED = "created", "opened", "closed", "removed"
# A read-only descriptor closed (IN_CLOSE_NOWRITE): a reader's, never its creator's, which
# opened it to write. It survives what hides a reader's IN_OPEN: the kernel drops an event
# identical to the last one queued, so a reader's open right behind its creator's (its
# close still pending) is no event of its own.
CLOSED_NOWRITE = "closed_nowrite"
OVERFLOW, RESCANNED, DIR_GONE = "overflow", "rescanned", "dir_gone"


class ShmEvent(NamedTuple):
    """One thing that happened in the shm dir, as far as inotify tells it.

    Immutable; a NamedTuple rather than a dataclass because a busy host makes tens of
    thousands a second and a tuple is built in a third of the time.
    """

    kind: str  # created | opened | closed | closed_nowrite | removed | overflow | rescanned | dir_gone
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


__all__ = ["CLOSED", "CLOSED_NOWRITE", "CREATED", "DIR_GONE", "OPENED", "OVERFLOW", "REMOVED", "RESCANNED", "ShmEvent"]
