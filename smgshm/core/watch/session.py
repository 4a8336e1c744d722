"""``watch``: a host's SHM traffic per interval, folded from inotify events, bounded in memory.

A session owns a ShmWatcher and a SegmentTracker. ``step()`` reads events until the
next interval boundary and returns that interval's figures: segments and bytes
created and consumed, what is in flight, time in flight (created to unlink, of the
segments a reader consumed), and orphans: segments still in flight after
``orphan_after_s``, each judged by gc's own ``judge_entry`` (producer alive? held?).
With a metrics URL it also scrapes the gateway's counters and puts them side by side.
Totals only grow, percentiles stream (quantiles.py): nothing grows with the number
of segments seen.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smgshm.core.errors import SmgshmError
from smgshm.core.gateway.metrics import MM_FAMILIES, MetricsSnapshot, scrape
from smgshm.core.gateway.rates import DEFAULT_SHM_MIN_BYTES, GatewayRates, failed_rates, gateway_rates
from smgshm.core.paths import DEFAULT_SHM_DIR, SMG_FAMILY_PREFIX
from smgshm.core.quantiles import StreamingQuantiles
from smgshm.core.segments.judge import ScanOptions, SegmentInfo, judge_entry
from smgshm.core.watch.follow import CONSUMED, SegmentLife, SegmentTracker, ShmEvent, ShmWatcher

# Time-in-flight histogram bounds (seconds) for the exporter; +Inf is implied.
FLIGHT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_MAX_JUDGED_PER_STEP = 4  # each judgement walks /proc (tens of ms): a leaking host must not stall the watch


@dataclass(frozen=True)
class WatchOptions:
    shm_dir: str = DEFAULT_SHM_DIR
    prefix: str = SMG_FAMILY_PREFIX
    interval_s: float = 1.0
    orphan_after_s: float = 30.0
    metrics_url: str | None = None
    metrics_timeout_s: float = 2.0
    shm_min_bytes: int = DEFAULT_SHM_MIN_BYTES
    max_tracked: int = 100_000
    max_orphans_listed: int = 20
    rejudge_after_s: float = 10.0
    stale_after_s: float = 3600.0  # gc's --stale-after, for the orphans' judgement
    assume_dead: bool = False


@dataclass(frozen=True)
class FlightTimes:
    """Time in flight (creation to unlink) of consumed segments, in milliseconds."""

    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None


@dataclass(frozen=True)
class Orphan:
    """A segment still in flight after --orphan-after, with gc's judgement of it."""

    name: str
    kind: str
    producer_pid: int | None
    producer_alive: bool | None
    state: str  # gc's state (in_flight, held, leaked, stale, hazard, unknown), "gone", or "unjudged"
    reason: str
    nbytes: int | None
    age_s: float
    reads: int


@dataclass(frozen=True)
class IntervalStats:
    seq: int
    t_unix_s: float
    interval_s: float
    created: int
    created_bytes: int
    consumed: int
    consumed_bytes: int
    cleaned: int
    unknown: int
    created_per_s: float
    created_bytes_per_s: float
    consumed_per_s: float
    consumed_bytes_per_s: float
    created_by_kind: dict[str, int]
    in_flight: int
    in_flight_bytes: int
    flight: FlightTimes
    orphans: int
    orphan_bytes: int
    orphan_list: list[Orphan]
    overflows: int
    dir_gone: int
    untracked: int
    events_read: int
    watching: bool
    gateway: GatewayRates | None


@dataclass(frozen=True)
class WatchSummary:
    shm_dir: str
    prefix: str
    started_unix_s: float
    duration_s: float
    intervals: int
    created: int
    created_bytes: int
    listed: int
    consumed: int
    consumed_bytes: int
    cleaned: int
    unknown: int
    ends_by_kind: dict[str, dict[str, int]]  # producer kind -> {consumed, cleaned, unknown}
    flight: FlightTimes
    in_flight: int
    in_flight_bytes: int
    orphans_seen: int
    orphans: int
    orphan_list: list[Orphan]
    overflows: int
    dir_gone: int
    untracked: int
    events_read: int
    gateway: GatewayRates | None
    notes: list[str] = field(default_factory=list)


def _flight(q: StreamingQuantiles) -> FlightTimes:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v / 1e6, 3)

    return FlightTimes(q.count, ms(q.quantile(0.5)), ms(q.quantile(0.9)), ms(q.quantile(0.99)), ms(q.max))


