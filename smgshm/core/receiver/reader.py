"""The reference receiver behind ``smgshm serve``: tensors in, receipts out.

``receive`` is the pure part (no gRPC): it reads each TensorData the way SMG's
servicer does (``mm_shm`` + ``tensor_wire``), only stricter where SMG can hang or
lose data. ``services`` wraps it, and the engine RPCs a gateway calls at
registration, in gRPC servicers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smgshm.core.engines import DEFAULT as DEFAULT_ENGINE
from smgshm.core.errors import HandleError, SegmentError, SmgshmError, WireError
from smgshm.core.host.identity import HostIdentity, read_host_identity
from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.names import in_family, validated_name
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.receiver.faults import FAULTS, MAX_FAULT_DELAY_S
from smgshm.core.receiver.receipts import ReceiptRing
from smgshm.core.segments.io import ReaderMode, check_handle, read_segment
from smgshm.core.transport.tensors import DIGEST_ALGO, check_payload, digest, expected_nbytes, tensor_from_payload
from smgshm.core.transport.wire import InTensor, Layout, parse_multimodal

if TYPE_CHECKING:
    from smgshm.core.receiver.memory import Trimmer
    from smgshm.core.receiver.modeldir import ModelDir

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # SMG's Python servers cap messages here
MODEL_NAME = "smgshm-reference-receiver"
# Checked before anything of a request is read: a hostile request must not hold a worker
# for minutes or fill memory with receipts (SMG's own Generate carries a handful).
MAX_TENSORS_PER_REQUEST = 1024
MAX_NDIM = 32
# WatchReceipts: streams open at once (one more is RESOURCE_EXHAUSTED at once), and how long one
# lasts before it ends (the client resumes with after_seq): an idle watch costs no CPU, but
# each holds a stream, so neither their number nor their life is left to the client.
MAX_WATCHERS = 64
WATCH_MAX_S = 3600.0
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class ReceiverConfig:
    """How the receiver behaves; ``namespace_id`` overrides the computed one (tests, demos)."""

    shm_dir: str = DEFAULT_SHM_DIR
    unlink_after_read: bool = True
    reader: ReaderMode = "view"
    engine: str = DEFAULT_ENGINE  # one of engines.SERVED
    namespace_id: str | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    workers: int = 8
    # The weight-less model directory GetModelInfo describes (written when missing); None
    # answers with smgshm's own model name and no tokenizer.
    model_dir: str | None = None
    # Accept media refs (--mm-processing worker): advertise a worker-side processor and serve
    # the model family the gateway lets a worker process (modeldir.WORKER_MODEL_TYPE).
    worker_processing: bool = False
    fault: str | None = None
    fault_delay_s: float = 2.0  # slow-read: how long Generate and Receive wait before reading (at most 60 s)
    # Read (and unlink) only names in SMG's family (smg-); True emulates SMG's reader, which
    # has no prefix check: then anyone who reaches the port can make it consume any file here.
    any_name: bool = False
    max_tensors: int = MAX_TENSORS_PER_REQUEST
    max_watchers: int = MAX_WATCHERS
    watch_max_s: float = WATCH_MAX_S
    # Called with every Generate receipt, from server threads (serve --log-receipts).
    on_receipt: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise WireError("unknown fault", fault=self.fault, known=",".join(FAULTS))
        if not 0 <= self.fault_delay_s <= MAX_FAULT_DELAY_S:
            raise WireError("fault delay out of range", fault_delay_s=self.fault_delay_s, max_s=MAX_FAULT_DELAY_S)

    def advertised_namespace_id(self) -> str:
        return self.namespace_id if self.namespace_id is not None else read_namespace_id(self.shm_dir)


@dataclass(frozen=True)
class Receipt:
    """What the receiver saw for one tensor."""

    key: str
    payload_kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int = 0
    digest: bytes = b""
    read_ns: int = 0
    decode_ns: int = 0
    unlinked: bool = False
    shm_name: str = ""
    reader: str = ""  # shm only: the read actually made (view falls back to copy without a lease)
    error_code: str = ""
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return not self.error_code

    @property
    def digest_algo(self) -> str:
        """The algorithm of ``digest``; empty when there is none (a refused tensor)."""
        return DIGEST_ALGO if self.digest else ""


def _error_code(err: SmgshmError) -> str:
    if isinstance(err, SegmentError):
        return err.code
    if isinstance(err, HandleError):
        return "invalid_handle"
    if isinstance(err, WireError):
        return "wire"
    return err.kind


def _public_message(err: SmgshmError, t: InTensor) -> str:
    """What a client may learn: the refusal and the handle's own name, never this host's paths,
    file sizes or uid (those go to no one but the server's operator)."""
    if isinstance(err, SegmentError | HandleError):
        return f"{err.what} (name={t.shm_name!r})" if t.kind == "shm" else err.what
    return str(err)  # a WireError's fields are the client's own dtype, shape and sizes


def _base(t: InTensor) -> dict[str, Any]:
    base: dict[str, Any] = {"key": t.key, "payload_kind": t.kind, "dtype": t.dtype, "shape": t.shape}
    if t.kind == "shm":
        base["shm_name"] = t.shm_name
    return base


def check_tensor(t: InTensor, cfg: ReceiverConfig) -> Receipt | None:
    """Everything that can be refused without touching a file: an error receipt, or None.

    dtype, rank, shape (every stride must fit int64: ``[0, 2^32-1, 2^32-1, 2^32-1]`` holds
    no bytes but overflows torch's stride computation), payload size against shape, the
    handle's name and its family. Nothing is opened, read or unlinked here.
    """
    base = _base(t)
    try:
        if t.kind == "remote":
            return Receipt(**base, error_code="remote_unsupported", error_message="remote payloads are not implemented")
        if t.kind not in ("inline", "shm"):
            return Receipt(**base, error_code="payload_missing", error_message="TensorData payload is required")
        itemsize = expected_nbytes((), t.dtype)
        if len(t.shape) > MAX_NDIM:
            raise WireError("too many dimensions", ndim=len(t.shape), limit=MAX_NDIM)
        suffix = itemsize
        for d in reversed(t.shape):
            suffix *= max(d, 1)
            if suffix > _INT64_MAX:
                raise WireError("shape overflows int64 strides", shape=list(t.shape))
        if t.kind == "inline":
            check_payload(t.shape, t.dtype, len(t.inline or b""))
            return None
        check_payload(t.shape, t.dtype, t.shm_nbytes)
        name = validated_name(t.shm_name)
        check_handle(t.shm_offset, t.shm_nbytes)
        if not cfg.any_name and not in_family(name):
            return Receipt(
                **base,
                error_code="foreign_name",
                error_message=f"refused unread: not an SMG segment name (name={t.shm_name!r}; --any-name reads any)",
            )
    except SmgshmError as err:
        return Receipt(**base, error_code=_error_code(err), error_message=_public_message(err, t))
    return None


def receive_one(t: InTensor, cfg: ReceiverConfig) -> Receipt:
    """Check, fetch and decode one tensor; every refusal becomes a receipt, never an exception."""
    return check_tensor(t, cfg) or _fetch(t, cfg)


def receive_all(tensors: list[InTensor], cfg: ReceiverConfig) -> list[Receipt]:
    """Every tensor checked before any is read, so a bad one cannot come after good ones were
    consumed; then the good ones are read, in order. One receipt each."""
    checked = [check_tensor(t, cfg) for t in tensors]
    return [bad or _fetch(t, cfg) for t, bad in zip(tensors, checked, strict=True)]


def _fetch(t: InTensor, cfg: ReceiverConfig) -> Receipt:
    base = _base(t)
    try:
        if t.kind == "inline":
            return _receive_inline(t, base)
        return _receive_shm(t, cfg, base)
    except SmgshmError as err:
        return Receipt(**base, error_code=_error_code(err), error_message=_public_message(err, t))


def _receive_inline(t: InTensor, base: dict[str, Any]) -> Receipt:
    t0 = time.perf_counter_ns()
    raw = t.inline or b""
    check_payload(t.shape, t.dtype, len(raw))
    d = digest(raw)
    t1 = time.perf_counter_ns()
    # A tensor over the message's own bytes, no copy (SMG's tensor_wire copies into a
    # bytearray first: with protobuf's parse and field access that made a 200 MiB inline
    # request cost ~1 GB). ``raw`` is a view into the request gRPC handed over (protowire).
    tensor = tensor_from_payload(raw, t.shape, t.dtype)
    del tensor
    return Receipt(**base, nbytes=len(raw), digest=d, read_ns=t1 - t0, decode_ns=time.perf_counter_ns() - t1)


def _receive_shm(t: InTensor, cfg: ReceiverConfig, base: dict[str, Any]) -> Receipt:
    seg = read_segment(
        t.shm_name, t.shm_offset, t.shm_nbytes, shm_dir=cfg.shm_dir, mode=cfg.reader, unlink=cfg.unlink_after_read
    )
    try:
        t1 = time.perf_counter_ns()
        tensor = tensor_from_payload(seg.data, t.shape, t.dtype)
        decode_ns = time.perf_counter_ns() - t1
        d = digest(seg.data)
        del tensor
    finally:
        seg.release()
    return Receipt(
        **base,
        nbytes=seg.nbytes,
        digest=d,
        read_ns=seg.read_ns,
        decode_ns=decode_ns,
        unlinked=seg.unlinked,
        reader=seg.mode,
    )


def receive(layout: Layout, raw: bytes | memoryview, cfg: ReceiverConfig) -> list[Receipt]:
    """One receipt per TensorData in a serialized engine ``MultimodalInputs``."""
    return receive_all(parse_multimodal(layout, raw, max_tensors=cfg.max_tensors), cfg)


@dataclass
class ReceiverState:
    """Live counters the engine RPCs report, the receipts ring and the model served."""

    cfg: ReceiverConfig
    started: float = field(default_factory=time.time)
    active: int = 0
    last_receive: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    ring: ReceiptRing = field(default_factory=ReceiptRing)
    model: ModelDir | None = None
    stopping: threading.Event = field(default_factory=threading.Event)  # set by stop(): waits end early
    trimmer: Trimmer | None = None  # told of each request's size as it ends (the server's loop)

    def identity(self) -> HostIdentity:
        return read_host_identity(self.cfg.shm_dir)


__all__ = ["DIGEST_ALGO", "MAX_MESSAGE_BYTES", "Receipt", "ReceiverConfig", "ReceiverState", "receive"]
