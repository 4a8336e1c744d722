"""The reference receiver: receive() on real /dev/shm segments, and its gRPC faces."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from smgshm.core.errors import WireError
from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.receiver.reader import MODEL_NAME, Receipt, ReceiverConfig, receive
from smgshm.core.receiver.services import RunningReceiver, start_receiver
from smgshm.core.segments.io import ShmRef, write_segment
from smgshm.core.transport.tensors import DIGEST_ALGO, digest, digest_mismatch, make_tensor, tensor_bytes
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal
from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

SHM = "/dev/shm"
LAYOUTS = [Layout.VLLM, Layout.TOKENSPEED]
FAKE_NS = "0badc0de-1111-4000-8000-000000000000:4242"


def _seg(scratch: list[str], data: bytes) -> ShmRef:
    ref = write_segment(data)
    scratch.append(ref.path)
    return ref


def _fake_ref(name: str, nbytes: int) -> ShmRef:
    return ShmRef(name=name, offset=0, nbytes=nbytes, owner_id=f"smg:{os.getpid()}", shm_dir=SHM)


def _tensor(shape: tuple[int, ...], dtype: str, seed: int) -> bytes:
    return bytes(tensor_bytes(make_tensor(shape, dtype, seed)))


def _keys(layout: Layout, extras: list[str]) -> list[str]:
    if layout is Layout.VLLM:
        return ["pixel_values", *(f"model_specific_tensors[{k}]" for k in extras)]
    return ["items[0].encoder_input", *(f"items[0].model_specific_tensors[{k}]" for k in extras)]


def _one(layout: Layout, t: OutTensor, cfg: ReceiverConfig | None = None) -> Receipt:
    raw = build_multimodal(layout, Request(primary=t)).SerializeToString()
    (r,) = receive(layout, raw, cfg or ReceiverConfig())
    return r


@pytest.mark.parametrize("reader", ["view", "copy"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_receive_inline_and_shm_several_per_request(scratch: list[str], layout: Layout, reader: str) -> None:
    pix = _tensor((2, 3, 16, 16), "float32", 1)
    emb = _tensor((7, 33), "bfloat16", 2)
    grid = _tensor((1, 3), "int64", 3)
    ids = _tensor((5,), "uint32", 4)
    pix_ref, emb_ref = _seg(scratch, pix), _seg(scratch, emb)
    req = Request(
        primary=OutTensor((2, 3, 16, 16), "float32", shm=pix_ref),
        extras={
            "emb": OutTensor((7, 33), "bfloat16", shm=emb_ref),
            "grid": OutTensor((1, 3), "int64", inline=grid),
            "ids": OutTensor((5,), "uint32", inline=ids),
        },
    )
    raw = build_multimodal(layout, req).SerializeToString()
    receipts = receive(layout, raw, ReceiverConfig(reader=reader))  # type: ignore[arg-type]
    assert [r.key for r in receipts] == _keys(layout, ["emb", "grid", "ids"])
    expected = [(pix, pix_ref.name), (emb, emb_ref.name), (grid, ""), (ids, "")]
    for r, t, (data, name) in zip(receipts, [req.primary, *req.extras.values()], expected, strict=True):
        assert r.ok, r.error_message
        assert t is not None
        assert (r.payload_kind, r.shape, r.dtype, r.shm_name) == ("shm" if name else "inline", t.shape, t.dtype, name)
        assert (r.nbytes, r.digest, r.unlinked) == (len(data), digest(data), bool(name))
    assert not os.path.exists(pix_ref.path)
    assert not os.path.exists(emb_ref.path)


@pytest.mark.parametrize("reader", ["view", "copy"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_receive_without_unlink_keeps_the_segment(scratch: list[str], layout: Layout, reader: str) -> None:
    data = _tensor((64, 64), "float16", 9)
    ref = _seg(scratch, data)
    cfg = ReceiverConfig(unlink_after_read=False, reader=reader)  # type: ignore[arg-type]
    r = _one(layout, OutTensor((64, 64), "float16", shm=ref), cfg)
    assert r.ok
    assert r.digest == digest(data)
    assert r.unlinked is False
    with open(ref.path, "rb") as f:
        assert f.read() == data


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_zero_element_tensors(scratch: list[str], layout: Layout) -> None:
    ref = _seg(scratch, b"")
    req = Request(primary=OutTensor((0, 3), "float32", shm=ref), extras={"e": OutTensor((0,), "int64", inline=b"")})
    receipts = receive(layout, build_multimodal(layout, req).SerializeToString(), ReceiverConfig())
    assert [(r.ok, r.nbytes, r.digest, r.payload_kind) for r in receipts] == [
        (True, 0, digest(b""), "shm"),
        (True, 0, digest(b""), "inline"),
    ]
    assert receipts[0].unlinked
    assert not os.path.exists(ref.path)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_symlink_gives_an_error_receipt_and_a_good_tensor_still_arrives(scratch: list[str], layout: Layout) -> None:
    data = _tensor((16,), "float32", 5)
    target = _seg(scratch, data)
    link = f"smg-smgshm-test-{os.getpid()}-{uuid.uuid4().hex}"
    scratch.append(os.path.join(SHM, link))
    os.symlink(target.path, os.path.join(SHM, link))
    good = _seg(scratch, data)
    req = Request(
        primary=OutTensor((16,), "float32", shm=_fake_ref(link, len(data))),
        extras={"ok": OutTensor((16,), "float32", shm=good)},
    )
    bad, fine = receive(layout, build_multimodal(layout, req).SerializeToString(), ReceiverConfig())
    assert (bad.ok, bad.error_code, bad.shm_name, bad.unlinked) == (False, "symlink", link, False)
    assert bad.digest == b""
    assert fine.ok
    assert fine.digest == digest(data)
    assert os.path.islink(os.path.join(SHM, link))
    with open(target.path, "rb") as f:
        assert f.read() == data


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
@pytest.mark.parametrize(
    ("shape", "dtype"), [((5,), "float32"), ((4,), "float16"), ((2, 2), "int64"), ((17,), "uint8")]
)
def test_shape_dtype_mismatch_leaves_the_segment_alone(
    scratch: list[str], layout: Layout, shape: tuple[int, ...], dtype: str
) -> None:
    data = os.urandom(16)
    ref = _seg(scratch, data)
    r = _one(layout, OutTensor(shape, dtype, shm=ref))
    assert (r.ok, r.error_code, r.unlinked) == (False, "wire", False)
    assert "does not match" in r.error_message
    with open(ref.path, "rb") as f:
        assert f.read() == data


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_short_segment_gives_an_error_receipt_and_is_kept(scratch: list[str], layout: Layout) -> None:
    ref = _seg(scratch, b"\x00" * 8)
    r = _one(layout, OutTensor((4,), "float32", shm=_fake_ref(ref.name, 16)))
    assert (r.ok, r.error_code) == (False, "short")
    assert os.path.getsize(ref.path) == 8


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
@pytest.mark.parametrize(
    ("name", "code"),
    [(f"smg-smgshm-test-{os.getpid()}-missing-{uuid.uuid4().hex}", "missing"), ("../etc/passwd", "invalid_handle")],
    ids=["missing", "traversal"],
)
def test_missing_or_invalid_name_gives_an_error_receipt(layout: Layout, name: str, code: str) -> None:
    r = _one(layout, OutTensor((4,), "uint8", shm=_fake_ref(name, 4)))
    assert (r.ok, r.error_code, r.payload_kind, r.digest, r.unlinked) == (False, code, "shm", b"", False)
    assert r.error_message


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_unsupported_dtype(scratch: list[str], layout: Layout) -> None:
    ref = _seg(scratch, bytes(16))
    req = Request(
        primary=OutTensor((2,), "float64", shm=ref),
        extras={"c": OutTensor((2,), "complex64", inline=bytes(16)), "bad_len": OutTensor((2,), "uint8", inline=b"x")},
    )
    receipts = receive(layout, build_multimodal(layout, req).SerializeToString(), ReceiverConfig())
    assert [(r.ok, r.error_code) for r in receipts] == [(False, "wire")] * 3
    assert "unsupported dtype" in receipts[0].error_message
    assert os.path.exists(ref.path)


def _raw_with(layout: Layout, td: Any) -> bytes:
    if layout is Layout.VLLM:
        return bytes(vllm_engine_pb2.MultimodalInputs(pixel_values=td).SerializeToString())
    item = tokenspeed_scheduler_pb2.MultimodalItem(encoder_input=td)
    return bytes(tokenspeed_scheduler_pb2.MultimodalInputs(items=[item]).SerializeToString())


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
@pytest.mark.parametrize(("kind", "code"), [("remote", "remote_unsupported"), ("unset", "payload_missing")])
def test_remote_and_unset_payloads_are_refused(layout: Layout, kind: str, code: str) -> None:
    pb = vllm_engine_pb2 if layout is Layout.VLLM else tokenspeed_scheduler_pb2
    td = pb.TensorData(shape=[4], dtype="uint8")
    if kind == "remote":
        td.remote.CopyFrom(common_pb2.RemoteTensorHandle(transport="nixl", descriptor=b"\x01", nbytes=4))
    (r,) = receive(layout, _raw_with(layout, td), ReceiverConfig())
    assert (r.ok, r.error_code, r.payload_kind, r.nbytes, r.digest) == (False, code, kind, 0, b"")


@pytest.mark.parametrize("reader", ["view", "copy"])
def test_handle_with_an_unaligned_offset(scratch: list[str], reader: str) -> None:
    """The gateway always sends offset 0, but a handle may point anywhere inside a segment."""
    blob = os.urandom(3 * 4096 + 11)
    ref = _seg(scratch, blob)
    off = 4096 + 3  # neither page- nor float32-aligned
    t = OutTensor((2, 5), "float32", shm=ShmRef(ref.name, off, 40, ref.owner_id, SHM))
    r = _one(Layout.TOKENSPEED, t, ReceiverConfig(reader=reader))  # type: ignore[arg-type]
    assert r.ok, r.error_message
    assert (r.nbytes, r.digest, r.unlinked) == (40, digest(blob[off : off + 40]), True)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_garbage_bytes_raise_wire_error(layout: Layout) -> None:
    with pytest.raises(WireError):
        receive(layout, b"\xff\xff\xff\xff", ReceiverConfig())


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


def test_digest_is_xxh3_128_and_a_receipt_vouches_only_under_the_same_algorithm() -> None:
    import xxhash

    data = os.urandom(1 << 16)
    want = digest(data)
    assert (DIGEST_ALGO, len(want)) == ("xxh3_128", 16)
    assert want == xxhash.xxh3_128_digest(data) == digest(memoryview(bytearray(data)))
    assert digest_mismatch(DIGEST_ALGO, want, want) is None
    flipped = bytes([want[0] ^ 1]) + want[1:]
    assert digest_mismatch(DIGEST_ALGO, flipped, want) == "the receiver's digest differs from the sender's"
    # An older receiver digesting with sha256 is a version skew, said so, not a silent pass.
    skew = digest_mismatch("sha256", want, want)
    assert skew is not None
    assert "'sha256'" in skew
    assert "upgrade" in skew
    assert digest_mismatch("", b"", want) is not None
