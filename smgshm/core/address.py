"""Addresses as a user or a peer typed them, read in one place: ``host:port``, gRPC targets, http(s)
URLs, which of them are this machine, and host names resolved under a deadline.

A ground module: the gRPC transport, the gateway's HTTP, the receiver, watch's exporter and the CLI's
options all read addresses, and each reads them by these rules.

Ports: gRPC and the kernel both take a port modulo 65536 (``127.0.0.1:99999`` binds 34463, ``:-1``
65535) and gRPC reads a service name as a port (``:http`` is 80), so nothing here hands them a
port it has not checked: ASCII digits, 1..65535, or 0 ("any") where listening.

URLs: the caller's and every redirect's Location go through ``parse_url``, so a port out of range,
unbalanced IPv6 brackets or a control character is a UrlError here, never a ValueError from deep
inside urllib or socket.

Names: the resolver's own wait can be 30 s; ``resolve`` waits at most what the caller has left.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from smgshm.core.errors import SmgshmError, TransportError

MAX_PORT = 65535
# Target forms gRPC resolves itself; nothing here to check.
GRPC_SCHEMES = ("unix:", "unix-abstract:", "vsock:", "dns:", "ipv4:", "ipv6:")
LOOPBACK_HOST = "127.0.0.1"  # where smgshm listens when no host is given
_ASCII = "".join(map(chr, range(0x21, 0x7F)))  # printable ASCII: kept as is in a request target


def parse_port(text: str, *, listen: bool = False) -> int:
    """A port number; ValueError (a one-line reason) unless it is 1..65535, or 0 when ``listen``."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"port {text!r} is not a number")
    port = int(text)
    if port > MAX_PORT or (port == 0 and not listen):
        span = "1..65535, or 0 for any" if listen else "1..65535"
        raise ValueError(f"port {port} is out of range ({span})")
    return port


def split_host_port(address: str, *, listen: bool = False) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host without brackets, port); ValueError when it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"{address!r} has no port (host:port)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif "[" in host or "]" in host or ":" in host:
        raise ValueError(f"{address!r} is not host:port (an IPv6 address goes in brackets: [::1]:port)")
    return host, parse_port(port, listen=listen)


def parse_listen(value: str, default_host: str = LOOPBACK_HOST) -> tuple[str, int]:
    """``[HOST:]PORT`` to listen on -> (host, port); HOST defaults to ``default_host``, port 0 picks one."""
    if ":" not in value:
        return default_host, parse_port(value, listen=True)
    host, port = split_host_port(value, listen=True)
    return host or default_host, port


def grpc_target(address: str) -> str:
    """``grpc://h:p`` and ``h:p`` -> ``h:p``; ``unix:PATH`` as is; a DP ``@rank`` suffix stripped."""
    a = address.strip()
    for scheme in ("grpc://", "grpcs://"):
        if a.startswith(scheme):
            a = a[len(scheme) :]
    if not a.startswith("unix:"):
        a = a.split("/", 1)[0].split("@", 1)[0]
    return a


def grpc_host_port(target: str, *, listen: bool = False) -> tuple[str, int] | None:
    """(host, port) of a gRPC target; None for a form gRPC resolves itself (``unix:PATH``,
    ``dns:///...``) and, when dialing, a bare host (gRPC's default port). ValueError for a
    port that is out of range or not a number, and, when listening, for no port at all."""
    if target.startswith(GRPC_SCHEMES):
        return None
    if not listen and ":" not in target:
        return None
    return split_host_port(target, listen=listen)


def bound_address(address: str, port: int) -> str:
    """The address a server listens on once bound to ``port``: ``host:0`` gets it; ``unix:PATH`` is as is."""
    return address if address.startswith("unix:") else f"{address.rsplit(':', 1)[0]}:{port}"


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback IP address (127.0.0.0/8, ::1), brackets or not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:  # a name other than localhost, or no host at all (every interface)
        return False


def is_loopback(address: str) -> bool:
    """True for unix sockets and loopback hosts; the receiver binds these by default."""
    if address.startswith("unix:"):
        return True
    return is_loopback_host(address.rsplit(":", 1)[0])


