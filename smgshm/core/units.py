"""Numbers for people and from people: sizes, rates, durations; ``64MiB`` and ``250ms`` parsed.

One style each, used by every command (JSON carries the raw numbers: bytes as integers):
- a size is binary: whole bytes below 1 KiB, then one decimal in the largest unit that keeps
  the number below 1024 (``512 B``, ``1.5 KiB``, ``4.6 MiB``, ``23.5 GiB``, ``1.0 TiB``);
- a rate is a size per second (``1.5 GiB/s``);
- a duration is ``0.25 ms`` / ``12.5 ms`` below a second, ``3.4 s`` below ten, then whole
  units in two parts at most (``42 s``, ``2 min 5 s``, ``3 h 4 min``, ``5 d 3 h``);
- a value not known yet is ``?``, never a zero that would read as a measurement.
"""

from __future__ import annotations

import math
import re

_KIB, _MIB, _GIB = 1024, 1024**2, 1024**3

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": _KIB,
    "mib": _MIB,
    "gib": _GIB,
}
_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
MAX_DURATION_S = 30 * 86400.0  # a timeout or a soak longer than this is a typo, and gRPC cannot take inf
UNKNOWN = "?"
_BINARY = ("KiB", "MiB", "GiB", "TiB")


def human_size(n: float | None) -> str:
    """Bytes for people: '512 B', '1.5 KiB', '4.6 MiB', '23.5 GiB'; None (not known) is '?'."""
    if n is None:
        return UNKNOWN
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in _BINARY:
        value /= 1024
        # Decided on the rounded figure: 1 MiB - 1 is '1.0 MiB', never '1024.0 KiB'.
        if abs(round(value, 1)) < 1024 or unit == _BINARY[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("not reached: TiB takes the rest")


def human_rate(bytes_per_s: float | None) -> str:
    """Bytes per second for people: ``human_size`` per second ('1.5 GiB/s'); None is '?'."""
    return UNKNOWN if bytes_per_s is None else f"{human_size(bytes_per_s)}/s"


def human_gb_per_s(gb_per_s: float | None) -> str:
    """A figure the library keeps in GB/s (1e9 bytes, the JSON's ``*_gb_per_s``) said as ``human_rate``."""
    return human_rate(None if gb_per_s is None else gb_per_s * 1e9)


def human_duration(seconds: float | None) -> str:
    """Time for people: '0.25 ms', '12.5 ms', '3.4 s', '42 s', '2 min 5 s', '3 h 4 min', '5 d 3 h'; None '?'."""
    if seconds is None or not math.isfinite(seconds):
        return UNKNOWN
    if seconds < 0:  # a clock step can make an age negative
        return "-" + human_duration(-seconds)
    if seconds == 0:  # an age of whole seconds, just made: not a measurement to two decimals
        return "0 s"
    ms = seconds * 1e3
    if round(ms, 2) < 10:
        return f"{ms:.2f} ms"
    if round(ms, 1) < 1000:
        return f"{ms:.1f} ms"
    if round(seconds, 1) < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for big, big_name, small, small_name in ((86400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s")):
        if whole >= big:
            a, rest = divmod(whole, big)
            b = rest // small
            return f"{a} {big_name}" + (f" {b} {small_name}" if b else "")
    return f"{whole} s"


def human_ms(ms: float | None) -> str:
    """``human_duration`` of a figure the library keeps in milliseconds (the JSON's ``*_ms``)."""
    return human_duration(None if ms is None else ms / 1e3)


def gb_per_s(nbytes: float, ns: float) -> float:
    """Bytes over nanoseconds, which is GB/s (GB = 1e9 bytes, the JSON's unit); 0.0 when no time passed."""
    return nbytes / ns if ns else 0.0


# Parsing what people type.


def parse_size(text: str) -> int:
    """'4096', '64KiB', '16MiB', '1GB', '1.5g' -> bytes; ValueError says what went wrong."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size (examples: 4096, 64KiB, 16MiB, 1GB)")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value >= 2**63:  # "9" * 400 is a float overflow, not a size
        raise ValueError(f"{text!r} is too large a size")
    return int(value)


def parse_duration(text: str) -> float:
    """Seconds, or Go-style '250ms', '2s', '1m', '1h' -> seconds; at most 30 days."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (examples: 250ms, 2s, 1.5)")
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than the longest duration accepted (30 days)")
    return seconds


__all__ = [
    "MAX_DURATION_S",
    "UNKNOWN",
    "gb_per_s",
    "human_duration",
    "human_gb_per_s",
    "human_ms",
    "human_rate",
    "human_size",
    "parse_duration",
    "parse_size",
]
