"""OpenAI chat requests with a generated image, sent through a gateway.

The image is a PNG made here with Pillow (a deterministic gradient, so every run
sends the same pixels and the gateway's preprocessing does the same work). The
request goes through core/gateway/http.py: one deadline for the whole exchange, a body cap,
and the API key only ever to the origin the caller named.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass

from smgshm.core.errors import ServerError
from smgshm.core.gateway.http import PeerJsonError, check_ready, loads_json, request

MAX_IMAGE_PX = 8192
MAX_REPLY_BYTES = 8 * 1024 * 1024
PROMPT = "describe this image"


def make_png(size: int) -> bytes:
    """A ``size`` x ``size`` RGB PNG: a gradient with a diagonal, the same bytes every time."""
    if not 1 <= size <= MAX_IMAGE_PX:
        raise ValueError(f"image size must be 1..{MAX_IMAGE_PX} px, not {size}")
    from PIL import Image

    ramp = bytes(range(256))
    r = Image.frombytes("L", (256, 1), ramp).resize((size, size))
    g = r.transpose(Image.Transpose.ROTATE_90)
    b = Image.frombytes("L", (256, 1), ramp[::-1]).resize((size, size)).transpose(Image.Transpose.TRANSPOSE)
    buf = io.BytesIO()
    Image.merge("RGB", (r, g, b)).save(buf, format="PNG")
    return buf.getvalue()


def chat_body(model: str, png: bytes, stream: bool, max_tokens: int = 1) -> bytes:
    """The /v1/chat/completions body: one text part and one data-URL image part."""
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    doc = {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return json.dumps(doc).encode()


@dataclass(frozen=True)
class ChatOutcome:
    """One request's answer: HTTP status, latency, and the gateway's error if it refused."""

    status: int
    elapsed_ms: float
    stream: bool
    ok: bool
    error: str = ""  # the gateway's error message or code (shown escaped: it is the peer's text)
    completion_tokens: int = 0


def _headers(api_key: str | None) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _error_text(body: bytes) -> str:
    try:
        doc = loads_json(body)
    except PeerJsonError:
        return body[:200].decode("utf-8", errors="replace")
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        parts = [str(err.get(k)) for k in ("code", "message") if err.get(k)]
        return ": ".join(parts)[:300]
    if isinstance(err, str):
        return err[:300]
    return json.dumps(doc)[:200]


def _stream_events(body: bytes) -> tuple[list[dict[str, object]], bool, str]:
    """SSE ``data:`` documents, whether ``[DONE]`` came, and an error event's text."""
    events: list[dict[str, object]] = []
    done, error = False, ""
    for raw in body.split(b"\n"):
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        try:
            doc = loads_json(data)
        except PeerJsonError:
            continue
        if isinstance(doc, dict):
            if "error" in doc:
                error = _error_text(data)
            events.append(doc)
    return events, done, error


def _usage_tokens(doc: dict[str, object]) -> int:
    usage = doc.get("usage")
    if isinstance(usage, dict):
        n = usage.get("completion_tokens")
        if isinstance(n, int):
            return n
    return 0


def send_chat(
    base_url: str, model: str, png: bytes, *, stream: bool, api_key: str | None = None, timeout_s: float = 60.0
) -> ChatOutcome:
    """POST one chat completion; TransportError when the gateway cannot be reached in time."""
    body = chat_body(model, png, stream)
    resp = request(
        "POST",
        base_url.rstrip("/") + "/v1/chat/completions",
        headers=_headers(api_key),
        body=body,
        deadline_s=timeout_s,
        max_bytes=MAX_REPLY_BYTES,
    )
    ms = resp.elapsed_s * 1000
    if resp.status != 200:
        return ChatOutcome(resp.status, ms, stream, False, _error_text(resp.body))
    if stream:
        events, done, error = _stream_events(resp.body)
        if error or not done:
            return ChatOutcome(resp.status, ms, stream, False, error or "the stream ended without [DONE]")
        tokens = max((_usage_tokens(e) for e in events), default=0)
        return ChatOutcome(resp.status, ms, stream, True, completion_tokens=tokens)
    try:
        doc = loads_json(resp.body)
    except PeerJsonError as err:
        return ChatOutcome(resp.status, ms, stream, False, f"the reply is {err.what}")
    if not isinstance(doc, dict) or not doc.get("choices"):
        return ChatOutcome(resp.status, ms, stream, False, _error_text(resp.body) or "the reply has no choices")
    return ChatOutcome(resp.status, ms, stream, True, completion_tokens=_usage_tokens(doc))


def first_model(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> str:
    """The first model id of ``GET /v1/models``; ServerError when there is none."""
    url = base_url.rstrip("/") + "/v1/models"
    resp = request("GET", url, headers=_headers(api_key), deadline_s=timeout_s, max_bytes=MAX_REPLY_BYTES)
    check_ready(resp, "GET /v1/models")
    if resp.status in (401, 403):
        raise ServerError(
            f"gateway refused GET /v1/models: HTTP {resp.status}",
            endpoint=url,
            hint="pass --api-key (the gateway's --api-key)",
        )
    if resp.status != 200:
        raise ServerError(f"gateway answered GET /v1/models with HTTP {resp.status}", endpoint=url)
    try:
        doc = loads_json(resp.body)  # bounded: depth and size, so str() below cannot recurse away
        ids = [str(m["id"]) for m in doc.get("data", []) if isinstance(m, dict) and m.get("id")]
    except PeerJsonError as err:
        raise ServerError("GET /v1/models is not an OpenAI model list", endpoint=url, reason=err.what) from None
    except (AttributeError, TypeError) as err:
        raise ServerError("GET /v1/models is not an OpenAI model list", endpoint=url) from err
    if not ids:
        raise ServerError("the gateway serves no model", endpoint=url, hint="pass --model")
    return ids[0]
