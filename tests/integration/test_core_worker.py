"""serve as a stand-in worker, in-process: the model directory, Generate, receipts and their ring."""

from __future__ import annotations

import os
import threading
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import (
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from smgshm.core.errors import TransportError
from smgshm.core.names import GATEWAY_PREFIX, new_segment_name
from smgshm.core.receiver.modeldir import SERVED_MODEL_NAME
from smgshm.core.receiver.reader import ReceiverConfig
from smgshm.core.receiver.receipts import (
    GenerateReceipt,
    fetch_receipts,
    from_proto,
)
from smgshm.core.receiver.services import RunningReceiver, start_receiver
from smgshm.core.segments.io import write_segment
from smgshm.core.transport.tensors import digest
from tests.conftest import SHM, closed_port

# --- the model directory ---------------------------------------------------------------------


# --- the ring --------------------------------------------------------------------------------


# --- Generate over gRPC, in-process ----------------------------------------------------------


def _vllm_request(rid: str, pixels: Any, extras: dict[str, Any] | None = None, stream: bool = False) -> Any:
    mm = vllm_engine_pb2.MultimodalInputs(pixel_values=pixels)
    for k, v in (extras or {}).items():
        mm.model_specific_tensors[k].CopyFrom(v)
    return vllm_engine_pb2.GenerateRequest(
        request_id=rid, tokenized=vllm_engine_pb2.TokenizedInput(input_ids=[1, 2, 3]), mm_inputs=mm, stream=stream
    )


def _shm_td(pb: Any, scratch: list[str], data: bytes, name: str | None = None) -> Any:
    ref = write_segment(data, name=name or new_segment_name(GATEWAY_PREFIX))
    scratch.append(ref.path)
    td = pb.TensorData(shape=[len(data)], dtype="uint8")
    td.shm.name, td.shm.offset, td.shm.nbytes, td.shm.owner_id = ref.name, 0, ref.nbytes, ref.owner_id
    return td


def test_vllm_generate_streams_a_chunk_then_a_complete_with_receipts(vllm: RunningReceiver, scratch: list[str]) -> None:
    pix = _shm_td(vllm_engine_pb2, scratch, b"\x01" * 70000)
    grid = vllm_engine_pb2.TensorData(shape=[1, 3], dtype="int64", inline=b"\0" * 24)
    extra = vllm_engine_pb2.MultimodalInputs(
        pixel_values=vllm_engine_pb2.TensorData(shape=[2], dtype="float32", inline=b"\0" * 8)
    )
    req = _vllm_request("req-1", pix, {"image_grid_thw": grid}, stream=True)
    req.extra_mm_inputs.append(extra)
    with grpc.insecure_channel(vllm.address) as ch:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(ch)
        out = list(stub.Generate(req, timeout=10))
        info = stub.GetModelInfo(vllm_engine_pb2.GetModelInfoRequest(), timeout=5)
        loads = stub.GetLoads(vllm_engine_pb2.GetLoadsRequest(), timeout=5)
        stub.Abort(vllm_engine_pb2.AbortRequest(request_ids=["req-1"]), timeout=5)
    assert [m.WhichOneof("response") for m in out] == ["chunk", "complete"]
    md = vllm.state.model
    assert md is not None
    assert list(out[1].complete.output_ids) == [md.reply_token_id]
    assert out[1].complete.finish_reason == "stop"
    assert out[1].complete.matched_token_id == md.eos_token_id
    assert out[1].complete.prompt_tokens == 3
    assert (info.served_model_name, info.model_path, info.tokenizer_path) == (SERVED_MODEL_NAME, md.path, md.path)
    assert info.supports_vision
    assert info.is_generation
    assert list(info.eos_token_ids) == [md.eos_token_id]
    assert len(loads.loads) == 1
    receipts, nxt = fetch_receipts(vllm.address)
    assert nxt == 3
    got = {r.key: r for r in receipts}
    assert set(got) == {"pixel_values", "model_specific_tensors[image_grid_thw]", "extra_mm_inputs[0].pixel_values"}
    pv = got["pixel_values"]
    assert (pv.payload_kind, pv.nbytes, pv.unlinked, pv.request_id) == ("shm", 70000, True, "req-1")
    assert pv.digest == digest(b"\x01" * 70000)
    assert pv.age_ns > 0
    assert not os.path.exists(os.path.join(SHM, pv.shm_name))
    assert fetch_receipts(vllm.address, after_seq=nxt) == ([], nxt)


def test_bad_tensor_is_a_typed_error_and_its_segment_is_kept(vllm: RunningReceiver, scratch: list[str]) -> None:
    good = _shm_td(vllm_engine_pb2, scratch, b"\x02" * 100)
    bad = vllm_engine_pb2.TensorData(shape=[7], dtype="float32", inline=b"\0" * 3)
    req = _vllm_request("req-bad", good, {"image_grid_thw": bad})
    with grpc.insecure_channel(vllm.address) as ch, pytest.raises(grpc.RpcError) as info:
        list(vllm_engine_pb2_grpc.VllmEngineStub(ch).Generate(req, timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model_specific_tensors[image_grid_thw]" in (info.value.details() or "")
    got = {r.key: r for r in fetch_receipts(vllm.address)[0]}
    assert got["model_specific_tensors[image_grid_thw]"].error_code == "wire"
    assert got["pixel_values"].ok


def test_media_refs_with_mm_inputs_is_refused_before_reading(vllm: RunningReceiver, scratch: list[str]) -> None:
    td = _shm_td(vllm_engine_pb2, scratch, b"\x03" * 10)
    req = _vllm_request("req-refs", td)
    req.media_refs.items.add(url="data:,x")
    with grpc.insecure_channel(vllm.address) as ch, pytest.raises(grpc.RpcError) as info:
        list(vllm_engine_pb2_grpc.VllmEngineStub(ch).Generate(req, timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert os.path.exists(os.path.join(SHM, td.shm.name))  # vLLM never reads it either
    assert fetch_receipts(vllm.address) == ([], 0)


def test_tokenspeed_generate_reads_every_item(model: str, scratch: list[str]) -> None:
    r = start_receiver(ReceiverConfig(model_dir=model, engine="tokenspeed"), "127.0.0.1:0")
    try:
        pb = tokenspeed_scheduler_pb2
        items = []
        for i in range(2):
            it = pb.MultimodalItem(encoder_input=_shm_td(pb, scratch, bytes([i]) * 1000))
            grid = pb.TensorData(shape=[3], dtype="int64", inline=b"\0" * 24)
            it.model_specific_tensors["image_grid_thw"].CopyFrom(grid)
            items.append(it)
        req = pb.GenerateRequest(
            request_id="ts-1", tokenized=pb.TokenizedInput(input_ids=[5]), mm_inputs=pb.MultimodalInputs(items=items)
        )
        with grpc.insecure_channel(r.address) as ch:
            stub = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(ch)
            out = list(stub.Generate(req, timeout=10))
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
            assert stub.Abort(pb.AbortRequest(request_id="ts-1"), timeout=5).success
        assert [m.WhichOneof("response") for m in out] == ["complete"]
        assert out[0].request_id == "ts-1"
        assert info.supports_vision
        assert info.served_model_name == SERVED_MODEL_NAME
        got = {x.key: x for x in fetch_receipts(r.address)[0]}
        keys = ("encoder_input", "model_specific_tensors[image_grid_thw]")
        assert set(got) == {f"items[{i}].{k}" for i in range(2) for k in keys}
        assert all(x.ok and x.engine == "tokenspeed" for x in got.values())
    finally:
        r.stop(0)


def _watch_receipts(address: str, timeout_s: float) -> list[GenerateReceipt]:
    """The WatchReceipts stream as a client reads it: every receipt until the deadline ends the call."""
    from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

    got: list[GenerateReceipt] = []
    with grpc.insecure_channel(address) as ch:
        stream = diag_pb2_grpc.DiagnosticsStub(ch).WatchReceipts(diag_pb2.ReceiptsRequest(), timeout=timeout_s)
        try:
            got.extend(from_proto(m) for m in stream)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
    return got


@pytest.mark.slow
def test_watch_receipts_streams_new_ones(vllm: RunningReceiver) -> None:
    got: list[GenerateReceipt] = []
    t = threading.Thread(target=lambda: got.extend(_watch_receipts(vllm.address, timeout_s=3)))
    t.start()
    req = _vllm_request("w", vllm_engine_pb2.TensorData(shape=[1], dtype="uint8", inline=b"\0"))
    with grpc.insecure_channel(vllm.address) as ch:
        list(vllm_engine_pb2_grpc.VllmEngineStub(ch).Generate(req, timeout=10))
    t.join(10)
    assert [(r.seq, r.key, r.request_id) for r in got] == [(1, "pixel_values", "w")]


def test_fetch_receipts_from_something_that_is_not_serve() -> None:
    with pytest.raises(TransportError):
        fetch_receipts(f"127.0.0.1:{closed_port()}", timeout_s=0.5)
