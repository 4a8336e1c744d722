"""Peers that misbehave: oversized inline requests, resets, silence, deadlines, a sender killed mid-request.

Each gives a typed error and a documented exit code within a bounded time, and no
segment is left behind that gc cannot prove dead and reap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from smgshm.core.host.namespace import read_namespace_id
from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc
from tests.conftest import Children, run_cli, smgshm_argv, start_serve, wait_for
from tests.support.cli_gc import JUDGE
from tests.support.cli_send import own_segments, receiver_has_received

pytestmark = pytest.mark.timeout(120)
MIB = 1024 * 1024


# --- inline requests over the receiver's message limit ------------------------------------------


@pytest.fixture(scope="module")
def small_limit() -> Iterator[str]:
    """A real `smgshm serve` whose gRPC message limit is 1 MiB."""
    reg = Children()
    try:
        _, doc = start_serve(reg, "--max-message-bytes", "1MiB")
        yield doc["result"]["address"]
    finally:
        reg.reap()


@pytest.mark.slow
def test_inline_over_the_receivers_limit_is_refused_before_sending(small_limit: str) -> None:
    out = run_cli("--json", "send", small_limit, "--transport", "inline", "--size", "2MiB", "--dtype", "uint8", exit=1)
    err = out.json["error"]
    assert err["kind"] == "message_too_large"
    assert "exceeds the receiver's gRPC message limit" in err["message"]
    assert f"limit={MIB}" in err["message"]
    assert "--transport shm" in err["hint"]
    assert not receiver_has_received(small_limit), "nothing should have been sent"


@pytest.mark.slow
def test_under_the_limit_inline_and_any_size_over_shm_still_go(small_limit: str) -> None:
    run_cli("send", small_limit, "--transport", "inline", "--size", "512KiB", "--dtype", "uint8")
    # A handle is a few bytes whatever the tensor: SHM is how big tensors fit.
    run_cli("send", small_limit, "--transport", "shm", "--size", "8MiB", "--dtype", "uint8")
    assert own_segments() == []


def test_several_tensors_count_together_against_the_limit(small_limit: str) -> None:
    args = ("--transport", "inline", "--size", "400KiB", "--dtype", "uint8")
    run_cli("send", small_limit, *args, "--tensors", "2")
    out = run_cli("send", small_limit, *args, "--tensors", "3", exit=1)
    assert "nbytes=1228800" in out.stderr


@pytest.mark.slow
def test_auto_that_falls_back_inline_says_smg_would_fail_too(children: Children) -> None:
    _, doc = start_serve(children, "--advertise-namespace-id", "00000000-0000-0000-0000-000000000000:1")
    out = run_cli("send", doc["result"]["address"], "--transport", "auto", "--size", "300MiB", exit=1)
    assert "exceeds the receiver's gRPC message limit" in out.stderr
    assert "SMG would fail this request the same way" in out.stderr


# --- endpoints that reset, stay silent, or never answer -----------------------------------------


@contextlib.contextmanager
def raw_listener(behaviour: str) -> Iterator[str]:
    """A TCP port that resets every connection, or accepts and then says nothing."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            if behaviour == "reset":  # SO_LINGER 0: close sends RST, not FIN
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
            else:
                held.append(conn)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["reset", "silent"])
def test_send_to_a_resetting_or_silent_peer_exits_4(behaviour: str) -> None:
    with raw_listener(behaviour) as address:
        out = run_cli("--json", "send", address, "--connect-timeout", "1s", "--timeout", "2s", exit=4)
    assert out.json["error"]["kind"] == "transport"
    assert "endpoint unreachable" in out.json["error"]["message"]
    assert own_segments() == []


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["reset", "silent"])
def test_probe_of_a_resetting_or_silent_peer_exits_4(behaviour: str) -> None:
    with raw_listener(behaviour) as address:
        out = run_cli("--json", "probe", address, "--timeout", "1s", exit=4)
    (worker,) = out.json["result"]["workers"]
    assert worker["verdict"] == "unreachable"


class _StuckDiagnostics(diag_pb2_grpc.DiagnosticsServicer):  # type: ignore[misc]
    """Answers Identity like a smgshm receiver, then never answers Receive (until released)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def Identity(self, request: Any, context: Any) -> Any:  # noqa: N802
        return diag_pb2.IdentityResponse(
            namespace_id=read_namespace_id(), unlink_after_read=True, uid=os.getuid(), reader="view"
        )

    def Receive(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.started.set()
        self.release.wait(60)
        context.abort(grpc.StatusCode.UNAVAILABLE, "released")


@pytest.fixture
def stuck() -> Iterator[tuple[str, _StuckDiagnostics]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    svc = _StuckDiagnostics()
    diag_pb2_grpc.add_DiagnosticsServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", svc
    finally:
        svc.release.set()
        server.stop(0)


@pytest.mark.slow
def test_a_receive_past_its_deadline_exits_4_and_unlinks_the_segment(stuck: tuple[str, Any]) -> None:
    address, svc = stuck
    out = run_cli("--json", "send", address, "--timeout", "1s", "-n", "3", exit=4)
    assert svc.started.is_set()
    r = out.json["result"]
    assert r["unreachable"] is True
    assert [p["kind"] for p in r["problems"]] == ["rpc_failed", "not_sent"]
    assert "DEADLINE_EXCEEDED" in r["problems"][0]["message"]
    assert own_segments() == []  # written, never read, unlinked by the sender


@pytest.mark.slow
def test_a_sender_sigkilled_after_writing_leaves_a_segment_gc_reaps(
    stuck: tuple[str, Any], children: Children, tmp_path: Path
) -> None:
    address, svc = stuck
    shm_dir = str(tmp_path)
    sender = children.spawn(smgshm_argv("send", address, "--shm-dir", shm_dir, "--size", "1MiB", "--timeout", "60s"))
    assert wait_for(svc.started.is_set, 60, "the sender's request")
    (name,) = os.listdir(shm_dir)  # written and handed over; the receiver has not answered
    os.killpg(sender.pid, signal.SIGKILL)
    sender.wait(10)

    doc = run_cli("--json", "gc", "--shm-dir", shm_dir, *JUDGE).json
    (seg,) = doc["result"]["segments"]
    assert (seg["name"], seg["kind"], seg["state"]) == (name, "smgshm", "leaked")
    assert (seg["producer_pid"], seg["producer_alive"], seg["nbytes"]) == (sender.pid, False, MIB)
    doc = run_cli("--json", "gc", "--shm-dir", shm_dir, *JUDGE, "--delete", "--min-age", "0", "--yes").json
    assert [d["name"] for d in doc["result"]["deleted"] if d["deleted"]] == [name]
    assert os.listdir(shm_dir) == []
