"""``watch --serve-metrics``: the session's figures as Prometheus metrics (prometheus_client).

A collector, not live Counter objects: the figures are copied from the session under
its lock at scrape time, so following 10,000 segments a second costs the exporter
nothing between scrapes. Counters are the run's totals; gauges are the last interval.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from smgshm.core.errors import TransportError
from smgshm.core.watch.figures import FLIGHT_BUCKETS_S
from smgshm.core.watch.session import WatchSession

PREFIX = "smgshm_watch_"


class _Collector:
    def __init__(self, session: WatchSession) -> None:
        self.session = session

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        fig = self.session.exported()
        shm_dir = self.session.opts.shm_dir

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return CounterMetricFamily(PREFIX + name, doc, labels=("shm_dir", *labels))

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return GaugeMetricFamily(PREFIX + name, doc, labels=("shm_dir", *labels))

        created = counter("segments_created", "Segments whose creation watch saw, by producer kind", ("kind",))
        for kind, n in sorted(fig["created_by_kind"].items()):
            created.add_metric([shm_dir, kind], n)
        yield created
        yield _one(counter("bytes_created", "Bytes of the created segments whose size was known"), shm_dir,
                   fig["created_bytes"])  # fmt: skip
        ended = counter("segments_ended", "Segments unlinked, by producer kind and how they ended", ("kind", "end"))
        for (kind, end), n in sorted(fig["ends"].items()):
            ended.add_metric([shm_dir, kind, end], n)
        yield ended
        ended_bytes = counter("bytes_ended", "Bytes of unlinked segments (known sizes), by how they ended", ("end",))
        for end, n in sorted(fig["end_bytes"].items()):
            ended_bytes.add_metric([shm_dir, end], n)
        yield ended_bytes
        doc = "Creation to unlink of the segments a reader consumed"
        hist = HistogramMetricFamily(PREFIX + "time_in_flight_seconds", doc, labels=("shm_dir",))
        cum, buckets = 0, []
        for bound, n in zip((*FLIGHT_BUCKETS_S, float("inf")), fig["buckets"], strict=True):
            cum += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cum))
        hist.add_metric([shm_dir], buckets, fig["flight_sum_s"])
        yield hist
        for name, doc, key in (
            ("overflows", "inotify queue overflows (each followed by a rescan)", "overflows"),
            ("dir_gone", "Times the shm dir was deleted, moved, unmounted or mounted over", "dir_gone"),
            ("untracked", "Segments not followed because too many were in flight", "untracked"),
            ("orphans_seen", "Segments that stayed in flight past --orphan-after", "orphans_seen"),
        ):
            yield _one(counter(name, doc), shm_dir, fig[key])
        last = fig["last"]
        if last is None:
            return
        for name, doc, value in (
            ("in_flight_segments", "Segments in flight at the end of the last interval", last.in_flight),
            ("in_flight_bytes", "Known bytes in flight at the end of the last interval", last.in_flight_bytes),
            ("orphans", "Segments in flight past --orphan-after", last.orphans),
            ("orphan_bytes", "Known bytes of those", last.orphan_bytes),
            ("created_per_second", "Segments created per second over the last interval", last.created_per_s),
            ("consumed_per_second", "Segments consumed per second over the last interval", last.consumed_per_s),
            ("consumed_bytes_per_second", "Bytes consumed per second over the last interval",
             last.consumed_bytes_per_s),
        ):  # fmt: skip
            yield _one(gauge(name, doc), shm_dir, value)
        q = gauge("interval_time_in_flight_seconds", "Time in flight over the last interval", ("quantile",))
        for label, v in (("0.5", last.flight.p50_ms), ("0.9", last.flight.p90_ms), ("0.99", last.flight.p99_ms),
                         ("1", last.flight.max_ms)):  # fmt: skip
            if v is not None:
                q.add_metric([shm_dir, label], v / 1e3)
        yield q
        gw = fig["last_traffic"]  # the last interval that carried tensors: idle ones keep the verdict
        if gw is not None:
            share = gauge("gateway_shm_byte_share", "Share of the gateway's tensor bytes through SHM (last traffic)")
            if gw.shm_byte_share is not None:
                share.add_metric([shm_dir], gw.shm_byte_share)
            yield share
            yield _one(gauge("gateway_eligible_inline", "1 when SHM-eligible tensors went inline (last traffic)"),
                       shm_dir, 1.0 if gw.eligible_inline else 0.0)  # fmt: skip
            rates = gauge("gateway_tensor_bytes_per_second", "The gateway's tensor bytes per second by path (last "
                          "traffic)", ("path",))  # fmt: skip
            for path, v in sorted(gw.bytes_per_s.items()):
                rates.add_metric([shm_dir, path], v)
            yield rates


def _one(family: Any, shm_dir: str, value: float) -> Any:
    family.add_metric([shm_dir], value)
    return family


class WatchExporter:
    """An HTTP /metrics endpoint serving a session's figures; ``stop()`` closes it."""

    def __init__(self, session: WatchSession, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(session))  # type: ignore[arg-type]
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            raise TransportError("cannot listen for --serve-metrics", endpoint=f"{host}:{port}",
                                 hint="is the port in use or the address wrong?") from err  # fmt: skip
        self.host = host
        self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


__all__ = ["WatchExporter"]
