"""Parse a serialized message with protobuf, its big bytes fields left where they are.

protobuf copies a bytes field twice on the way in (its parse, then every field access).
``parse_excised`` walks the serialized message (driven by its descriptor, only into the
fields that can lead to a target), replaces the value of every target bytes field
(``TensorData.inline``, ``ReceiveRequest.multimodal_inputs``) with a short marker of its
own, and hands that much smaller message to protobuf. The marker protobuf keeps names the
payload's view into the original bytes, so every merge or override rule (a field given
twice, a oneof arm set twice, a repeated singular message, a map key given twice) is
protobuf's own, never re-implemented here. What the walk cannot follow exactly (a group,
more than ``MAX_FIELDS`` fields, nesting deeper than ``MAX_DEPTH``, a truncated field) is
parsed by protobuf as sent: the same message, or the same DecodeError, only with its copies.

``as_on_the_wire`` reads a message as it was sent, every map a list of its entries: what a
request carries is counted there (a map key given 5000 times is one entry to protobuf's map,
and 5000 to whoever counts the cost of the request).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from smgshm.core.errors import TooManyTensorsError

_LEN = 2  # wire type of length-delimited fields
MAX_FIELDS = 1 << 16  # fields walked in Python per message (~0.1 s); beyond, protobuf's own (C) parse
MAX_DEPTH = 32  # the engines' messages nest 5 deep down to a TensorData

Target = tuple[str, int]  # (a message's full name, the number of one of its bytes fields)


class _NotExactError(Exception):
    """The walk cannot follow this encoding exactly; protobuf parses it as sent."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _NotExactError
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _leads_to_target(desc: Any, targets: frozenset[Target], memo: dict[str, bool]) -> bool:
    """Can a field of ``desc``, at any depth, be a target? Worked out for every type reachable
    from ``desc`` at once (a fixpoint): a type judged while a cycle through it was still open
    (A -> B -> A, before A's own target field) must not keep that provisional False."""
    if desc.full_name not in memo:
        reach: dict[str, Any] = {}
        todo = [desc]
        while todo:
            d = todo.pop()
            if d.full_name not in reach and d.full_name not in memo:
                reach[d.full_name] = d
                todo += [f.message_type for f in d.fields if f.message_type is not None]
        leads = {n: any((n, f.number) in targets for f in d.fields) for n, d in reach.items()}
        changed = True
        while changed:
            changed = False
            for n, d in reach.items():
                subs = (f.message_type.full_name for f in d.fields if f.message_type is not None)
                if not leads[n] and any(leads.get(m) or memo.get(m) for m in subs):
                    leads[n] = changed = True
        memo.update(leads)
    return memo[desc.full_name]


class _Walk:
    def __init__(self, targets: frozenset[Target], cap: tuple[str, int] | None = None) -> None:
        self.targets = targets
        self.memo: dict[str, bool] = {}
        self.payloads: dict[bytes, memoryview] = {}
        self.fields = 0
        self.cap = cap  # (a message's full name, how many of it may be sent)
        self.seen = 0  # messages of the capped type walked into, as sent

    def _count(self, name: str) -> None:
        """A message ``name`` walked into: past the cap of its type, refused here, before the rest is walked
        or anything is parsed."""
        if self.cap is None or name != self.cap[0]:
            return
        self.seen += 1
        if self.seen > self.cap[1]:
            raise TooManyTensorsError(
                f"too many tensors in one request: more than {self.cap[1]} sent (refused at the "
                f"{self.seen}th, before the rest was read)",
                limit=self.cap[1],
            )

    def message(self, desc: Any, buf: memoryview, depth: int) -> list[bytes | memoryview] | None:
        """``buf`` as pieces with every target value replaced by a marker; None when unchanged."""
        if depth > MAX_DEPTH:
            raise _NotExactError
        name = desc.full_name
        self._count(name)
        pieces: list[bytes | memoryview] = []
        changed = False
        kept = pos = 0  # buf[kept:field start] is still to be copied as it is
        while pos < len(buf):
            self.fields += 1
            if self.fields > MAX_FIELDS:
                raise _NotExactError
            tag, pos = _varint(buf, pos)
            num, wt = tag >> 3, tag & 7
            if wt == 0:
                _, pos = _varint(buf, pos)
            elif wt == 1:
                pos += 8
            elif wt == 5:
                pos += 4
            elif wt == _LEN:
                head = pos
                n, pos = _varint(buf, pos)
                if pos + n > len(buf):
                    raise _NotExactError
                value, end = buf[pos : pos + n], pos + n
                new: Iterable[bytes | memoryview] | None = None
                if (name, num) in self.targets:
                    marker = b"%d" % len(self.payloads)
                    self.payloads[marker] = value
                    new = (marker,)
                else:
                    field = desc.fields_by_number.get(num)
                    sub = field.message_type if field is not None else None
                    if sub is not None and _leads_to_target(sub, self.targets, self.memo):
                        new = self.message(sub, value, depth + 1)
                if new is not None:
                    new = list(new)
                    pieces += [buf[kept:head], _encode_varint(sum(len(p) for p in new)), *new]
                    kept, changed = end, True
                pos = end
            else:
                raise _NotExactError  # groups (3, 4) and invalid wire types: protobuf decides
            if pos > len(buf):
                raise _NotExactError
        if not changed:
            return None
        pieces.append(buf[kept:])
        return pieces


