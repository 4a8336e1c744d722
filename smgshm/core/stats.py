"""Percentiles and medians: of a list (``percentiles``), or streamed in bounded memory (``StreamingQuantiles``).

Lists: one computation, ``percentiles``, with the method named by its caller. The methods
give different answers on the same data and each caller keeps the one it printed before
(issue #23 may settle on one): ``nearest`` (send's and bench's p50/p90/p99), ``linear``
(``statistics.median`` at q=0.5: bench's GB/s, the what-if, e2e) and ``higher`` (e2e's
human "consumed in" median).

Streams: every value lands in a bucket whose bounds grow by a fixed ratio, so a quantile is
known to within that relative error (about 1 % here) however many values went in, while
the memory is the number of distinct buckets touched (at most a few thousand for anything
between a nanosecond and a year). Count, sum, min and max are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal, TypeVar, overload

Method = Literal["nearest", "linear", "higher"]
T = TypeVar("T")


class _Raise:
    """The default of ``empty``: no values is a ValueError."""


_RAISE = _Raise()


@overload
def percentiles(values: Iterable[float], qs: Sequence[float], method: Method) -> list[float]: ...
@overload
def percentiles(values: Iterable[float], qs: Sequence[float], method: Method, *, empty: T) -> list[float | T]: ...
def percentiles(values: Iterable[float], qs: Sequence[float], method: Method, *, empty: object = _RAISE) -> list[Any]:
    """The ``q``-quantiles (0..1) of ``values``, one per ``qs``; with no values, ``empty`` for each, else ValueError.

    On the sorted values ``s`` at position ``p = q * (len(s) - 1)``: ``nearest`` takes
    ``s[round(p)]`` (half to even, as numpy's "nearest"), ``higher`` takes ``s[ceil(p)]``,
    ``linear`` interpolates between its two neighbours (at q=0.5 exactly ``statistics.median``).
    A value that falls on an element is that element, unconverted.
    """
    s = sorted(values)
    if not s:
        if isinstance(empty, _Raise):
            raise ValueError("no values to take a percentile of")
        return [empty for _ in qs]
    last = len(s) - 1
    out: list[float] = []
    for q in qs:
        p = q * last
        if method == "nearest":
            out.append(s[min(last, round(p))])
        elif method == "higher":
            out.append(s[min(last, math.ceil(p))])
        elif method == "linear":
            lo = math.floor(p)
            frac = p - lo
            # Weighted so that at frac 0.5 it is statistics.median's (a + b) / 2 to the bit.
            out.append(s[lo] if not frac else s[lo] * (1 - frac) + s[lo + 1] * frac)
        else:
            raise ValueError(f"unknown percentile method {method!r}")
    return out


@overload
def median(values: Iterable[float], *, method: Method = "linear") -> float: ...
@overload
def median(values: Iterable[float], *, method: Method = "linear", empty: T) -> float | T: ...
def median(values: Iterable[float], *, method: Method = "linear", empty: object = _RAISE) -> object:
    """The 0.5-quantile, interpolated by default (``statistics.median``); with no values, ``empty``, else ValueError."""
    return percentiles(values, (0.5,), method, empty=empty)[0]


_GROWTH = 1.02  # bucket bounds grow 2 % each: a reported quantile is within 1 % of a true value
_LOG_GROWTH = math.log(_GROWTH)


class StreamingQuantiles:
    """Quantiles of non-negative numbers (ns, bytes) without keeping the numbers."""

    __slots__ = ("_buckets", "count", "max", "min", "total", "zeros")

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.zeros = 0  # values below 1, kept apart: log(0) has no bucket
        self.total = 0.0
        self.min: float | None = None
        self.max: float | None = None

    def add(self, value: float) -> None:
        v = max(0.0, float(value))
        self.count += 1
        self.total += v
        self.min = v if self.min is None or v < self.min else self.min
        self.max = v if self.max is None or v > self.max else self.max
        if v < 1.0:
            self.zeros += 1
            return
        i = int(math.log(v) / _LOG_GROWTH)
        self._buckets[i] = self._buckets.get(i, 0) + 1

    def merge(self, other: StreamingQuantiles) -> None:
        for i, n in other._buckets.items():
            self._buckets[i] = self._buckets.get(i, 0) + n
        self.count += other.count
        self.zeros += other.zeros
        self.total += other.total
        for v in (other.min, other.max):
            if v is not None:
                self.min = v if self.min is None or v < self.min else self.min
                self.max = v if self.max is None or v > self.max else self.max

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1), None when empty; q=1 is the exact max, q=0 the exact min."""
        if not self.count:
            return None
        if q >= 1.0:
            return self.max
        if q <= 0.0:
            return self.min
        rank = q * self.count  # the value below which a share q of the values lie
        seen = self.zeros
        if seen >= rank:
            return self.min if self.min is not None and self.min < 1.0 else 0.0
        for i in sorted(self._buckets):
            seen += self._buckets[i]
            if seen >= rank:
                mid: float = _GROWTH ** (i + 0.5)  # the bucket's geometric middle
                return min(max(mid, self.min or 0.0), self.max or mid)
        return self.max

    @property
    def buckets(self) -> int:
        return len(self._buckets)


__all__ = ["Method", "StreamingQuantiles", "median", "percentiles"]
