"""Human output of ``smgshm probe``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.ns_view import sharing_fix

if TYPE_CHECKING:
    from smgshm.cli.app import App

def probe_report(app: App, report: Any) -> None:
    shared = [w for w in report.workers if w.verdict == "shared"]
    n = len(report.workers)
    if len(shared) == n:
        head, style = f"SHM usable: /dev/shm is shared with {'the worker' if n == 1 else f'all {n} workers'}", "green"
    else:
        head, style = f"SHM not usable for {n - len(shared)} of {n} worker(s)", "red"
    app.console.print(Text(head, style=f"bold {style}"))
    table = Table(show_lines=False)
    labelled = any(w.gateway_label is not None for w in report.workers)
    for col in ("worker", "engine", "health", "verdict", "auto", *(("gw label",) if labelled else ())):
        table.add_column(col, no_wrap=True)
    for w in report.workers:
        health = "-"
        if w.health is not None:
            ok = w.health.engine_healthy is not False and w.health.grpc_health == "SERVING"
            health = "ok" if ok else f"{'healthy' if w.health.engine_healthy else 'unhealthy'}/{w.health.grpc_health}"
        auto = w.decisions["auto"].path if w.decisions else "-"
        label = () if not labelled else (("same" if w.gateway_label == w.namespace_id else w.gateway_label or "-"),)
        table.add_row(Text(w.address), w.engine or "-", health, w.verdict, auto, *label)
    app.console.print(table)
    for w in report.workers:
        why = w.reason + (f"; verify: {w.verify.message}" if w.verify is not None else "")
        auto = f"; under auto the gateway sends {w.decisions['auto'].path}" if w.decisions else ""
        app.console.print(Text(f"{w.address}: ", style="bold") + Text(why + auto))
    if app.quiet:
        return
    for w in report.workers:
        fix = sharing_fix(w.verdict)
        if w.verdict == "unreachable":
            fix = "check the address and that the worker's gRPC server is up (--connect-timeout to wait longer)"
        if w.verdict == "uid_mismatch":
            fix = "run the gateway and the worker as the same uid (segments are created 0600)"
        if fix:
            app.err_console.print(Text("hint: ", style="cyan") + Text(f"{w.address}: {fix}"))
