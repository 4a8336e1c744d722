"""`send` stops on SIGINT, SIGTERM and SIGHUP: in-flight requests cancelled, segments unlinked, a report.

The receiver here is a real gRPC server on loopback that accepts requests and then
holds them (as a stuck worker would), so the sender is caught with segments in
flight when the signal arrives.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from smgshm.rpc.v1 import diag_pb2_grpc
from tests.conftest import SHM, Children, smgshm_argv, wait_for

pytestmark = pytest.mark.timeout(120)

# A bound on a hang, not a timing assertion: the sender polls its stop event every 0.1 s.
STOP_BOUND_S = 15.0


class Stuck(diag_pb2_grpc.DiagnosticsServicer):  # type: ignore[misc]
    """Answers Identity; holds every Receive until released (or 60 s)."""

    def __init__(self) -> None:
        self.held = 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    def Identity(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's method name
        from smgshm.core.host.namespace import read_namespace_id
        from smgshm.rpc.v1 import diag_pb2

        return diag_pb2.IdentityResponse(namespace_id=read_namespace_id(), uid=os.getuid(), unlink_after_read=True)

    def Receive(self, request: Any, context: Any) -> Any:  # noqa: N802
        from smgshm.rpc.v1 import diag_pb2

        with self.lock:
            self.held += 1
        self.release.wait(60)
        return diag_pb2.ReceiveResponse(request_id=request.request_id)


@pytest.fixture
def stuck() -> Iterator[tuple[Stuck, str]]:
    servicer = Stuck()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    diag_pb2_grpc.add_DiagnosticsServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    assert port != 0
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.release.set()
    server.stop(0).wait()


def _segments_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir(SHM) if n.startswith(f"smg-smgshm-{pid}-"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "run"),
    [
        (signal.SIGINT, 130, ("-n", "1000")),
        (signal.SIGTERM, 143, ("--duration", "10m")),
        (signal.SIGHUP, 129, ("-n", "1000")),
    ],
    ids=["SIGINT-count", "SIGTERM-duration", "SIGHUP-count"],
)
def test_a_signal_stops_send_unlinks_its_segments_and_reports(
    children: Children, stuck: tuple[Stuck, str], sig: signal.Signals, code: int, run: tuple[str, ...]
) -> None:
    servicer, addr = stuck
    p = children.spawn(
        smgshm_argv(
            "--json",
            "send",
            "--transport",
            "shm",
            "--shape",
            "256x256",
            "--shm-min-bytes",
            "1",
            "--tensors",
            "2",
            "-c",
            "2",
            *run,
            addr,
        )
    )
    wait_for(lambda: servicer.held >= 2, what="two requests held in flight")
    assert len(_segments_of(p.pid)) == 4, "two requests of two tensors each are in flight"
    p.send_signal(sig)
    out, err = p.communicate(timeout=STOP_BOUND_S)
    assert p.returncode == code, err
    assert _segments_of(p.pid) == [], "every segment the sender created is unlinked"
    doc = json.loads(out)
    assert doc["ok"] is False
    r = doc["result"]
    assert r["stopped"] is True
    assert r["cancelled"] == 2
    assert any(prob["kind"] == "not_sent" for prob in r["problems"])
    assert servicer.held == 2, "no request started after the signal"


@pytest.mark.slow
def test_human_report_says_stopped(children: Children, stuck: tuple[Stuck, str]) -> None:
    servicer, addr = stuck
    p = children.spawn(smgshm_argv("send", "--transport", "inline", "--shape", "16x16", "-n", "1000", addr))
    wait_for(lambda: servicer.held >= 1, what="a request held in flight")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=STOP_BOUND_S)
    assert p.returncode == 130, err
    assert out.startswith("STOPPED by SIGINT: 0 request(s) done, 1 cancelled in flight")
