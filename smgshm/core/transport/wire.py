"""Between core values and the engines' real protobuf messages (smg-grpc-proto).

Generated types stay here: callers hand in and get back dataclasses. The vLLM and
TokenSpeed ``TensorData`` differ in field numbers (shape/dtype/inline are 2/3/1 in
vLLM and 1/2/3 in TokenSpeed); using their own classes keeps that right.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from smgshm.core.errors import TooManyTensorsError, WireError
from smgshm.core.segments.io import ShmRef
from smgshm.core.transport.protowire import inline_target, parse_excised, resolve


class Layout(enum.Enum):
    """Which engine's ``MultimodalInputs`` carries the tensors."""

    VLLM = "vllm"
    TOKENSPEED = "tokenspeed"


@dataclass(frozen=True)
class OutTensor:
    """A tensor to put on the wire: inline bytes or a segment this process wrote."""

    shape: tuple[int, ...]
    dtype: str
    inline: bytes | None = None
    shm: ShmRef | None = None


@dataclass(frozen=True)
class InTensor:
    """One TensorData as read off the wire, before its payload is fetched."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # inline | shm | remote | unset
    inline: bytes | memoryview | None = None  # a view into the request's bytes where one could be had
    shm_name: str = ""
    shm_offset: int = 0
    shm_nbytes: int = 0
    shm_owner_id: str = ""


@dataclass(frozen=True)
class Request:
    """The tensors of one request: the primary (pixel values / encoder input) and extras."""

    primary: OutTensor | None
    extras: dict[str, OutTensor] = field(default_factory=dict)


def engine_pb2(layout: Layout) -> ModuleType:
    """The engine's generated message module."""
    if layout is Layout.VLLM:
        from smg_grpc_proto.generated import vllm_engine_pb2

        return vllm_engine_pb2
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2

    return tokenspeed_scheduler_pb2


def to_tensor_data(layout: Layout, t: OutTensor) -> Any:
    """An engine ``TensorData`` for ``t``, with the payload arm it carries."""
    pb = engine_pb2(layout)
    td = pb.TensorData(shape=list(t.shape), dtype=t.dtype)
    if t.shm is not None:
        td.shm.name = t.shm.name
        td.shm.offset = t.shm.offset
        td.shm.nbytes = t.shm.nbytes
        td.shm.owner_id = t.shm.owner_id
    elif t.inline is not None:
        td.inline = t.inline
    return td


def build_multimodal(layout: Layout, req: Request) -> Any:
    """The engine's ``MultimodalInputs`` message for ``req`` (TokenSpeed: one item)."""
    pb = engine_pb2(layout)
    if layout is Layout.VLLM:
        msg = pb.MultimodalInputs()
        if req.primary is not None:
            msg.pixel_values.CopyFrom(to_tensor_data(layout, req.primary))
        for k, t in req.extras.items():
            msg.model_specific_tensors[k].CopyFrom(to_tensor_data(layout, t))
        return msg
    item = pb.MultimodalItem()
    if req.primary is not None:
        item.encoder_input.CopyFrom(to_tensor_data(layout, req.primary))
    for k, t in req.extras.items():
        item.model_specific_tensors[k].CopyFrom(to_tensor_data(layout, t))
    return pb.MultimodalInputs(items=[item])


def from_tensor_data(key: str, td: Any, payloads: dict[bytes, memoryview] | None = None) -> InTensor:
    """Read one ``TensorData`` (either engine's) into an ``InTensor``; with ``payloads`` (the
    message was parsed by ``protowire.parse_excised``) its inline field holds a marker, and
    the payload is a view into the serialized message, not a copy."""
    kind = td.WhichOneof("payload") or "unset"
    shape, dtype = tuple(int(d) for d in td.shape), str(td.dtype)
    if kind == "inline":
        return InTensor(key, shape, dtype, kind, inline=resolve(td.inline, payloads))
    if kind == "shm":
        h = td.shm
        return InTensor(key, shape, dtype, kind, None, h.name, int(h.offset), int(h.nbytes), h.owner_id)
    return InTensor(key, shape, dtype, kind)


