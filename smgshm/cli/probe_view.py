"""Human output of ``smgshm probe``: a headline that agrees with the exit code, then the table."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.fmt import fit_table, hint, prose, safe, sharing_fix

if TYPE_CHECKING:
    from smgshm.cli.app import App


def _headline(report: Any, code: ExitCode, expect: str, local_failures: list[str]) -> tuple[str, str]:
    n = len(report.workers)
    who = "the worker" if n == 1 else f"all {n} workers"
    shared = [w for w in report.workers if w.verdict == "shared"]
    if code == ExitCode.OK:
        if expect == "not-shared":
            return f"as expected, /dev/shm is not shared with {who}", "green"
        if n and all(w.verdict == "not_grpc" for w in report.workers):
            return f"SHM not applicable: {who} {'is' if n == 1 else 'are'} not gRPC (tensors go inline)", "green"
        return (f"SHM usable: /dev/shm is shared with {who}" if n else "SHM usable here"), "green"
    unusable = n - len(shared) - sum(1 for w in report.workers if w.verdict == "not_grpc")
    if code == ExitCode.UNREACHABLE:
        k = sum(1 for w in report.workers if w.verdict == "unreachable")
        more = f"; SHM not usable for {unusable} of {n}" if unusable > k else ""
        return f"UNREACHABLE: {k} of {n} worker(s) did not answer (worker_unreachable){more}", "red"
    if code == ExitCode.UNDETERMINED:
        k = sum(1 for w in report.workers if w.verdict == "undetermined")
        said = [f"{k} of {n} worker(s) advertise no usable namespace id"] if k else []
        if report.cause_info is not None:  # nothing judged (no_workers): said first, with its code
            said.insert(0, f"{report.cause_info.message} ({report.cause_info.code})")
        return "UNDETERMINED: " + "; ".join(said), "yellow"
    if code == ExitCode.HOST:
        return f"SHM not usable: {local_failures[0] if local_failures else 'this host cannot write segments'}", "red"
    if expect == "not-shared" and shared:
        return f"SHM is shared with {len(shared)} of {n} worker(s), expected not shared", "red"
    if len(shared) == n and local_failures:
        return f"SHM not usable: {local_failures[0]}", "red"
    return f"SHM not usable for {n - len(shared)} of {n} worker(s)", "red"


def probe_report(code: ExitCode, expect: str, local_failures: list[str]) -> Callable[[App, Any], None]:
    """The renderer, told the exit code so that its first line says the same."""

    def render(app: App, report: Any) -> None:
        head, style = _headline(report, code, expect, local_failures)
        prose(app.console, safe(head, f"bold {style}"), 2)
        if app.quiet:
            return  # -q: the verdict line only
        if report.workers:
            _table(app, report)
        if report.cause_info is not None:
            hint(app, report.cause_info.fix)

    return render


def _table(app: App, report: Any) -> None:
    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0))
    labelled = any(w.gateway_label is not None for w in report.workers)
    for col in ("worker", "engine", "health", "verdict", "auto", *(("gw label",) if labelled else ())):
        table.add_column(col, no_wrap=True)
    for w in report.workers:
        health = "unknown"  # every unknown figure said, never a bare "-"
        if w.health is not None:
            ok = w.health.engine_healthy is not False and w.health.grpc_health == "SERVING"
            health = "ok" if ok else f"{'healthy' if w.health.engine_healthy else 'unhealthy'}/{w.health.grpc_health}"
        auto = w.decisions["auto"].path if w.decisions else "unknown"
        # "same" only for an id both sides have: two missing ids agree on nothing.
        same = bool(w.gateway_label) and w.gateway_label == w.namespace_id
        label = () if not labelled else (safe("same") if same else safe(w.gateway_label or "none"),)
        table.add_row(safe(w.address), safe(w.engine or "unknown"), health, w.verdict, auto, *label)
    fit_table(app.console, table)
    for w in report.workers:
        why = w.reason + (f"; verify: {w.verify.message}" if w.verify is not None else "")
        auto = f"; under auto the gateway sends {w.decisions['auto'].path}" if w.decisions else ""
        # The catalogue's code, as in JSON, where it says more than the verdict column.
        code = f" ({w.cause_info.code})" if w.cause_info is not None and w.cause_info.code != w.verdict else ""
        prose(app.console, safe(w.address, "bold") + Text(": ") + safe(why + auto + code), indent=2)
    for w in report.workers:
        fix = sharing_fix(w.verdict)
        own = w.verdict in ("unreachable", "uid_mismatch") or (
            w.cause_info and w.cause_info.code in ("zmq_lane", "engine_inline_only", "namespace_unreadable")
        )
        if w.cause_info is not None and own:
            fix = w.cause_info.fix
        if fix:
            hint(app, f"{w.address}: {fix}")
