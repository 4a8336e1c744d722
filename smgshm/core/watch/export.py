"""``watch --serve-metrics``: the session's figures as Prometheus metrics (prometheus_client).

A collector, not live Counter objects: the figures are copied from the session under
its lock at scrape time, so following 10,000 segments a second costs the exporter
nothing between scrapes. Counters are the run's totals, every label value there at 0 from
the first scrape (``rate()`` and ``increase()`` need the 0 to see the first burst); gauges
are the last interval. Rates are left to ``rate()``: no gauge repeats one of a counter here.
``METRICS`` is the exposition's catalogue; README's metrics table is checked against it.
"""

from __future__ import annotations

import contextlib
import io
import math
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from smgshm.core.address import listen_addrinfo, url_host
from smgshm.core.errors import TransportError
from smgshm.core.names import KINDS
from smgshm.core.watch.figures import FLIGHT_BUCKETS_S
from smgshm.core.watch.health import Verdict, session_health
from smgshm.core.watch.life import ENDS
from smgshm.core.watch.session import WatchSession
from smgshm.core.watch.webconfig import REALM, WebConfig

if TYPE_CHECKING:  # imported where they are used
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from prometheus_client.registry import Collector

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

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


# Each client of the exporter holds a thread while it is served, so neither its time nor the
# number of clients is left to the client (prometheus_client's own server waits forever).
CLIENT_TIMEOUT_S = 5.0  # to send the request, and again to take the answer
MAX_CLIENTS = 16  # served at once; one more evicts the oldest still sending its request
MAX_HEAD_BYTES = 64 * 1024


def _handshake(sock: ssl.SSLSocket, deadline: float) -> bool:
    """The TLS handshake by ``deadline`` (monotonic), however the client trickles it: a client that never
    finishes holds its thread until then, no longer (a socket timeout would bound each read, not all)."""
    sock.setblocking(False)
    while True:
        try:
            sock.do_handshake()
            return True
        except ssl.SSLWantReadError:
            want = select.POLLIN
        except ssl.SSLWantWriteError:
            want = select.POLLOUT
        except (OSError, ValueError):  # refused (plain HTTP, no client certificate), reset, or evicted
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        poller = select.poll()  # not select(): a descriptor may be above FD_SETSIZE in a busy process
        poller.register(sock, want)
        if not poller.poll(max(1, int(left * 1000))):
            return False


def _read_head(sock: socket.socket, deadline: float) -> bytes:
    """The request line and headers by ``deadline`` (monotonic); b"" when they do not come."""
    buf = bytearray()
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
    return bytes(buf)


def _server(family: int, tls: ssl.SSLContext | None) -> tuple[type[WSGIServer], type[WSGIRequestHandler]]:
    """The server class for an address family (TLS with ``tls``), and its request handler class."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

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
                        # The socket's own shutdown (not SSLSocket's, which drops its TLS state under the
                        # thread still using it): its read or handshake returns at once, its thread ends.
                        socket.socket.shutdown(oldest, socket.SHUT_RDWR)
                self.clients.add(request)
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                with self.clients_lock:
                    self.clients.discard(request)

        def get_request(self) -> tuple[socket.socket, Any]:
            sock, addr = self.socket.accept()
            if tls is None:
                return sock, addr
            try:  # no I/O here: the handshake is the client's thread's, within its bound
                return tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr
            except OSError:
                sock.close()
                raise

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client's failure (a reset, a timeout) is its own

        def read_head(self, sock: socket.socket) -> bytes:
            """The TLS handshake if any, then the request line and headers, all within CLIENT_TIMEOUT_S;
            b"" when they do not come."""
            deadline = time.monotonic() + CLIENT_TIMEOUT_S
            with self.clients_lock:
                self.reading[sock] = None
            try:
                if isinstance(sock, ssl.SSLSocket) and not _handshake(sock, deadline):
                    return b""
                return _read_head(sock, deadline)
            finally:
                with self.clients_lock:
                    self.reading.pop(sock, None)

    class Handler(WSGIRequestHandler):
        server: Server  # the one above, which reads a request's head within its bound

        def setup(self) -> None:
            super().setup()
            # The request is read whole within CLIENT_TIMEOUT_S (a trickle of one byte a second
            # must not reset a per-read timeout); what is not a whole head is answered by nothing.
            self.rfile = io.BytesIO(self.server.read_head(self.connection))
            self.connection.settimeout(CLIENT_TIMEOUT_S)  # sendall's whole answer, at most

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def get_stderr(self) -> Any:
            return io.StringIO()  # a client gone mid-answer is no traceback on watch's terminal

    return Server, Handler


def _plain(start_response: Callable[..., Any], status: str, text: str, *headers: tuple[str, str]) -> list[bytes]:
    body = (text + "\n").encode()
    start_response(
        status,
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), *headers],
    )
    return [body]


def _app(metrics: WsgiApp, web: WebConfig, health: Callable[[], Verdict] | None) -> WsgiApp:
    """/healthz (no credentials asked: probes cannot send them, and it says ok or why not only), and
    every other path the exposition, behind basic auth when the web config has users."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if health is not None and environ.get("PATH_INFO") == "/healthz":
            v = health()
            status = "200 OK" if v.ok else "503 Service Unavailable"
            return _plain(start_response, status, v.reason, ("Cache-Control", "no-store"))
        if web.auth is not None:
            ok = web.auth.check(environ.get("HTTP_AUTHORIZATION"), CLIENT_TIMEOUT_S)
            if ok is None:
                return _plain(start_response, "503 Service Unavailable", "busy checking passwords: retry")
            if not ok:  # which of user or password was wrong is not said
                challenge = ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')
                return _plain(start_response, "401 Unauthorized", "Unauthorized", challenge)
        return metrics(environ, start_response)

    return app


class MetricsServer:
    """An HTTP /metrics endpoint serving what ``collector`` (prometheus_client's protocol) yields at
    each scrape, its clients bounded as above; ``stop()`` closes it. watch's and the node's.
    ``web``: TLS and basic auth (webconfig.py); ``health``: the verdict /healthz serves."""

    def __init__(
        self,
        collector: Collector,
        host: str,
        port: int,
        web: WebConfig | None = None,
        health: Callable[[], Verdict] | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app

        web = web or WebConfig()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.tls = web.tls is not None
        tls = web.tls.context() if web.tls is not None else None
        try:
            family, sockaddr = listen_addrinfo(host, port)
            server, handler = _server(family, tls)
            self._server = server((str(sockaddr[0]), port), handler)  # an inet sockaddr's host: a str already
        except OSError as err:
            raise TransportError(
                "cannot listen for --serve-metrics",
                endpoint=f"{host}:{port}",
                hint="is the port in use or the address wrong?",
            ) from err
        self._server.set_app(_app(make_wsgi_app(self.registry), web, health))
        self._thread = threading.Thread(target=self._server.serve_forever, name="smgshm-metrics", daemon=True)
        self._thread.start()
        self.host = host
        self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{url_host(self.host)}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class WatchExporter(MetricsServer):
    """An HTTP /metrics endpoint serving a session's figures; ``stop()`` closes it."""

    def __init__(self, session: WatchSession, host: str, port: int, web: WebConfig | None = None) -> None:
        super().__init__(_Collector(session), host, port, web, lambda: session_health(session))


__all__ = [
    "AFTER_INTERVAL",
    "AFTER_TRAFFIC",
    "ALWAYS",
    "METRICS",
    "PREFIX",
    "QUANTILES",
    "MetricsServer",
    "WatchExporter",
]
