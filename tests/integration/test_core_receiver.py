"""The reference receiver: receive() on real /dev/shm segments, and its gRPC faces."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import (
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.receiver.reader import MODEL_NAME, ReceiverConfig
from smgshm.core.receiver.services import RunningReceiver, start_receiver
from smgshm.core.transport.tensors import DIGEST_ALGO, digest
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal
from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc
from tests.support.core_receiver import SHM, _fake_ref, _seg, _tensor

FAKE_NS = "0badc0de-1111-4000-8000-000000000000:4242"


# --- gRPC ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _serving(cfg: ReceiverConfig) -> Iterator[tuple[RunningReceiver, grpc.Channel]]:
    r = start_receiver(cfg, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(r.address) as ch:
            yield r, ch
    finally:
        r.stop(0)


@pytest.fixture
def vllm_channel(receiver: RunningReceiver) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(receiver.address) as ch:
        yield ch


def _health(ch: grpc.Channel, service: str) -> int:
    resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return int(resp.status)


def test_vllm_face_registration_rpcs(receiver: RunningReceiver, vllm_channel: grpc.Channel) -> None:
    assert receiver.engine_service == "vllm.grpc.engine.VllmEngine"
    stub = vllm_engine_pb2_grpc.VllmEngineStub(vllm_channel)
    info = stub.GetServerInfo(vllm_engine_pb2.GetServerInfoRequest(), timeout=10)
    assert info.shm_namespace_id == read_namespace_id()
    assert info.shm_namespace_id
    health = stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=10)
    assert health.healthy
    model = stub.GetModelInfo(vllm_engine_pb2.GetModelInfoRequest(), timeout=10)
    assert model.served_model_name == MODEL_NAME
    # Generate answers (a text-only request: just a complete); Embed is not served.
    out = list(stub.Generate(vllm_engine_pb2.GenerateRequest(), timeout=10))
    assert [m.WhichOneof("response") for m in out] == ["complete"]
    with pytest.raises(grpc.RpcError) as ei:
        stub.Embed(vllm_engine_pb2.EmbedRequest(), timeout=10)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
    for service in ("", "vllm.grpc.engine.VllmEngine", "smgshm.rpc.v1.Diagnostics"):
        assert _health(vllm_channel, service) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as ei:
        _health(vllm_channel, "no.such.Service")
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


def test_diagnostics_identity(vllm_channel: grpc.Channel) -> None:
    ident = diag_pb2_grpc.DiagnosticsStub(vllm_channel).Identity(diag_pb2.IdentityRequest(), timeout=10)
    assert ident.pid == os.getpid()
    assert ident.namespace_id == read_namespace_id()
    assert ident.shm_dev == os.stat(SHM).st_dev
    assert (ident.engine, ident.reader, ident.unlink_after_read, ident.shm_dir) == ("vllm", "view", True, SHM)
    assert ident.uid == os.getuid()


def test_diagnostics_receive_over_grpc(scratch: list[str], vllm_channel: grpc.Channel) -> None:
    data = _tensor((32, 32), "float32", 11)
    ref = _seg(scratch, data)
    missing = f"smg-smgshm-test-{os.getpid()}-{uuid.uuid4().hex}"
    req = Request(
        primary=OutTensor((32, 32), "float32", shm=ref),
        extras={"gone": OutTensor((4,), "uint8", shm=_fake_ref(missing, 4))},
    )
    raw = build_multimodal(Layout.VLLM, req).SerializeToString()
    msg = diag_pb2.ReceiveRequest(request_id="r1", layout=diag_pb2.LAYOUT_VLLM, multimodal_inputs=raw)
    resp = diag_pb2_grpc.DiagnosticsStub(vllm_channel).Receive(msg, timeout=10)
    assert resp.request_id == "r1"
    good, bad = resp.receipts
    assert not good.HasField("error")
    assert (good.key, good.payload_kind, good.digest_algo) == ("pixel_values", "shm", DIGEST_ALGO)
    assert good.digest == digest(data)
    assert (list(good.shape), good.nbytes, good.unlinked, good.shm_name) == ([32, 32], len(data), True, ref.name)
    assert bad.HasField("error")
    assert bad.error.code == "missing"
    assert bad.digest_algo == ""
    assert not os.path.exists(ref.path)


@pytest.mark.parametrize(
    ("layout", "payload"),
    [
        (diag_pb2.LAYOUT_UNSPECIFIED, b""),
        (diag_pb2.LAYOUT_VLLM, b"\xff\xff\xff"),
        (diag_pb2.LAYOUT_TOKENSPEED, b"\x0a"),
    ],
)
def test_diagnostics_receive_invalid_argument(vllm_channel: grpc.Channel, layout: int, payload: bytes) -> None:
    stub = diag_pb2_grpc.DiagnosticsStub(vllm_channel)
    with pytest.raises(grpc.RpcError) as ei:
        stub.Receive(diag_pb2.ReceiveRequest(layout=layout, multimodal_inputs=payload), timeout=10)  # type: ignore[arg-type]
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_tokenspeed_face(scratch: list[str]) -> None:
    with _serving(ReceiverConfig(engine="tokenspeed")) as (r, ch):
        assert r.engine_service == "tokenspeed.grpc.scheduler.TokenSpeedScheduler"
        stub = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(ch)
        info = stub.GetServerInfo(tokenspeed_scheduler_pb2.GetServerInfoRequest(), timeout=10)
        assert info.scheduler_info["shm_namespace_id"] == read_namespace_id()
        assert stub.HealthCheck(tokenspeed_scheduler_pb2.HealthCheckRequest(), timeout=10).healthy
        stub.GetModelInfo(tokenspeed_scheduler_pb2.GetModelInfoRequest(), timeout=10)
        assert _health(ch, r.engine_service) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as ei:
            _health(ch, "vllm.grpc.engine.VllmEngine")
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
        ident = diag_pb2_grpc.DiagnosticsStub(ch).Identity(diag_pb2.IdentityRequest(), timeout=10)
        assert ident.engine == "tokenspeed"
        data = _tensor((8, 8), "bfloat16", 12)
        ref = _seg(scratch, data)
        raw = build_multimodal(Layout.TOKENSPEED, Request(primary=OutTensor((8, 8), "bfloat16", shm=ref)))
        resp = diag_pb2_grpc.DiagnosticsStub(ch).Receive(
            diag_pb2.ReceiveRequest(layout=diag_pb2.LAYOUT_TOKENSPEED, multimodal_inputs=raw.SerializeToString()),
            timeout=10,
        )
        (receipt,) = resp.receipts
        assert (receipt.key, receipt.digest, receipt.unlinked) == ("items[0].encoder_input", digest(data), True)


def test_sglang_face_advertises_no_namespace() -> None:
    with _serving(ReceiverConfig(engine="sglang")) as (r, ch):
        assert r.engine_service == "sglang.grpc.scheduler.SglangScheduler"
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(ch)
        info = stub.GetServerInfo(sglang_scheduler_pb2.GetServerInfoRequest(), timeout=10)
        assert "shm_namespace_id" not in info.scheduler_info
        assert "shm_namespace_id" not in info.server_args
        assert "shm_namespace_id" not in sglang_scheduler_pb2.GetServerInfoResponse.DESCRIPTOR.fields_by_name
        assert info.server_type == "grpc"
        assert stub.HealthCheck(sglang_scheduler_pb2.HealthCheckRequest(), timeout=10).healthy
        assert _health(ch, r.engine_service) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("ns", [FAKE_NS, ""])
def test_namespace_override_is_advertised(ns: str) -> None:
    with _serving(ReceiverConfig(namespace_id=ns)) as (_, ch):
        info = vllm_engine_pb2_grpc.VllmEngineStub(ch).GetServerInfo(vllm_engine_pb2.GetServerInfoRequest(), timeout=10)
        assert info.shm_namespace_id == ns
        ident = diag_pb2_grpc.DiagnosticsStub(ch).Identity(diag_pb2.IdentityRequest(), timeout=10)
        assert ident.namespace_id == ns
    with _serving(ReceiverConfig(engine="tokenspeed", namespace_id=ns)) as (_, ch):
        stub = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(ch)
        info = stub.GetServerInfo(tokenspeed_scheduler_pb2.GetServerInfoRequest(), timeout=10)
        # An empty id is not advertised at all, as SMG's servicer leaves the key out.
        assert dict(info.scheduler_info).get("shm_namespace_id") == (ns or None)
