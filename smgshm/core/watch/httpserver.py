"""The exporter's HTTP server: /metrics from a prometheus_client collector, /healthz from a verdict,
over TLS and behind basic auth when a web config says so (webconfig.py). watch's and the node's.

Every wait is bounded: each client holds a thread while it is served, so neither its time (its TLS
handshake and its request within one deadline, its answer within another) nor the number of clients
is left to the client (prometheus_client's own server waits forever).
"""

from __future__ import annotations

import contextlib
import io
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from smgshm.core.address import listen_addrinfo, url_host
from smgshm.core.errors import TransportError
from smgshm.core.watch.health import Verdict
from smgshm.core.watch.webconfig import REALM, WebConfig

if TYPE_CHECKING:  # imported where they are used
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from prometheus_client.registry import Collector

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

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


__all__ = ["CLIENT_TIMEOUT_S", "MAX_CLIENTS", "MAX_HEAD_BYTES", "MetricsServer"]
