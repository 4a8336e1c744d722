"""preflight's output: the verdict first, then what was reclaimed and kept; its JSON; its NPD line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli.fmt import cause_fix, display, escape, fix_line, lossless, prose, safe

__all__ = ["display", "doc", "headline", "human", "npd"]
from smgshm.cli.jsonout import plain
from smgshm.cli.npd import NpdStatus, npd_emit
from smgshm.core.units import human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.core.node.preflight import Entry, PreflightReport

_STYLE = {"ok": "bold green", "unknown": "bold yellow", "fail": "bold red"}
_MODE = {"wrapper": "wrapper", "init_container": "init container", "standalone": "standalone"}
# Causes that say the check could not be made (Unknown), not that the node has a problem: SHM *may* be off.
_UNKNOWN_CAUSES = {"preflight_timeout", "namespace_unreadable"}


def headline(r: PreflightReport) -> str:
    """The first line; it agrees with the exit code (and in wrapper mode says what happens next)."""
    freed = (
        f"reclaimed {r.reclaimed_count} ({human_size(r.reclaimed_bytes)})"
        if r.reclaims
        else f"would reclaim {r.would_reclaim_count} ({human_size(r.would_reclaim_bytes)}; read-only, --reclaim does)"
    )
    codes = ", ".join(c.code for c in r.causes)
    if r.verdict == "fail" and not r.may_start:
        return f"preflight failed ({codes}): the gateway must not start (--require-shm); {freed}"
    if r.verdict == "fail":  # SMG falls back to inline: the gateway starts, slower
        # a wrapper's headline is written before its exec: it says what comes next, not that it ran
        starts = {"wrapper": "the gateway is exec'd next", "init_container": "the gateway starts"}.get(
            r.mode, "the gateway may start"
        )
        off = "may be off" if all(c.code in _UNKNOWN_CAUSES for c in r.causes) else "will be off"
        return f"preflight degraded: {starts}; SHM {off} (inline): {codes}; {freed}"
    space = f"{human_size(r.shm_free_bytes)} of {human_size(r.shm_total_bytes)} free"
    if r.verdict == "unknown":
        n = r.kept_counts.get("unknown", 0)
        return f"preflight unknown: the gateway may start; {freed}, {n} SMG name(s) could not be judged (kept); {space}"
    return f"preflight ok: the gateway may start; {freed}; {space}"


def _entry_doc(e: Entry) -> dict[str, Any]:
    return {
        "name": display(e.name),
        "name_hex": lossless(e.name),
        "kind": e.kind,
        "state": e.state,
        "nbytes": e.nbytes,
        "producer_pid": e.producer_pid,
        "reason": e.reason,
        "freed_bytes": e.freed_bytes,
    }


def doc(r: PreflightReport) -> dict[str, Any]:
    """The JSON result (``result`` of the one document)."""
    out: dict[str, Any] = plain(r)
    out["shm_dir"] = display(r.shm_dir)
    out["reclaimed"] = [_entry_doc(e) for e in r.reclaimed]
    out["kept"] = [_entry_doc(e) for e in r.kept]
    out["would_reclaim"] = [_entry_doc(e) for e in r.would_reclaim]
    out["headline"] = headline(r)
    return out


def _entries(app: App, title: str, entries: list[Entry], total: int) -> None:
    if not entries:
        return
    app.console.print(Text(f"{title}:", style="bold"))
    for e in entries:
        size = human_size(e.freed_bytes if title == "reclaimed" else e.nbytes)
        prose(app.console, Text(f"  {e.state:<9} {size:>10}  ") + safe(e.name) + Text(": ") + safe(e.reason), indent=4)
    if total > len(entries):
        app.console.print(f"  ... {total - len(entries)} more (--json lists the first {len(entries)})")


def human(app: App, r: PreflightReport) -> None:
    style = _STYLE["unknown"] if r.verdict == "fail" and r.may_start else _STYLE[r.verdict]  # degraded: yellow
    prose(app.console, Text(headline(r), style=style), 2)
    for c in r.causes:
        prose(app.console, Text(f"  {c.code}: ", style="red") + safe(c.message), indent=4)
        fix_line(app, cause_fix(c), indent=4)
    proof = "holds" if r.proof.holds else "does not hold"
    prose(
        app.console,
        Text(f"mode: {_MODE[r.mode]}, pid {r.pid}; proof ({r.proof.rule}) {proof}: ") + safe(r.proof.note),
        indent=2,
    )
    ns = escape(r.namespace_id) if r.namespace_id else "unreadable"
    prose(
        app.console,
        Text(
            f"shm dir {escape(r.shm_dir)}: {escape(r.fstype or '?')}, namespace id {ns}, "
            f"need {human_size(r.need_bytes)}"
        ),
        2,
    )
    _entries(app, "reclaimed", r.reclaimed, r.reclaimed_count)
    _entries(app, "would reclaim (read-only: --reclaim reclaims)", r.would_reclaim, r.would_reclaim_count)
    _entries(app, "kept", r.kept, sum(r.kept_counts.values()))
    for note in r.notes:
        app.warn(note)


def npd(r: PreflightReport) -> int:
    """NPD's line and status: a failed check is a problem (1) unless it could not be checked (2)."""
    if r.verdict == "fail":
        status = NpdStatus.UNKNOWN if all(c.code in _UNKNOWN_CAUSES for c in r.causes) else NpdStatus.PROBLEM
        first = r.causes[0]
        detail = (
            f"free {human_size(r.shm_free_bytes)} < need {human_size(r.need_bytes)}"
            if first.code in ("shm_too_small", "shm_full") and r.need_bytes
            else first.message
        )
        return npd_emit(status, f"{first.code}: {detail}")
    if r.verdict == "unknown":
        n = r.kept_counts.get("unknown", 0)
        return npd_emit(NpdStatus.UNKNOWN, f"preflight unknown: {n} SMG name(s) not judged: {r.proof.note}")
    done = f"reclaimed {r.reclaimed_count}" if r.reclaims else f"{r.would_reclaim_count} reclaimable (read-only)"
    return npd_emit(NpdStatus.OK, f"preflight ok: {human_size(r.shm_free_bytes)} free, {done}")
