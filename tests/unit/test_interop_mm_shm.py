"""smgshm against SMG's own code: the servicer's reader (mm_shm, tensor_wire) and smg-grpc-proto messages."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType

import pytest
from smg_grpc_proto.generated import common_pb2, tokenspeed_scheduler_pb2, vllm_engine_pb2
from smg_grpc_servicer import mm_shm

from smgshm.core.segments.io import ShmRef, write_segment
from smgshm.core.transport.tensors import DTYPES, make_tensor, tensor_bytes
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal, parse_multimodal, to_tensor_data

LAYOUTS = [Layout.VLLM, Layout.TOKENSPEED]
PB: dict[Layout, ModuleType] = {Layout.VLLM: vllm_engine_pb2, Layout.TOKENSPEED: tokenspeed_scheduler_pb2}


@pytest.fixture(autouse=True)
def smg_unlinks(monkeypatch: pytest.MonkeyPatch) -> None:
    """mm_shm reads its unlink flag at import; pin SMG's default (unlink after read)."""
    monkeypatch.setattr(mm_shm, "UNLINK_MM_SHM_AFTER_READ", True)


@pytest.fixture
def segments() -> Iterator[list[ShmRef]]:
    refs: list[ShmRef] = []
    try:
        yield refs
    finally:
        for r in refs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(r.path)


def test_smgshm_knows_exactly_smgs_dtypes() -> None:
    from smg_grpc_servicer.tensor_wire import PROTO_DTYPE_MAP

    assert set(DTYPES) == set(PROTO_DTYPE_MAP)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (2, 0, 4)], ids=str)
def test_mm_shm_reads_our_segments_byte_exactly(
    segments: list[ShmRef], layout: Layout, dtype: str, shape: tuple[int, ...]
) -> None:
    import torch
    from smg_grpc_servicer.tensor_wire import tensor_from_parts

    t = make_tensor(shape, dtype, seed=hash((layout.value, dtype, shape)) & 0xFFFF)
    data = tensor_bytes(t)
    ref = write_segment(data)
    segments.append(ref)
    td = to_tensor_data(layout, OutTensor(shape, dtype, shm=ref))
    # Over the wire and back, as the servicer would receive it.
    wire = PB[layout].TensorData.FromString(td.SerializeToString())
    assert wire.WhichOneof("payload") == "shm"
    raw = mm_shm.tensor_payload_bytes(wire)
    assert raw == bytes(data)
    assert len(raw) == t.numel() * t.element_size()
    assert not os.path.exists(ref.path)
    if not raw:
        # SMG's tensor_from_parts cannot decode a zero-element tensor (torch.frombuffer
        # refuses an empty buffer); the bytes above are all there is to compare.
        with pytest.raises(ValueError, match="must not be 0"):
            tensor_from_parts(raw, list(wire.shape), wire.dtype)
        return
    back = tensor_from_parts(raw, list(wire.shape), wire.dtype)
    assert back.dtype == t.dtype
    assert tuple(back.shape) == shape
    assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_mm_shm_reads_our_inline_payload(layout: Layout) -> None:
    t = make_tensor((4, 4), "bfloat16", seed=7)
    data = bytes(tensor_bytes(t))
    sent = to_tensor_data(layout, OutTensor((4, 4), "bfloat16", inline=data))
    td = PB[layout].TensorData.FromString(sent.SerializeToString())
    assert td.WhichOneof("payload") == "inline"
    assert mm_shm.tensor_payload_bytes(td) == data


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_mm_shm_refuses_what_we_leave_unset(layout: Layout) -> None:
    td = to_tensor_data(layout, OutTensor((2,), "float32"))
    assert td.WhichOneof("payload") is None
    with pytest.raises(ValueError, match="payload is required"):
        mm_shm.tensor_payload_bytes(td)


def _request(segments: list[ShmRef]) -> tuple[Request, bytes, bytes]:
    pix = make_tensor((2, 3, 8, 8), "float32", seed=1)
    pix_bytes = bytes(tensor_bytes(pix))
    ref = write_segment(pix_bytes)
    segments.append(ref)
    grid = make_tensor((1, 3), "int64", seed=2)
    grid_bytes = bytes(tensor_bytes(grid))
    req = Request(
        primary=OutTensor((2, 3, 8, 8), "float32", shm=ref),
        extras={"image_grid_thw": OutTensor((1, 3), "int64", inline=grid_bytes)},
    )
    return req, pix_bytes, grid_bytes


