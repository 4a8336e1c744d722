"""A gateway's Prometheus metrics: scraped under one deadline, parsed, subtracted.

SMG meters every multimodal tensor once, by path (smg-facts §6):
``smg_mm_tensors_total{runtime,path}``, ``smg_mm_tensor_bytes_total{runtime,path}``
and ``smg_mm_shm_write_failures_total{runtime}``; ``smg_mm_processing_total`` says
where preprocessing ran. A delta of two scrapes around a request is the gateway's own
account of what that request did (when nothing else ran through it meanwhile).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace

from smgshm.core.address import parse_url
from smgshm.core.errors import ServerError, TransportError
from smgshm.core.gateway.http import request

DEFAULT_METRICS_PORT = 29000  # the gateway's --prometheus-port default
MAX_METRICS_BYTES = 16 * 1024 * 1024

TENSORS = "smg_mm_tensors_total"
TENSOR_BYTES = "smg_mm_tensor_bytes_total"
SHM_WRITE_FAILURES = "smg_mm_shm_write_failures_total"
PROCESSING = "smg_mm_processing_total"
# Every HTTP answer by path and status_code: the chat path's say whether the requests that carried tensors failed.
HTTP_RESPONSES = "smg_http_responses_total"
CHAT_PATH = "/v1/chat/completions"  # where image requests go (OpenAI chat)
MM_FAMILIES = frozenset({TENSORS, TENSOR_BYTES, SHM_WRITE_FAILURES, PROCESSING, HTTP_RESPONSES})  # all mm_traffic reads

Labels = frozenset[tuple[str, str]]


class UnusableCounterError(ServerError):
    """A counter smgshm needs holds NaN or +/-Inf: valid exposition, but no evidence of anything."""


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
    chat_responses: int = 0  # its answers to chat requests (/v1/chat/completions)
    chat_errors: int = 0  # of them, those with a status other than 2xx

    @property
    def total_tensors(self) -> int:
        return sum(self.tensors.values())

    @property
    def shm_byte_share(self) -> float | None:
        total = sum(self.nbytes.values())
        return self.nbytes.get("shm", 0) / total if total else None


def mm_traffic(snap: MetricsSnapshot) -> MmTraffic:
    """The counters SMG keeps for multimodal tensors, read out of ``snap``.

    UnusableCounterError when one of them is NaN or infinite (Prometheus allows both as
    sample values; a counter holding one, or a delta through one, counts nothing).
    """

    def finite(name: str, v: float) -> float:
        if not math.isfinite(v):
            spelled = "NaN" if math.isnan(v) else "+Inf" if v > 0 else "-Inf"  # as the exposition spells them
            raise UnusableCounterError(
                f"the gateway's counter {name} is {spelled}: not usable as evidence", endpoint=snap.url
            )
        return v

    def ints(name: str, d: dict[str, float]) -> dict[str, int]:
        return {k: round(finite(name, v)) for k, v in d.items()}

    # Answers are context, not the tensors' account: one unusable (NaN, Inf) is left out, never an error.
    answers = snap.by_label(HTTP_RESPONSES, "status_code", path=CHAT_PATH)
    chat = {k: round(v) for k, v in answers.items() if math.isfinite(v)}
    return MmTraffic(
        tensors=ints(TENSORS, snap.by_label(TENSORS, "path")),
        nbytes=ints(TENSOR_BYTES, snap.by_label(TENSOR_BYTES, "path")),
        shm_write_failures=round(finite(SHM_WRITE_FAILURES, snap.value(SHM_WRITE_FAILURES))),
        processing=ints(PROCESSING, snap.by_label(PROCESSING, "mode")),
        exported=snap.has(TENSORS) or snap.has(TENSOR_BYTES),
        chat_responses=sum(chat.values()),
        chat_errors=sum(n for status, n in chat.items() if not status.startswith("2")),
    )


def mm_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> MmTraffic:
    """What the counters did between two scrapes (``exported`` as ``after`` says).

    Each scrape is checked on its own first, so an UnusableCounterError names the value
    the gateway exported (+Inf), not the NaN a subtraction through it makes.
    """
    mm_traffic(before)
    exported = mm_traffic(after).exported
    return replace(mm_traffic(after.minus(before)), exported=exported)


# One sample line: name, optional {labels}, value, optional integer timestamp.
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*(?:\{(.*)\})?[ \t]*([^ \t{}]+)(?:[ \t]+-?[0-9]+)?[ \t]*\r?")
_PAIR = r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"'
_LABELS = re.compile(rf"[ \t]*(?:{_PAIR}[ \t]*(?:,[ \t]*|$))*")  # the whole label set, checked at once
_LABEL = re.compile(_PAIR)
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}
_CLOCK_EVERY = 4096  # lines between two looks at the deadline


def parse_metrics(
    text: str, url: str = "", *, families: frozenset[str] | None = None, deadline: float | None = None
) -> MetricsSnapshot:
    """Prometheus text exposition into a snapshot; ServerError when it is not that.

    Every line must be a comment or a sample; the labels and values of only the samples named
    in ``families`` (all, when None) are read and kept, which keeps a 16 MiB page cheap.
    NaN and +/-Inf are sample values as Prometheus defines them and are kept as they are: the
    reader of a counter judges them (mm_traffic). Past ``deadline`` (a time.monotonic() value)
    TransportError: parsing is part of the scrape's time.
    """
    samples: dict[tuple[str, Labels], float] = {}
    for i, line in enumerate(text.split("\n")):
        if deadline is not None and i % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
            raise TransportError("deadline exceeded reading the metrics", endpoint=url)
        if not line or line[0] == "#" or line.isspace():
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            raise ServerError("not Prometheus text exposition", endpoint=url, detail=f"line {i + 1}: {line[:80]}")
        name, labels, value = m.groups()
        if families is not None and name not in families:
            continue
        try:
            key = (name, _labels(labels) if labels else frozenset())
            if "_" in value:  # float() takes 1_000; the exposition format does not
                raise ValueError(f"not a number: {value[:40]}")
            number = float(value)
        except ValueError as err:
            raise ServerError(
                "not Prometheus text exposition", endpoint=url, detail=f"line {i + 1}: {err}"[:120]
            ) from None
        samples[key] = samples.get(key, 0.0) + number
    return MetricsSnapshot(url, samples)


def _labels(text: str) -> Labels:
    if _LABELS.fullmatch(text) is None:
        raise ValueError(f"bad labels: {text[:60]}")
    pairs = _LABEL.findall(text)
    if "\\" in text:
        pairs = [(k, _ESCAPE.sub(lambda e: _UNESCAPED.get(e.group(1), e.group(0)), v)) for k, v in pairs]
    return frozenset(pairs)


def scrape(url: str, timeout_s: float = 5.0, families: frozenset[str] | None = None) -> MetricsSnapshot:
    """GET ``url`` (a /metrics endpoint) and parse it (``families`` only, when given), under one deadline."""
    deadline = time.monotonic() + timeout_s
    resp = request("GET", url, headers={"Accept": "text/plain"}, deadline_s=timeout_s, max_bytes=MAX_METRICS_BYTES)
    if resp.status != 200:
        raise ServerError(f"metrics endpoint answered HTTP {resp.status}", endpoint=resp.url)
    return parse_metrics(resp.text(), resp.url, families=families, deadline=deadline)


def default_metrics_url(gateway_url: str) -> str:
    """The gateway's host, port 29000, /metrics: where SMG serves Prometheus by default."""
    host = parse_url(gateway_url).host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{DEFAULT_METRICS_PORT}/metrics"
