"""``watch --serve-metrics``: the session's figures as Prometheus metrics (prometheus_client).

A collector, not live Counter objects: the figures are copied from the session under
its lock at scrape time, so following 10,000 segments a second costs the exporter
nothing between scrapes. Counters are the run's totals; gauges are the last interval.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
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


# Each client of the exporter holds a thread while it is served, so neither its time nor the
# number of clients is left to the client (prometheus_client's own server waits forever).
CLIENT_TIMEOUT_S = 5.0  # to send the request, and again to take the answer
MAX_CLIENTS = 16  # served at once; one more evicts the oldest still sending its request
MAX_HEAD_BYTES = 64 * 1024


def _handler() -> type:
    from wsgiref.simple_server import WSGIRequestHandler

    class Handler(WSGIRequestHandler):
        def setup(self) -> None:
            super().setup()
            # The request is read whole within CLIENT_TIMEOUT_S (a trickle of one byte a second
            # must not reset a per-read timeout); what is not a whole head is answered by nothing.
            self.rfile = io.BytesIO(self.server.read_head(self.connection))  # type: ignore[attr-defined]
            self.connection.settimeout(CLIENT_TIMEOUT_S)  # sendall's whole answer, at most

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def get_stderr(self) -> Any:
            return io.StringIO()  # a client gone mid-answer is no traceback on watch's terminal

    return Handler


def _server(family: int) -> type:
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIServer

    class Server(ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True
        request_queue_size = 128  # the listen backlog (5 by default): a burst of clients is accepted, then judged

        def __init__(self, *args: Any, **kw: Any) -> None:
            self.clients_lock = threading.Lock()
            self.clients: set[Any] = set()
            self.reading: dict[Any, None] = {}  # clients still sending their request, oldest first
            super().__init__(*args, **kw)

        def process_request(self, request: Any, client_address: Any) -> None:
            with self.clients_lock:
                if len(self.clients) >= MAX_CLIENTS:
                    oldest = next(iter(self.reading), None)
                    if oldest is None:  # every one is being answered, each within its bound
                        self.shutdown_request(request)
                        return
                    del self.reading[oldest]
                    self.clients.discard(oldest)
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)  # its read returns at once, its thread ends
                self.clients.add(request)
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                with self.clients_lock:
                    self.clients.discard(request)

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client's failure (a reset, a timeout) is its own

        def read_head(self, sock: socket.socket) -> bytes:
            """The request line and headers, within CLIENT_TIMEOUT_S; b"" when they do not come."""
            deadline = time.monotonic() + CLIENT_TIMEOUT_S
            buf = bytearray()
            with self.clients_lock:
                self.reading[sock] = None
            try:
                while b"\r\n\r\n" not in buf and b"\n\n" not in buf and len(buf) < MAX_HEAD_BYTES:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return b""
                    sock.settimeout(left)
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    buf += chunk
            except OSError:  # timed out, reset, or evicted
                return b""
            finally:
                with self.clients_lock:
                    self.reading.pop(sock, None)
            return bytes(buf)

    return Server


class WatchExporter:
    """An HTTP /metrics endpoint serving a session's figures; ``stop()`` closes it."""

    def __init__(self, session: WatchSession, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(session))  # type: ignore[arg-type]
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            self._server = _server(info[0])((info[4][0], port), _handler())
        except OSError as err:
            raise TransportError("cannot listen for --serve-metrics", endpoint=f"{host}:{port}",
                                 hint="is the port in use or the address wrong?") from err  # fmt: skip
        self._server.set_app(make_wsgi_app(self.registry))
        self._thread = threading.Thread(target=self._server.serve_forever, name="smgshm-metrics", daemon=True)
        self._thread.start()
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
