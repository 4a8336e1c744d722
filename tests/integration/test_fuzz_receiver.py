"""Hostile wire input against the receiver's decoding: typed errors or receipts, never a crash.

Property-based (hypothesis): arbitrary bytes as MultimodalInputs and as serve's GenerateRequest,
and well-formed messages with arbitrary shapes, dtypes and handles (Generate over real gRPC
too). Nothing may raise anything but WireError, allocate from a
hostile size, or touch a file outside the handles' names (the shm dir is an empty temp dir).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgshm.core.receiver.reader import ReceiverConfig
from tests.support.fuzz_receiver import SLOW_OK, dims, names


@pytest.fixture(scope="module")
def generate_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """One in-process serve (vLLM face) over an empty private shm dir, for the whole module."""
    from smgshm.core.receiver.services import start_receiver

    shm_dir = str(tmp_path_factory.mktemp("shm"))
    r = start_receiver(ReceiverConfig(shm_dir=shm_dir), "127.0.0.1:0")
    yield r, shm_dir
    r.stop(0)


# --- serve's Generate path (the stand-in worker behind a gateway) -------------------------------


tensor_data = st.builds(
    lambda shape, dtype, name, nbytes, inline: (shape, dtype, name, nbytes, inline),
    dims,
    st.sampled_from(["float32", "uint8", "int64", "nope"]),
    names,
    st.integers(min_value=0, max_value=2**64 - 1),
    st.one_of(st.none(), st.binary(max_size=32)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_OK)
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
