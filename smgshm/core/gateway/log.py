"""The transport setting as SMG's gateway logged it at start, read from its log file.

The gateway resolves flag > YAML > ``SMG_MM_TENSOR_TRANSPORT`` > default once at start
and logs the outcome (smg-facts §2.3, §5.5)::

    ... Multimodal tensor transport configured mode=shm shm_min_bytes=65536 dev_writable=true

That line is the only authoritative account of the setting: the process title hides
the flags and the environment. The log is a stranger's file (any user can title a
process ``smg::router``), so it is opened only if it is a regular file (a FIFO would
block), and only what the start-up line needs is read: its first ``HEAD_BYTES`` (a run's
first lines) and its last ``TAIL_BYTES`` (the last start of a log appended across
restarts), each file once however many links or fds name it, within one ``LogBudget``
of bytes and time for a whole inspection. Lines are found by searching the bytes for the
few strings that matter, never walked one by one; their text is data.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from smgshm.core.errors import HostError
from smgshm.core.gateway.setting import Mode, parse_mode

CONFIGURED = "Multimodal tensor transport configured"
# What the gateway logs for each SHM write that failed (its error after it), before it sends the tensor inline.
WRITE_ERROR = "Failed to write multimodal SHM tensor"
MAX_WRITE_ERRORS = 3  # the last few of a run are quoted: the log is a stranger's, its lines are bounded data
MAX_QUOTE = 240  # characters of one quoted line
HEAD_BYTES = 1 << 20  # the start-up line is among a run's first lines
TAIL_BYTES = 4 << 20  # a log appended across restarts has its last start near its end
MAX_TOTAL_BYTES = 64 << 20  # all the logs of one inspection together
MAX_SECONDS = 5.0  # the same, in time
_CHUNK = 1 << 20  # bytes per read: the budget is checked between reads
_MAX_LINE = 64 * 1024  # of a line, only this much each side of what was found is parsed
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Lines the gateway logs when the operator's setting did not take (binary strings of smg 1.13.0).
_WARNINGS = {
    "Unknown multimodal tensor transport value": "an unknown transport value was given: the gateway uses inline",
    "Invalid multimodal SHM min-bytes value": "an invalid shm_min_bytes was given: the gateway uses its default",
    "Deprecated multimodal transport env var is set": "a deprecated SMG_TOKENSPEED_* variable sets the transport",
    # A log message's text, not a path we use:
    "/dev/shm is not writable": "the gateway's probe could not write /dev/shm: SHM falls back to inline",  # noqa: S108
}
_NEEDLES = re.compile(b"|".join(re.escape(n.encode()) for n in (CONFIGURED, WRITE_ERROR, *_WARNINGS)))


@dataclass(frozen=True)
class TransportConfig:
    """The last transport line of a log: what the gateway that wrote it runs with."""

    path: str
    line_no: int  # 0: not known (the line is in the tail of a log whose middle was not read)
    mode: Mode  # as logged
    shm_min_bytes: int | None
    dev_writable: bool | None
    timestamp: str  # the line's own leading timestamp, as printed
    starts: int = 1  # how many start-up lines the part read holds (a log appended across restarts)
    warnings: list[str] = field(default_factory=list)  # what the gateway said about the setting
    truncated: bool = False  # only part of the log was read (its head and tail, or what the budget allowed)
    # The last few lines (at most MAX_WRITE_ERRORS) of the run that line began that say an SHM write failed, as
    # ``quote`` makes them: colour codes gone, control characters replaced, each at most MAX_QUOTE characters.
    write_errors: list[str] = field(default_factory=list)  # the run's last SHM write-error lines, quoted

    @property
    def where(self) -> str:
        """The line's place, for evidence: ``path:line``, or where in the file when its number is not known."""
        return f"{self.path}:{self.line_no}" if self.line_no else f"{self.path} (in its last {TAIL_BYTES >> 20} MiB)"


@dataclass
class LogBudget:
    """What one inspection may spend on logs: bytes and time for all of them, each file read once.

    A file already read (the same inode through another link, fd or gateway) gives the answer
    it gave before, at no cost."""

    bytes_left: int = MAX_TOTAL_BYTES
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_SECONDS)
    read: dict[tuple[int, int], TransportConfig | None] = field(default_factory=dict)  # by (st_dev, st_ino)

    def spent(self) -> str:
        """Why nothing more may be read ("" while something may)."""
        if self.bytes_left <= 0:
            return f"the {MAX_TOTAL_BYTES >> 20} MiB budget for reading gateway logs is spent"
        if time.monotonic() >= self.deadline:
            return f"the {MAX_SECONDS:g} s budget for reading gateway logs is spent"
        return ""


def _field(line: str, key: str) -> str | None:
    # key=value (text format) or "key":value / "key":"value" (--log-json).
    m = re.search(rf'(?<![A-Za-z0-9_]){key}"?\s*[=:]\s*"?([A-Za-z0-9_.-]+)', line)
    return m.group(1) if m else None


def parse_transport_line(line: str) -> tuple[Mode, int | None, bool | None] | None:
    """(mode, shm_min_bytes, dev_writable) of one log line, or None if it is not the line (a mode SMG does
    not have included: no setting is read from it)."""
    line = _ANSI.sub("", line)
    if CONFIGURED not in line:
        return None
    mode = parse_mode(_field(line, "mode"))
    if mode is None:
        return None
    size = _field(line, "shm_min_bytes")
    writable = _field(line, "dev_writable")
    return (
        mode,
        int(size) if size is not None and size.isascii() and size.isdigit() else None,
        {"true": True, "false": False}.get((writable or "").lower()),
    )


