"""The reference receiver, in-process: receive() on /dev/shm segments it is handed, and its refusals."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from smg_grpc_proto.generated import (
    common_pb2,
    tokenspeed_scheduler_pb2,
    vllm_engine_pb2,
)

from smgshm.core.errors import WireError
from smgshm.core.receiver.reader import Receipt, ReceiverConfig, receive
from smgshm.core.segments.io import ShmRef
from smgshm.core.transport.tensors import DIGEST_ALGO, digest, digest_mismatch
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal
from tests.support.core_receiver import SHM, _fake_ref, _seg, _tensor

LAYOUTS = [Layout.VLLM, Layout.TOKENSPEED]


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


@pytest.mark.slow
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
