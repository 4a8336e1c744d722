"""The stand-in worker's Generate, without gRPC: read every tensor, keep a receipt for each.

``services`` calls ``read_generate`` from its vLLM and TokenSpeed ``Generate`` handlers
and turns the outcome into the engine's stream (one chunk when asked, then a complete).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from smgshm.core.errors import WireError
from smgshm.core.names import parse_name
from smgshm.core.receiver.reader import Receipt, ReceiverConfig, check_tensor, receive_one
from smgshm.core.receiver.receipts import GenerateReceipt, ReceiptRing, receipt_as
from smgshm.core.transport.wire import (
    InTensor,
    Layout,
    check_tensor_count,
    count_generate_tensors,
    engine_pb2,
    generate_tensors,
    parse_excised_message,
)


@dataclass(frozen=True)
class GenerateOutcome:
    """What one Generate carried, and how many prompt tokens it had."""

    request_id: str
    receipts: list[GenerateReceipt]
    prompt_tokens: int

    @property
    def refused(self) -> list[GenerateReceipt]:
        return [r for r in self.receipts if not r.ok]


def segment_age_ns(name: str, now_ns: int) -> int:
    """``now_ns`` minus the creation nanos in an SMG segment name; 0 when it has none."""
    nanos = parse_name(name).nanos
    if nanos is None:
        return 0
    return max(0, now_ns - nanos)


def _to_generate_receipt(r: Receipt, t: InTensor, request_id: str, engine: str, now_ns: int) -> GenerateReceipt:
    return receipt_as(
        GenerateReceipt,
        r,
        request_id=request_id,
        engine=engine,
        shm_owner_id=t.shm_owner_id,
        age_ns=segment_age_ns(t.shm_name, now_ns) if t.kind == "shm" else 0,
        received_unix_ns=now_ns,
    )


def parse_and_read(layout: Layout, raw: bytes, cfg: ReceiverConfig, ring: ReceiptRing) -> tuple[Any, GenerateOutcome]:
    """Parse a serialized GenerateRequest and read it: (request, outcome). WireError when unparseable,
    TooManyTensorsError (before it is parsed) when it carries more than ``cfg.max_tensors``.

    Inline payloads are read in place from ``raw`` (``protowire``): the parsed request holds
    markers, never a copy of them."""
    request, payloads = parse_excised_message(layout, engine_pb2(layout).GenerateRequest, raw, cfg.max_tensors)
    return request, read_generate(layout, request, cfg, ring, payloads)


def prompt_tokens(layout: Layout, request: Any) -> int:
    if layout.engine.text_input and request.WhichOneof("input") != "tokenized":
        return 0
    return len(request.tokenized.input_ids)


def check_generate(layout: Layout, request: Any) -> None:
    """The refusals the engine's servicer makes before reading anything (its segments stay unread):
    vLLM's, media_refs with mm_inputs."""
    if layout.engine.media_refs and request.HasField("media_refs") and request.HasField("mm_inputs"):
        raise WireError("media_refs and mm_inputs are mutually exclusive")


def read_generate(
    layout: Layout,
    request: Any,
    cfg: ReceiverConfig,
    ring: ReceiptRing,
    payloads: dict[bytes, memoryview] | None = None,
) -> GenerateOutcome:
    """Read every tensor of ``request`` through the receiver's reader; receipts go to ``ring``.

    ``payloads``: the request was parsed by ``protowire.parse_excised``, whose markers name
    the inline payloads' views into the serialized request.
    """
    check_generate(layout, request)
    check_tensor_count(count_generate_tensors(layout, request), cfg.max_tensors)
    request_id = str(request.request_id)
    tensors = generate_tensors(layout, request, payloads)
    # Every tensor is checked before any is read: a bad one never follows consumed good ones.
    checked = [check_tensor(t, cfg) for t in tensors]
    out: list[GenerateReceipt] = []
    for t, bad in zip(tensors, checked, strict=True):
        now = time.time_ns()
        out.append(_to_generate_receipt(bad or receive_one(t, cfg), t, request_id, layout.value, now))
    return GenerateOutcome(request_id, ring.add(out), prompt_tokens(layout, request))
