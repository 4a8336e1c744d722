"""Hostile wire input against the receiver's decoding: typed errors or receipts, never a crash.

Property-based (hypothesis): arbitrary bytes as MultimodalInputs and as serve's GenerateRequest,
and well-formed messages with arbitrary shapes, dtypes and handles (Generate over real gRPC
too). Nothing may raise anything but WireError, allocate from a
hostile size, or touch a file outside the handles' names (the shm dir is an empty temp dir).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgshm.core.errors import WireError
from smgshm.core.receiver.reader import ReceiverConfig, receive
from smgshm.core.receiver.receipts import ReceiptRing
from smgshm.core.receiver.worker import read_generate
from smgshm.core.transport.wire import Layout, engine_pb2
from tests.support.fuzz_receiver import SLOW_OK, dims, names

LAYOUTS = st.sampled_from([Layout.VLLM, Layout.TOKENSPEED])
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=SLOW_OK)


@pytest.mark.slow
@SETTINGS
@given(layout=LAYOUTS, raw=st.binary(max_size=512))
def test_arbitrary_bytes_give_receipts_or_wire_error(tmp_path: Path, layout: Layout, raw: bytes) -> None:
    cfg = ReceiverConfig(shm_dir=str(tmp_path))
    try:
        receipts = receive(layout, raw, cfg)
    except WireError:
        return
    for r in receipts:
        assert r.ok or r.error_code  # every tensor is accounted for, one way or the other
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
@SETTINGS
@given(
    layout=LAYOUTS,
    shape=dims,
    dtype=st.one_of(
        st.sampled_from(["float32", "bfloat16", "float16", "uint8", "int64", "uint32"]), st.text(max_size=8)
    ),
    name=names,
    offset=st.integers(min_value=0, max_value=2**64 - 1),
    nbytes=st.integers(min_value=0, max_value=2**64 - 1),
    inline=st.one_of(st.none(), st.binary(max_size=64)),
)
def test_hostile_tensor_data_is_refused_cleanly(
    tmp_path: Path,
    layout: Layout,
    shape: list[int],
    dtype: str,
    name: str,
    offset: int,
    nbytes: int,
    inline: bytes | None,
) -> None:
    pb = engine_pb2(layout)
    td = pb.TensorData(shape=shape, dtype=dtype)
    if inline is not None:
        td.inline = inline
    else:
        td.shm.name, td.shm.offset, td.shm.nbytes = name, offset, nbytes
    if layout is Layout.VLLM:
        msg = pb.MultimodalInputs()
        msg.pixel_values.CopyFrom(td)
    else:
        msg = pb.MultimodalInputs(items=[pb.MultimodalItem(encoder_input=td)])
    sentinel = tmp_path / ("s" * 41)  # longer than any generated name: no handle can name it
    sentinel.write_bytes(b"k")
    receipts = receive(layout, msg.SerializeToString(), ReceiverConfig(shm_dir=str(tmp_path)))
    assert len(receipts) == 1
    r = receipts[0]
    # The only file in the dir is one no handle names: it must survive whatever the handle says.
    assert sentinel.read_bytes() == b"k"
    if inline is None:
        assert not r.ok  # no such segment exists, whatever the handle says


# --- serve's Generate path (the stand-in worker behind a gateway) -------------------------------


@pytest.mark.slow
@SETTINGS
@given(layout=LAYOUTS, raw=st.binary(max_size=512))
def test_arbitrary_generate_requests_give_receipts_or_wire_error(tmp_path: Path, layout: Layout, raw: bytes) -> None:
    from google.protobuf.message import DecodeError

    req = engine_pb2(layout).GenerateRequest()
    try:
        req.ParseFromString(raw)
    except DecodeError:
        return  # gRPC refuses it (INTERNAL) before serve's handler runs
    ring = ReceiptRing(size=16)
    try:
        outcome = read_generate(layout, req, ReceiverConfig(shm_dir=str(tmp_path)), ring)
    except WireError:
        return
    assert [r.seq for r in outcome.receipts] == list(range(1, len(outcome.receipts) + 1))
    assert all(r.ok or r.error_code for r in outcome.receipts)
    assert os.listdir(tmp_path) == []


def _tensors(layout: Layout, request: Any, payloads: dict[bytes, memoryview] | None) -> list[tuple[Any, ...]]:
    from smgshm.core.transport.wire import generate_tensors

    return [
        (t.key, t.kind, t.shape, t.dtype, None if t.inline is None else bytes(t.inline), t.shm_name)
        for t in generate_tensors(layout, request, payloads)
    ]


@pytest.mark.slow
@SETTINGS
@given(
    layout=LAYOUTS,
    payloads=st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=40)), max_size=5),
    primary=st.one_of(st.none(), st.binary(max_size=40)),
    extras=st.integers(min_value=0, max_value=2),
    shm_primary=st.booleans(),
    junk=st.binary(max_size=24),
    pieces=st.lists(st.integers(min_value=0, max_value=2), max_size=3),
)
def test_excised_parse_is_exactly_protobufs(
    layout: Layout,
    payloads: list[tuple[str, bytes]],
    primary: bytes | None,
    extras: int,
    shm_primary: bool,
    junk: bytes,
    pieces: list[int],
) -> None:
    """serve parses with its inline payloads excised (protowire) and reads them in place; every
    tensor must be what protobuf's own parse of the bytes gives, for canonical encodings and for
    the ones protobuf merges (concatenated messages: fields, oneof arms and map keys given twice,
    a singular message repeated), and the one must refuse exactly what the other refuses."""
    from google.protobuf.message import DecodeError

    from smgshm.core.transport.protowire import inline_target, parse_excised

    pb = engine_pb2(layout)
    reqs = []
    for variant in range(3):
        req = pb.GenerateRequest(request_id=f"v{variant}")
        mms = [req.mm_inputs]
        if layout is Layout.VLLM:
            mms += [req.extra_mm_inputs.add() for _ in range(extras)]
        for mm in mms:
            holder = mm if layout is Layout.VLLM else mm.items.add()
            primary_td = holder.pixel_values if layout is Layout.VLLM else holder.encoder_input
            if primary is not None:
                primary_td.inline = primary[variant:]
            if shm_primary and variant == 1:
                primary_td.shm.name = "smg-x"  # the oneof's other arm, given after inline
            for k, data in payloads:
                holder.model_specific_tensors[k].inline = data + bytes([variant])
        reqs.append(req.SerializeToString())
    raws = [reqs[0], reqs[0] + junk, b"".join(reqs[i] for i in pieces) + reqs[0]]
    target = frozenset({inline_target(pb)})
    for raw in raws:
        want = pb.GenerateRequest()
        try:
            want.ParseFromString(raw)
        except DecodeError:
            with pytest.raises(DecodeError):
                parse_excised(pb.GenerateRequest, raw, target)
            continue
        got, excised = parse_excised(pb.GenerateRequest, raw, target)
        assert _tensors(layout, got, excised) == _tensors(layout, want, None)
        assert got.request_id == want.request_id
        if raw == reqs[0] and (primary is not None or payloads):
            assert excised is not None  # a canonical encoding is always read in place


@pytest.mark.slow
@SETTINGS
@given(layout=LAYOUTS, raw=st.binary(max_size=512))
def test_excised_parse_of_arbitrary_bytes_is_protobufs(layout: Layout, raw: bytes) -> None:
    from google.protobuf.message import DecodeError

    from smgshm.core.transport.protowire import inline_target, parse_excised

    pb = engine_pb2(layout)
    want = pb.GenerateRequest()
    try:
        want.ParseFromString(raw)
    except DecodeError:
        with pytest.raises(DecodeError):
            parse_excised(pb.GenerateRequest, raw, frozenset({inline_target(pb)}))
        return
    got, excised = parse_excised(pb.GenerateRequest, raw, frozenset({inline_target(pb)}))
    assert _tensors(layout, got, excised) == _tensors(layout, want, None)


@pytest.mark.slow
@SETTINGS
@given(layout=LAYOUTS, inline=st.binary(max_size=64), junk=st.binary(max_size=16), twice=st.booleans())
def test_receive_reads_the_same_tensors_in_place(
    tmp_path: Path, layout: Layout, inline: bytes, junk: bytes, twice: bool
) -> None:
    """Diagnostics Receive's request parsed in place gives the receipts protobuf's copy gives."""
    from google.protobuf.message import DecodeError

    from smgshm.core.receiver.services import receive_request
    from smgshm.rpc.v1 import diag_pb2

    pb = engine_pb2(layout)
    td = pb.TensorData(shape=[len(inline)], dtype="uint8", inline=inline)
    mm = (
        pb.MultimodalInputs(pixel_values=td)
        if layout is Layout.VLLM
        else pb.MultimodalInputs(items=[pb.MultimodalItem(encoder_input=td)])
    )
    wire_layout = diag_pb2.LAYOUT_VLLM if layout is Layout.VLLM else diag_pb2.LAYOUT_TOKENSPEED
    one = diag_pb2.ReceiveRequest(request_id="r", layout=wire_layout, multimodal_inputs=mm.SerializeToString())
    raw = one.SerializeToString() + (one.SerializeToString() if twice else b"") + junk
    cfg = ReceiverConfig(shm_dir=str(tmp_path))
    layouts = {diag_pb2.LAYOUT_VLLM: Layout.VLLM, diag_pb2.LAYOUT_TOKENSPEED: Layout.TOKENSPEED}
    want: Any
    try:
        req = diag_pb2.ReceiveRequest.FromString(raw)
        if req.layout not in layouts:
            want = "layout"
        else:
            want = [
                (r.key, r.nbytes, r.digest, r.error_code)
                for r in receive(layouts[req.layout], req.multimodal_inputs, cfg)
            ]
    except DecodeError:
        want = "unparseable"
    except WireError:
        want = "wire"
    got: Any
    try:
        _, receipts = receive_request(raw, cfg)
        got = [(r.key, r.nbytes, r.digest, r.error_code) for r in receipts]
    except WireError as err:
        got = {
            "cannot parse ReceiveRequest": "unparseable",
            "layout must be LAYOUT_VLLM or LAYOUT_TOKENSPEED": "layout",
        }.get(err.what, "wire")
    assert got == want


@pytest.mark.parametrize("what", ["many fields", "a group", "deep nesting"])
def test_what_the_walk_cannot_follow_is_protobufs_parse(what: str) -> None:
    """Past the walk's bounds the request is parsed by protobuf as sent: same tensors, copies."""
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb

    from smgshm.core.transport.protowire import MAX_DEPTH, MAX_FIELDS, Target, inline_target, parse_excised

    td = pb.TensorData(shape=[3], dtype="uint8", inline=b"abc")
    raw = pb.GenerateRequest(request_id="x", mm_inputs=pb.MultimodalInputs(pixel_values=td)).SerializeToString()
    targets: frozenset[Target] = frozenset({inline_target(pb)})
    cls: Any = pb.GenerateRequest
    if what == "many fields":
        raw = b"\xf8\x07\x01" * MAX_FIELDS + raw  # field 127 (unknown to it), varint 1
    elif what == "a group":
        raw = b"\xfb\x07\xfc\x07" + raw  # an empty group, field 127
    else:
        from google.protobuf import struct_pb2

        # A recursive type leading to a target: a Value's string_value (3) deep in lists.
        cls, targets = struct_pb2.Value, frozenset({("google.protobuf.Value", 3)})
        v = struct_pb2.Value(string_value="abc")
        for _ in range(MAX_DEPTH + 1):
            v = struct_pb2.Value(list_value=struct_pb2.ListValue(values=[v]))
        raw = v.SerializeToString()
    got, payloads = parse_excised(cls, raw, targets)
    assert payloads is None
    assert got == cls.FromString(raw)
    if what != "deep nesting":
        assert got.mm_inputs.pixel_values.inline == b"abc"


