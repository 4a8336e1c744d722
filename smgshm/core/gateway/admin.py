"""SMG's gateway admin API, read-only: the workers it registered and their labels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smgshm.core.address import normalize_url
from smgshm.core.errors import ServerError, TransportError
from smgshm.core.gateway.http import PeerJsonError, check_ready, loads_json, request


@dataclass(frozen=True)
class GatewayWorker:
    """One entry of ``GET /workers``, with what probe needs."""

    id: str
    url: str
    connection_mode: str
    runtime_type: str
    label_namespace_id: str
    is_healthy: bool
    status: str
    # For doctor's configuration lint: which model, which role, and the per-worker transport override
    # (SMG ignores it although its docs promise it: smg-facts §2.3).
    model_id: str = ""
    worker_type: str = ""
    transport_override: str = ""

    @property
    def grpc(self) -> bool:
        return self.connection_mode == "grpc"


MAX_BODY_BYTES = 16 * 1024 * 1024  # a /workers listing of thousands of workers is well under this


def list_workers(base_url: str, api_key: str | None = None, timeout: float = 5.0) -> list[GatewayWorker]:
    """``GET {base_url}/workers`` under one deadline; TransportError/ServerError with the endpoint.

    Through core/gateway/http.py: the whole exchange is bounded by ``timeout`` (a trickling gateway
    cannot stretch it), the body is capped, and a redirect to another origin is refused, so
    the API key goes only to the gateway named. A body that is not UTF-8 JSON of the shape
    SMG documents is a ServerError, never a crash.
    """
    url = normalize_url(base_url).rstrip("/") + "/workers"
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        resp = request("GET", url, headers=headers, deadline_s=timeout, max_bytes=MAX_BODY_BYTES)
    except TransportError as err:  # say whose endpoint it was: "gateway unreachable: connection refused"
        raise TransportError(f"gateway unreachable: {err.what}", hint=err.hint, **err.fields) from err
    check_ready(resp, "GET /workers")
    if resp.status != 200:
        hint = "pass --api-key (the gateway's --api-key)" if resp.status in (401, 403) else None
        raise ServerError(f"gateway refused GET /workers: HTTP {resp.status}", endpoint=url, hint=hint)
    try:
        doc: Any = loads_json(resp.body, max_bytes=MAX_BODY_BYTES)
    except PeerJsonError as err:
        raise ServerError(f"gateway answered GET /workers with {err.what}", endpoint=url, **err.fields) from None
    entries = doc.get("workers") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ServerError(
            'gateway answered GET /workers without a "workers" list; is this SMG\'s admin API?', endpoint=url
        )
    return [_worker(w, i, url) for i, w in enumerate(entries)]


def _text(w: dict[str, Any], key: str) -> str:
    v = w.get(key)
    return v if isinstance(v, str) else ""


def _worker(w: Any, i: int, url: str) -> GatewayWorker:
    if not isinstance(w, dict) or not _text(w, "url"):
        raise ServerError(f"gateway's GET /workers entry {i} is not a worker with a url", endpoint=url)
    labels = w.get("labels")
    label = labels.get("shm_namespace_id") if isinstance(labels, dict) else None
    models = m if isinstance(m := w.get("models"), list) else []
    return GatewayWorker(
        id=_text(w, "id"),
        # DP-aware workers are "{base}@{rank}"; dial the base.
        url=_text(w, "dp_base_url") or _text(w, "url").split("@", 1)[0],
        connection_mode=_text(w, "connection_mode"),
        runtime_type=_text(w, "runtime_type"),
        label_namespace_id=label if isinstance(label, str) else "",
        is_healthy=w.get("is_healthy") is True,
        status=_text(w, "status"),
        model_id=_text(w, "model_id") or next((m for m in models if isinstance(m, str)), ""),
        worker_type=_text(w, "worker_type"),
        transport_override=_override(w),
    )


def _override(w: dict[str, Any]) -> str:
    """The per-worker transport fields as set (``""``: none), e.g. ``multimodal_tensor_transport=shm``."""
    labels = got if isinstance(got := w.get("labels"), dict) else {}
    out = []
    for key in ("multimodal_tensor_transport", "multimodal_shm_min_bytes"):
        v = w.get(key, labels.get(key))
        if isinstance(v, (str, int)) and not isinstance(v, bool) and v != "":
            out.append(f"{key}={v}")
    return " ".join(out)
