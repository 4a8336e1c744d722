"""watch as a witness: the sightings of the segments it sees made, stored for gc's proofs.

gc proves pid reuse and staleness on the boot clock from when smgshm first saw a segment
(segments/sightings.py). watch sees each segment as it is made, so it records the sighting
then, and a process that takes the producer's pid afterwards is provably not the producer,
with no gc run needed before. A sighting is of an entry's identity (inode, owner, ctime, name),
so watch lstats the name and then reads the boot clock, once per batch of events: the time
comes after the lstat that found the identity, as a scan's does. It looks at each
close-after-write, as a write sets a new ctime: the identity gc will find is the one after the
producer's close, first seen when watch reads that close (an lstat at the creation, before the
write, would most often find an identity that is gone a moment later). A name renamed in, or
listed, is looked at at once; one made and not closed yet (a link, a producer still writing)
by the next store write.

The store is written at each interval and at the end, merged with what a gc wrote meanwhile
(the earlier sighting of the same entry is kept, never one no one made), and bounded: watch
drops the rows it wrote of entries it then saw unlinked, and carries the rest. What it holds
in memory is the entries alive now, at most ``max_entries`` (watch's --max-tracked); a newcomer
beyond that waits.
Nothing here raises: a store that cannot be written leaves gc's own proofs as they were.
"""

from __future__ import annotations

import array
import os
import time
from collections.abc import Iterable

from smgshm.core.host import clock
from smgshm.core.names import MATCH_GROUPS, PID_LIMIT, match_name
from smgshm.core.segments.sightings import MAX_RECORDS, Columns, StoreFile, name_sum, store_file, write_merged
from smgshm.core.watch.events import CLOSED, CREATED, DIR_GONE, REMOVED, RESCANNED, ShmEvent

_IFMT, _IFREG = 0o170000, 0o100000  # stat.S_IFMT's mask and S_IFREG, inline
# A row in memory: inode, uid, ctime (ns), name checksum, first seen (boot clock, ns), and whether it was stored.
_Row = list[int]


def _has_pid(name: str) -> bool:
    """Whether ``name`` carries a producer pid (what gc records a sighting of)."""
    m = match_name(name)
    return m is not None and int(m[MATCH_GROUPS[m.lastindex][1]]) < PID_LIMIT  # type: ignore[index]


