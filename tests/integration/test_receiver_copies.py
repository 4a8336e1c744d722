"""An inline payload costs serve no copy of its own (issue 14): measured in a real ``serve`` child.

What a 64 MiB inline tensor costs the receiving process is measured in two phases of one call,
by its peak RSS (VmHWM in /proc/PID/status, reset by writing 5 to /proc/PID/clear_refs):

- gRPC's phase, from the request's first byte until serve's handler holds it as bytes. This is
  gRPC's own: grpcio (1.85) keeps its core buffer, a bytes object per slice and their join alive
  at once, about three payloads at its peak. A bare grpc.aio server with a raw-bytes handler
  (tests/bare_grpc_receiver.py) is measured the same way, and serve must cost no more.
- serve's phase: everything after, the request parsed (protowire excises the payload first),
  then the payload checked, digested and made a tensor in place. It must grow by no payload
  copy at all: at most SLACK, a quarter of the payload, where one copy would be all of it.

The handler is held between the phases with ``--fault slow-read``: serve counts the request
as active while it waits, so the test resets the peak once GetServerInfo says so. Memory, not
time: a loaded machine slows the call but does not change what it holds.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from smgshm.core.receiver.faces import engine_modules
from smgshm.core.receiver.receipts import fetch_receipts
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal, engine_pb2
from smgshm.rpc.v1 import diag_pb2
from tests.conftest import Children, start_serve, wait_for

MIB = 1024 * 1024
PAYLOAD = 64 * MIB
# Allocator noise and the small objects of one call (a few MiB measured). One copy of the
# payload would be 64 MiB, so no copy can hide under it.
SLACK = PAYLOAD // 4
HOLD_S = "3s"  # how long serve holds the request between the phases (slow-read)
OPTS = [("grpc.max_send_message_length", 256 * MIB), ("grpc.max_receive_message_length", 256 * MIB)]


def _status_bytes(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS


@dataclass(frozen=True)
class Phases:
    idle: int  # RSS before the call
    grpc_peak: int  # peak from the first byte until serve's handler held the request
    handed: int  # RSS when it did
    own_peak: int  # peak from then until the answer

    def show(self, what: str) -> str:
        grpc_x = (self.grpc_peak - self.idle) / PAYLOAD
        whole_x = (max(self.grpc_peak, self.own_peak) - self.idle) / PAYLOAD
        return (
            f"{what}: idle {self.idle / MIB:.0f} MiB; gRPC's phase peak +{grpc_x:.2f}x the payload; "
            f"serve's phase +{(self.own_peak - self.handed) / MIB:.1f} MiB over the {self.handed / MIB:.0f} MiB "
            f"held when the handler had it; the whole call +{whole_x:.2f}x"
        )


@pytest.fixture(scope="module")
def grpc_floor() -> float:
    """A bare grpc.aio server's peak growth receiving the payload as bytes, in payloads."""
    kids = Children()
    try:
        p = kids.spawn([sys.executable, "-m", "tests.support.bare_grpc_receiver"])
        assert p.stdout is not None
        port = int(p.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTS) as ch:
            take = ch.unary_unary("/smgshm.test.Bare/Take", lambda b: b, lambda b: b)
            assert take(b"x", timeout=30) == b"1"
            data = b"\x07" * PAYLOAD
            _reset_peak(p.pid)
            idle = _status_bytes(p.pid, "VmRSS")
            assert take(data, timeout=120) == str(PAYLOAD).encode()
            growth = (_status_bytes(p.pid, "VmHWM") - idle) / PAYLOAD
        print(f"\nbare grpc.aio {grpc.__version__} receiving {PAYLOAD // MIB} MiB as bytes: peak +{growth:.2f}x")
        return growth
    finally:
        kids.reap()


def _tensor_request() -> Request:
    return Request(OutTensor((PAYLOAD,), "uint8", inline=b"\x07" * PAYLOAD))


