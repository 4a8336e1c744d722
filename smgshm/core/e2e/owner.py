"""Whose metrics: the counters e2e judges must be the tested gateway's own, never a neighbour's.

Port 29000 is only SMG's default: another gateway may hold it, or nothing. So the endpoint is
taken only with a proof that it belongs to the gateway under test, in this order:

1. a gateway on this host: the process listening on the gateway's port has a port of its own
   that answers ``GET /metrics`` with SMG's counters (found as ``--running`` and doctor find it);
2. a metrics URL on this host (given, or the default): the process listening on its port is the
   gateway's process itself; another process there is a definite refusal;
3. otherwise (a remote gateway, or a process this user may not see): a challenge. smgshm sends a
   random number k (3..7) of GETs to a path of its own on the gateway, which SMG counts in
   ``smg_http_requests_total{method="GET",path="other"}`` (unknown routes are folded into
   ``other``), between two scrapes. The endpoint is the gateway's only when that counter moved by
   exactly k. Moving by at least k is necessary but not sufficient: a busy neighbour's counters
   move too; requests to unknown routes are rare in real traffic, so an exact, randomly chosen
   count on that one counter is what a neighbour matches only by coincidence, while a real
   gateway fails it only when strangers hit unknown routes in the same instant (a refusal, never a
   wrong verdict: run again, or pass the right --metrics).

Unproven is a refusal (TransportError, exit 4) before any chat request is sent, with a hint
naming ``--metrics``: no verdict is ever drawn from another gateway's counters.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from smgshm.core.address import is_local_url
from smgshm.core.e2e.evidence import listening_pid
from smgshm.core.errors import SmgshmError, TransportError
from smgshm.core.gateway.http import request
from smgshm.core.gateway.metrics import MetricsSnapshot, default_metrics_url, scrape

HTTP_REQUESTS = "smg_http_requests_total"
CHALLENGE_PATH = "/smgshm-metrics-owner-"  # + a nonce: a route SMG does not have
_SETTLE_S = (0.0, 0.1, 0.3)  # the counter may move a moment after the response: look again, bounded


@dataclass(frozen=True)
class OwnedMetrics:
    url: str
    owner: str  # why these counters are the gateway's own


def own_metrics(
    gateway_url: str,
    pid: int | None,
    find_own: Callable[[], str],
    given_url: str | None,
    api_key: str | None = None,
    timeout_s: float = 5.0,
) -> OwnedMetrics:
    """The metrics endpoint of the gateway at ``gateway_url``, with the proof that it is its own.

    ``pid``: the process listening on the gateway's port here (None: remote or not visible);
    ``find_own``: finds that process's own /metrics port ("" none); ``given_url``: --metrics.
    TransportError (exit 4, hinting --metrics) when it cannot be shown to be the gateway's."""
    found_url = find_own() if given_url is None else ""
    if found_url:
        return OwnedMetrics(found_url, f"the metrics port of gateway pid {pid} itself")
    url = given_url or default_metrics_url(gateway_url)

    def hint() -> str:  # asked on refusal only: the way to the right endpoint, found when it can be
        return _hint(found_url or (find_own() if given_url is not None else ""))

    if pid is not None and is_local_url(url):
        holder = listening_pid(url)
        if holder == pid:
            return OwnedMetrics(url, f"served by gateway pid {pid} itself")
        if holder is not None:
            raise TransportError(
                f"{url} is served by pid {holder}, not by the gateway (pid {pid}): its counters are another process's",
                endpoint=url,
                hint=hint(),
            )
    return _challenge(gateway_url.rstrip("/"), url, api_key, min(timeout_s, 5.0), hint)


def _hint(found_url: str) -> str:
    if found_url:
        return f"its own metrics are at {found_url}: pass --metrics {found_url}"
    return "pass --metrics URL: the gateway's own Prometheus endpoint (its --prometheus-port)"


def _scrape(url: str, timeout_s: float, hint: Callable[[], str]) -> MetricsSnapshot:
    try:
        return scrape(url, timeout_s, frozenset({HTTP_REQUESTS}))
    except SmgshmError as err:
        raise TransportError(
            f"cannot read the gateway's metrics at {url}: {err.what}", endpoint=url, hint=hint()
        ) from None


def _unknown_gets(snap: MetricsSnapshot, path: str) -> float:
    """GETs to routes SMG does not have: folded into path "other" (or, were they not, under their own path)."""
    by_path = snap.by_label(HTTP_REQUESTS, "path", method="GET")
    return by_path.get("other", 0.0) + by_path.get(path, 0.0)


def _challenge(
    gateway_url: str, url: str, api_key: str | None, timeout_s: float, hint: Callable[[], str]
) -> OwnedMetrics:
    """Send k GETs to a route of smgshm's own; the counters are the gateway's when they moved by exactly k."""
    k = 3 + secrets.randbelow(5)
    path = CHALLENGE_PATH + secrets.token_hex(8)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # its origin only, as for the chat requests
    before = _unknown_gets(_scrape(url, timeout_s, hint), path)
    for _ in range(k):
        request("GET", gateway_url + path, headers=headers, deadline_s=timeout_s, max_bytes=64 << 10)
    moved = 0.0
    for pause in _SETTLE_S:
        time.sleep(pause)
        moved = _unknown_gets(_scrape(url, timeout_s, hint), path) - before
        if not math.isfinite(moved) or moved >= k:
            break
    if moved == k:
        return OwnedMetrics(url, f"its {HTTP_REQUESTS} counted exactly smgshm's {k} requests to {gateway_url}")
    seen = f"moved by {moved:g}" if math.isfinite(moved) else "is not a number"
    raise TransportError(
        f"cannot tell that {url} is this gateway's metrics: smgshm sent {k} requests to {gateway_url} and its "
        f'{HTTP_REQUESTS}{{method="GET",path="other"}} {seen}',
        endpoint=url,
        hint=hint(),
    )
