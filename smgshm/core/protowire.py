"""Where a GenerateRequest's inline tensor payloads sit in its serialized bytes, without copying.

protobuf copies a bytes field twice on the way in (its parse, then every field access);
serve reads inline payloads as views into the message's own bytes instead, so a 200 MiB
inline tensor costs the message and protobuf's parse, not five copies. The walk is exact
only for a canonical encoding: any field that appears twice where protobuf would merge or
override it makes ``inline_views`` return None, and the caller falls back to protobuf's copy.
"""

from __future__ import annotations

from collections.abc import Iterator

from smgshm.core.wire import Layout

_LEN = 2  # wire type of length-delimited fields


class _MalformedError(Exception):
    pass


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _MalformedError
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int, memoryview | None]]:
    """(field number, wire type, the value's bytes for length-delimited fields, else None)."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            _, pos = _varint(buf, pos)
            yield num, wt, None
        elif wt == 1:
            pos += 8
            yield num, wt, None
        elif wt == 5:
            pos += 4
            yield num, wt, None
        elif wt == _LEN:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise _MalformedError
            yield num, wt, buf[pos : pos + n]
            pos += n
        else:
            raise _MalformedError  # groups: not in these messages
        if pos > len(buf):
            raise _MalformedError


def _once(buf: memoryview, wanted: dict[int, str]) -> dict[str, memoryview]:
    """Length-delimited fields by name; one that appears twice cannot be read exactly."""
    out: dict[str, memoryview] = {}
    for num, wt, val in _fields(buf):
        name = wanted.get(num)
        if name is None:
            continue
        if wt != _LEN or val is None or name in out:
            raise _MalformedError
        out[name] = val
    return out


def _inline(td: memoryview, field: int) -> memoryview | None:
    return _once(td, {field: "inline"}).get("inline")


def _map(buf: memoryview, field: int) -> dict[str, memoryview]:
    """A map<string, message> field's entries (a key given twice: not exact, refuse)."""
    out: dict[str, memoryview] = {}
    for num, wt, val in _fields(buf):
        if num != field:
            continue
        if wt != _LEN or val is None:
            raise _MalformedError
        entry = _once(val, {1: "key", 2: "value"})
        key = bytes(entry.get("key", b"")).decode("utf-8")
        if key in out:
            raise _MalformedError
        out[key] = entry.get("value", memoryview(b""))
    return out


def _put(out: dict[str, memoryview], key: str, td: memoryview, inline_field: int) -> None:
    v = _inline(td, inline_field)
    if v is not None:
        out[key] = v


def _vllm_mm(out: dict[str, memoryview], mm: memoryview, prefix: str) -> None:
    top = _once(mm, {2: "pixel_values"})
    if "pixel_values" in top:
        _put(out, f"{prefix}pixel_values", top["pixel_values"], 1)
    for k, td in _map(mm, 3).items():
        _put(out, f"{prefix}model_specific_tensors[{k}]", td, 1)


def _tokenspeed_mm(out: dict[str, memoryview], mm: memoryview) -> None:
    i = 0
    for num, wt, item in _fields(mm):
        if num != 1:
            continue
        if wt != _LEN or item is None:
            raise _MalformedError
        p = f"items[{i}]"
        top = _once(item, {3: "encoder_input"})
        if "encoder_input" in top:
            _put(out, f"{p}.encoder_input", top["encoder_input"], 3)
        for k, td in _map(item, 4).items():
            _put(out, f"{p}.model_specific_tensors[{k}]", td, 3)
        i += 1


def inline_views(layout: Layout, raw: bytes) -> dict[str, memoryview] | None:
    """Every inline payload of a serialized GenerateRequest, keyed as ``generate_tensors`` keys
    them, as views into ``raw``; None when the encoding is not one this walk reads exactly."""
    buf = memoryview(raw)
    out: dict[str, memoryview] = {}
    try:
        if layout is Layout.VLLM:
            extra = 0
            for num, wt, val in _fields(buf):
                if num not in (7, 11):
                    continue
                if wt != _LEN or val is None:
                    raise _MalformedError
                if num == 7:
                    _vllm_mm(out, val, "")
                else:
                    _vllm_mm(out, val, f"extra_mm_inputs[{extra}].")
                    extra += 1
            mm_count = sum(1 for num, _, _ in _fields(buf) if num == 7)
        else:
            mm_count = 0
            for num, wt, val in _fields(buf):
                if num == 9:
                    if wt != _LEN or val is None:
                        raise _MalformedError
                    mm_count += 1
                    _tokenspeed_mm(out, val)
        if mm_count > 1:  # protobuf merges repeated occurrences of a singular message
            return None
    except (_MalformedError, UnicodeDecodeError):
        return None
    return out
