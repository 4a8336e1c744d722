"""A gateway's multimodal traffic between two scrapes: rates by path, SHM's share, and a verdict.

The gateway counts tensors and bytes per path but not their sizes, so "SHM-eligible
traffic went inline" is inferred soundly from the averages: when the tensors sent
inline average at least ``shm_min_bytes`` each, at least one of them was big enough
for SHM (a mean cannot exceed every value). Write failures are counted by the
gateway itself, and each one is a tensor it sent inline instead.

A verdict names its cause from the catalogue (``cause_info``): write failures are split
into full / too small / permission when the gateway writes to this host's shm dir (the
inline average is a size some failed write needed: a lower bound of the largest).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from smgshm.core.causes import CATALOGUE, Cause, Found, Where, found, write_failure
from smgshm.core.gateway.metrics import MetricsSnapshot, UnusableCounterError, mm_delta
from smgshm.core.gateway.setting import DEFAULT_SHM_MIN_BYTES
from smgshm.core.units import human_size


@dataclass(frozen=True)
class GatewayRates:
    """What the gateway's own counters say happened over ``interval_s``."""

    url: str
    interval_s: float
    tensors: dict[str, int] = field(default_factory=dict)  # by path: inline | shm | remote
    nbytes: dict[str, int] = field(default_factory=dict)
    tensors_per_s: dict[str, float] = field(default_factory=dict)
    bytes_per_s: dict[str, float] = field(default_factory=dict)
    shm_write_failures: int = 0
    shm_write_failures_per_s: float = 0.0
    shm_byte_share: float | None = None  # of all tensor bytes, the share through SHM; None without traffic
    inline_avg_bytes: int | None = None  # mean size of the tensors sent inline, rounded down; None: none went
    eligible_inline: bool = False  # SHM-eligible tensors went inline (see the module docstring)
    verdict: str = ""  # one plain sentence; "" when there is nothing to say
    cause_info: Found | None = None  # the verdict's cause from the catalogue, with its fix (None: no verdict)
    exported: bool = False  # the gateway exports smg_mm_* at all (only once traffic flowed)
    error: str = ""  # the scrape failed: the rates are empty


def gateway_rates(
    before: MetricsSnapshot,
    after: MetricsSnapshot,
    interval_s: float,
    shm_min_bytes: int = DEFAULT_SHM_MIN_BYTES,
    shm_dir: str | None = None,
) -> GatewayRates:
    """Rates from the delta of two scrapes ``interval_s`` apart; a NaN or infinite counter
    in either makes them unknown (``error`` says which), never an exception. ``shm_dir``:
    the shm dir the gateway writes to, when it is this host's (read only on write failures)."""
    try:
        d = mm_delta(before, after)
    except UnusableCounterError as err:
        return failed_rates(after.url, interval_s, str(err))
    dt = interval_s if interval_s > 0 else 1.0
    tensors = {k: v for k, v in d.tensors.items() if v}
    nbytes = {k: v for k, v in d.nbytes.items() if v}
    inline_n, inline_b = tensors.get("inline", 0), nbytes.get("inline", 0)
    # Rounded down: bytes are integers in JSON, and floor(avg) >= an integer threshold iff avg >= it.
    avg = inline_b // inline_n if inline_n else None
    eligible = avg is not None and avg >= shm_min_bytes
    share = d.shm_byte_share if sum(nbytes.values()) else None
    verdict = _verdict(tensors, d.shm_write_failures, avg, shm_min_bytes)
    return GatewayRates(
        url=after.url,
        interval_s=interval_s,
        tensors=tensors,
        nbytes=nbytes,
        tensors_per_s={k: v / dt for k, v in tensors.items()},
        bytes_per_s={k: v / dt for k, v in nbytes.items()},
        shm_write_failures=d.shm_write_failures,
        shm_write_failures_per_s=d.shm_write_failures / dt,
        shm_byte_share=share,
        inline_avg_bytes=avg,
        eligible_inline=eligible or d.shm_write_failures > 0,
        verdict=verdict,
        cause_info=_cause(verdict, tensors, d.shm_write_failures, avg, shm_dir),
        exported=d.exported,
    )


def failed_rates(url: str, interval_s: float, error: str) -> GatewayRates:
    return GatewayRates(url=url, interval_s=interval_s, error=error)


def _verdict(tensors: dict[str, int], failures: int, inline_avg: float | None, min_bytes: int) -> str:
    if failures:
        return f"{failures} SHM write(s) failed: the gateway sent those tensors inline"
    if inline_avg is None or inline_avg < min_bytes:
        return ""
    avg = human_size(inline_avg)
    if not tensors.get("shm"):
        return (
            f"all traffic went inline although inline tensors average {avg} (>= shm_min_bytes {min_bytes}): "
            "SHM-eligible tensors went inline (transport inline, or auto with a foreign namespace id)"
        )
    return f"some SHM-eligible tensors went inline: inline tensors average {avg} (>= shm_min_bytes {min_bytes})"


def _cause(
    verdict: str, tensors: dict[str, int], failures: int, inline_avg: float | None, shm_dir: str | None
) -> Found | None:
    if not verdict:
        return None
    if failures:
        cause = Cause.SHM_WRITES_FAILING
        if shm_dir is not None:  # the inline average is a size a failed write needed
            from smgshm.core.host.capacity import shm_space
            from smgshm.core.host.identity import probe_writable

            size, free = shm_space(shm_dir)
            cause = write_failure(int(inline_avg or 0), size, free, probe_writable(shm_dir) is None)
        return found(cause, verdict, Where(shm_dir or ""))
    if tensors.get("shm"):  # SHM works for some: others went to workers the rule sends inline (which: per worker)
        return found(Cause.SOME_WORKERS_INLINE, verdict)
    # Nothing through SHM: the mode is inline, or auto with a worker in another namespace; the counters
    # cannot tell which, so the fix names both.
    return found(
        Cause.MODE_INLINE,
        verdict,
        fix=f"{CATALOGUE[Cause.MODE_INLINE].fix}; if it is auto already, its "
        "worker is in another namespace: smgshm doctor names it",
    )


__all__ = ["DEFAULT_SHM_MIN_BYTES", "GatewayRates", "failed_rates", "gateway_rates"]
