"""SMG's gateway admin API, read-only: the workers it registered and their labels."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from smgshm.core.errors import ServerError, TransportError


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

    @property
    def grpc(self) -> bool:
        return self.connection_mode == "grpc"


def list_workers(base_url: str, api_key: str | None = None, timeout: float = 5.0) -> list[GatewayWorker]:
    """``GET {base_url}/workers``; raises TransportError/ServerError with the endpoint."""
    url = base_url.rstrip("/") + "/workers"
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    req = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310 - scheme checked above
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only
            doc: Any = json.load(resp)
    except urllib.error.HTTPError as err:
        hint = "pass --api-key (the gateway's --api-key)" if err.code in (401, 403) else None
        raise ServerError(f"gateway refused GET /workers: HTTP {err.code}", endpoint=url, hint=hint) from err
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        raise TransportError("gateway unreachable", endpoint=url, detail=str(getattr(err, "reason", err))) from err
    except json.JSONDecodeError as err:
        raise ServerError("gateway answered GET /workers with something that is not JSON", endpoint=url) from err
    entries = doc.get("workers", []) if isinstance(doc, dict) else []
    out = []
    for w in entries:
        if not isinstance(w, dict):
            continue
        labels = w.get("labels") or {}
        out.append(
            GatewayWorker(
                id=str(w.get("id", "")),
                # DP-aware workers are "{base}@{rank}"; dial the base.
                url=str(w.get("dp_base_url") or str(w.get("url", "")).split("@", 1)[0]),
                connection_mode=str(w.get("connection_mode", "")),
                runtime_type=str(w.get("runtime_type", "")),
                label_namespace_id=str(labels.get("shm_namespace_id", "")) if isinstance(labels, dict) else "",
                is_healthy=bool(w.get("is_healthy", False)),
                status=str(w.get("status", "")),
            )
        )
    return out
