"""node-problem-detector's custom plugin contract, in one place: the status codes, the one line, and the
verdicts of gc's check (``gc --check --npd``, ``gc --node --check --npd`` and the exporter's verdict file,
core/node/npdfile.py, all say them through here).

NPD runs a plugin, reads its exit status (0 OK, 1 NonOK: a problem, 2 Unknown) and takes its stdout,
cut to ``max_output_length`` (80 by default), as the condition's or event's message. So a plugin
mode prints exactly one line of at most 80 characters, plain ASCII (no colour, a stranger's name
escaped), and every failure of its own, a usage error or a bug included, is Unknown: never OK.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from smgshm.core.host.escape import escape
from smgshm.core.node.sight import Blind
from smgshm.core.units import human_size

MAX_CHARS = 80


class NpdStatus(enum.IntEnum):
    OK = 0
    PROBLEM = 1  # NPD's NonOK
    UNKNOWN = 2


def npd_line(message: str) -> str:
    """``message`` as NPD's one line: escaped, ASCII only, at most MAX_CHARS (cut with "...")."""
    text = escape(message).encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."


@dataclass(frozen=True)
class NpdVerdict:
    """A check's status and its one line (already ``npd_line``'s)."""

    status: NpdStatus
    line: str

    @classmethod
    def of(cls, status: NpdStatus, message: str) -> NpdVerdict:
        return cls(status, npd_line(message))


def gc_verdict(
    counts: Mapping[str, int], bytes_by_state: Mapping[str, int], deleted: int, untrusted: str, where: str = ""
) -> NpdVerdict:
    """gc --check's verdict: leaked or hazardous entries are a problem (1), entries that cannot be judged
    (``untrusted``: why liveness is not trusted) Unknown (2), else OK (0)."""
    c, b = counts, bytes_by_state
    gone = f", deleted {deleted}" if deleted else ""
    at = f" ({where})" if where else ""
    if c["leaked"] or c["hazard"]:
        return NpdVerdict.of(
            NpdStatus.PROBLEM, f"gc: {c['leaked']} leaked ({human_size(b['leaked'])}), {c['hazard']} hazard{gone}{at}"
        )
    if c["unknown"]:
        why = untrusted or "liveness undecided"
        return NpdVerdict.of(NpdStatus.UNKNOWN, f"gc: {c['unknown']} unknown{gone}{at}: {why}")
    return NpdVerdict.of(NpdStatus.OK, f"gc: ok, {sum(c.values())} SMG segment(s), none leaked{gone}{at}")


def node_verdict(
    counts: Mapping[str, int],
    bytes_by_state: Mapping[str, int],
    *,
    deleted: int,
    tmpfs: int,
    untrusted: int,
    unread: int,
    blind: Sequence[Blind],
) -> NpdVerdict:
    """gc --node --check's verdict over every tmpfs (``tmpfs`` of them: ``untrusted`` not judged by pid,
    ``unread`` still mounted but not scanned): a blind view (sight.py) or a tmpfs not scanned is Unknown
    unless a leak was found anyway."""
    found = counts["leaked"] or counts["hazard"]
    if blind and not found:
        why = {
            Blind.NODE_ROOT: "no kubelet/runtime dir under --node-root",
            Blind.HOST_PID: "no hostPID",
            Blind.STATE_DIR: "--runtime-state-dir missing",
            Blind.LAYOUT_READ: "a dir under --node-root stalled",
            Blind.UNREADABLE: "a node dir may not be listed",
            Blind.HOST_MNT: "host mount namespace unknown",
        }
        said = "; ".join(dict.fromkeys(why[r] for r in blind))
        return NpdVerdict.of(NpdStatus.UNKNOWN, f"gc: node view unknown: {said}")
    note = f"{untrusted} of {tmpfs} tmpfs not judged by pid" if untrusted else ""
    if unread and not found:  # a leak elsewhere stays a problem (1)
        return NpdVerdict.of(NpdStatus.UNKNOWN, f"gc: {unread} of {tmpfs} tmpfs could not be scanned (node)")
    return gc_verdict(counts, bytes_by_state, deleted, note, where=f"node, {tmpfs} tmpfs")


def error_verdict(kind: str, message: str) -> NpdVerdict:
    """A run that failed (the node root unreadable): Unknown, said as the CLI says an error under --npd."""
    return NpdVerdict.of(NpdStatus.UNKNOWN, f"error: {kind}: {message}")


__all__ = ["MAX_CHARS", "NpdStatus", "NpdVerdict", "error_verdict", "gc_verdict", "node_verdict", "npd_line"]
