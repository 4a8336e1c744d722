"""The transport setting as SMG's gateway logged it at start, read from its log file.

The gateway resolves flag > YAML > ``SMG_MM_TENSOR_TRANSPORT`` > default once at start
and logs the outcome (smg-facts §2.3, §5.5)::

    ... Multimodal tensor transport configured mode=shm shm_min_bytes=65536 dev_writable=true

That line is the only authoritative account of the setting: the process title hides
the flags and the environment. The log is a stranger's file, so it is opened only if it
is a regular file (a FIFO would block), read up to a cap, and its text is data.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from smgshm.core.errors import HostError

CONFIGURED = "Multimodal tensor transport configured"
MAX_LOG_BYTES = 256 * 1024 * 1024  # a log bigger than this is read only up to here
_MAX_LINE = 64 * 1024
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Lines the gateway logs when the operator's setting did not take (binary strings of smg 1.13.0).
_WARNINGS = {
    "Unknown multimodal tensor transport value": "an unknown transport value was given: the gateway uses inline",
    "Invalid multimodal SHM min-bytes value": "an invalid shm_min_bytes was given: the gateway uses its default",
    "Deprecated multimodal transport env var is set": "a deprecated SMG_TOKENSPEED_* variable sets the transport",
    # A log message's text, not a path we use:
    "/dev/shm is not writable": "the gateway's probe could not write /dev/shm: SHM falls back to inline",  # noqa: S108
}


@dataclass(frozen=True)
class TransportConfig:
    """The last transport line of a log: what the gateway that wrote it runs with."""

    path: str
    line_no: int
    mode: str  # inline | shm | auto | rdma (as logged)
    shm_min_bytes: int | None
    dev_writable: bool | None
    timestamp: str  # the line's own leading timestamp, as printed
    starts: int = 1  # how many start-up lines the log holds (a log appended across restarts)
    warnings: list[str] = field(default_factory=list)  # what the gateway said about the setting
    truncated: bool = False  # the log was longer than MAX_LOG_BYTES


def _field(line: str, key: str) -> str | None:
    # key=value (text format) or "key":value / "key":"value" (--log-json).
    m = re.search(rf'(?<![A-Za-z0-9_]){key}"?\s*[=:]\s*"?([A-Za-z0-9_.-]+)', line)
    return m.group(1) if m else None


def parse_transport_line(line: str) -> tuple[str, int | None, bool | None] | None:
    """(mode, shm_min_bytes, dev_writable) of one log line, or None if it is not the line."""
    line = _ANSI.sub("", line)
    if CONFIGURED not in line:
        return None
    mode = _field(line, "mode")
    if mode is None:
        return None
    size = _field(line, "shm_min_bytes")
    writable = _field(line, "dev_writable")
    return (
        mode.lower(),
        int(size) if size is not None and size.isascii() and size.isdigit() else None,
        {"true": True, "false": False}.get((writable or "").lower()),
    )


def read_transport_config(path: str, max_bytes: int = MAX_LOG_BYTES) -> TransportConfig | None:
    """The last transport line in ``path`` (None when there is none); HostError when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise HostError(f"cannot read the gateway log: {err.strerror}", path=path) from err
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise HostError("the gateway log is not a regular file", path=path)
        found: TransportConfig | None = None
        starts, warnings, read = 0, [], 0
        pending: list[str] = []
        for no, raw in enumerate(iter(lambda: f.readline(_MAX_LINE), b""), start=1):
            read += len(raw)
            if read > max_bytes:
                break
            line = raw.decode("utf-8", "replace")
            for needle, meaning in _WARNINGS.items():
                if needle in line and meaning not in pending:
                    pending.append(meaning)
            parsed = parse_transport_line(line)
            if parsed is None:
                continue
            starts += 1
            warnings, pending = pending, []  # warnings belong to the start they precede
            clean = _ANSI.sub("", line).strip()
            stamp = " ".join(clean.split()[:2]) if clean[:1].isdigit() else ""
            found = TransportConfig(path, no, *parsed, timestamp=stamp)
        if found is None:
            return None
        # What came after the last start line belongs to the run that line began.
        late = [w for w in pending if w not in warnings]
        return TransportConfig(
            found.path,
            found.line_no,
            found.mode,
            found.shm_min_bytes,
            found.dev_writable,
            found.timestamp,
            starts,
            warnings + late,
            read > max_bytes,
        )


def read_open_log(pid: int, logs: Iterable[tuple[int, str]]) -> TransportConfig | None:
    """The transport line of the first log process ``pid`` has open that holds one, or None.

    ``logs``: (fd, path as the process names it). Each is read through /proc/PID/fd/N, the very
    file even from another mount namespace, and the result is named by the process's own path.
    """
    for fd, path in logs:
        try:
            config = read_transport_config(f"/proc/{pid}/fd/{fd}")
        except HostError:
            continue
        if config is not None:
            return replace(config, path=path)
    return None
