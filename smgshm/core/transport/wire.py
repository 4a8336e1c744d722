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

from smgshm.core.engines import Engine, engine_named
from smgshm.core.errors import TooManyTensorsError, WireError
from smgshm.core.segments.io import ShmRef
from smgshm.core.transport.protowire import as_on_the_wire, excise, inline_target, resolve


class Layout(enum.Enum):
    """Which engine's ``MultimodalInputs`` carries the tensors: one per SHM engine of the table
    (``engines.SHM_ENGINES``; tests/test_engines.py holds them equal)."""

    VLLM = "vllm"
    TOKENSPEED = "tokenspeed"

    @property
    def engine(self) -> Engine:
        """The engine's row: where its messages keep their tensors."""
        return engine_named(self.value)


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
    return layout.engine.pb2()


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
    """The engine's ``MultimodalInputs`` message for ``req`` (an engine with items: one item)."""
    pb, e = engine_pb2(layout), layout.engine
    holder = pb.MultimodalItem() if e.mm_items else pb.MultimodalInputs()
    if req.primary is not None:
        getattr(holder, e.primary_tensor).CopyFrom(to_tensor_data(layout, req.primary))
    for k, t in req.extras.items():
        holder.model_specific_tensors[k].CopyFrom(to_tensor_data(layout, t))
    return pb.MultimodalInputs(items=[holder]) if e.mm_items else holder


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
    layout: Layout, cls: Any, raw: bytes | memoryview, max_tensors: int | None = None
) -> tuple[Any, dict[bytes, memoryview] | None]:
    """Parse an engine ``GenerateRequest`` or ``MultimodalInputs`` (``cls``) with its inline
    payloads left in ``raw`` (protowire); WireError when protobuf cannot parse it.

    With ``max_tensors``, TooManyTensorsError first when it carries more TensorData than
    that, counted as sent: a map key given twice is two tensors to count, though protobuf's
    map keeps one (the cost of a request is in what it carries)."""
    from google.protobuf.message import DecodeError

    try:
        target = inline_target(engine_pb2(layout))
        cap = None if max_tensors is None else (target[0], max_tensors)  # sent TensorData: never fewer than counted
        body, payloads = excise(cls, raw, frozenset({target}), cap)
        if max_tensors is not None:
            check_tensor_count(_COUNTS[cls.DESCRIPTOR.name](layout, as_on_the_wire(cls).FromString(body)), max_tensors)
        msg = cls()
        msg.ParseFromString(body)
    except DecodeError as err:
        name = cls.DESCRIPTOR.name
        raise WireError(f"cannot parse {layout.value} {name}", nbytes=memoryview(raw).nbytes) from err
    return msg, payloads


def parse_multimodal(layout: Layout, raw: bytes | memoryview, max_tensors: int | None = None) -> list[InTensor]:
    """Every TensorData in a serialized ``MultimodalInputs``, keyed by where it sits; inline
    payloads are views into ``raw``."""
    msg, payloads = parse_excised_message(layout, engine_pb2(layout).MultimodalInputs, raw, max_tensors)
    return multimodal_tensors(layout, msg, payloads=payloads)


def check_tensor_count(n: int, limit: int) -> None:
    """Refuse a request with more tensors than ``limit`` before any is looked at."""
    if n > limit:
        raise TooManyTensorsError("too many tensors in one request", tensors=n, limit=limit)


def _holders(layout: Layout, msg: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(key prefix, message) of each part of a ``MultimodalInputs`` that holds tensors: the
    message itself, or each of its items."""
    if layout.engine.mm_items:
        return [(f"{prefix}items[{i}].", item) for i, item in enumerate(msg.items)]
    return [(prefix, msg)]


def count_multimodal(layout: Layout, msg: Any) -> int:
    """How many TensorData a parsed ``MultimodalInputs`` holds, without building anything."""
    primary = layout.engine.primary_tensor
    return sum(int(h.HasField(primary)) + len(h.model_specific_tensors) for _, h in _holders(layout, msg))


def multimodal_tensors(
    layout: Layout, msg: Any, prefix: str = "", payloads: dict[bytes, memoryview] | None = None
) -> list[InTensor]:
    """Every TensorData of a parsed ``MultimodalInputs``, keyed by where it sits."""
    primary = layout.engine.primary_tensor
    out: list[InTensor] = []
    for p, h in _holders(layout, msg, prefix):
        if h.HasField(primary):
            out.append(from_tensor_data(f"{p}{primary}", getattr(h, primary), payloads))
        for k in sorted(h.model_specific_tensors):
            out.append(from_tensor_data(f"{p}model_specific_tensors[{k}]", h.model_specific_tensors[k], payloads))
    return out


def generate_tensors(layout: Layout, request: Any, payloads: dict[bytes, memoryview] | None = None) -> list[InTensor]:
    """Every TensorData of an engine ``GenerateRequest``: ``mm_inputs``, then, where the engine has
    them, each ``extra_mm_inputs[i]`` (keys prefixed so)."""
    out: list[InTensor] = []
    if request.HasField("mm_inputs"):
        out.extend(multimodal_tensors(layout, request.mm_inputs, payloads=payloads))
    if layout.engine.extra_mm_inputs:
        for i, extra in enumerate(request.extra_mm_inputs):
            out.extend(multimodal_tensors(layout, extra, f"extra_mm_inputs[{i}].", payloads))
    return out


def count_generate_tensors(layout: Layout, request: Any) -> int:
    """How many TensorData a GenerateRequest carries, without building anything."""
    n = count_multimodal(layout, request.mm_inputs) if request.HasField("mm_inputs") else 0
    if layout.engine.extra_mm_inputs:
        n += sum(count_multimodal(layout, m) for m in request.extra_mm_inputs)
    return n


_COUNTS = {"GenerateRequest": count_generate_tensors, "MultimodalInputs": count_multimodal}