class Witness:
    """The sightings watch makes of one shm dir: ``feed`` it the events, ``save`` each interval."""

    def __init__(self, shm_dir: str, max_entries: int = MAX_RECORDS) -> None:
        self.shm_dir, self.max_entries = shm_dir, max_entries
        self.alive: dict[str, _Row] = {}  # name -> row, of the entries with a pid alive now
        self.ended: set[tuple[int, int, int, int]] = set()  # stored rows since seen unlinked: dropped at the save
        self.listing: set[str] = set()  # the names of the listing under way (rescan "created" events)
        self.pending: set[str] = set()  # made, not yet closed after a write: looked at by the next save at the latest
        self.saves = 0  # stores written
        self.unsaved = 0  # rows alive and not in the store yet: with ``ended``, what a write is for
        self._next_save = 0.0  # monotonic: nine times a write's cost passes before the next (a big store)
        self.store: StoreFile | None = None
        self.dev: int | None = None
        self._bind()

    def _bind(self) -> None:
        """Take the shm dir as it is now (again, after it went away and came back)."""
        try:
            self.dev = os.stat(self.shm_dir).st_dev
        except OSError:
            self.dev, self.store = None, None
            return
        self.store = store_file(self.shm_dir, self.dev)

    def feed(self, events: Iterable[ShmEvent], stats: dict[str, os.stat_result] | None = None) -> None:
        """Record the sightings of a batch of events, just read; ``stats``: lstats of some of its names
        made since they were read (the watcher's, at each close-after-write), taken instead of another."""
        touched: dict[str, None] = {}  # to lstat now
        alive, pending = self.alive, self.pending
        for e in events:
            kind = e.kind
            if kind == CLOSED:
                touched[e.name] = None
                pending.discard(e.name)
            elif kind == CREATED:
                if e.rescan:
                    touched[e.name] = None
                    self.listing.add(e.name)
                elif e.detail:  # renamed in: whole, no write to wait for
                    touched[e.name] = None
                elif len(pending) < self.max_entries:  # made: whole at its producer's close (a write sets a ctime)
                    pending.add(e.name)
            elif kind == REMOVED:
                touched.pop(e.name, None)
                pending.discard(e.name)
                self._end(e.name)
            elif kind == RESCANNED:
                # What the listing did not show is gone (its unlink was lost to an overflow, say).
                listed = self.listing
                for name in [n for n in alive if n not in listed]:
                    self._end(name)
                touched = {n: None for n in touched if n in listed}
                pending.intersection_update(listed)
                self.listing = set()
            elif kind == DIR_GONE:
                # Another dir (or none) at the path now: its entries are another store's, this one's ended with it.
                alive.clear()
                self.ended.clear()
                touched.clear()
                pending.clear()
                self.listing = set()
                self.store = None
        if touched:
            self._look(touched, stats)

    def _end(self, name: str) -> None:
        row = self.alive.pop(name, None)
        if row is None:
            return
        if row[5]:
            self.ended.add((row[0], row[1], row[2], row[3]))
        else:
            self.unsaved -= 1  # made and gone between two writes: nothing to write (most segments)

    def _look(self, names: Iterable[str], stats: dict[str, os.stat_result] | None = None) -> None:
        """lstat each name (or take its lstat from ``stats``), then read the boot clock: each identity
        found is first seen then, unless it is the one already recorded for that name."""
        if self.store is None:
            self._bind()
            if self.store is None:
                return
        alive, dev, join, lstat, d = self.alive, self.dev, os.path.join, os.lstat, self.shm_dir
        found: list[tuple[str, os.stat_result]] = []
        for name in names:
            if name not in alive and (len(alive) + len(found) >= self.max_entries or not _has_pid(name)):
                continue
            st = stats.get(name) if stats else None
            if st is None:
                try:
                    st = lstat(join(d, name))
                except OSError:
                    self._end(name)  # unlinked since (its event follows) or renamed
                    continue
            if st.st_mode & _IFMT == _IFREG and st.st_dev == dev:
                found.append((name, st))
        now = clock.boot_clock_ns()  # after every lstat of the batch: each identity was there by then
        for name, st in found:
            row = alive.get(name)
            if row is not None and (row[0], row[1], row[2]) == (st.st_ino, st.st_uid, st.st_ctime_ns):
                continue  # the same entry, first seen earlier
            if row is not None:
                self._end(name)  # rewritten: the old identity has ended
            alive[name] = [st.st_ino, st.st_uid, st.st_ctime_ns, name_sum(name), now, 0]
            self.unsaved += 1

    def save(self, *, now: bool = False) -> bool:
        """Write the store: what watch saw, merged with what is on disk (the earlier of two sightings
        of the same entry; disk rows of entries watch saw unlinked dropped, others carried). The
        earlier sightings a gc made are taken into memory too. False when nothing was written (nor
        needed: a gc's write since keeps watch's rows, as they are of entries alive or made after it began).
        A big store is written less often than each interval: at most a tenth of watch's time goes to it
        (``now``: at the end, whatever it costs)."""
        t0 = time.monotonic()
        if t0 < self._next_save and not now:
            return False
        if self.pending:  # made and still open (or linked in): seen as they are now
            self._look(list(self.pending))
            self.pending.clear()
        store = self.store
        if store is None or not (self.unsaved or self.ended):
            return False
        rows = list(self.alive.values())
        mine: Columns = tuple(array.array(c, [r[i] for r in rows]) for i, c in enumerate("QIqIQ"))  # type: ignore[assignment]
        written = write_merged(store, mine, ended=self.ended)
        self._next_save = t0 + 10 * (time.monotonic() - t0)
        if written is None:
            return False
        # A gc's earlier sighting of the same entry, taken into memory (the carried rows are of other inodes).
        by_ino = {r[0]: r for r in reversed(rows)}  # two links of one inode: the first name's row is stored
        for ino, seen in zip(written[0], written[4], strict=True):
            r = by_ino.get(ino)
            if r is not None and seen < r[4]:
                r[4] = seen
        for r in rows:
            r[5] = 1  # stored (a second link's: its inode is, under the first name)
        self.ended.clear()
        self.unsaved = 0
        self.saves += 1
        return True


__all__ = ["Witness"]
