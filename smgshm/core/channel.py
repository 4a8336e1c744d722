"""Dialing a worker: address forms, message limits, and a bounded wait for the connection."""

from __future__ import annotations

from typing import Any

from smgshm.core.errors import TransportError


def grpc_target(address: str) -> str:
    """``grpc://h:p`` and ``h:p`` -> ``h:p``; ``unix:PATH`` as is; a DP ``@rank`` suffix stripped."""
    a = address.strip()
    for scheme in ("grpc://", "grpcs://"):
        if a.startswith(scheme):
            a = a[len(scheme) :]
    if not a.startswith("unix:"):
        a = a.split("/", 1)[0].split("@", 1)[0]
    return a


def open_channel(address: str, connect_timeout: float, max_message_bytes: int | None = None) -> Any:
    """A connected insecure channel, or TransportError within ``connect_timeout`` seconds."""
    import grpc

    target = grpc_target(address)
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
