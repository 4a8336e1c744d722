"""One bounded HTTP exchange: the gateway's admin API, its metrics, its chat endpoint.

Peers stall, trickle, lie and redirect, so every exchange here has one deadline for
the whole of it (connect, headers and body together, not per socket read), a cap on
the body it will hold, and follows a redirect only to the same origin: a credential
is never sent anywhere the caller did not name.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse
from dataclasses import dataclass, field

from smgshm.core.errors import ServerError, TransportError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_MAX_REDIRECTS = 3
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class HttpResponse:
    """What came back: status, lower-cased headers and the whole body."""

    url: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    elapsed_s: float = 0.0

    def text(self) -> str:
        """The body as text; undecodable bytes become U+FFFD (it is shown, never trusted)."""
        return self.body.decode("utf-8", errors="replace")


def normalize_url(url: str) -> str:
    """``host:port`` and ``host:port/path`` get ``http://``; other schemes are refused."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportError("not an http(s) URL", endpoint=url)
    return url


def _origin(parts: urllib.parse.SplitResult) -> tuple[str, str, int]:
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def request(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    deadline_s: float = 5.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> HttpResponse:
    """``method url`` under one deadline; raises TransportError (unreachable, deadline, too big).

    Any status is returned (the caller judges 4xx/5xx). A redirect is followed only within
    the same scheme, host and port; one to another origin is an error, so headers such as
    ``Authorization`` never leave for a host the caller did not choose.
    """
    url = normalize_url(url)
    start = time.monotonic()
    deadline = start + deadline_s
    for _ in range(_MAX_REDIRECTS + 1):
        resp = _once(method, url, headers or {}, body, deadline, max_bytes)
        if resp.status not in (301, 302, 303, 307, 308) or "location" not in resp.headers:
            return HttpResponse(resp.url, resp.status, resp.headers, resp.body, time.monotonic() - start)
        target = urllib.parse.urljoin(url, resp.headers["location"])
        if _origin(urllib.parse.urlsplit(target)) != _origin(urllib.parse.urlsplit(url)):
            # A TransportError (exit 4): the origin named is not the service, so it is not reached.
            raise TransportError(
                "redirected to another origin; not followed (credentials stay with the origin you named)",
                endpoint=url,
                location=target[:200],
            )
        url = target
        if resp.status == 303:
            method, body = "GET", None
    raise ServerError("too many redirects", endpoint=url)


# A gateway that is up but not serving yet (its worker not registered, a proxy in front
# with no backend) answers these: the service is not reachable yet, so TransportError (4).
NOT_READY_STATUSES = (502, 503, 504)


def check_ready(resp: HttpResponse, what: str) -> None:
    """TransportError when ``resp`` says the service is not ready (HTTP 502/503/504)."""
    if resp.status in NOT_READY_STATUSES:
        raise TransportError(
            f"gateway not ready: {what} answered HTTP {resp.status}",
            endpoint=resp.url,
            hint="its worker may not be registered yet: retry in a few seconds",
        )


def _remaining(deadline: float, url: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TransportError("deadline exceeded", endpoint=url)
    return left


def _once(
    method: str, url: str, headers: dict[str, str], body: bytes | None, deadline: float, max_bytes: int
) -> HttpResponse:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=_remaining(deadline, url))
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    try:
        conn.request(method, path, body=body, headers=headers)
        # Kept: getresponse() may hand the socket to the response and drop conn.sock.
        sock = conn.sock
        if sock is not None:
            sock.settimeout(_remaining(deadline, url))
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while True:
            # The socket timeout bounds one read; the deadline bounds them all (a trickling peer).
            left = _remaining(deadline, url)
            if sock is not None:
                sock.settimeout(left)
            chunk = resp.read1(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise TransportError("response larger than allowed", endpoint=url, max_bytes=max_bytes)
            chunks.append(chunk)
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        return HttpResponse(url, resp.status, hdrs, b"".join(chunks))
    except TimeoutError as err:
        raise TransportError("deadline exceeded", endpoint=url) from err
    except socket.gaierror as err:
        raise TransportError("cannot resolve host", endpoint=url, detail=str(err.strerror or err)) from err
    except ConnectionRefusedError as err:
        raise TransportError("connection refused", endpoint=url) from err
    except (OSError, http.client.HTTPException) as err:
        raise TransportError("endpoint unreachable", endpoint=url, detail=str(err)[:200]) from err
    finally:
        conn.close()