def test_a_target_reached_only_through_a_cycle_is_excised() -> None:
    """A recursive type whose first field leads back into the cycle (A -> B -> A) before A's own
    target field: B was once judged to lead nowhere while A was still being judged, and that
    False was kept, so an A inside a B kept its bytes; a crafted b"0" there then read as the
    payload of marker 0 (another tensor's). Every target is excised, wherever it sits."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    from smgshm.core.transport.protowire import parse_excised, resolve

    fdp = descriptor_pb2.FileDescriptorProto(name="smgshm_cycle_test.proto", package="cyc", syntax="proto3")
    fdp.message_type.add(name="Tensor").field.add(name="inline", number=1, type=12, label=1)
    a = fdp.message_type.add(name="A")
    a.field.add(name="b", number=1, type=11, type_name=".cyc.B", label=1)  # into the cycle first
    a.field.add(name="t", number=2, type=11, type_name=".cyc.Tensor", label=1)
    fdp.message_type.add(name="B").field.add(name="a", number=1, type=11, type_name=".cyc.A", label=1)
    fdp.message_type.add(name="Req").field.add(name="a", number=1, type=11, type_name=".cyc.A", label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    req_cls: Any = message_factory.GetMessageClass(pool.FindMessageTypeByName("cyc.Req"))
    req = req_cls()
    req.a.t.inline = b"outer payload"
    req.a.b.a.t.inline = b"0"  # what marker 0 looks like
    raw = req.SerializeToString()
    got, payloads = parse_excised(req_cls, raw, frozenset({("cyc.Tensor", 1)}))
    assert payloads is not None
    assert bytes(resolve(got.a.t.inline, payloads)) == b"outer payload"
    assert bytes(resolve(got.a.b.a.t.inline, payloads)) == b"0", "the nested target read another tensor's payload"
    assert len(payloads) == 2
