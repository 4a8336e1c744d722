"""Receipts of Generate traffic: what a gateway sent the stand-in worker, tensor by tensor.

``serve`` keeps them in a bounded ring (``ReceiptRing``) and serves them through the
Diagnostics RPCs ``Receipts`` and ``WatchReceipts``; ``fetch_receipts`` reads them back.
``receipt_as`` is the one mapping between the forms a receipt takes.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import Any, TypeVar

from smgshm.core.errors import TransportError

T = TypeVar("T")

RING_SIZE = 4096  # receipts kept; older ones are dropped (and counted as dropped)
MAX_PER_CALL = 1000  # receipts one Receipts call returns at most


@dataclass(frozen=True)
class GenerateReceipt:
    """One tensor of one Generate request, as the worker read it."""

    request_id: str
    engine: str
    key: str
    payload_kind: str  # inline | shm | remote | unset
    dtype: str
    shape: tuple[int, ...]
    nbytes: int = 0
    shm_name: str = ""
    shm_owner_id: str = ""
    digest_algo: str = ""
    digest: bytes = b""
    read_ns: int = 0
    decode_ns: int = 0
    unlinked: bool = False
    age_ns: int = 0  # receive time minus the nanos in the segment's name; 0 when unknown
    received_unix_ns: int = 0
    reader: str = ""
    error_code: str = ""
    error_message: str = ""
    seq: int = 0  # assigned by ReceiptRing.add

    @property
    def ok(self) -> bool:
        return not self.error_code

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: the digest in hex, the shape as a list."""
        doc = asdict(self)
        doc["digest"] = self.digest.hex()
        doc["shape"] = list(self.shape)
        return doc


class ReceiptRing:
    """A bounded, thread-safe ring of receipts with increasing ``seq``; whoever subscribes is
    told after each ``add`` (WatchReceipts waits for that, it never polls)."""

    def __init__(self, size: int = RING_SIZE, sink: Callable[[GenerateReceipt], None] | None = None) -> None:
        self._ring: collections.deque[GenerateReceipt] = collections.deque(maxlen=size)
        self._lock = threading.Lock()
        self._seq = 0
        self._sink = sink
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every ``add``, from the adding thread."""
        with self._lock:
            self._listeners.append(listener)

    def add(self, receipts: list[GenerateReceipt]) -> list[GenerateReceipt]:
        """Number the receipts (seq is assigned here, so the ring is always in seq order) and keep them."""
        with self._lock:
            numbered = []
            for r in receipts:
                self._seq += 1
                numbered.append(replace(r, seq=self._seq))
            self._ring.extend(numbered)
            listeners = list(self._listeners)
        for listener in listeners:
            listener()
        if self._sink is not None:
            for r in numbered:
                self._sink(r)
        return numbered

    def after(self, after_seq: int, limit: int = MAX_PER_CALL) -> tuple[list[GenerateReceipt], int, int]:
        """(receipts with seq > after_seq, next after_seq, how many had already been dropped)."""
        with self._lock:
            out = [r for r in self._ring if r.seq > after_seq][: max(1, limit)]
            oldest = self._ring[0].seq if self._ring else self._seq + 1
            dropped = max(0, oldest - after_seq - 1) if after_seq < oldest else 0
            nxt = out[-1].seq if out else max(after_seq, self._seq)
            return out, nxt, dropped


def _values(r: Any) -> dict[str, Any]:
    """A receipt's values by field name, whatever its form; its error as error_code/error_message."""
    if is_dataclass(type(r)):  # asked of its class: is_dataclass(r) would type r as any dataclass
        values = {f.name: getattr(r, f.name) for f in fields(r)}
        values["digest_algo"] = r.digest_algo  # the reader's Receipt derives it from its digest
        return values
    values = {f.name: getattr(r, f.name) for f in r.DESCRIPTOR.fields if f.name != "error"}
    values["shape"] = tuple(int(d) for d in r.shape)
    err = r.error if r.HasField("error") else None
    values["error_code"], values["error_message"] = (err.code, err.message) if err else ("", "")
    return values


def receipt_as(target: type[T], r: Any, **extra: Any) -> T:
    """Receipt ``r`` in another form: ``target`` is a receipt dataclass (the reader's ``Receipt``,
    ``GenerateReceipt``) or a Diagnostics message class (``TensorReceipt``, ``GenerateReceipt``).

    The one mapping between them: the forms name what they share alike, so every field of
    ``target`` that ``r`` has is taken by name, then ``extra`` (what ``r`` does not know, such as
    the request id). The error is error_code/error_message on a dataclass and the ``error``
    sub-message on the wire.
    """
    cls: Any = target
    wire = not is_dataclass(cls)
    names = list(cls.DESCRIPTOR.fields_by_name) if wire else [f.name for f in fields(cls)]
    unknown = set(extra) - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
    values = _values(r) | extra
    made = cls(**{n: values[n] for n in names if n in values and n != "error"})
    if wire and values["error_code"]:
        err = made.error
        err.code, err.message = values["error_code"], values["error_message"]
    out: T = made
    return out


def to_proto(r: GenerateReceipt) -> Any:
    from smgshm.rpc.v1 import diag_pb2

    return receipt_as(diag_pb2.GenerateReceipt, r)


def from_proto(m: Any) -> GenerateReceipt:
    return receipt_as(GenerateReceipt, m)


def _rpc_error(err: Any, target: str) -> TransportError:
    import grpc

    code = err.code() if hasattr(err, "code") else None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return TransportError("not a smgshm serve with receipts (Receipts is unimplemented)", endpoint=target)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TransportError("deadline exceeded reading receipts", endpoint=target)
    return TransportError(f"cannot read receipts: {code.name if code else err}", endpoint=target)


def fetch_receipts(address: str, after_seq: int = 0, timeout_s: float = 5.0) -> tuple[list[GenerateReceipt], int]:
    """The receipts a smgshm serve holds with seq > ``after_seq``, and the after_seq for next time.

    Pages through the server's per-call cap, all within one ``timeout_s`` deadline.
    TransportError when the address is unreachable or is not a smgshm serve.
    """
    import time

    import grpc

    from smgshm.core.transport.channel import open_channel
    from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

    deadline = time.monotonic() + timeout_s
    channel = open_channel(address, timeout_s)
    out: list[GenerateReceipt] = []
    try:
        stub = diag_pb2_grpc.DiagnosticsStub(channel)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError("deadline exceeded reading receipts", endpoint=address)
            try:
                resp = stub.Receipts(diag_pb2.ReceiptsRequest(after_seq=after_seq, max=MAX_PER_CALL), timeout=left)
            except grpc.RpcError as err:
                raise _rpc_error(err, address) from None
            out.extend(from_proto(m) for m in resp.receipts)
            if not resp.receipts or int(resp.next_seq) <= after_seq:
                return out, max(after_seq, int(resp.next_seq))
            after_seq = int(resp.next_seq)
    finally:
        channel.close()