def url_host(host: str) -> str:
    """``host`` as it goes into a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def dial_host(address: str) -> str:
    """Where to reach a socket bound to ``address`` from this host, URL-ready."""
    if address in ("0.0.0.0", ""):  # noqa: S104 - a bound address read from /proc, dialled as loopback
        return LOOPBACK_HOST
    if address == "::":
        return "[::1]"
    return url_host(address)


class UrlError(SmgshmError):
    """A URL that cannot be dialled: not http(s), no host, a port outside 1..65535, bad brackets.

    The CLI turns one the user typed into a usage error (exit 2); a redirect's Location that
    is one is the peer's fault, a TransportError (exit 4).
    """

    kind = "bad_url"


@dataclass(frozen=True)
class HttpUrl:
    """A URL checked to be dialable: scheme, host, port (the default filled in) and request target."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query: what goes on the request line

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host.lower(), self.port


def parse_url(url: str) -> HttpUrl:
    """``url`` checked and split; ``host:port[/path]`` gets ``http://``. UrlError says what is wrong.

    The one URL parser: the caller's URLs and every redirect's Location go through it, so a
    port out of range, unbalanced IPv6 brackets or a control character is an error here, never
    a ValueError from deep inside urllib or socket.
    """
    if any(ord(c) < 0x21 or 0x7F <= ord(c) < 0xA0 for c in url):
        # urlsplit would silently drop tabs and newlines; a space is not a URL either.
        raise UrlError("not a URL: it holds a space or a control character", url=url[:200])
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as err:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is no number
        raise UrlError(f"not a valid URL: {err}", url=url[:200]) from None
    if parts.scheme not in ("http", "https"):
        raise UrlError("not an http(s) URL", url=url[:200])
    host = parts.hostname or ""
    if not host:
        raise UrlError("the URL names no host", url=url[:200])
    if port == 0:
        raise UrlError("port 0 cannot be dialled (ports are 1..65535)", url=url[:200])
    try:
        host.encode("idna")  # what the resolver and the Host header need; a 64-byte label is not a name
    except UnicodeError as err:
        raise UrlError(f"not a valid host name: {err}", url=url[:200]) from None
    # The request line is ASCII: anything else in the path or query is sent percent-encoded (UTF-8).
    target = urllib.parse.quote(urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")), safe=_ASCII)
    return HttpUrl(url, parts.scheme, host, port or (443 if parts.scheme == "https" else 80), target)


def normalize_url(url: str) -> str:
    """``host:port`` and ``host:port/path`` get ``http://``; UrlError for anything not dialable."""
    return parse_url(url).url


def resolve(host: str, port: int, timeout: float, target: str) -> list[Any]:
    """getaddrinfo under a deadline (the resolver's own can be 30 s): a DNS failure says so."""
    out: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            out.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as err:
            failure.append(err)

    t = threading.Thread(target=run, daemon=True, name="smgshm-resolve")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TransportError("cannot resolve host: the resolver did not answer in time", endpoint=target)
    if failure:
        err = failure[0]
        raise TransportError("cannot resolve host", endpoint=target, detail=str(getattr(err, "strerror", err)))
    return out


def listen_addrinfo(host: str, port: int) -> tuple[int, Any]:
    """(address family, socket address) to bind ``host:port`` with; OSError when the host does not resolve."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return info[0], info[4]


def is_local_url(url: str) -> bool:
    """Does ``url``'s host name this machine (loopback or one of its own addresses)?"""
    try:
        u = parse_url(url)
        infos = resolve(u.host, u.port, 5.0, url)  # the resolver's own wait can be 30 s
    except SmgshmError:  # not a URL, or its host does not resolve: not this machine as far as we know
        return False
    mine = _own_addresses()
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if addr.is_loopback or str(addr) in mine:
            return True
    return False


def _own_addresses() -> set[str]:
    import psutil

    out: set[str] = set()
    with contextlib.suppress(OSError):
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address.split("%", 1)[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    return out