def _read_span(fd: int, start: int, end: int, budget: LogBudget) -> tuple[bytes, bool]:
    """Bytes [start, end) of the file, read while the budget lasts; (data, whether all of it was read)."""
    parts: list[bytes] = []
    pos = start
    while pos < end:
        if budget.spent():
            return b"".join(parts), False
        want = min(_CHUNK, end - pos, budget.bytes_left)
        got = os.pread(fd, want, pos)
        budget.bytes_left -= len(got)
        if not got:
            break  # shrunk meanwhile: what is there is all there is
        parts.append(got)
        pos += len(got)
    return b"".join(parts), True


def _head_and_tail(fd: int, size: int, budget: LogBudget) -> tuple[list[tuple[bytes, bool]], bool]:
    """The parts of the file to search, each (bytes, whether its line numbers are known), and whether
    they are the whole file. Only whole lines: a line cut at an edge is not read as if it were whole."""
    if size <= HEAD_BYTES + TAIL_BYTES:
        data, whole = _read_span(fd, 0, size, budget)
        return [(data if whole else data[: data.rfind(b"\n") + 1], True)], whole
    head, whole = _read_span(fd, 0, HEAD_BYTES, budget)
    chunks = [(head[: head.rfind(b"\n") + 1], True)]
    if whole:
        # From one byte before the tail: a newline there means the tail begins with a whole line.
        tail, whole = _read_span(fd, size - TAIL_BYTES - 1, size, budget)
        cut = tail.find(b"\n")
        if cut >= 0:
            chunks.append((tail[cut + 1 :] if whole else tail[cut + 1 : tail.rfind(b"\n") + 1], False))
    return chunks, False


def _lines(data: bytes, numbered: bool, budget: LogBudget) -> Iterator[tuple[int, str]]:
    """(line number or 0, text) of each line of ``data`` that holds one of the strings that matter."""
    last_start, no, counted = -1, 1, 0
    for i, m in enumerate(_NEEDLES.finditer(data)):
        if i % 4096 == 4095 and budget.spent():
            return  # a log full of matching lines: the time bound holds
        start = data.rfind(b"\n", 0, m.start()) + 1
        if start == last_start:
            continue  # one line, several strings: it is looked at once
        last_start = start
        end = data.find(b"\n", m.end())
        end = len(data) if end < 0 else end
        if numbered:
            no += data.count(b"\n", counted, start)
            counted = start
        raw = data[max(start, m.start() - _MAX_LINE) : min(end, m.end() + _MAX_LINE)]
        yield (no if numbered else 0), raw.decode("utf-8", "replace")


def read_transport_config(path: str, budget: LogBudget | None = None) -> TransportConfig | None:
    """The last transport line in ``path`` (None when there is none); HostError when unreadable or
    when ``budget`` (a fresh one by default) is spent before the file could be read."""
    budget = LogBudget() if budget is None else budget
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise HostError(f"cannot read the gateway log: {err.strerror}", path=path) from err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HostError("the gateway log is not a regular file", path=path)
        key = (st.st_dev, st.st_ino)
        if key in budget.read:
            known = budget.read[key]
            return None if known is None else replace(known, path=path)
        why = budget.spent()
        if why:
            raise HostError(why, path=path)
        chunks, whole = _head_and_tail(fd, st.st_size, budget)
    except OSError as err:
        raise HostError(f"cannot read the gateway log: {err.strerror}", path=path) from err
    finally:
        os.close(fd)
    found = _last_start(path, chunks, budget)
    if found is not None and not whole:
        found = replace(found, truncated=True)
    budget.read[key] = found
    return found


def quote(line: str) -> str:
    """A log line as smgshm may repeat it: colour codes gone, every character that is not printable (controls,
    bidi overrides, line separators) as U+FFFD, at most MAX_QUOTE characters. The line is a stranger's."""
    text = "".join(ch if ch.isprintable() else "\ufffd" for ch in _ANSI.sub("", line).strip())
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 1] + "\u2026"


def _last_start(path: str, chunks: list[tuple[bytes, bool]], budget: LogBudget) -> TransportConfig | None:
    found: TransportConfig | None = None
    starts, warnings = 0, []
    pending: list[str] = []
    errors: list[str] = []  # the write errors since the last start line read
    for data, numbered in chunks:
        for no, line in _lines(data, numbered, budget):
            if WRITE_ERROR in line:
                errors.append(quote(line))
                del errors[:-MAX_WRITE_ERRORS]
            for needle, meaning in _WARNINGS.items():
                if needle in line and meaning not in pending:
                    pending.append(meaning)
            parsed = parse_transport_line(line)
            if parsed is None:
                continue
            starts += 1
            warnings, pending, errors = pending, [], []  # warnings belong to the start they precede
            clean = _ANSI.sub("", line).strip()
            stamp = " ".join(clean.split()[:2]) if clean[:1].isdigit() else ""
            found = TransportConfig(path, no, *parsed, timestamp=stamp)
    if found is None:
        return None
    # What came after the last start line belongs to the run that line began.
    late = [w for w in pending if w not in warnings]
    return replace(found, starts=starts, warnings=warnings + late, write_errors=errors)


def read_open_log(pid: int, logs: Iterable[tuple[int, str]], budget: LogBudget | None = None) -> TransportConfig | None:
    """The transport line of the first log process ``pid`` has open that holds one, or None.

    ``logs``: (fd, path as the process names it). Each is read through /proc/PID/fd/N, the very
    file even from another mount namespace, and the result is named by the process's own path.
    ``budget`` (a fresh one by default) bounds them all together: once spent, the rest are not read.
    """
    budget = LogBudget() if budget is None else budget
    for fd, path in logs:
        if budget.spent():
            return None
        try:
            config = read_transport_config(f"/proc/{pid}/fd/{fd}", budget)
        except HostError:
            continue
        if config is not None:
            return replace(config, path=path)
    return None
