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
by the next store write. What was found becomes a row only if it is still there at that write:
most segments are read and unlinked within milliseconds, and cost a dict entry and no more.

The store is written at each interval and at the end, merged with what a gc wrote meanwhile
(the earlier sighting of the same entry is kept, never one no one made), and bounded: watch
drops the rows it wrote of entries it then saw unlinked, and carries the rest. What it holds
in memory is the entries alive now, at most ``max_entries`` (watch's --max-tracked); a newcomer
beyond that waits. Nothing here raises: a store that cannot be written leaves gc's own proofs as they were.
"""

from __future__ import annotations

import array
import os
import sys
import time
from collections.abc import Iterable
from zlib import crc32

from smgshm.core.names import MATCH_GROUPS, PID_LIMIT, match_name
from smgshm.core.segments.sightings import MAX_RECORDS, StoreFile, as_columns, store_file, write_merged
from smgshm.core.watch.events import CLOSED, CREATED, DIR_GONE, REMOVED, RESCANNED, ShmEvent

_IFMT, _IFREG = 0o170000, 0o100000  # stat.S_IFMT's mask and S_IFREG, inline
_FS_ENCODING = sys.getfilesystemencoding()  # a name's bytes, as os.fsencode makes them: sightings.name_sum, inline
# A row in memory: inode, uid, ctime (ns), name checksum, first seen (boot clock, ns), and whether it was stored.
_Row = list[int]


class Witness:
    """The sightings watch makes of one shm dir: ``feed`` it the events, ``save`` each interval."""

    def __init__(self, shm_dir: str, max_entries: int = MAX_RECORDS) -> None:
        self.shm_dir, self.max_entries = shm_dir, max_entries
        self.alive: dict[str, _Row] = {}  # name -> row, of the entries with a pid alive now
        self.ended: set[tuple[int, int, int, int]] = set()  # stored rows since seen unlinked: dropped at the save
        self.listing: set[str] = set()  # the names of the listing under way (rescan "created" events)
        self.pending: set[str] = set()  # made, not yet closed after a write: looked at by the next save at the latest
        self.fresh: dict[str, tuple[os.stat_result, int]] = {}  # found since the last write: (its lstat, boot clock)
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
        made since they were read (the watcher's, at each close-after-write), taken instead of another.
        Called for every batch watch reads (tens of thousands a second): a tight loop, no call per event."""
        touched: dict[str, None] = {}  # to look at now
        alive, pending, fresh = self.alive, self.pending, self.fresh
        for e in events:
            kind = e.kind
            if kind == CLOSED:
                touched[e.name] = None
                pending.discard(e.name)
            elif kind == CREATED:
                if e.rescan or e.detail:  # listed, or renamed in: whole, no write to wait for
                    touched[e.name] = None
                    if e.rescan:
                        self.listing.add(e.name)
                elif len(pending) < self.max_entries:  # made: whole at its producer's close (a write sets a ctime)
                    pending.add(e.name)
            elif kind == REMOVED:
                name = e.name
                if touched:
                    touched.pop(name, None)
                if pending:
                    pending.discard(name)
                if fresh:
                    fresh.pop(name, None)
                if name in alive:
                    self._end(name)
            elif kind == RESCANNED:
                touched = self._rescanned(touched)
            elif kind == DIR_GONE:
                self._dir_gone()
                touched = {}
        if touched:
            self._look(touched, stats)

    def _rescanned(self, touched: dict[str, None]) -> dict[str, None]:
        """What the listing did not show is gone (its unlink was lost to an overflow, say); the names
        still to look at, of those it showed."""
        listed, fresh = self.listing, self.fresh
        for name in [n for n in self.alive if n not in listed]:
            self._end(name)
        self.pending.intersection_update(listed)
        for name in [n for n in fresh if n not in listed]:
            del fresh[name]
        self.listing = set()
        return {n: None for n in touched if n in listed}

    def _dir_gone(self) -> None:
        """Another dir (or none) at the path now: its entries are another store's, this one's ended with it."""
        self.alive.clear()
        self.ended.clear()
        self.pending.clear()
        self.fresh.clear()
        self.listing, self.store, self.unsaved = set(), None, 0

    def _end(self, name: str) -> None:
        row = self.alive.pop(name, None)
        if row is None:
            return
        if row[5]:
            self.ended.add((row[0], row[1], row[2], row[3]))
        else:
            self.unsaved -= 1

    def _look(self, names: Iterable[str], stats: dict[str, os.stat_result] | None = None) -> None:
        """lstat each name (or take its lstat from ``stats``), then read the boot clock: what each
        found then, is first seen then (``fresh``), unless it was found before, the same. Only what
        is still there at the next store write becomes a row (``_settle``): most segments are not."""
        fresh, room = self.fresh, self.max_entries - len(self.alive) - len(self.fresh)
        found: list[tuple[str, os.stat_result]] = []
        for name in names:
            st = stats.get(name) if stats else None
            if st is None:
                try:
                    st = os.lstat(os.path.join(self.shm_dir, name))
                except OSError:
                    fresh.pop(name, None)
                    self._end(name)  # unlinked since (its event follows) or renamed
                    continue
            prev = fresh.get(name)
            if prev is None:
                if room <= 0:
                    continue
                room -= 1
            elif prev[0].st_ino == st.st_ino and prev[0].st_ctime_ns == st.st_ctime_ns:
                continue  # found before, the same (a reader that opened it to write closed it)
            found.append((name, st))
        # clock.boot_clock_ns, inline; after every lstat of the batch: each identity was there by then
        now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        for name, st in found:
            fresh[name] = (st, now)

    def _settle(self) -> None:
        """Make rows of what was found since the last write and is still there: a regular file of this
        dir whose name carries a producer pid (what gc records), first seen when it was found unless
        it is the entry already recorded under that name."""
        if self.store is None:
            self._bind()
        alive, dev, fresh, enc = self.alive, self.dev, self.fresh, _FS_ENCODING
        self.fresh = {}
        if self.store is None:
            return
        for name, (st, t) in fresh.items():
            if st.st_mode & _IFMT != _IFREG or st.st_dev != dev:
                continue
            row = alive.get(name)
            if row is not None:
                if row[0] == st.st_ino and row[2] == st.st_ctime_ns and row[1] == st.st_uid:
                    continue  # the same entry, first seen earlier
                self._end(name)  # rewritten: the old identity has ended
            else:
                m = match_name(name)  # a name gc records a sighting of: one with a producer pid
                if m is None or int(m[MATCH_GROUPS[m.lastindex][1]]) >= PID_LIMIT:
                    continue
            alive[name] = [st.st_ino, st.st_uid, st.st_ctime_ns, crc32(name.encode(enc, "surrogateescape")), t, 0]
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
        self._settle()
        store = self.store
        if store is None or not (self.unsaved or self.ended):
            return False
        rows = list(self.alive.values())
        mine = as_columns(array.array(c, [r[i] for r in rows]) for i, c in enumerate("QIqIQ"))
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
