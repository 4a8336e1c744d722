"""Hostile wire input against the receiver's decoding: typed errors or receipts, never a crash.

Property-based (hypothesis): arbitrary bytes as MultimodalInputs and as serve's GenerateRequest,
and well-formed messages with arbitrary shapes, dtypes and handles (Generate over real gRPC
too). Nothing may raise anything but WireError, allocate from a
hostile size, or touch a file outside the handles' names (the shm dir is an empty temp dir).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smgshm.core.errors import WireError
from smgshm.core.receipts import ReceiptRing
from smgshm.core.receiver import ReceiverConfig, receive
from smgshm.core.wire import Layout, engine_pb2
from smgshm.core.worker import read_generate


@pytest.fixture(scope="module")
def generate_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """One in-process serve (vLLM face) over an empty private shm dir, for the whole module."""
    from smgshm.core.services import start_receiver

    shm_dir = str(tmp_path_factory.mktemp("shm"))
    r = start_receiver(ReceiverConfig(shm_dir=shm_dir), "127.0.0.1:0")
    yield r, shm_dir
    r.stop(0)


LAYOUTS = st.sampled_from([Layout.VLLM, Layout.TOKENSPEED])
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


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


names = st.one_of(st.text(max_size=40), st.just("../etc/passwd"), st.just("/"), st.just("a\x00b"), st.just("x" * 300))
dims = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=5)


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
    tmp_path: Path, layout: Layout, shape: list[int], dtype: str, name: str, offset: int, nbytes: int,
    inline: bytes | None,
) -> None:  # fmt: skip
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


tensor_data = st.builds(
    lambda shape, dtype, name, nbytes, inline: (shape, dtype, name, nbytes, inline),
    dims, st.sampled_from(["float32", "uint8", "int64", "nope"]), names,
    st.integers(min_value=0, max_value=2**64 - 1), st.one_of(st.none(), st.binary(max_size=32)),
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=st.lists(tensor_data, min_size=1, max_size=6), stream=st.booleans())
def test_hostile_generate_over_grpc_is_a_status_never_a_crash(
    generate_server: Any, tensors: list[Any], stream: bool
) -> None:
    import grpc
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb
    from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pbg

    receiver, shm_dir = generate_server
    req = pb.GenerateRequest(request_id="fuzz", stream=stream)
    for i, (shape, dtype, name, nbytes, inline) in enumerate(tensors):
        td = pb.TensorData(shape=shape, dtype=dtype)
        if inline is not None:
            td.inline = inline
        else:
            td.shm.name, td.shm.nbytes = name, nbytes
        mm = req.mm_inputs if i % 2 == 0 else req.extra_mm_inputs.add()
        mm.model_specific_tensors[f"t{i}"].CopyFrom(td)
    with grpc.insecure_channel(receiver.address) as ch:
        code, out = grpc.StatusCode.OK, []
        try:
            out = list(pbg.VllmEngineStub(ch).Generate(req, timeout=10))
        except grpc.RpcError as err:
            code = err.code()
        # A typed refusal or a complete answer; never UNKNOWN or INTERNAL (a crash in the handler).
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
        if code == grpc.StatusCode.OK:
            assert out[-1].WhichOneof("response") == "complete"
        health = pbg.VllmEngineStub(ch).HealthCheck(pb.HealthCheckRequest(), timeout=5)
    assert health.healthy
    assert os.listdir(shm_dir) == []


@SETTINGS
@given(
    layout=LAYOUTS,
    payloads=st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=40)), max_size=5),
    primary=st.one_of(st.none(), st.binary(max_size=40)),
    extras=st.integers(min_value=0, max_value=2),
    junk=st.binary(max_size=24),
)
def test_inline_views_are_exactly_protobufs_bytes(
    layout: Layout, payloads: list[tuple[str, bytes]], primary: bytes | None, extras: int, junk: bytes
) -> None:
    """serve reads inline payloads in place (protowire); they must be the very bytes protobuf parses,
    or the walk must decline (None) and protobuf's copy is used."""
    from google.protobuf.message import DecodeError

    from smgshm.core.protowire import inline_views
    from smgshm.core.wire import generate_tensors

    pb = engine_pb2(layout)
    req = pb.GenerateRequest(request_id="v")
    mms = [req.mm_inputs]
    if layout is Layout.VLLM:
        mms += [req.extra_mm_inputs.add() for _ in range(extras)]
    for mm in mms:
        holder = mm if layout is Layout.VLLM else mm.items.add()
        if primary is not None:
            (holder.pixel_values if layout is Layout.VLLM else holder.encoder_input).inline = primary
        for k, data in payloads:
            holder.model_specific_tensors[k].inline = data
    for raw in (req.SerializeToString(), req.SerializeToString() + junk):
        parsed = pb.GenerateRequest()
        try:
            parsed.ParseFromString(raw)
        except DecodeError:  # junk can make it unparseable: gRPC refuses that, nothing to compare
            continue
        views = inline_views(layout, raw)
        if views is None:
            continue
        want = {t.key: bytes(t.inline or b"") for t in generate_tensors(layout, parsed) if t.kind == "inline"}
        assert {k: bytes(v) for k, v in views.items() if k in want} == want