def _generate_call(ch: grpc.Channel, engine: str) -> Callable[[], Any]:
    layout = Layout.VLLM if engine == "vllm" else Layout.TOKENSPEED
    pb = engine_pb2(layout)
    raw = pb.GenerateRequest(
        request_id="big", mm_inputs=build_multimodal(layout, _tensor_request())
    ).SerializeToString()
    service = pb.DESCRIPTOR.services_by_name[engine_modules(engine)[2]].full_name
    gen = ch.unary_stream(f"/{service}/Generate", lambda b: b, pb.GenerateResponse.FromString)

    def call() -> Any:
        out = list(gen(raw, timeout=120))
        assert out[-1].WhichOneof("response") == "complete"
        return out

    return call


def _receive_call(ch: grpc.Channel, engine: str) -> Callable[[], Any]:
    layout = Layout.VLLM if engine == "vllm" else Layout.TOKENSPEED
    mm = build_multimodal(layout, _tensor_request()).SerializeToString()
    wire = diag_pb2.LAYOUT_VLLM if layout is Layout.VLLM else diag_pb2.LAYOUT_TOKENSPEED
    raw = diag_pb2.ReceiveRequest(request_id="big", layout=wire, multimodal_inputs=mm).SerializeToString()
    del mm
    rcv = ch.unary_unary("/smgshm.rpc.v1.Diagnostics/Receive", lambda b: b, diag_pb2.ReceiveResponse.FromString)

    def call() -> Any:
        resp = rcv(raw, timeout=120)
        assert [(r.nbytes, r.error.code) for r in resp.receipts] == [(PAYLOAD, "")]
        return resp

    return call


def _active(ch: grpc.Channel, engine: str) -> int:
    pb, pb_grpc, svc = engine_modules(engine)
    stub = getattr(pb_grpc, f"{svc}Stub")(ch)
    return int(stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10).active_requests)


def _measure(children: Children, engine: str, rpc: str) -> Phases:
    proc, doc = start_serve(children, "--engine", engine, "--fault", "slow-read", "--fault-delay", HOLD_S)
    address, pid = doc["result"]["address"], proc.pid
    with grpc.insecure_channel(address, options=OPTS) as ch, grpc.insecure_channel(address) as probe:
        call = (_generate_call if rpc == "Generate" else _receive_call)(ch, engine)
        assert _active(probe, engine) == 0
        done: list[Any] = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                done.append(call())
            except BaseException as err:  # re-raised in the test's thread
                failed.append(err)

        _reset_peak(pid)
        idle = _status_bytes(pid, "VmRSS")
        sender = threading.Thread(target=run)
        sender.start()
        try:
            # Active: the whole request reached serve's handler, which holds it for HOLD_S.
            wait_for(lambda: failed or _active(probe, engine) == 1, timeout=120, what="serve holding the request")
            grpc_peak, handed = _status_bytes(pid, "VmHWM"), _status_bytes(pid, "VmRSS")
            _reset_peak(pid)
            if rpc == "Generate":  # still held: no tensor read yet
                assert fetch_receipts(address)[0] == []
        finally:
            sender.join(180)
        if failed:
            raise failed[0]
        assert done
        own_peak = _status_bytes(pid, "VmHWM")
    return Phases(idle, grpc_peak, handed, own_peak)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "tokenspeed"])
@pytest.mark.parametrize("rpc", ["Generate", "Receive"])
def test_an_inline_payload_costs_serve_no_copy_of_its_own(
    children: Children, grpc_floor: float, engine: str, rpc: str
) -> None:
    got = _measure(children, engine, rpc)
    print("\n" + got.show(f"serve --engine {engine} {rpc}, {PAYLOAD // MIB} MiB inline"))
    print(f"  (a bare grpc.aio server: +{grpc_floor:.2f}x)")
    # serve's part: no payload-sized buffer of its own (the bytes gRPC handed over are read in place).
    assert got.own_peak - got.handed <= SLACK
    # gRPC's part is gRPC's: no deserializer or copy of serve's rides along before the handler.
    assert got.grpc_peak - got.idle <= grpc_floor * PAYLOAD + SLACK
