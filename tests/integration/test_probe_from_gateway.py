"""`probe --from-gateway` against a small fake admin API: what the real gateway cannot easily show.

(The real gateway, `smg launch`, is exercised in test_interop_gateway.py.)
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.receiver.reader import ReceiverConfig
from smgshm.core.receiver.services import RunningReceiver, start_receiver
from tests.conftest import LoopbackHttp, run_cli

KEY = "sekret"


@pytest.fixture
def two_receivers() -> Iterator[tuple[RunningReceiver, RunningReceiver]]:
    a = start_receiver(ReceiverConfig(), "127.0.0.1:0")
    b = start_receiver(ReceiverConfig(), "127.0.0.1:0")
    yield a, b
    a.stop(0)
    b.stop(0)


def _gateway(workers: list[dict[str, Any]], key: str | None = None) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"workers": workers, "total": len(workers), "stats": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def _worker(url: str, label: str, mode: str = "grpc", **extra: Any) -> dict[str, Any]:
    return {
        "id": os.urandom(4).hex(),
        "url": url,
        "connection_mode": mode,
        "runtime_type": "vllm",
        "labels": {"shm_namespace_id": label},
        "is_healthy": True,
        "status": "ready",
        **extra,
    }


@pytest.mark.slow
def test_dp_rank_http_worker_and_stale_label(two_receivers: tuple[RunningReceiver, RunningReceiver]) -> None:
    a, b = two_receivers
    me = read_namespace_id()
    stale = "00000000-0000-4000-8000-000000000000:1"
    workers = [
        _worker(f"grpc://{a.address}@3", me),  # DP-aware: dial the base
        _worker(f"grpc://{b.address}", stale),  # the label recorded at registration is not what it says now
        _worker("http://127.0.0.1:1", "", mode="http"),
    ]
    srv, url = _gateway(workers, key=KEY)
    try:
        res = run_cli("--json", "probe", "--from-gateway", url, "--api-key", KEY)
    finally:
        srv.shutdown()
    doc = res.json
    rows = {w["address"]: w for w in doc["result"]["workers"]}
    assert rows[f"grpc://{a.address}"]["verdict"] == "shared"
    assert rows[f"grpc://{a.address}"]["gateway_label"] == me
    assert rows[f"grpc://{b.address}"]["gateway_label"] == stale
    assert rows["http://127.0.0.1:1"]["verdict"] == "not_grpc"
    assert rows["http://127.0.0.1:1"]["cause_info"]["code"] == "not_grpc"
    assert any("stale" in w and b.address in w for w in doc["warnings"])


@pytest.mark.slow
def test_api_key_required() -> None:
    srv, url = _gateway([], key=KEY)
    try:
        res = run_cli("probe", "--from-gateway", url, exit=1)
    finally:
        srv.shutdown()
    assert "HTTP 401" in res.stderr
    assert "--api-key" in res.stderr


def test_gateway_unreachable() -> None:
    res = run_cli("probe", "--from-gateway", "http://127.0.0.1:1", "--timeout", "1s", exit=4)
    assert "connection refused" in res.stderr


def _raw_gateway(handle: Any) -> tuple[ThreadingHTTPServer, str]:
    """A tiny HTTP server whose do_GET is ``handle(handler)``; records each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            handle(self)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.seen = seen  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def _body(body: bytes) -> Any:
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return handle