class _Totals:
    """Monotonic counters, updated per batch of completed lives."""

    def __init__(self) -> None:
        self.ends: dict[tuple[str, str], int] = {}  # (kind, end) -> lives
        self.end_bytes: dict[str, int] = {}  # end -> bytes (known sizes)
        self.flight = StreamingQuantiles()
        self.buckets = [0] * (len(FLIGHT_BUCKETS_S) + 1)
        self.flight_sum_s = 0.0

    def add(self, lives: list[SegmentLife], interval_q: StreamingQuantiles) -> None:
        for life in lives:
            end = life.end or "unknown"
            key = (life.kind, end)
            self.ends[key] = self.ends.get(key, 0) + 1
            if life.nbytes:
                self.end_bytes[end] = self.end_bytes.get(end, 0) + life.nbytes
            if end == CONSUMED and life.observed:
                self.flight.add(life.in_flight_ns)
                interval_q.add(life.in_flight_ns)
                s = life.in_flight_ns / 1e9
                self.buckets[bisect.bisect_left(FLIGHT_BUCKETS_S, s)] += 1
                self.flight_sum_s += s

    def count(self, end: str) -> int:
        return sum(n for (_, e), n in self.ends.items() if e == end)


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
        self.on_life, self.on_event, self.on_orphan = on_life, on_event, on_orphan
        self.watcher = ShmWatcher(opts.shm_dir, opts.prefix)
        self.tracker = SegmentTracker(opts.max_tracked)
        self.totals = _Totals()
        self.started_unix_s = time.time()
        self._t0 = time.monotonic()
        self._seq = 0
        self._tick = 0.0
        self._judged: dict[str, tuple[SegmentInfo | None, float, str]] = {}
        self.orphans_seen = 0
        self._first_snap: MetricsSnapshot | None = None
        self._snap: MetricsSnapshot | None = None
        self._snap_t = self._first_snap_t = 0.0
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
        """Start watching; the first scrape fails loudly (a wrong URL should not wait for an interval)."""
        self.watcher.open()
        if self.opts.metrics_url:
            try:
                self._snap = self._first_snap = scrape(self.opts.metrics_url, self.opts.metrics_timeout_s, MM_FAMILIES)
            except BaseException:
                self.watcher.close()
                raise
            self._snap_t = self._first_snap_t = time.monotonic()
        self._t0 = self._last_report = time.monotonic()
        self._tick = self._t0 + self.opts.interval_s
        self._consume(self.watcher.events(0))

    def close(self) -> None:
        self.watcher.close()

    # -- reading -------------------------------------------------------------------------

    def _consume(self, events: list[ShmEvent], interval_q: StreamingQuantiles | None = None) -> None:
        if not events:
            return
        if self.on_event is not None:
            for e in events:
                if e.kind in ("overflow", "rescanned", "dir_gone"):
                    self.on_event(e)
        lives = self.tracker.feed(events)
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
        cur = (tr.created, tr.created_bytes, consumed, t.end_bytes.get("consumed", 0), cleaned, unknown,
               w.overflows, w.dir_gone, w.events_read)  # fmt: skip
        d = [a - b for a, b in zip(cur, self._prev, strict=True)]
        self._prev = cur
        now_mono = time.monotonic()
        dt = max(1e-9, now_mono - self._last_report)
        self._last_report = now_mono
        self._seq += 1
        orphans, orphan_bytes, listed = self._orphans()
        kinds = {k: n - self._prev_kinds.get(k, 0) for k, n in tr.created_by_kind.items()}
        self._prev_kinds = dict(tr.created_by_kind)
        stats = IntervalStats(
            seq=self._seq, t_unix_s=time.time(), interval_s=round(dt, 6),
            created=d[0], created_bytes=d[1], consumed=d[2], consumed_bytes=d[3], cleaned=d[4], unknown=d[5],
            created_per_s=d[0] / dt, created_bytes_per_s=d[1] / dt, consumed_per_s=d[2] / dt,
            consumed_bytes_per_s=d[3] / dt, created_by_kind={k: n for k, n in kinds.items() if n},
            in_flight=len(tr), in_flight_bytes=tr.in_flight_bytes, flight=_flight(q),
            orphans=orphans, orphan_bytes=orphan_bytes, orphan_list=listed,
            overflows=d[6], dir_gone=d[7], untracked=tr.untracked, events_read=d[8], watching=w.watching,
            gateway=self._scrape(),
        )  # fmt: skip
        with self.lock:
            self.last = stats
            if stats.gateway is not None and stats.gateway.tensors:
                self.last_traffic = stats.gateway  # an idle interval does not clear the verdict
        return stats

    # -- orphans -------------------------------------------------------------------------

    def _orphans(self) -> tuple[int, int, list[Orphan]]:
        now_ns = time.time_ns()
        cutoff = now_ns - int(self.opts.orphan_after_s * 1e9)
        count, nbytes, new, old = self.tracker.orphans(cutoff, self.opts.max_orphans_listed, now_ns)
        self.orphans_seen += new
        listed_names = {life.name for life in old}
        for gone in [n for n in self._judged if n not in listed_names]:
            del self._judged[gone]  # judgements are kept for the listed ones only: bounded
        listed: list[Orphan] = []
        budget = _MAX_JUDGED_PER_STEP
        for life in old:
            orphan, judged_now = self._orphan(life, budget > 0)
            budget -= judged_now
            listed.append(orphan)
        return count, nbytes, listed

    def _orphan(self, life: SegmentLife, may_judge: bool) -> tuple[Orphan, int]:
        seen = self._judged.get(life.name)
        now = time.monotonic()
        judged = 0
        first = seen is None
        if (seen is None or now - seen[1] >= self.opts.rejudge_after_s) and may_judge:
            opts = ScanOptions(self.opts.shm_dir, self.opts.stale_after_s, self.opts.assume_dead)
            try:
                info, err = judge_entry(self.opts.shm_dir, life.name, opts), ""
            except SmgshmError as e:
                info, err = None, str(e)
            seen, judged = (info, now, err), 1
            self._judged[life.name] = seen
        age = life.in_flight_ns / 1e9
        if seen is None:
            o = Orphan(life.name, life.kind, life.producer_pid, None, "unjudged", "not judged yet", life.nbytes, age,
                       life.reads)  # fmt: skip
        else:
            info, _, err = seen
            if info is None:
                state, reason = ("unknown", err) if err else ("gone", "unlinked since; its unlink event is queued")
                o = Orphan(life.name, life.kind, life.producer_pid, None, state, reason, life.nbytes, age, life.reads)
            else:
                o = Orphan(life.name, life.kind, life.producer_pid, info.producer_alive, info.state.value, info.reason,
                           life.nbytes if life.nbytes is not None else info.nbytes, age, life.reads)  # fmt: skip
        if first and judged and self.on_orphan is not None:
            self.on_orphan(o)
        return o, judged

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
        rates = gateway_rates(self._snap, snap, dt, self.opts.shm_min_bytes) if self._snap else None
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
            gw = gateway_rates(self._first_snap, self._snap, span, self.opts.shm_min_bytes)
        notes = []
        if w.overflows:
            notes.append(f"{w.overflows} inotify queue overflow(s): the lives that spanned one ended unknown "
                         "(raise fs.inotify.max_queued_events if it recurs)")  # fmt: skip
        if w.dir_gone:
            notes.append(f"the shm dir went away {w.dir_gone} time(s) and was watched again")
        if tr.untracked:
            notes.append(f"{tr.untracked} segment(s) not followed: more than {tr.max_tracked} in flight at once")
        last = self.last
        return WatchSummary(
            shm_dir=self.opts.shm_dir, prefix=self.opts.prefix, started_unix_s=self.started_unix_s,
            duration_s=round(time.monotonic() - self._t0, 3), intervals=self._seq,
            created=tr.created, created_bytes=tr.created_bytes, listed=tr.listed,
            consumed=t.count("consumed"), consumed_bytes=t.end_bytes.get("consumed", 0),
            cleaned=t.count("cleaned"), unknown=t.count("unknown"), ends_by_kind=ends, flight=_flight(t.flight),
            in_flight=len(tr), in_flight_bytes=tr.in_flight_bytes, orphans_seen=self.orphans_seen,
            orphans=last.orphans if last else 0, orphan_list=last.orphan_list if last else [],
            overflows=w.overflows, dir_gone=w.dir_gone, untracked=tr.untracked, events_read=w.events_read,
            gateway=gw, notes=notes,
        )  # fmt: skip

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
                "created_bytes": self.tracker.created_bytes,
                "overflows": self.watcher.overflows,
                "dir_gone": self.watcher.dir_gone,
                "untracked": self.tracker.untracked,
                "orphans_seen": self.orphans_seen,
                "last": self.last,
                "last_traffic": self.last_traffic,
            }


__all__ = ["FlightTimes", "IntervalStats", "Orphan", "WatchOptions", "WatchSession", "WatchSummary"]
