"""``watch --serve-metrics``: the session's figures as Prometheus metrics (prometheus_client).

A collector, not live Counter objects: the figures are copied from the session under
its lock at scrape time, so following 10,000 segments a second costs the exporter
nothing between scrapes. Counters are the run's totals, every label value there at 0 from
the first scrape (``rate()`` and ``increase()`` need the 0 to see the first burst); gauges
are the last interval. Rates are left to ``rate()``: no gauge repeats one of a counter here.
``METRICS`` is the exposition's catalogue; README's metrics table is checked against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from smgshm.core.names import KINDS
from smgshm.core.watch.figures import FLIGHT_BUCKETS_S
from smgshm.core.watch.health import session_health
from smgshm.core.watch.httpserver import CLIENT_TIMEOUT_S, MAX_CLIENTS, MetricsServer
from smgshm.core.watch.life import ENDS
from smgshm.core.watch.session import WatchSession

if TYPE_CHECKING:
    from smgshm.core.watch.webconfig import WebConfig

PREFIX = "smgshm_watch_"
# When a family is in the exposition.
ALWAYS, AFTER_INTERVAL, AFTER_TRAFFIC = "always", "after the first interval", "with --metrics, after gateway traffic"
# The interval's quantiles of time in flight; 1 is its maximum.
QUANTILES = ("0.5", "0.9", "0.99", "1")

# name (as exposed) -> (type, labels besides shm_dir, when it is there, help)
METRICS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "segments_created_total": ("counter", ("kind",), ALWAYS, "Segments whose creation watch saw, by producer kind"),
    "created_bytes_total": (
        "counter",
        ("kind",),
        ALWAYS,
        "Bytes of the created segments whose size was known, by producer kind",
    ),
    "segments_ended_total": (
        "counter",
        ("kind", "end"),
        ALWAYS,
        "Segments unlinked, by producer kind and how they ended",
    ),
    "ended_bytes_total": (
        "counter",
        ("kind", "end"),
        ALWAYS,
        "Bytes of the unlinked segments whose size was known, by producer kind and how they ended",
    ),
    "time_in_flight_seconds": ("histogram", ("le",), ALWAYS, "Creation to unlink of the segments a reader consumed"),
    "interval_time_in_flight_seconds": (
        "summary",
        ("quantile",),
        ALWAYS,
        "Creation to unlink of the segments a reader consumed: quantiles over the "
        "last interval (1 is its maximum, NaN when none ended), count and sum over "
        "the run",
    ),
    "overflows_total": ("counter", (), ALWAYS, "inotify queue overflows (each followed by a rescan)"),
    "dir_gone_total": ("counter", (), ALWAYS, "Times the shm dir was deleted, moved, unmounted or mounted over"),
    "untracked_total": ("counter", (), ALWAYS, "Segments not followed because too many were in flight"),
    "orphans_seen_total": ("counter", (), ALWAYS, "Segments that stayed in flight past --orphan-after"),
    "in_flight_segments": ("gauge", (), AFTER_INTERVAL, "Segments in flight at the end of the last interval"),
    "in_flight_bytes": ("gauge", (), AFTER_INTERVAL, "Known bytes in flight at the end of the last interval"),
    "orphan_segments": ("gauge", (), AFTER_INTERVAL, "Segments in flight past --orphan-after (last interval)"),
    "orphan_bytes": ("gauge", (), AFTER_INTERVAL, "Known bytes of the segments in flight past --orphan-after"),
    "gateway_shm_byte_ratio": (
        "gauge",
        (),
        AFTER_TRAFFIC,
        "Ratio of the gateway's tensor bytes that went through SHM (last interval with tensors)",
    ),
    "gateway_eligible_inline": (
        "gauge",
        (),
        AFTER_TRAFFIC,
        "1 when SHM-eligible tensors went inline (last interval with tensors), else 0",
    ),
}


class _Collector:
    def __init__(self, session: WatchSession) -> None:
        self.session = session

    def collect(self) -> Iterator[Any]:
        fig = self.session.exported()
        shm_dir = self.session.opts.shm_dir
        yield from _created_and_ended(fig, shm_dir)
        yield from _time_in_flight(fig, shm_dir)
        for name in ("overflows_total", "dir_gone_total", "untracked_total", "orphans_seen_total"):
            yield _one(_family(name), shm_dir, fig[name.removesuffix("_total")])
        yield from _last_interval(fig, shm_dir)


def _family(name: str) -> Any:
    """The empty family of ``METRICS[name]``, labelled by shm_dir and its own labels."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

    kind, labels, _, doc = METRICS[name]
    labels = ("shm_dir", *(x for x in labels if x not in ("le", "quantile")))
    if kind == "counter":  # prometheus_client adds the _total back
        return CounterMetricFamily(PREFIX + name.removesuffix("_total"), doc, labels=labels)
    if kind == "histogram":
        return HistogramMetricFamily(PREFIX + name, doc, labels=labels)
    if kind == "summary":
        return Metric(PREFIX + name, doc, "summary")
    return GaugeMetricFamily(PREFIX + name, doc, labels=labels)