@pytest.mark.slow
def test_a_redirect_to_another_origin_never_gets_the_api_key() -> None:
    other, other_url = _raw_gateway(_body(b'{"workers": []}'))

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", f"{other_url}/workers")
        h.send_header("Content-Length", "0")
        h.end_headers()

    srv, url = _raw_gateway(redirect)
    try:
        res = run_cli("probe", "--from-gateway", url, "--api-key", KEY, exit=4)
    finally:
        srv.shutdown()
        other.shutdown()
    assert "another origin" in res.stderr
    assert KEY not in res.stderr
    assert srv.seen[0].get("Authorization") == f"Bearer {KEY}"  # type: ignore[attr-defined]
    assert other.seen == []  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_trickling_gateway_is_cut_off_at_the_timeout() -> None:
    import time

    stop = threading.Event()

    def trickle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(1000):  # one byte every 0.3 s: every read succeeds, the whole never ends
            if stop.wait(0.3):
                return
            h.wfile.write(b" ")
            h.wfile.flush()

    srv, url = _raw_gateway(trickle)
    t0 = time.monotonic()
    try:
        res = run_cli("probe", "--from-gateway", url, "--timeout", "1s", exit=4)
    finally:
        stop.set()
        srv.shutdown()
    assert "deadline exceeded" in res.stderr
    assert time.monotonic() - t0 < 30  # a bound on a hang, not a timing assertion


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        (b'{"workers": 5}', 'without a "workers" list'),
        (b"[1, 2]", 'without a "workers" list'),
        (b'{"workers": [7]}', "not a worker with a url"),
        (b'{"workers": [{"url": {"x": 1}}]}', "not a worker with a url"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"<html>", "not JSON"),
        (b"[" * 100_000, "not JSON"),
    ],
)
def test_malformed_bodies_are_typed_errors(body: bytes, phrase: str) -> None:
    srv, url = _raw_gateway(_body(body))
    try:
        res = run_cli("--json", "probe", "--from-gateway", url, exit=1)
        human = run_cli("probe", "--from-gateway", url, exit=1)
    finally:
        srv.shutdown()
    assert res.json["error"]["kind"] == "refused"
    assert phrase in res.json["error"]["message"]
    assert human.stderr.startswith("Error: ")
    assert "internal error" not in human.stderr


def test_no_address_is_usage() -> None:
    run_cli("probe", exit=2)


def _status(code: int, body: bytes = b"") -> Any:
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return handle


@pytest.mark.slow
def test_e2e_against_a_gateway_not_ready_yet_exits_4() -> None:
    """SMG answers /workers but 503 on /v1/models until its worker registers: not ready is 4, never 1."""

    def not_ready(h: BaseHTTPRequestHandler) -> None:
        (_body(b'{"workers": []}') if h.path.startswith("/workers") else _status(503, b"no workers"))(h)

    srv, url = _raw_gateway(not_ready)
    try:
        res = run_cli("e2e", "--gateway", url, "--metrics", url + "/metrics", "-n", "1", exit=4)
    finally:
        srv.shutdown()
    assert "gateway not ready: GET /v1/models answered HTTP 503" in res.stderr
    assert any(s.get("Host") for s in srv.seen), "the test's gateway was asked"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_probe_from_a_gateway_not_ready_exits_4_and_one_that_refuses_exits_1() -> None:
    srv, url = _raw_gateway(_status(503))
    try:
        res = run_cli("probe", "--from-gateway", url, exit=4)
    finally:
        srv.shutdown()
    assert "gateway not ready: GET /workers answered HTTP 503" in res.stderr
    srv, url = _raw_gateway(_status(401))
    try:
        res = run_cli("probe", "--from-gateway", url, exit=1)
    finally:
        srv.shutdown()
    assert "--api-key" in res.stderr


@pytest.mark.slow
def test_an_http_worker_without_ids_shows_none_not_same() -> None:
    srv, url = _gateway([_worker("http://127.0.0.1:1", "", mode="http")])
    try:
        out = run_cli("--no-color", "probe", "--from-gateway", url).stdout
    finally:
        srv.shutdown()
    [row] = [ln for ln in out.splitlines() if "http://127.0.0.1:1" in ln and "not_grpc" in ln]
    assert "same" not in row, "neither side has an id: nothing to call the same"
    assert row.rstrip(" │|").rstrip().endswith("none"), row


def test_a_gateway_with_no_workers_is_undetermined_never_usable() -> None:
    """Nothing probed is nothing judged: no_workers, exit 6, in the headline and the JSON (never "SHM usable")."""
    listing = json.dumps({"workers": [], "total": 0, "stats": {}}).encode()
    with LoopbackHttp(lambda _path: listing, content_type="application/json") as gw:
        doc = run_cli("--json", "probe", "--from-gateway", gw.base, exit=6).json
        human = run_cli("--no-color", "probe", "--from-gateway", gw.base, exit=6).stdout
        quiet = run_cli("-q", "probe", "--from-gateway", gw.base, exit=6).stdout
    assert doc["ok"] is False
    assert doc["result"]["workers"] == []
    assert doc["result"]["cause_info"]["code"] == "no_workers"
    assert doc["result"]["cause_info"]["fix"] == CATALOGUE[Cause.NO_WORKERS].fix
    head = human.splitlines()[0]
    assert head.startswith("UNDETERMINED: ")
    assert "(no_workers)" in " ".join(human.split())
    assert "usable" not in human
    assert "(no_workers)" in " ".join(quiet.split())
