"""Dialing a worker: address forms, message limits, and a bounded wait for the connection."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from smgshm.core.errors import TransportError
from smgshm.core.transport.address import grpc_host_port


def grpc_target(address: str) -> str:
    """``grpc://h:p`` and ``h:p`` -> ``h:p``; ``unix:PATH`` as is; a DP ``@rank`` suffix stripped."""
    a = address.strip()
    for scheme in ("grpc://", "grpcs://"):
        if a.startswith(scheme):
            a = a[len(scheme) :]
    if not a.startswith("unix:"):
        a = a.split("/", 1)[0].split("@", 1)[0]
    return a


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


def preflight(target: str, timeout: float) -> None:
    """Fail at once where gRPC would retry quietly until the connect timeout (no such host,
    refused) or dial another port than the one given (a port out of range: see ``address``).

    gRPC's channel_ready_future sees a refused port only as TRANSIENT_FAILURE and keeps
    reconnecting with backoff, so an operator waited the whole --connect-timeout for a
    typo. One plain TCP connect first tells "cannot resolve host" and "connection refused"
    apart from a slow peer; the channel then connects as before.
    """
    try:
        hp = grpc_host_port(target)
    except ValueError as err:
        raise TransportError(f"not an address to dial: {err}", endpoint=target) from None
    if hp is None:
        return
    deadline = time.monotonic() + timeout
    infos = resolve(hp[0], hp[1], timeout, target)
    refused = False
    for family, kind, proto, _, addr in infos:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(left)
            try:
                sock.connect(addr)
                return
            except ConnectionRefusedError:
                refused = True
            except OSError:
                continue  # unreachable network, timeout: let gRPC try within what is left
    if refused:
        raise TransportError(
            "endpoint unreachable: connection refused",
            endpoint=target,
            hint="is the worker's gRPC server up on that port?",
        )


def open_channel(address: str, connect_timeout: float, max_message_bytes: int | None = None) -> Any:
    """A connected insecure channel, or TransportError within ``connect_timeout`` seconds."""
    import grpc

    target = grpc_target(address)
    start = time.monotonic()
    preflight(target, connect_timeout)
    connect_timeout = max(0.05, connect_timeout - (time.monotonic() - start))
    opts = []
    if max_message_bytes:
        opts = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
    channel = grpc.insecure_channel(target, options=opts)
    try:
        grpc.channel_ready_future(channel).result(timeout=connect_timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        raise TransportError("endpoint unreachable", endpoint=target, connect_timeout_s=connect_timeout) from None
    return channel