def _created_and_ended(fig: dict[str, Any], shm_dir: str) -> Iterator[Any]:
    by_kind = (
        ("segments_created_total", fig["created_by_kind"]),
        ("created_bytes_total", fig["created_bytes_by_kind"]),
    )
    for name, values in by_kind:
        fam = _family(name)
        for kind in KINDS:
            fam.add_metric([shm_dir, kind], values.get(kind, 0))
        yield fam
    for name, values in (("segments_ended_total", fig["ends"]), ("ended_bytes_total", fig["end_bytes"])):
        fam = _family(name)
        for kind in KINDS:
            for end in ENDS:
                fam.add_metric([shm_dir, kind, end], values.get((kind, end), 0))
        yield fam


def _time_in_flight(fig: dict[str, Any], shm_dir: str) -> Iterator[Any]:
    hist = _family("time_in_flight_seconds")
    cum, buckets = 0, []
    for bound, n in zip((*FLIGHT_BUCKETS_S, float("inf")), fig["buckets"], strict=True):
        cum += n
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cum))
    hist.add_metric([shm_dir], buckets, fig["flight_sum_s"])
    yield hist
    # A summary, as Prometheus has it for quantiles the client computes over a window of its
    # own: the window is the interval; count and sum are the run's, as the histogram's.
    last = fig["last"]
    summary = _family("interval_time_in_flight_seconds")
    f = last.flight if last is not None else None
    for q, ms in zip(QUANTILES, (f.p50_ms, f.p90_ms, f.p99_ms, f.max_ms) if f else (None,) * 4, strict=True):
        summary.add_sample(summary.name, {"shm_dir": shm_dir, "quantile": q}, math.nan if ms is None else ms / 1e3)
    summary.add_sample(summary.name + "_count", {"shm_dir": shm_dir}, cum)
    summary.add_sample(summary.name + "_sum", {"shm_dir": shm_dir}, fig["flight_sum_s"])
    yield summary


def _last_interval(fig: dict[str, Any], shm_dir: str) -> Iterator[Any]:
    """The gauges of the last interval: none before the first one ends."""
    last = fig["last"]
    if last is None:
        return
    for name, value in (
        ("in_flight_segments", last.in_flight),
        ("in_flight_bytes", last.in_flight_bytes),
        ("orphan_segments", last.orphans),
        ("orphan_bytes", last.orphan_bytes),
    ):
        yield _one(_family(name), shm_dir, value)
    gw = fig["last_traffic"]  # the last interval that carried tensors: idle ones keep the verdict
    if gw is not None:
        if gw.shm_byte_share is not None:
            yield _one(_family("gateway_shm_byte_ratio"), shm_dir, gw.shm_byte_share)
        yield _one(_family("gateway_eligible_inline"), shm_dir, 1.0 if gw.eligible_inline else 0.0)


def _one(family: Any, shm_dir: str, value: float) -> Any:
    family.add_metric([shm_dir], value)
    return family


class WatchExporter(MetricsServer):
    """An HTTP /metrics endpoint serving a session's figures; ``stop()`` closes it."""

    def __init__(self, session: WatchSession, host: str, port: int, web: WebConfig | None = None) -> None:
        super().__init__(_Collector(session), host, port, web, lambda: session_health(session))


__all__ = [
    "AFTER_INTERVAL",
    "AFTER_TRAFFIC",
    "ALWAYS",
    "CLIENT_TIMEOUT_S",
    "MAX_CLIENTS",
    "METRICS",
    "PREFIX",
    "QUANTILES",
    "MetricsServer",
    "WatchExporter",
]