def parse_excised_message(
    layout: Layout, cls: Any, raw: bytes | memoryview
) -> tuple[Any, dict[bytes, memoryview] | None]:
    """Parse an engine message (``cls``) with its inline payloads left in ``raw`` (protowire);
    WireError when protobuf cannot parse it."""
    from google.protobuf.message import DecodeError

    try:
        return parse_excised(cls, raw, frozenset({inline_target(engine_pb2(layout))}))
    except DecodeError as err:
        name = cls.DESCRIPTOR.name
        raise WireError(f"cannot parse {layout.value} {name}", nbytes=memoryview(raw).nbytes) from err


def parse_multimodal(layout: Layout, raw: bytes | memoryview, max_tensors: int | None = None) -> list[InTensor]:
    """Every TensorData in a serialized ``MultimodalInputs``, keyed by where it sits; inline
    payloads are views into ``raw``."""
    msg, payloads = parse_excised_message(layout, engine_pb2(layout).MultimodalInputs, raw)
    if max_tensors is not None:
        check_tensor_count(count_multimodal(layout, msg), max_tensors)
    return multimodal_tensors(layout, msg, payloads=payloads)


def check_tensor_count(n: int, limit: int) -> None:
    """Refuse a request with more tensors than ``limit`` before any is looked at."""
    if n > limit:
        raise TooManyTensorsError("too many tensors in one request", tensors=n, limit=limit)


def count_multimodal(layout: Layout, msg: Any) -> int:
    """How many TensorData a parsed ``MultimodalInputs`` holds, without building anything."""
    if layout is Layout.VLLM:
        return int(msg.HasField("pixel_values")) + len(msg.model_specific_tensors)
    return sum(int(it.HasField("encoder_input")) + len(it.model_specific_tensors) for it in msg.items)


def multimodal_tensors(
    layout: Layout, msg: Any, prefix: str = "", payloads: dict[bytes, memoryview] | None = None
) -> list[InTensor]:
    """Every TensorData of a parsed ``MultimodalInputs``, keyed by where it sits."""
    out: list[InTensor] = []

    def add(key: str, td: Any) -> None:
        out.append(from_tensor_data(key, td, payloads))

    if layout is Layout.VLLM:
        if msg.HasField("pixel_values"):
            add(f"{prefix}pixel_values", msg.pixel_values)
        for k in sorted(msg.model_specific_tensors):
            add(f"{prefix}model_specific_tensors[{k}]", msg.model_specific_tensors[k])
        return out
    for i, item in enumerate(msg.items):
        p = f"{prefix}items[{i}]"
        if item.HasField("encoder_input"):
            add(f"{p}.encoder_input", item.encoder_input)
        for k in sorted(item.model_specific_tensors):
            add(f"{p}.model_specific_tensors[{k}]", item.model_specific_tensors[k])
    return out


def generate_tensors(layout: Layout, request: Any, payloads: dict[bytes, memoryview] | None = None) -> list[InTensor]:
    """Every TensorData of an engine ``GenerateRequest``: vLLM ``mm_inputs`` then each
    ``extra_mm_inputs[i]`` (keys prefixed so), TokenSpeed every item of ``mm_inputs``."""
    out: list[InTensor] = []
    if request.HasField("mm_inputs"):
        out.extend(multimodal_tensors(layout, request.mm_inputs, payloads=payloads))
    if layout is Layout.VLLM:
        for i, extra in enumerate(request.extra_mm_inputs):
            out.extend(multimodal_tensors(layout, extra, f"extra_mm_inputs[{i}].", payloads))
    return out


def count_generate_tensors(layout: Layout, request: Any) -> int:
    """How many TensorData a GenerateRequest carries, without building anything."""
    n = count_multimodal(layout, request.mm_inputs) if request.HasField("mm_inputs") else 0
    if layout is Layout.VLLM:
        n += sum(count_multimodal(layout, m) for m in request.extra_mm_inputs)
    return n
