"""What ``watch`` reports: its options, each interval's figures, the whole run's summary, and the
monotonic totals the exporter reads. Plain data; ``session.py`` fills it in."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from smgshm.core.causes import Found
from smgshm.core.closed import Closed
from smgshm.core.gateway.rates import DEFAULT_SHM_MIN_BYTES, GatewayRates
from smgshm.core.names import SMG_FAMILY_PREFIX
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.segments.judge import State
from smgshm.core.stats import StreamingQuantiles
from smgshm.core.watch.follow import CONSUMED, SegmentLife
from smgshm.core.watch.life import End

# Time-in-flight histogram bounds (seconds) for the exporter; +Inf is implied.
FLIGHT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


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


class Unseen(Closed):
    """An orphan's state where gc's judgement has none."""

    GONE = "gone"  # unlinked before it was judged (its unlink event is queued)
    UNJUDGED = "unjudged"  # not judged yet


@dataclass(frozen=True)
class Orphan:
    """A segment still in flight after --orphan-after, with gc's judgement of it."""

    name: str
    kind: str
    producer_pid: int | None
    producer_alive: bool | None
    state: State | Unseen  # gc's state, or why there is none
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
    cause_info: Found | None = None  # the orphans' cause, leaked or stranded (the gateway's: gateway.cause_info)


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
    cause_info: Found | None = None  # the last orphans' cause, leaked or stranded (the gateway's: gateway.cause_info)


def flight_times(q: StreamingQuantiles) -> FlightTimes:
    """The quantiles of times in flight (nanoseconds) in milliseconds."""

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v / 1e6, 3)

    return FlightTimes(q.count, ms(q.quantile(0.5)), ms(q.quantile(0.9)), ms(q.quantile(0.99)), ms(q.max))


class Totals:
    """Monotonic counters, updated per batch of completed lives."""

    def __init__(self) -> None:
        self.ends: dict[tuple[str, str], int] = {}  # (kind, end) -> lives
        self.end_bytes: dict[tuple[str, str], int] = {}  # (kind, end) -> bytes (known sizes)
        self.flight = StreamingQuantiles()
        self.buckets = [0] * (len(FLIGHT_BUCKETS_S) + 1)
        self.flight_sum_s = 0.0

    def add(self, lives: list[SegmentLife], interval_q: StreamingQuantiles) -> None:
        for life in lives:
            end = life.end or End.UNKNOWN
            key = (life.kind, end)
            self.ends[key] = self.ends.get(key, 0) + 1
            if life.nbytes:
                self.end_bytes[key] = self.end_bytes.get(key, 0) + life.nbytes
            if end == CONSUMED and life.observed:
                self.flight.add(life.in_flight_ns)
                interval_q.add(life.in_flight_ns)
                s = life.in_flight_ns / 1e9
                self.buckets[bisect.bisect_left(FLIGHT_BUCKETS_S, s)] += 1
                self.flight_sum_s += s

    def count(self, end: str) -> int:
        return sum(n for (_, e), n in self.ends.items() if e == end)

    def bytes_ended(self, end: str) -> int:
        return sum(n for (_, e), n in self.end_bytes.items() if e == end)


__all__ = [
    "FLIGHT_BUCKETS_S",
    "FlightTimes",
    "IntervalStats",
    "Orphan",
    "Totals",
    "WatchOptions",
    "WatchSummary",
    "flight_times",
]
