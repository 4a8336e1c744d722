"""File descriptors: every connection takes one, so connections are capped below the limit.

gRPC accepts until the process runs out of descriptors; under ``ulimit -n 128``, 300 clients
that connected and sent nothing kept every other client out for as long as they stayed (and
a segment could not be opened meanwhile). So serve raises its soft limit to the hard one at
start-up, lets gRPC hold at most ``connection_cap`` connections (one more is closed at once),
drops a connection that has not sent its HTTP/2 preface within ``HANDSHAKE_TIMEOUT_S`` and one
with no call under way for ``IDLE_TIMEOUT_S`` (300 that sent the preface and stayed idle kept
every other client out until they closed), and says when the descriptors in use reach the cap.
"""

from __future__ import annotations

import os
import resource

FD_RESERVE = 64  # never taken by connections: segments being read, /proc, logs, the listener
MAX_CONNECTIONS = 1024  # far more than gateways and tools hold; each costs gRPC memory
MAX_SOFT_LIMIT = 65536  # raised at most this far: enough for the cap, sane for select() users
HANDSHAKE_TIMEOUT_S = 3.0  # a gRPC client sends its preface at once; a silent one is let go
# A connection with no call under way for this long is closed (GOAWAY): one that sent its preface and
# then nothing would hold its descriptor for good. A gateway's channel reconnects at its next call.
IDLE_TIMEOUT_S = 5.0


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE toward the hard one (at most MAX_SOFT_LIMIT): (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_SOFT_LIMIT if hard == resource.RLIM_INFINITY else min(hard, MAX_SOFT_LIMIT)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):  # a hard limit the kernel will not grant (nr_open): keep ours
            pass
    return soft, hard


def soft_fd_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_SOFT_LIMIT if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(soft: int | None = None) -> int:
    """How many connections gRPC may hold at once under a soft limit of ``soft`` (now's by default)."""
    soft = soft_fd_limit() if soft is None else soft
    return max(1, min(MAX_CONNECTIONS, soft - FD_RESERVE))


def open_fds() -> int:
    """Descriptors this process has open now (0 when /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


class FdPressure:
    """Says once when the descriptors in use reach the connection cap, again only after they fell well below."""

    def __init__(self) -> None:
        self.said = False

    def check(self) -> str | None:
        soft = soft_fd_limit()
        cap, n = connection_cap(soft), open_fds()
        if n >= cap and not self.said:
            self.said = True
            return (
                f"{n} of {soft} file descriptors (ulimit -n) open: near the cap of {cap} connections, "
                "beyond which a new one is closed at once"
            )
        if n < cap // 2:
            self.said = False
        return None