def _check_shm(td: object, ref: ShmRef, shape: tuple[int, ...], dtype: str) -> None:
    assert td.WhichOneof("payload") == "shm"  # type: ignore[attr-defined]
    assert tuple(td.shape) == shape  # type: ignore[attr-defined]
    assert td.dtype == dtype  # type: ignore[attr-defined]
    h = td.shm  # type: ignore[attr-defined]
    assert (h.name, h.offset, h.nbytes, h.owner_id) == (ref.name, 0, ref.nbytes, f"smg:{os.getpid()}")


def test_vllm_multimodal_parses_with_smg_proto(segments: list[ShmRef]) -> None:
    req, pix_bytes, grid_bytes = _request(segments)
    raw = build_multimodal(Layout.VLLM, req).SerializeToString()
    msg = vllm_engine_pb2.MultimodalInputs.FromString(raw)
    assert msg.HasField("pixel_values")
    assert req.primary is not None
    assert req.primary.shm is not None
    _check_shm(msg.pixel_values, req.primary.shm, (2, 3, 8, 8), "float32")
    assert req.primary.shm.nbytes == len(pix_bytes)
    assert list(msg.model_specific_tensors) == ["image_grid_thw"]
    extra = msg.model_specific_tensors["image_grid_thw"]
    assert extra.WhichOneof("payload") == "inline"
    assert (list(extra.shape), extra.dtype, extra.inline) == ([1, 3], "int64", grid_bytes)
    assert mm_shm.tensor_payload_bytes(msg.pixel_values) == pix_bytes
    assert not os.path.exists(req.primary.shm.path)


def test_tokenspeed_multimodal_parses_with_smg_proto(segments: list[ShmRef]) -> None:
    req, pix_bytes, grid_bytes = _request(segments)
    raw = build_multimodal(Layout.TOKENSPEED, req).SerializeToString()
    msg = tokenspeed_scheduler_pb2.MultimodalInputs.FromString(raw)
    assert len(msg.items) == 1
    item = msg.items[0]
    assert item.HasField("encoder_input")
    assert req.primary is not None
    assert req.primary.shm is not None
    _check_shm(item.encoder_input, req.primary.shm, (2, 3, 8, 8), "float32")
    extra = item.model_specific_tensors["image_grid_thw"]
    assert (list(extra.shape), extra.dtype, extra.inline) == ([1, 3], "int64", grid_bytes)
    assert mm_shm.tensor_payload_bytes(item.encoder_input) == pix_bytes
    assert not os.path.exists(req.primary.shm.path)


def test_vllm_messages_built_by_smg_proto_parse_into_in_tensors() -> None:
    msg = vllm_engine_pb2.MultimodalInputs(
        pixel_values=vllm_engine_pb2.TensorData(
            shape=[1, 3, 4, 4],
            dtype="float16",
            shm=common_pb2.ShmHandle(name="smg-tokenspeed-1-2-3", offset=64, nbytes=96, owner_id="smg:1"),
        ),
    )
    zeta = vllm_engine_pb2.TensorData(shape=[2], dtype="uint8", inline=b"\x01\x02")
    msg.model_specific_tensors["zeta"].CopyFrom(zeta)
    msg.model_specific_tensors["alpha"].CopyFrom(
        vllm_engine_pb2.TensorData(
            shape=[8], dtype="uint8", remote=common_pb2.RemoteTensorHandle(transport="nixl", descriptor=b"d", nbytes=8)
        )
    )
    msg.model_specific_tensors["mid"].CopyFrom(vllm_engine_pb2.TensorData(shape=[3], dtype="int64"))
    got = {t.key: t for t in parse_multimodal(Layout.VLLM, msg.SerializeToString())}
    assert list(got) == [
        "pixel_values",
        "model_specific_tensors[alpha]",
        "model_specific_tensors[mid]",
        "model_specific_tensors[zeta]",
    ]
    pv = got["pixel_values"]
    assert (pv.kind, pv.shape, pv.dtype) == ("shm", (1, 3, 4, 4), "float16")
    assert (pv.shm_name, pv.shm_offset, pv.shm_nbytes, pv.shm_owner_id) == ("smg-tokenspeed-1-2-3", 64, 96, "smg:1")
    assert pv.inline is None
    z = got["model_specific_tensors[zeta]"]
    assert (z.kind, z.shape, z.dtype, z.inline) == ("inline", (2,), "uint8", b"\x01\x02")
    assert got["model_specific_tensors[alpha]"].kind == "remote"
    assert got["model_specific_tensors[mid]"].kind == "unset"


