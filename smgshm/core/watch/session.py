"""``watch``: a host's SHM traffic per interval, folded from inotify events, bounded in memory.

A session owns a ShmWatcher and a SegmentTracker. ``step()`` reads events until the
next interval boundary and returns that interval's figures: segments and bytes
created and consumed, what is in flight, time in flight (created to unlink, of the
segments a reader consumed), and orphans: segments still in flight after
``orphan_after_s``, each judged by gc's own ``judge_entry`` (producer alive? held?).
With a metrics URL it also scrapes the gateway's counters and puts them side by side.
Totals only grow, percentiles stream (stats.py): nothing grows with the number
of segments seen. What it reports is in ``figures.py``; the orphans' judgement in ``orphans.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from smgshm.core.errors import SmgshmError
from smgshm.core.gateway.metrics import MM_FAMILIES, MetricsSnapshot, scrape
from smgshm.core.gateway.rates import GatewayRates, failed_rates, gateway_rates
from smgshm.core.stats import StreamingQuantiles
from smgshm.core.watch.events import OF_THE_WATCH
from smgshm.core.watch.figures import (
    IntervalStats,
    Orphan,
    Totals,
    WatchOptions,
    WatchSummary,
    flight_times,
)
from smgshm.core.watch.follow import SegmentLife, SegmentTracker, ShmEvent, ShmWatcher
from smgshm.core.watch.orphans import OrphanJudge, orphans_cause
from smgshm.core.watch.witness import Witness


class WatchSession:
    """Follow the shm dir; ``step()`` per interval, ``summary()`` at any time (Ctrl-C included)."""

    def __init__(
        self,
        opts: WatchOptions,
        *,
        on_life: Callable[[SegmentLife], None] | None = None,
        on_event: Callable[[ShmEvent], None] | None = None,
        on_orphan: Callable[[Orphan], None] | None = None,
    ) -> None:
        self.opts = opts
        self.on_life, self.on_event = on_life, on_event
        self.watcher = ShmWatcher(opts.shm_dir, opts.prefix)
        self.tracker = SegmentTracker(opts.max_tracked)
        self.totals = Totals()
        self.started_unix_s = time.time()
        self._t0 = time.monotonic()
        self._seq = 0
        self._tick = 0.0
        self.orphan_judge = OrphanJudge(opts, on_orphan)
        # Each segment seen made is a sighting for gc's proofs, stored at each interval and at the end.
        self.witness = Witness(opts.shm_dir, opts.max_tracked)
        self._first_snap: MetricsSnapshot | None = None
        self._snap: MetricsSnapshot | None = None
        self._snap_t = self._first_snap_t = 0.0
        self.first_scrape_error = ""  # the first scrape failed (survived): why
        self._gateway_dir: str | None = None  # the shm dir the gateway writes to, when it runs here
        self.last: IntervalStats | None = None
        self.last_traffic: GatewayRates | None = None  # the gateway's rates over the last interval with tensors
        self.lock = threading.Lock()  # the exporter reads ``last`` and the totals from its own thread
        self._prev = (0, 0, 0, 0, 0, 0, 0, 0, 0)
        self._prev_kinds: dict[str, int] = {}
        self._last_report = self._t0

    def __enter__(self) -> WatchSession:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Start watching, with a first scrape as the baseline of the gateway's rates. A failed one is survived
        as every later one is (``first_scrape_error`` says why; the next interval's scrape is the baseline):
        one bad answer from a stalling endpoint never ends a watch meant to run unattended."""
        self.watcher.open()
        if self.opts.metrics_url:
            from smgshm.core.address import is_local_url

            self._snap_t = self._first_snap_t = time.monotonic()
            try:
                self._snap = self._first_snap = scrape(self.opts.metrics_url, self.opts.metrics_timeout_s, MM_FAMILIES)
            except SmgshmError as err:
                self.first_scrape_error = str(err)
            except BaseException:
                self.watcher.close()
                raise
            # A gateway here writes to this shm dir: its size and writability tell why writes fail.
            self._gateway_dir = self.opts.shm_dir if is_local_url(self.opts.metrics_url) else None
        self._t0 = self._last_report = time.monotonic()
        self._tick = self._t0 + self.opts.interval_s
        self._consume(self.watcher.events(0))

    def close(self) -> None:
        self.watcher.close()
        self.witness.save(now=True)

    # -- reading -------------------------------------------------------------------------

    def _consume(self, events: list[ShmEvent], interval_q: StreamingQuantiles | None = None) -> None:
        if not events:
            return
        if self.on_event is not None:
            for e in events:
                if e.kind in OF_THE_WATCH:
                    self.on_event(e)
        lives = self.tracker.feed(events)
        self.witness.feed(events, self.watcher.closed_stats)
        with self.lock:
            self.totals.add(lives, interval_q if interval_q is not None else StreamingQuantiles())
        if self.on_life is not None:
            for life in lives:
                self.on_life(life)

    def step(self) -> IntervalStats:
        """Read events until the next interval boundary, then report the interval.

        At least one read, even when the step begins after its boundary (the process was
        descheduled): an interval that says no event was read means none was queued.
        """
        q = StreamingQuantiles()
        read = False
        while True:
            left = self._tick - time.monotonic()
            if left <= 0 and read:
                break
            self._consume(self.watcher.events(max(0.0, left)), q)
            read = True
        now = time.monotonic()
        # Stay on the grid; after a stall (a suspended process) restart it rather than burst.
        behind = now - self._tick >= self.opts.interval_s
        self._tick = (now if behind else self._tick) + self.opts.interval_s
        return self._report(q)

    def _report(self, q: StreamingQuantiles) -> IntervalStats:
        t, tr, w = self.totals, self.tracker, self.watcher
        consumed, cleaned, unknown = t.count("consumed"), t.count("cleaned"), t.count("unknown")
        cur = (
            tr.created,
            tr.created_bytes,
            consumed,
            t.bytes_ended("consumed"),
            cleaned,
            unknown,
            w.overflows,
            w.dir_gone,
            w.events_read,
        )
        d = [a - b for a, b in zip(cur, self._prev, strict=True)]
        self._prev = cur
        now_mono = time.monotonic()
        dt = max(1e-9, now_mono - self._last_report)
        self._last_report = now_mono
        self._seq += 1
        self.witness.save()  # first: the orphans' judgement reads the store
        orphans, orphan_bytes, listed = self.orphan_judge.look(self.tracker)
        kinds = {k: n - self._prev_kinds.get(k, 0) for k, n in tr.created_by_kind.items()}
        self._prev_kinds = dict(tr.created_by_kind)
        stats = IntervalStats(
            seq=self._seq,
            t_unix_s=time.time(),
            interval_s=round(dt, 6),
            created=d[0],
            created_bytes=d[1],
            consumed=d[2],
            consumed_bytes=d[3],
            cleaned=d[4],
            unknown=d[5],
            created_per_s=d[0] / dt,
            created_bytes_per_s=d[1] / dt,
            consumed_per_s=d[2] / dt,
            consumed_bytes_per_s=d[3] / dt,
            created_by_kind={k: n for k, n in kinds.items() if n},
            in_flight=len(tr),
            in_flight_bytes=tr.in_flight_bytes,
            flight=flight_times(q),
            orphans=orphans,
            orphan_bytes=orphan_bytes,
            orphan_list=listed,
            overflows=d[6],
            dir_gone=d[7],
            untracked=tr.untracked,
            events_read=d[8],
            watching=w.watching,
            gateway=self._scrape(),
            cause_info=orphans_cause(listed, self.opts.shm_dir, self.opts.assume_dead),
        )
        with self.lock:
            self.last = stats
            if stats.gateway is not None and stats.gateway.tensors:
                self.last_traffic = stats.gateway  # an idle interval does not clear the verdict
        return stats

    # -- the gateway's side --------------------------------------------------------------

    def _scrape(self) -> GatewayRates | None:
        url = self.opts.metrics_url
        if not url:
            return None
        now = time.monotonic()
        dt = now - self._snap_t
        try:
            snap = scrape(url, self.opts.metrics_timeout_s, MM_FAMILIES)
        except SmgshmError as err:
            return failed_rates(url, dt, str(err))
        if self._snap is None:  # no earlier answer: this one is the baseline (the first scrape failed)
            self._snap = self._first_snap = snap
            self._snap_t = self._first_snap_t = now
            return failed_rates(url, dt, "no earlier answer to count from: this scrape is the baseline")
        rates = gateway_rates(self._snap, snap, dt, self.opts.shm_min_bytes, self._gateway_dir)
        self._snap, self._snap_t = snap, now
        return rates

    # -- the whole run -------------------------------------------------------------------

    def summary(self) -> WatchSummary:
        t, tr, w = self.totals, self.tracker, self.watcher
        ends: dict[str, dict[str, int]] = {}
        for (kind, end), n in sorted(t.ends.items()):
            ends.setdefault(kind, {"consumed": 0, "cleaned": 0, "unknown": 0})[end] = n
        gw = None
        if self._first_snap is not None and self._snap is not None:
            span = max(1e-9, self._snap_t - self._first_snap_t)
            gw = gateway_rates(self._first_snap, self._snap, span, self.opts.shm_min_bytes, self._gateway_dir)
        notes = []
        if w.overflows:
            notes.append(
                f"{w.overflows} inotify queue overflow(s): the lives that spanned one ended unknown "
                "(raise fs.inotify.max_queued_events if it recurs)"
            )
        if w.dir_gone:
            notes.append(f"the shm dir went away {w.dir_gone} time(s) and was watched again")
        if tr.untracked:
            notes.append(f"{tr.untracked} segment(s) not followed: more than {tr.max_tracked} in flight at once")
        last = self.last
        return WatchSummary(
            shm_dir=self.opts.shm_dir,
            prefix=self.opts.prefix,
            started_unix_s=self.started_unix_s,
            duration_s=round(time.monotonic() - self._t0, 3),
            intervals=self._seq,
            created=tr.created,
            created_bytes=tr.created_bytes,
            listed=tr.listed,
            consumed=t.count("consumed"),
            consumed_bytes=t.bytes_ended("consumed"),
            cleaned=t.count("cleaned"),
            unknown=t.count("unknown"),
            ends_by_kind=ends,
            flight=flight_times(t.flight),
            in_flight=len(tr),
            in_flight_bytes=tr.in_flight_bytes,
            orphans_seen=self.orphan_judge.seen,
            orphans=last.orphans if last else 0,
            orphan_list=last.orphan_list if last else [],
            overflows=w.overflows,
            dir_gone=w.dir_gone,
            untracked=tr.untracked,
            events_read=w.events_read,
            gateway=gw,
            notes=notes,
            cause_info=orphans_cause(last.orphan_list, self.opts.shm_dir, self.opts.assume_dead) if last else None,
        )

    def exported(self) -> dict[str, Any]:
        """A consistent copy of the figures for the exporter's thread."""
        with self.lock:
            return {
                "ends": dict(self.totals.ends),
                "end_bytes": dict(self.totals.end_bytes),
                "buckets": list(self.totals.buckets),
                "flight_sum_s": self.totals.flight_sum_s,
                "created": self.tracker.created,
                "created_by_kind": dict(self.tracker.created_by_kind),
                "created_bytes_by_kind": dict(self.tracker.created_bytes_by_kind),
                "overflows": self.watcher.overflows,
                "dir_gone": self.watcher.dir_gone,
                "untracked": self.tracker.untracked,
                "orphans_seen": self.orphan_judge.seen,
                "last": self.last,
                "last_traffic": self.last_traffic,
            }


__all__ = ["WatchSession"]