def excise(
    cls: Any, raw: bytes | memoryview, targets: frozenset[Target], cap: tuple[str, int] | None = None
) -> tuple[bytes, dict[bytes, memoryview] | None]:
    """(what protobuf is to parse as a ``cls``, the target payloads by marker as views into ``raw``).

    Every target field of the first holds a marker, the key of its payload in the dict; the
    dict is None when the walk cannot follow ``raw`` exactly and the first is ``raw`` as sent.
    ``cap``: (a message type on the way to a target, N): TooManyTensorsError as soon as the walk meets
    the N+1st sent (a map key given 9M times is refused at its 1025th entry, not after protobuf built it).
    """
    buf = memoryview(raw).cast("B")
    walk = _Walk(targets, cap)
    try:
        pieces = walk.message(cls.DESCRIPTOR, buf, 0)
    except _NotExactError:
        return (raw if isinstance(raw, bytes) else bytes(buf)), None
    if pieces is None:  # no target in it: nothing excised, nothing to copy either
        return (raw if isinstance(raw, bytes) else bytes(buf)), walk.payloads
    return b"".join(pieces), walk.payloads


def parse_excised(
    cls: Any, raw: bytes | memoryview, targets: frozenset[Target]
) -> tuple[Any, dict[bytes, memoryview] | None]:
    """(the parsed message, its target payloads by marker as views into ``raw``).

    Every target field of the message holds a marker, the key of its payload in the dict;
    the dict is None when protobuf parsed ``raw`` as sent (target fields hold their bytes).
    Raises protobuf's DecodeError exactly when ``cls.FromString(raw)`` would.
    """
    body, payloads = excise(cls, raw, targets)
    msg = cls()
    msg.ParseFromString(body)
    return msg, payloads


@functools.cache
def _pool_without_maps(file: Any) -> Any:
    """A descriptor pool with ``file`` and its imports, every map entry type a plain message."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(fd: Any) -> None:
        if fd.name in added:
            return
        for dep in fd.dependencies:
            add(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        todo = list(proto.message_type)
        while todo:
            m = todo.pop()
            m.options.ClearField("map_entry")  # the same wire form: a repeated entry message
            todo += m.nested_type
        pool.Add(proto)
        added.add(fd.name)

    add(file)
    return pool


def as_on_the_wire(cls: Any) -> Any:
    """``cls`` with every map field read as the list of entries sent (protobuf's map keeps one per
    key, the last): parse with it to count what a message carries, not what protobuf keeps."""
    from google.protobuf import message_factory

    desc = cls.DESCRIPTOR
    return message_factory.GetMessageClass(_pool_without_maps(desc.file).FindMessageTypeByName(desc.full_name))


def resolve(marker: bytes, payloads: dict[bytes, memoryview] | None) -> bytes | memoryview:
    """A target field's value: its payload's view, or the bytes themselves when not excised."""
    if payloads is None or not marker:  # not excised, or a field that was never set
        return marker
    view = payloads.get(marker)
    if view is None:  # every target value is a marker of this walk; anything else is a bug
        raise AssertionError(f"no excised payload under marker {marker[:16]!r}")
    return view


def inline_target(pb: Any) -> Target:
    """``(TensorData's full name, the number of its inline field)`` in an engine's pb2 module."""
    d = pb.TensorData.DESCRIPTOR
    return d.full_name, d.fields_by_name["inline"].number
