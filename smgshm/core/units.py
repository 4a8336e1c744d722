"""Numbers for people and from people: sizes, durations, rates; ``64MiB`` and ``250ms`` parsed.

Every size style smgshm prints is one named function here. They differ today (binary
``4.6 MiB`` in gc, watch and the CLI; ``4,710.2 MiB`` in doctor's host checks; whole
``24105 MiB`` in doctor's shm dir check; decimal ``4.8 MB`` in e2e and the gateway's mode),
and each is kept byte for byte as its callers printed it: issue #23 unifies them.
"""

from __future__ import annotations

import math
import re

_KIB, _MIB, _GIB = 1024, 1024**2, 1024**3

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": _KIB, "mib": _MIB, "gib": _GIB,
}  # fmt: skip
_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
MAX_DURATION_S = 30 * 86400.0  # a timeout or a soak longer than this is a typo, and gRPC cannot take inf


# Sizes. Issue #23 unifies these styles into one; until then each keeps its callers' output.


def binary_size(n: int) -> str:
    """1536 -> '1.5 KiB', 512 -> '512 B': one decimal from KiB up to TiB (the CLI's, gc's, watch's style)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # not reached: TiB takes the rest


def mib_size(n: float) -> str:
    """'0.5 MiB', '4,710.2 MiB' below 1 GiB, '1.5 GiB' from there (doctor's host checks' style)."""
    return f"{n / _MIB:,.1f} MiB" if n < _GIB else f"{n / _GIB:,.1f} GiB"


def whole_mib(n: float) -> str:
    """'24105 MiB': whole MiB however large (doctor's shm dir check)."""
    return f"{n / _MIB:.0f} MiB"


def whole_kib(n: float) -> str:
    """'64 KiB': whole KiB however large (the gateway's inline average)."""
    return f"{n / _KIB:.0f} KiB"


def decimal_mb(n: float) -> str:
    """'4.8 MB' (1e6 bytes), however small (the gateway's mode finding)."""
    return f"{n / 1e6:.1f} MB"


def decimal_size(n: float) -> str:
    """'4.8 MB' from 100 kB up, '95.0 kB' below (e2e's verdict)."""
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


# Durations and rates.


def short_duration(seconds: float) -> str:
    """'42s', '1.5m', '2.0h', '3.1d': an age or a run's length in one short word."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def binary_rate(bytes_per_s: float) -> str:
    """'1.5 MiB/s': ``binary_size`` per second (whole bytes)."""
    return f"{binary_size(int(bytes_per_s))}/s"


def gb_per_s(nbytes: float, ns: float) -> float:
    """Bytes over nanoseconds, which is GB/s (GB = 1e9 bytes); 0.0 when no time passed."""
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
    "binary_rate",
    "binary_size",
    "decimal_mb",
    "decimal_size",
    "gb_per_s",
    "mib_size",
    "parse_duration",
    "parse_size",
    "short_duration",
    "whole_kib",
    "whole_mib",
]
