"""The SmgshmError tree. Each error carries fields and builds a one-line message."""

from __future__ import annotations

from typing import Any

from smgshm.core.outcomes import Outcome


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, raised once the run has stopped what it started: ``said`` is that, in one
    line (what it stopped, and what became of the files it made), for the CLI to print before exit 130."""

    def __init__(self, said: str) -> None:
        super().__init__(said)
        self.said = said


class SmgshmError(Exception):
    """Base of every error the core raises on purpose.

    ``kind`` is a stable snake_case name used in JSON; ``fields`` carry the facts
    (path, pid, endpoint, nbytes) the way psutil's exceptions do; ``hint`` is the fix.
    ``outcome`` is what the error means for the run (the CLI's exit code follows from it).
    """

    kind = "error"
    outcome = Outcome.FAILED

    def __init__(self, what: str, *, hint: str | None = None, **fields: Any) -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint
        self.fields = {k: v for k, v in fields.items() if v is not None}

    def __str__(self) -> str:
        if not self.fields:
            return self.what
        inner = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in self.fields.items())
        return f"{self.what} ({inner})"


class HandleError(SmgshmError):
    """A ShmHandle that SMG's reader would refuse: bad name, offset or size."""

    kind = "invalid_handle"


class SegmentError(SmgshmError):
    """A segment that exists but cannot be read as a tensor payload."""

    kind = "bad_segment"

    def __init__(self, what: str, *, code: str = "bad_segment", **kw: Any) -> None:
        super().__init__(what, **kw)
        self.code = code


class WireError(SmgshmError):
    """A TensorData whose dtype, shape and payload disagree, or an unknown layout."""

    kind = "wire"


class MessageTooLargeError(WireError):
    """An inline request the receiver's gRPC message limit would refuse: refused before sending."""

    kind = "message_too_large"


class VerificationError(SmgshmError):
    """A receiver's receipts do not vouch for what was sent: a verdict (exit 3), not a fault."""

    kind = "verification_failed"
    outcome = Outcome.CHECK_FAILED


class TooManyTensorsError(WireError):
    """A request carrying more tensors than the receiver's documented limit: refused up front."""

    kind = "too_many_tensors"


class HostError(SmgshmError):
    """The local environment: no shm dir, a full tmpfs, permission denied."""

    kind = "host"
    outcome = Outcome.HOST


class NoSpaceError(HostError):
    """The shm dir cannot hold the segment; carries needed, total and free bytes, and ``cause``, the code of
    its cause (``shm_too_small`` when the total is below the need, whatever is free; else ``shm_full``)."""

    kind = "no_space"

    def __init__(self, what: str, *, cause: str = "shm_full", **kw: Any) -> None:
        super().__init__(what, **kw)
        self.cause = cause


class TransportError(SmgshmError):
    """The endpoint is unreachable, timed out, or is not the service we expected."""

    kind = "transport"
    outcome = Outcome.UNREACHABLE


class GatewayNotReadyError(TransportError):
    """The gateway answers but does not serve yet (HTTP 502/503/504): still exit 4, under its own kind,
    which is the cause catalogue's code (``gateway_not_ready``) so that JSON can alert on it."""

    kind = "gateway_not_ready"


class ServerError(SmgshmError):
    """The peer answered but refused the request."""

    kind = "refused"