def test_tokenspeed_messages_built_by_smg_proto_parse_into_in_tensors() -> None:
    pb = tokenspeed_scheduler_pb2
    first = pb.MultimodalItem(
        encoder_input=pb.TensorData(shape=[4, 2], dtype="bfloat16", inline=bytes(16)),
    )
    first.model_specific_tensors["grid"].CopyFrom(
        pb.TensorData(shape=[1, 3], dtype="int64", shm=common_pb2.ShmHandle(name="seg", nbytes=24))
    )
    second = pb.MultimodalItem(
        encoder_input=pb.TensorData(shape=[5], dtype="uint32", shm=common_pb2.ShmHandle(name="seg2", nbytes=20)),
    )
    third = pb.MultimodalItem()  # an item with no encoder input contributes nothing
    raw = pb.MultimodalInputs(items=[first, second, third]).SerializeToString()
    got = parse_multimodal(Layout.TOKENSPEED, raw)
    assert [(t.key, t.kind) for t in got] == [
        ("items[0].encoder_input", "inline"),
        ("items[0].model_specific_tensors[grid]", "shm"),
        ("items[1].encoder_input", "shm"),
    ]
    assert got[0].inline == bytes(16)
    assert (got[0].shape, got[0].dtype) == ((4, 2), "bfloat16")
    assert (got[1].shm_name, got[1].shm_offset, got[1].shm_nbytes) == ("seg", 0, 24)
    assert (got[2].shape, got[2].dtype, got[2].shm_name) == ((5,), "uint32", "seg2")


def test_shape_field_numbers_differ_between_engines() -> None:
    v = vllm_engine_pb2.TensorData(shape=[3]).SerializeToString()
    t = tokenspeed_scheduler_pb2.TensorData(shape=[3]).SerializeToString()
    assert v[0] == 0x12  # field 2, length-delimited (packed)
    assert t[0] == 0x0A  # field 1, length-delimited (packed)
    assert v[1:] == t[1:] == b"\x01\x03"


@pytest.mark.parametrize(
    ("layout", "shape_tag", "dtype_tag", "inline_tag"),
    [(Layout.VLLM, 0x12, 0x1A, 0x0A), (Layout.TOKENSPEED, 0x0A, 0x12, 0x1A)],
    ids=["vllm", "tokenspeed"],
)
def test_our_tensor_data_uses_each_engines_field_numbers(
    layout: Layout, shape_tag: int, dtype_tag: int, inline_tag: int
) -> None:
    def tag(td: object) -> int:
        return td.SerializeToString()[0]  # type: ignore[attr-defined,no-any-return]

    assert tag(to_tensor_data(layout, OutTensor((2,), ""))) == shape_tag
    assert tag(to_tensor_data(layout, OutTensor((), "uint8"))) == dtype_tag
    assert tag(to_tensor_data(layout, OutTensor((), "", inline=b"ab"))) == inline_tag


def test_reading_with_the_wrong_layout_misplaces_fields() -> None:
    """Why layouts matter: vLLM TensorData bytes read as TokenSpeed's land in the wrong fields."""
    raw = to_tensor_data(Layout.VLLM, OutTensor((2,), "uint8", inline=b"xy")).SerializeToString()
    right = vllm_engine_pb2.TensorData.FromString(raw)
    assert (list(right.shape), right.dtype, right.inline) == ([2], "uint8", b"xy")
    wrong = tokenspeed_scheduler_pb2.TensorData.FromString(raw)
    assert list(wrong.shape) == [ord("x"), ord("y")]
    assert wrong.inline == b"uint8"
    assert wrong.dtype == "\x02"
