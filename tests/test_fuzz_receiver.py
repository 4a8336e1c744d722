"""Hostile wire input against the receiver's decoding: typed errors or receipts, never a crash.

Property-based (hypothesis): arbitrary bytes as MultimodalInputs, and well-formed messages with
arbitrary shapes, dtypes and handles. Nothing may raise anything but WireError, allocate from a
hostile size, or touch a file outside the handles' names (the shm dir is an empty temp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smgshm.core.errors import WireError
from smgshm.core.receiver import ReceiverConfig, receive
from smgshm.core.wire import Layout, engine_pb2

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
