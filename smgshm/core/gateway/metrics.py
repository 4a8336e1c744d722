"""A gateway's Prometheus metrics: scraped under one deadline, parsed, subtracted.

SMG meters every multimodal tensor once, by path (smg-facts §6):
``smg_mm_tensors_total{runtime,path}``, ``smg_mm_tensor_bytes_total{runtime,path}``
and ``smg_mm_shm_write_failures_total{runtime}``; ``smg_mm_processing_total`` says
where preprocessing ran. A delta of two scrapes around a request is the gateway's own
account of what that request did (when nothing else ran through it meanwhile).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from smgshm.core.errors import ServerError
from smgshm.core.gateway.http import normalize_url, request

DEFAULT_METRICS_PORT = 29000  # the gateway's --prometheus-port default
MAX_METRICS_BYTES = 16 * 1024 * 1024

TENSORS = "smg_mm_tensors_total"
TENSOR_BYTES = "smg_mm_tensor_bytes_total"
SHM_WRITE_FAILURES = "smg_mm_shm_write_failures_total"
PROCESSING = "smg_mm_processing_total"

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every sample of one scrape, keyed by (sample name, label set)."""

    url: str
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 when absent)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def by_label(self, name: str, label: str, **match: str) -> dict[str, float]:
        """``name`` summed per value of ``label`` (over samples that match ``match``)."""
        want = set(match.items())
        out: dict[str, float] = {}
        for (n, ls), v in self.samples.items():
            if n != name or not want <= ls:
                continue
            key = dict(ls).get(label, "")
            out[key] = out.get(key, 0.0) + v
        return out

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)

    def minus(self, before: MetricsSnapshot) -> MetricsSnapshot:
        """What changed since ``before``: a counter missing there counts from 0."""
        keys = set(self.samples) | set(before.samples)
        return MetricsSnapshot(self.url, {k: self.samples.get(k, 0.0) - before.samples.get(k, 0.0) for k in keys})


@dataclass(frozen=True)
class MmTraffic:
    """The multimodal tensor counters of a snapshot (or a delta), by path."""

    tensors: dict[str, int]
    nbytes: dict[str, int]
    shm_write_failures: int
    processing: dict[str, int]  # by mode: router | worker
    exported: bool  # the gateway exports the smg_mm_* counters at all (they appear once traffic flowed)

    @property
    def total_tensors(self) -> int:
        return sum(self.tensors.values())

    @property
    def shm_byte_share(self) -> float | None:
        total = sum(self.nbytes.values())
        return self.nbytes.get("shm", 0) / total if total else None


def mm_traffic(snap: MetricsSnapshot) -> MmTraffic:
    """The counters SMG keeps for multimodal tensors, read out of ``snap``."""

    def ints(d: dict[str, float]) -> dict[str, int]:
        return {k: round(v) for k, v in d.items()}

    return MmTraffic(
        tensors=ints(snap.by_label(TENSORS, "path")),
        nbytes=ints(snap.by_label(TENSOR_BYTES, "path")),
        shm_write_failures=round(snap.value(SHM_WRITE_FAILURES)),
        processing=ints(snap.by_label(PROCESSING, "mode")),
        exported=snap.has(TENSORS) or snap.has(TENSOR_BYTES),
    )


def parse_metrics(text: str, url: str = "") -> MetricsSnapshot:
    """Prometheus text exposition into a snapshot; ServerError when it is not that."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[tuple[str, Labels], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = (s.name, frozenset((str(k), str(v)) for k, v in s.labels.items()))
                samples[key] = samples.get(key, 0.0) + float(s.value)
    except (ValueError, TypeError, IndexError) as err:
        raise ServerError("not Prometheus text exposition", endpoint=url, detail=str(err)[:120]) from err
    return MetricsSnapshot(url, samples)


def scrape(url: str, timeout_s: float = 5.0) -> MetricsSnapshot:
    """GET ``url`` (a /metrics endpoint) under one deadline and parse it."""
    resp = request("GET", url, headers={"Accept": "text/plain"}, deadline_s=timeout_s, max_bytes=MAX_METRICS_BYTES)
    if resp.status != 200:
        raise ServerError(f"metrics endpoint answered HTTP {resp.status}", endpoint=resp.url)
    return parse_metrics(resp.text(), resp.url)


def default_metrics_url(gateway_url: str) -> str:
    """The gateway's host, port 29000, /metrics: where SMG serves Prometheus by default."""
    parts = urllib.parse.urlsplit(normalize_url(gateway_url))
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{DEFAULT_METRICS_PORT}/metrics"
