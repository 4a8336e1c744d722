"""One bounded HTTP exchange: the gateway's admin API, its metrics, its chat endpoint.

Peers stall, trickle, lie and redirect, so every exchange here has one deadline for the
whole of it: name resolution, connect, the TLS handshake, every send and every receive
(the status line, each header byte, each chunk-size digit, the body) waits at most what
is left of it. It has a cap on the body it will hold, and follows a redirect only to the
same origin: a credential is never sent anywhere the caller did not name. URLs, the
caller's or a redirect's, are parsed in one place (``address.parse_url``), and a peer's JSON is
decoded in one place (``loads_json``), with a depth and a size limit.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from smgshm.core.address import HttpUrl, UrlError, parse_url, resolve
from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.errors import GatewayNotReadyError, ServerError, SmgshmError, TransportError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64  # SMG's documents nest a handful of levels; deeper is not SMG's, and recursion is finite
_MAX_REDIRECTS = 3
_CHUNK = 64 * 1024


class PeerJsonError(ServerError):
    """A peer's body that is not JSON within the limits: not JSON, too deep, too big (exit 1)."""


def loads_json(data: bytes | str, *, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A peer's JSON document, or PeerJsonError: not UTF-8, not JSON (NaN and Infinity are not),
    bigger than ``max_bytes`` or nested deeper than ``max_depth``. Never a RecursionError: the
    depth is checked without recursion, so whatever reads the document recurses at most that.

    The error's ``what`` reads after "answered with": "something that is not JSON".
    """
    if len(data) > max_bytes:
        raise PeerJsonError("a JSON document larger than allowed", nbytes=len(data), max_bytes=max_bytes)
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise PeerJsonError("a body that is not UTF-8") from None
    too_deep = PeerJsonError("something that is not JSON", reason=f"nested deeper than {max_depth} levels")
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # the decoder's own limit, met before ours
        raise too_deep from None
    except ValueError as err:  # JSONDecodeError, NaN, a 5000-digit integer
        raise PeerJsonError("something that is not JSON", detail=str(err)[:120]) from None
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise too_deep
        items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


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
    the same scheme, host and port; one to another origin, or to a Location that is not a
    valid URL, is a TransportError, so headers such as ``Authorization`` never leave for a
    host the caller did not choose.
    """
    target = parse_url(url)
    _check_headers(headers or {})
    start = time.monotonic()
    deadline = start + deadline_s
    for _ in range(_MAX_REDIRECTS + 1):
        resp = _once(method, target, headers or {}, body, deadline, max_bytes)
        if resp.status not in (301, 302, 303, 307, 308) or "location" not in resp.headers:
            return HttpResponse(resp.url, resp.status, resp.headers, resp.body, time.monotonic() - start)
        target = _redirect(target, resp.headers["location"])
        if resp.status == 303:
            method, body = "GET", None
    raise ServerError("too many redirects", endpoint=target.url)


def _check_headers(headers: dict[str, str]) -> None:
    """What http.client would refuse with a ValueError (a newline in an API key), refused here by name."""
    for name, value in headers.items():
        try:
            raw = value.encode("latin-1")
        except UnicodeEncodeError:
            raw = b"\x00"
        if any((b < 0x20 and b != 0x09) or b == 0x7F for b in raw):
            raise SmgshmError(
                "a request header holds a character HTTP does not allow",
                header=name,
                hint="an API key (--api-key, SMG_API_KEY) must be one line of Latin-1 text",
            )


def _redirect(current: HttpUrl, location: str) -> HttpUrl:
    """Where a redirect points, if it may be followed: the peer's Location is the peer's fault (exit 4)."""
    try:
        nxt = parse_url(urllib.parse.urljoin(current.url, location))
    except (UrlError, ValueError) as err:
        what = err.what if isinstance(err, UrlError) else str(err)
        raise TransportError(
            f"redirected to an invalid Location: {what}", endpoint=current.url, location=location[:200]
        ) from None
    if nxt.origin != current.origin:
        # A TransportError (exit 4): the origin named is not the service, so it is not reached.
        raise TransportError(
            "redirected to another origin; not followed (credentials stay with the origin you named)",
            endpoint=current.url,
            location=nxt.url[:200],
        )
    return nxt


# A gateway that is up but not serving yet (its worker not registered, a proxy in front
# with no backend) answers these: the service is not reachable yet, so TransportError (4).
NOT_READY_STATUSES = (502, 503, 504)


def check_ready(resp: HttpResponse, what: str) -> None:
    """TransportError when ``resp`` says the service is not ready (HTTP 502/503/504)."""
    if resp.status in NOT_READY_STATUSES:
        raise GatewayNotReadyError(
            f"gateway not ready: {what} answered HTTP {resp.status}",
            endpoint=resp.url,
            hint=CATALOGUE[Cause.GATEWAY_NOT_READY].fix,
        )


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline exceeded")
    return left


class _DeadlineSocket:
    """A connected socket whose every send and receive waits at most what is left of the deadline.

    http.client sets a socket timeout once, then reads the status line, headers and chunk
    sizes line by line, each recv waiting the whole timeout anew: a peer trickling a byte a
    second held it forever. Here each wait is re-armed with the time left. Closing is left to
    the owner: http.client closes the connection while its response still reads the socket.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def _arm(self) -> None:
        self.sock.settimeout(_left(self.deadline))

    def sendall(self, data: bytes) -> None:
        self._arm()
        self.sock.sendall(data)  # the timeout bounds the whole sendall (Python >= 3.5)

    def recv_into(self, buf: Any) -> int:
        self._arm()
        return self.sock.recv_into(buf)

    def makefile(self, *_args: Any, **_kw: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self))

    def close(self) -> None:
        pass  # the connection's owner closes the real socket, after the response is read

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        return self.sock.recv_into(buf)


class _Bounded(http.client.HTTPConnection):
    """http.client's connection, dialled and spoken under one deadline (see _DeadlineSocket)."""

    deadline: float
    endpoint: str
    raw: socket.socket | None = None

    def _dial(self, address: tuple[str, int], *_args: Any) -> socket.socket:
        last: OSError | None = None
        for family, kind, proto, _, addr in resolve(address[0], address[1], _left(self.deadline), self.endpoint):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(_left(self.deadline))
                sock.connect(addr)
                sock.settimeout(_left(self.deadline))  # the TLS handshake, if any, waits at most this
            except OSError as err:
                sock.close()
                last = err
                continue
            self.raw = sock
            return sock
        raise last or OSError("the host resolves to no address")

    def connect(self) -> None:
        self._create_connection = self._dial
        super().connect()  # TCP through _dial; for https, the handshake too
        if self.sock is not None:
            self.raw = self.sock  # the TLS socket when there is one: the one to close
            self.sock = _DeadlineSocket(self.sock, self.deadline)

    def close_all(self) -> None:
        self.close()
        if self.raw is not None:
            self.raw.close()


class _BoundedTls(_Bounded, http.client.HTTPSConnection):
    pass


def _once(
    method: str, url: HttpUrl, headers: dict[str, str], body: bytes | None, deadline: float, max_bytes: int
) -> HttpResponse:
    cls = _BoundedTls if url.scheme == "https" else _Bounded
    conn = cls(url.host, url.port)
    conn.deadline, conn.endpoint = deadline, url.url
    try:
        conn.request(method, url.target, body=body, headers=headers)
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while chunk := resp.read1(_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise TransportError("response larger than allowed", endpoint=url.url, max_bytes=max_bytes)
            chunks.append(chunk)
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        return HttpResponse(url.url, resp.status, hdrs, b"".join(chunks))
    except TimeoutError as err:
        raise TransportError("deadline exceeded", endpoint=url.url) from err
    except ConnectionRefusedError as err:
        raise TransportError("connection refused", endpoint=url.url) from err
    except (OSError, http.client.HTTPException) as err:
        raise TransportError("endpoint unreachable", endpoint=url.url, detail=str(err)[:200]) from err
    finally:
        conn.close_all()
