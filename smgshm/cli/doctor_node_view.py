"""Output of ``smgshm doctor --node``: a verdict for the node, then a block per tmpfs, verdict first.

A block shows its pod, its figures, and each check that is not plain ok, with its cause and fix
(doctor's own check lines); --json carries every check. Pod names, volumes and paths come from the
node's filesystem: shown escaped, as gc --node shows them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli.doctor_view import doctor_check, mark
from smgshm.cli.fmt import TMPFS_KINDS, display, escape, prose, safe, tmpfs_fields
from smgshm.cli.jsonout import plain
from smgshm.core.node.doctor import NodeCheckup, TmpfsCheckup
from smgshm.core.node.scan import pod_label
from smgshm.core.units import human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App

VERDICTS = ("fail", "warn", "unknown", "ok")
_SHOWN = ("fail", "warn", "unknown", "info")  # a block lists these checks; ok and skip are in --json


def tally(report: NodeCheckup) -> dict[str, int]:
    out = dict.fromkeys(VERDICTS, 0)
    for t in report.tmpfs:
        out[t.verdict] += 1
    return out


def headline(report: NodeCheckup) -> tuple[str, str]:
    """The first line and its style: it agrees with the exit code (failed only when a check failed)."""
    n = tally(report)
    parts = ", ".join(f"{n[v]} {'failed' if v == 'fail' else v}" for v in VERDICTS if n[v]) or "none found"
    line = f"doctor: node {display(report.root)}: {len(report.tmpfs)} tmpfs: {parts}"
    if report.node_checks:  # what it cannot see: first, since "none found" may be blindness
        line += f"; node view unknown ({len(report.node_checks)} warning(s))"
    warned = n["warn"] or n["unknown"] or report.node_checks
    style = "bold red" if n["fail"] else "bold yellow" if warned else "bold green"
    return line, style


def report(app: App, r: NodeCheckup) -> None:
    """The node's verdict, then each tmpfs's block (--quiet: the verdict)."""
    line, style = headline(r)
    prose(app.console, safe(line, style), 6)
    for check in r.node_checks:
        doctor_check(app, check, show_cause=True)
    for t in [] if app.quiet else r.tmpfs:
        app.console.print()
        _block(app, t)


def _block(app: App, c: TmpfsCheckup) -> None:
    t = c.tmpfs
    who = "no pod" if t.pod_uid is None else f"pod {escape(pod_label(t))} (uid {escape(t.pod_uid)})"
    what = TMPFS_KINDS[t.place.kind] + ("" if t.place.volume is None else f" {escape(t.place.volume)}")
    prose(app.console, mark(c.verdict) + Text(f" {who}, {what}: {escape(t.place.path)}"), 7)
    h = t.hidden
    states = ", ".join(f"{k} {n}" for k, n in c.counts.items() if n) or "none"
    figures = (
        f"size {human_size(c.shm_total_bytes)}, used {human_size(c.shm_used_bytes)}, free "
        f"{human_size(c.shm_free_bytes)}; leaked {human_size(c.leaked_bytes)} ({_pct(c.share(c.leaked_bytes))}), "
        f"hidden {human_size(h.nbytes)} ({_pct(c.share(h.nbytes))}); SMG names: {states}"
    )
    prose(app.console, Text("       " + figures), 7)
    for check in c.checks:
        if check.status in _SHOWN:
            doctor_check(app, check, show_cause=True)


def _pct(share: float) -> str:
    return "<0.1%" if 0 < share < 0.001 else f"{share:.1%}"


def doc(r: NodeCheckup) -> dict[str, Any]:
    """The --json result: the node's tally and each tmpfs's figures and checks (doctor's check objects)."""
    n = tally(r)
    worst = next((v for v in VERDICTS if n[v] or (v == "warn" and r.node_checks)), "ok")
    return {
        "node_root": display(r.root),
        "pods_known": r.pods_known,
        "verdict": worst,
        "verdicts": n,
        "tmpfs": [_tmpfs_doc(t) for t in r.tmpfs],
        "node_checks": plain(r.node_checks),
    }


def _tmpfs_doc(c: TmpfsCheckup) -> dict[str, Any]:
    t, h = c.tmpfs, c.tmpfs.hidden
    return {
        **tmpfs_fields(t),
        "verdict": c.verdict,
        "namespace_id": c.namespace_id,
        "shm_total_bytes": c.shm_total_bytes,
        "shm_used_bytes": c.shm_used_bytes,
        "shm_free_bytes": c.shm_free_bytes,
        "leaked_bytes": c.leaked_bytes,
        "leaked_ratio": c.share(c.leaked_bytes),
        "hidden_bytes": h.nbytes,
        "hidden_ratio": c.share(h.nbytes),
        "hidden_files": h.files,
        "hidden_complete": h.complete,
        "processes": len(t.users),
        "pid_namespaces": [s.ns for s in t.spaces],
        "gateways": [{"pid": g.pid, "ns_pid": g.ns_pid} for g in c.gateways],
        "liveness_trusted": t.trust.trusted,
        "liveness_note": t.trust.note,
        "counts": c.counts,
        "checks": plain(c.checks),
    }


__all__ = ["doc", "headline", "report"]
