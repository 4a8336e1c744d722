"""``watch --node``: follow every pod's /dev/shm tmpfs of a node, cheaply, for the exporter.

Two paces. A **full scan** every ``rescan_every_s`` (and at the start): the node view's ``look``
(places, pod names, each process's /dev/shm, pid namespaces, hidden bytes), one holder walk of
/proc for every tmpfs at once, then each tmpfs listed and judged by the pod judge (scan.py), its
sightings stored. Between full scans nothing reads /proc: inotify (one instance, one watch per
tmpfs followed, at most ``max_volumes``) says which tmpfs saw a segment created, written or
unlinked, and at most every ``update_every_s`` each such tmpfs is **updated**: listed again and
its entries judged by the judge of its last full scan (its pid map, its holders, the start times
it read). What an update can get wrong it does not say: a verdict gc deletes on (leaked, stale)
counts only where the last full scan gave that very inode the same verdict; any other entry it
would call so is ``unknown`` until the next full scan (a producer started since has a pid the old
map lacks; a reader that opened it since is no holder the old walk saw). A tmpfs with more than
``max_update_entries`` entries waits for the full scan (an update lists it whole), and so does every
tmpfs beyond ``max_kept_entries`` entries kept node-wide (in the look's order): what an update needs
(a judge with its sightings, the full scan's proofs) is kept per entry, so across a node of many
tmpfs it is bounded as a whole, not per tmpfs. Their verdicts are the full scans', never weaker.

A pod's tmpfs unmounted (the pod deleted) ends its watch (IN_UNMOUNT): it leaves the exposition at
once; new pods come with the next full scan. Nothing holds a tmpfs open between scans, so the
kubelet's unmount never finds it busy (an inotify watch pins nothing). Scrapes read the last
figures (``figures()``), built once per change: a scrape costs no filesystem work at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import struct
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from smgshm.core.errors import HostError, SmgshmError
from smgshm.core.host.holders import holder_index_devs
from smgshm.core.host.mountpoints import mount_points_of
from smgshm.core.names import SMG_FAMILY_PREFIX
from smgshm.core.node import npdfile
from smgshm.core.node.judge import PodJudge
from smgshm.core.node.metrics import Health, VolumeFigures, statvfs_bytes, unscanned_figures, volume_figures
from smgshm.core.node.npd import NpdVerdict, error_verdict, node_verdict
from smgshm.core.node.scan import Others, ScanFailure, Tmpfs, TmpfsScan, failure_of, look, pod_label
from smgshm.core.node.sight import Unseen
from smgshm.core.segments.judge import ScanOptions, State, Tally
from smgshm.core.watch.health import Verdict, judge

# inotify(7): the events that change what a listing shows (creation, a write's end, an unlink, a
# rename) and the watch's own end. Opens and reads are not asked for: a reader changes nothing here.
IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x8, 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x1000000, 0x2000000
_MASK = IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
_HEADER = struct.Struct("iIII")
_READ_BYTES = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class NodeWatchOptions:
    root: str = "/"
    rescan_every_s: float = 30.0
    update_every_s: float = 1.0
    max_volumes: int = 256
    max_update_entries: int = 10_000
    max_kept_entries: int = 100_000  # node-wide: the entries of the tmpfs kept for updates, all told (see the module)
    stale_after_s: float = 3600.0
    state_dirs: tuple[tuple[str, ...], ...] = ()  # custom runtime state dirs under the root (layout.NodeRoot)
    npd_file: str | None = None  # after each full scan, gc --node --check --npd's verdict there (npdfile.py)


@dataclass
class _Volume:
    """One tmpfs followed: what its last full scan found, and its figures as last judged."""

    tmpfs: Tmpfs
    judge: PodJudge | None = None
    # (inode, name) -> leaked | stale, per the last full scan (the name too: a tmpfs may give an inode number again)
    proven: dict[tuple[int, str], str] = field(default_factory=dict)
    entries: int = 0  # entries at its last listing
    wd: int | None = None
    dirty: bool = False
    figures: VolumeFigures | None = None
    failure: ScanFailure | None = None  # why its last scan could not list it (still mounted): its series say so

    @property
    def key(self) -> tuple[int, int]:
        return self.tmpfs.place.dev, self.tmpfs.place.mount_id


@dataclass(frozen=True)
class Pass:
    """What one step did, for a line per interval."""

    full: bool
    volumes: int
    updated: int
    duration_s: float
    errors: list[str]
    notes: list[str] = field(default_factory=list)  # what the scan left undone without failing (sightings dropped)


class NodeWatch:
    """Follow a node's tmpfs (see the module). ``step(timeout_s)`` runs what is due; ``figures()``
    is safe from any thread."""

    def __init__(self, opts: NodeWatchOptions) -> None:
        self.opts = opts
        self.scan_opts = ScanOptions(stale_after_s=opts.stale_after_s)
        self.volumes: dict[tuple[int, int], _Volume] = {}
        self.by_wd: dict[int, _Volume] = {}
        self.counters = {"scans": 0, "scan_errors": 0, "updates": 0, "events": 0, "overflows": 0}
        self.health = Health(counters=dict(self.counters))
        self.lock = threading.Lock()
        self._figures: tuple[list[VolumeFigures], Health] = ([], self.health)
        self.unseen: list[Unseen] = []  # what the last full scan could not see (sight.py), for the log
        self._news: list[tuple[bool, str]] = []  # (a problem, what): a tmpfs newly unscanned, and after (take_news)
        self._ino: Any = None
        self._poller: Any = None
        self._next_full = 0.0
        self._next_update = 0.0
        self._room = opts.max_kept_entries  # what a full scan may still keep for updates (_judge_fully)
        # For /healthz (core/watch/health.py): when the last full scan that looked at the node ended
        # (monotonic), whether the last one failed to, and how long the last one took.
        self._scan_ok_at: float | None = None
        self._scan_failed = False
        self._scan_s = 0.0

    def __enter__(self) -> NodeWatch:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """The inotify instance, then the first full scan (a HostError when the root cannot be read)."""
        import inotify_simple

        try:
            self._ino = inotify_simple.INotify(nonblocking=True)
        except OSError as err:
            raise HostError(
                f"cannot start inotify: {err.strerror}", hint="raise it: sysctl fs.inotify.max_user_instances=1024"
            ) from err
        self._poller = select.poll()
        self._poller.register(self._ino.fileno(), select.POLLIN)
        self.full_scan(raise_errors=True)

    def close(self) -> None:
        if self._ino is not None:
            self._ino.close()
            self._ino = None

    def verdict(self) -> Verdict:
        """/healthz's verdict (core/watch/health.py): failing while the last full scan could not look at
        the node, stale when the last that could is a few --rescan-every old. Safe from any thread."""
        with self.lock:
            ok_at, failed, scan_s = self._scan_ok_at, self._scan_failed, self._scan_s
        failing = "the last full scan could not look at the node" if failed else None
        age = None if ok_at is None else max(0.0, time.monotonic() - ok_at)
        return judge(age, self.opts.rescan_every_s, scan_s, failing)

    def figures(self) -> tuple[list[VolumeFigures], Health]:
        """The last figures of every tmpfs followed and the health (what a scrape reads)."""
        with self.lock:
            return self._figures

    # -- the loop --------------------------------------------------------------------------

    def step(self, timeout_s: float) -> Pass | None:
        """Wait at most ``timeout_s`` for inotify activity, then run what is due (a full scan, or the
        updates of the tmpfs that saw activity); None when nothing was."""
        now = time.monotonic()
        due = (
            self._next_full
            if not any(v.dirty for v in self.volumes.values())
            else min(self._next_full, self._next_update)
        )
        wait = max(0.0, min(timeout_s, due - now))
        self._read_events(wait)
        now = time.monotonic()
        if now >= self._next_full:
            return self.full_scan()
        if now >= self._next_update and any(v.dirty for v in self.volumes.values()):
            return self.update()
        return None

    def _read_events(self, wait_s: float) -> None:
        try:
            if not self._poller.poll(int(wait_s * 1000)):
                return
            data = os.read(self._ino.fileno(), _READ_BYTES)
        except BlockingIOError:
            return
        except OSError as err:
            raise HostError(f"cannot read inotify events: {err.strerror}") from err
        pos, end, n, gone = 0, len(data), 0, False
        unpack, size = _HEADER.unpack_from, _HEADER.size
        by_wd = self.by_wd
        while pos < end:
            wd, mask, _cookie, length = unpack(data, pos)
            pos += size + length
            n += 1
            if mask & IN_Q_OVERFLOW:
                self.counters["overflows"] += 1
                for v in self.volumes.values():
                    v.dirty = True
                continue
            vol = by_wd.get(wd)
            if vol is None:
                continue  # a watch already dropped, still draining
            if mask & _GONE:  # unmounted (the pod deleted), or the dir moved or deleted: out of the exposition
                self._drop(vol)
                gone = True
                continue
            vol.dirty = True
        self.counters["events"] += n
        if gone:
            self._publish()

    # -- full scans ------------------------------------------------------------------------

    def full_scan(self, raise_errors: bool = False) -> Pass:
        """Look at the node again and judge every tmpfs afresh (see the module)."""
        t0, wall0 = time.monotonic(), time.time()
        errors: list[str] = []
        try:
            node = look(self.opts.root, state_dirs=self.opts.state_dirs)
        except SmgshmError as err:
            if raise_errors:
                raise
            return self._look_failed(err, t0, wall0)
        # A tmpfs below a dir not read in time (layout.py) is never touched (its path may stall): not followed,
        # counted unread for NPD, and the view says it (node.unseen: smgshm_node_view_unknown{layout_read}).
        readable = [t for t in node.tmpfs if t.unread is None]
        found = readable[: self.opts.max_volumes]
        unfollowed = len(readable) - len(found)
        fresh = self._follow_only(found)
        # One walk of /proc and one read of every mount namespace's table, for every tmpfs at once.
        holders = node.holders  # the look's own walk (its reach rule read the fds and maps already)
        if holders is None:
            holders = holder_index_devs(vol.tmpfs.place.dev for vol in fresh.values())
        mounted = mount_points_of((vol.tmpfs.place.path for vol in fresh.values()), read=node.tables)
        unread = unfollowed + len(node.tmpfs) - len(readable)  # for NPD: tmpfs not judged (gc --node's are all)
        notes: list[str] = []
        failed = 0
        self._room = self.opts.max_kept_entries
        for vol in list(fresh.values()):
            try:
                dropped = self._judge_fully(vol, holders, mounted.get(vol.tmpfs.place.path, {}))
                if dropped:
                    notes.append(f"{vol.tmpfs.place.path}: sightings store full, {dropped} first sightings not stored")
            except (SmgshmError, OSError) as err:
                failed += 1
                if self._unscanned(vol, err):
                    unread += 1
                else:  # gone mid-scan (its pod deleted): nothing of it can leak, said with this scan
                    errors.append(f"{vol.tmpfs.place.path}: {err}")
        self.counters["scans"] += 1
        self.counters["scan_errors"] += failed
        now = time.monotonic()
        self._next_full = now + self.opts.rescan_every_s
        self._next_update = now + self.opts.update_every_s
        unseen = tuple(u.reason for u in node.unseen)
        self.health = Health(time.time(), now - t0, failed, unfollowed, dict(self.counters), unseen)
        self.unseen = node.unseen
        with self.lock:  # a tmpfs that failed alone is churn (its pod going), not a failed scan
            self._scan_ok_at, self._scan_failed, self._scan_s = now, False, now - t0
        self._publish()
        errors += self._write_npd(self._npd_verdict(len(node.tmpfs), unread, node.unseen))
        return Pass(True, len(self.volumes), len(self.volumes), now - t0, errors, notes)

    def _npd_verdict(self, tmpfs: int, unread: int, unseen: list[Unseen]) -> NpdVerdict:
        """gc --node --check --npd's verdict (core/node/npd.py) from this full scan's judgements."""
        counts = {s.value: 0 for s in State}
        nbytes = dict(counts)
        untrusted = 0
        for vol in self.volumes.values():
            if vol.figures is None:
                continue
            untrusted += not vol.figures.trusted and vol.figures.failure is None  # an unscanned one is unread
            for k, n in vol.figures.counts.items():
                counts[k] += n
            for k, n in vol.figures.bytes_by_state.items():
                nbytes[k] += n
        return node_verdict(
            counts,
            nbytes,
            deleted=0,
            tmpfs=tmpfs,
            untrusted=untrusted,
            unread=unread,
            blind=[u.reason for u in unseen],
        )

    def _write_npd(self, verdict: NpdVerdict) -> list[str]:
        """The verdict file rewritten (npdfile.py); what went wrong, for the scan's line (the first: raised)."""
        if self.opts.npd_file is None:
            return []
        try:
            npdfile.write(self.opts.npd_file, verdict)
        except HostError as err:
            if self.counters["scans"] <= 1:  # the first full scan: a flag that cannot work fails the run (exit 5)
                raise
            return [str(err)]
        return []

    def _look_failed(self, err: SmgshmError, t0: float, wall0: float) -> Pass:
        """The node could not be looked at: a failed scan, said (and NPD's file says why)."""
        self.counters["scans"] += 1
        self.counters["scan_errors"] += 1
        self._next_full = time.monotonic() + self.opts.rescan_every_s
        self.health = Health(
            wall0, time.monotonic() - t0, 1, self.health.unfollowed, dict(self.counters), self.health.unseen
        )
        with self.lock:
            self._scan_failed, self._scan_s = True, time.monotonic() - t0
        self._publish()
        said = [str(err), *self._write_npd(error_verdict(err.kind, str(err)))]
        return Pass(True, len(self.volumes), 0, time.monotonic() - t0, said)

    def _follow_only(self, found: list[Tmpfs]) -> dict[tuple[int, int], _Volume]:
        """The volumes followed from now on: those of ``found`` (kept when followed already), every other one
        dropped; each watched before it is listed, so nothing between the two goes unseen."""
        fresh: dict[tuple[int, int], _Volume] = {}
        for t in found:
            vol = self.volumes.get((t.place.dev, t.place.mount_id)) or _Volume(t)
            vol.tmpfs = t
            fresh[vol.key] = vol
        for key, vol in list(self.volumes.items()):
            if key not in fresh:
                self._drop(vol)
        self.volumes = fresh
        for vol in fresh.values():
            if vol.wd is None:
                self._watch(vol)
        return fresh

    def _judge_fully(self, vol: _Volume, holders: dict[tuple[int, int], list[Any]], mounted: dict[str, str]) -> int:
        """Judge a tmpfs afresh; how many of its first sightings its store had no room for (sightings.py)."""
        scan = TmpfsScan(vol.tmpfs, self.scan_opts, holders=holders, mounted=mounted)
        vol.dirty = False
        proven: dict[tuple[int, str], str] = {}
        n, room = 0, min(self.opts.max_update_entries, self._room)
        for seg in scan:
            n += 1
            if n > room:  # a crowded tmpfs, or one past the node's room, waits for full scans: its proofs are of no use
                if proven:
                    proven = {}
                continue
            if seg.state in (State.LEAKED, State.STALE):
                proven[seg.ino, seg.name] = seg.state.value
        judge = scan.judge
        if not isinstance(judge, PodJudge):  # TmpfsScan.make_judge's, always
            raise TypeError("a tmpfs judged by another judge than the pod judge")
        dropped = judge.sightings.dropped
        judge.sightings.forget()  # saved; updates add nothing to a store they never write
        vol.entries = n + sum(scan.others.counts.values())
        # A crowded tmpfs is judged by full scans only: its judge (the sightings it loaded) is not kept between them.
        kept = vol.entries <= room
        vol.judge, vol.proven = (judge, proven) if kept else (None, {})
        self._room -= vol.entries if kept else 0
        size, used = scan.shm_total_bytes, scan.shm_total_bytes - scan.shm_free_bytes
        vol.figures = volume_figures(vol.tmpfs, scan.tally, scan.others, (size, used, scan.shm_free_bytes))
        if vol.failure is not None:
            vol.failure = None
            self._news.append((False, f"{_where(vol.tmpfs)}: scanned again"))
        return dropped

    def _unscanned(self, vol: _Volume, err: BaseException) -> bool:
        """A tmpfs that could not be listed: kept, with why, while it is still mounted (its series say so, its
        news once); dropped when it is gone. Whether it was kept."""
        if not _still_mounted(vol.tmpfs):
            self._drop(vol)
            return False
        failure = failure_of(err)
        if failure != vol.failure:
            self._news.append((True, f"{_where(vol.tmpfs)}: not scanned ({failure}): {err}"))
        vol.failure, vol.judge, vol.proven, vol.dirty = failure, None, {}, False
        vol.figures = unscanned_figures(vol.tmpfs, failure)
        return True

    def take_news(self) -> list[tuple[bool, str]]:
        """What changed since last asked in which tmpfs can be scanned, (a problem, what): each said once, for
        the log (a tmpfs's series say it all along: volume_scanned, volume_scan_failure)."""
        news, self._news = self._news, []
        return news

    # -- updates between full scans ---------------------------------------------------------

    def update(self) -> Pass:
        """List again each tmpfs that saw activity, judged by its last full scan's judge."""
        t0 = time.monotonic()
        errors: list[str] = []
        updated = failed = 0
        for vol in list(self.volumes.values()):
            if not vol.dirty or vol.judge is None or vol.entries > self.opts.max_update_entries:
                continue  # a crowded tmpfs (or one past the node's room: no judge kept) waits for the full scan
            vol.dirty = False
            try:
                self._update_one(vol)
                updated += 1
            except OSError as err:
                failed += 1
                if not self._unscanned(vol, err):  # (one kept says so in its news)
                    errors.append(f"{vol.tmpfs.place.path}: {err.strerror}")
        self.counters["updates"] += updated
        self.counters["scan_errors"] += failed
        self._next_update = time.monotonic() + self.opts.update_every_s
        self.health = replace(self.health, counters=dict(self.counters))
        self._publish()
        return Pass(False, len(self.volumes), updated, time.monotonic() - t0, errors)

    def _update_one(self, vol: _Volume) -> None:
        judge, place = vol.judge, vol.tmpfs.place
        if judge is None:  # update() skips those
            return
        fd = os.open(place.path, _DIR)
        try:
            if os.fstat(fd).st_dev != place.dev:  # mounted over or replaced: the next full scan says what is there
                raise OSError(errno.ESTALE, "the tmpfs changed since the full scan")
            usage = statvfs_bytes(fd)
            smg: list[os.DirEntry[str]] = []
            others = Others()
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.name.startswith(SMG_FAMILY_PREFIX):
                        smg.append(entry)
                        continue
                    with contextlib.suppress(OSError):
                        others.add(entry.name, entry.stat(follow_symlinks=False).st_blocks * 512)
            sights = judge.sightings
            tally, proven = Tally(), vol.proven
            try:
                for seg in judge.each(smg):
                    st = seg.state
                    if st in (State.LEAKED, State.STALE) and proven.get((seg.ino, seg.name)) != st.value:
                        seg = seg._replace(state=State.UNKNOWN)  # not proven by a full scan: see the module
                    tally.add(seg)
            finally:
                sights.forget()
        finally:
            os.close(fd)
        vol.entries = tally.total + sum(others.counts.values())
        vol.figures = volume_figures(vol.tmpfs, tally, others, usage)

    # -- watches -----------------------------------------------------------------------------

    def _watch(self, vol: _Volume) -> None:
        """One inotify watch on the very tmpfs (opened without following a link, checked by device,
        then watched through its fd); a tmpfs that cannot be watched is judged by full scans only."""
        try:
            fd = os.open(vol.tmpfs.place.path, _DIR)
        except OSError:
            return
        try:
            if os.fstat(fd).st_dev != vol.tmpfs.place.dev:
                return
            vol.wd = self._ino.add_watch(f"/proc/self/fd/{fd}", _MASK | IN_ONLYDIR)
            self.by_wd[vol.wd] = vol
        except OSError:
            vol.wd = None  # ENOSPC: fs.inotify.max_user_watches reached
        finally:
            os.close(fd)

    def _drop(self, vol: _Volume) -> None:
        if vol.failure is not None:  # its unscanned series go with it: said, as its failure was
            self._news.append((False, f"{_where(vol.tmpfs)}: gone (not scanned till then)"))
            vol.failure = None
        if vol.wd is not None:
            self.by_wd.pop(vol.wd, None)
            with contextlib.suppress(OSError):
                self._ino.rm_watch(vol.wd)  # already gone after IN_IGNORED
            vol.wd = None
        self.volumes.pop(vol.key, None)

    def _publish(self) -> None:
        figs = [v.figures for v in self.volumes.values() if v.figures is not None]
        with self.lock:
            self._figures = (figs, self.health)


def _where(t: Tmpfs) -> str:
    return f"tmpfs {t.place.path} (pod {pod_label(t)})"


def _still_mounted(t: Tmpfs) -> int:
    """1 when the tmpfs a full scan could not judge is still there (the same device), 0 when it is gone (its
    pod deleted mid-scan: nothing of it can leak), as gc --node tells them apart."""
    try:
        return int(os.stat(t.place.path, follow_symlinks=False).st_dev == t.place.dev)
    except OSError:
        return 0


__all__ = ["NodeWatch", "NodeWatchOptions", "Pass"]
