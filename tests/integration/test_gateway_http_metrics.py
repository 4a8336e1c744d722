"""core/gateway/http.py and core/gateway/metrics.py against real HTTP servers on loopback."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from smgshm.core.errors import ServerError, TransportError
from smgshm.core.gateway.http import request
from smgshm.core.gateway.metrics import scrape
from tests.conftest import closed_port
from tests.support.gateway_http_metrics import SAMPLE

Handler = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def http_server() -> Iterator[Callable[[Handler], str]]:
    """Serve GETs with a handler function; yields a factory returning the base URL."""
    servers: list[ThreadingHTTPServer] = []

    def make(fn: Handler) -> str:
        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fn(self)

            def log_message(self, *_: Any) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k.replace("_", "-"), v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


@pytest.mark.slow
def test_scrape_a_real_server(http_server: Callable[[Handler], str]) -> None:
    base = http_server(lambda h: _send(h, 200, SAMPLE.encode(), Content_Type="text/plain"))
    snap = scrape(base + "/metrics")
    assert snap.value("smg_mm_tensors_total", path="shm") == 1


@pytest.mark.slow
def test_not_prometheus_text_is_a_server_error(http_server: Callable[[Handler], str]) -> None:
    base = http_server(lambda h: _send(h, 200, b"smg_mm_tensors_total{{{ not metrics"))
    with pytest.raises(ServerError):
        scrape(base + "/metrics")


@pytest.mark.slow
def test_trickling_peer_is_bounded_by_one_deadline(http_server: Callable[[Handler], str]) -> None:
    def trickle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        for _ in range(100):
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.3)

    base = http_server(trickle)
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="deadline"):
        request("GET", base + "/metrics", deadline_s=1.0)
    # Each read is well under the 1 s bound; only a whole-exchange deadline stops it.
    assert time.monotonic() - t0 < 10


@pytest.mark.slow
def test_cross_origin_redirect_is_not_followed_and_keeps_the_credential(
    http_server: Callable[[Handler], str],
) -> None:
    seen: list[str | None] = []
    other = http_server(lambda h: (seen.append(h.headers.get("Authorization")), _send(h, 200, b"{}")))
    # Same host, other port: another origin.
    base = http_server(lambda h: _send(h, 302, b"", Location=other + "/workers"))
    with pytest.raises(TransportError, match="another origin"):
        request("GET", base + "/workers", headers={"Authorization": "Bearer s3cret"})
    assert seen == []


@pytest.mark.slow
def test_same_origin_redirect_is_followed(http_server: Callable[[Handler], str]) -> None:
    def h(req: BaseHTTPRequestHandler) -> None:
        if req.path == "/old":
            _send(req, 307, b"", Location="/new")
        else:
            _send(req, 200, b"here")

    base = http_server(h)
    assert request("GET", base + "/old").body == b"here"


@pytest.mark.slow
def test_oversized_body_is_refused(http_server: Callable[[Handler], str]) -> None:
    base = http_server(lambda h: _send(h, 200, b"x" * 200_000))
    with pytest.raises(TransportError, match="larger"):
        request("GET", base + "/", max_bytes=100_000)


def test_refused_connection_fails_at_once() -> None:
    port = closed_port()
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="refused"):
        request("GET", f"http://127.0.0.1:{port}/", deadline_s=30)
    assert time.monotonic() - t0 < 10
