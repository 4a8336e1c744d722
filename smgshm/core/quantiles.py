"""Streaming percentiles in bounded memory: a log-bucketed histogram (HDR-style).

Every value lands in a bucket whose bounds grow by a fixed ratio, so a quantile is
known to within that relative error (about 1 % here) however many values went in,
while the memory is the number of distinct buckets touched (at most a few thousand
for anything between a nanosecond and a year). Count, sum, min and max are exact.
"""

from __future__ import annotations

import math

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
                mid = _GROWTH ** (i + 0.5)  # the bucket's geometric middle
                return min(max(mid, self.min or 0.0), self.max or mid)
        return self.max

    @property
    def buckets(self) -> int:
        return len(self._buckets)


__all__ = ["StreamingQuantiles"]
