"""Addresses to listen on or dial, as a user or a peer typed them: host:port parsed in one place.

gRPC and the kernel both take a port modulo 65536 (``127.0.0.1:99999`` binds 34463, ``:-1``
65535) and gRPC reads a service name as a port (``:http`` is 80), so nothing here hands them a
port it has not checked: ASCII digits, 1..65535, or 0 ("any") where listening.
"""

from __future__ import annotations

MAX_PORT = 65535
# Target forms gRPC resolves itself; nothing here to check.
GRPC_SCHEMES = ("unix:", "unix-abstract:", "vsock:", "dns:", "ipv4:", "ipv6:")


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


def grpc_host_port(target: str, *, listen: bool = False) -> tuple[str, int] | None:
    """(host, port) of a gRPC target; None for a form gRPC resolves itself (``unix:PATH``,
    ``dns:///...``) and, when dialing, a bare host (gRPC's default port). ValueError for a
    port that is out of range or not a number, and, when listening, for no port at all."""
    if target.startswith(GRPC_SCHEMES):
        return None
    if not listen and ":" not in target:
        return None
    return split_host_port(target, listen=listen)


def is_loopback(address: str) -> bool:
    """True for unix sockets and loopback hosts; the receiver binds these by default."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")
