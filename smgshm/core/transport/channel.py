"""Dialing a worker: message limits and a bounded wait for the connection (its address is read by ``address``)."""

from __future__ import annotations

import socket
import time
from typing import Any

from smgshm.core.address import grpc_host_port, grpc_target, resolve
from smgshm.core.errors import TransportError


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
