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
from smgshm.core.gateway.metrics import default_metrics_url, mm_traffic, parse_metrics, scrape
from tests.conftest import closed_port

SAMPLE = """\
# HELP smg_mm_tensors_total Multimodal tensors sent
# TYPE smg_mm_tensors_total counter
smg_mm_tensors_total{runtime="vllm",path="shm"} 1
smg_mm_tensors_total{runtime="vllm",path="inline"} 2
# TYPE smg_mm_tensor_bytes_total counter
smg_mm_tensor_bytes_total{runtime="vllm",path="shm"} 4816896
smg_mm_tensor_bytes_total{runtime="vllm",path="inline"} 32
# TYPE smg_mm_processing_total counter
smg_mm_processing_total{model="m",mode="router",reason="model_not_opted_in"} 1
"""

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


def test_parse_and_summarise_smg_counters() -> None:
    t = mm_traffic(parse_metrics(SAMPLE))
    assert t.tensors == {"shm": 1, "inline": 2}
    assert t.nbytes["shm"] == 4816896
    assert t.shm_write_failures == 0
    assert t.processing == {"router": 1}
    assert t.exported
    assert t.shm_byte_share is not None
    assert t.shm_byte_share > 0.99


def test_delta_counts_new_series_from_zero() -> None:
    before = parse_metrics('smg_mm_tensors_total{runtime="vllm",path="inline"} 2\n')
    after = parse_metrics(SAMPLE)
    d = mm_traffic(after.minus(before))
    assert d.tensors == {"shm": 1, "inline": 0}


def test_no_mm_counters_is_not_exported() -> None:
    t = mm_traffic(parse_metrics("# TYPE up gauge\nup 1\n"))
    assert not t.exported
    assert t.total_tensors == 0


def test_scrape_a_real_server(http_server: Callable[[Handler], str]) -> None:
    base = http_server(lambda h: _send(h, 200, SAMPLE.encode(), Content_Type="text/plain"))
    snap = scrape(base + "/metrics")
    assert snap.value("smg_mm_tensors_total", path="shm") == 1


def test_not_prometheus_text_is_a_server_error(http_server: Callable[[Handler], str]) -> None:
    base = http_server(lambda h: _send(h, 200, b"smg_mm_tensors_total{{{ not metrics"))
    with pytest.raises(ServerError):
        scrape(base + "/metrics")


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


def test_same_origin_redirect_is_followed(http_server: Callable[[Handler], str]) -> None:
    def h(req: BaseHTTPRequestHandler) -> None:
        if req.path == "/old":
            _send(req, 307, b"", Location="/new")
        else:
            _send(req, 200, b"here")

    base = http_server(h)
    assert request("GET", base + "/old").body == b"here"


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


def test_default_metrics_url() -> None:
    assert default_metrics_url("http://127.0.0.1:30000") == "http://127.0.0.1:29000/metrics"
    assert default_metrics_url("gw.local:8080/v1") == "http://gw.local:29000/metrics"
    assert default_metrics_url("http://[::1]:30000") == "http://[::1]:29000/metrics"
