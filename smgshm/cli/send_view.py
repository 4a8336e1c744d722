"""Human output of ``smgshm send``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.fmt import human_bytes

if TYPE_CHECKING:
    from smgshm.cli.app import App

def send_report(app: App, report: Any) -> None:
    n = sum(p.requests for p in report.paths)
    if report.ok:
        what = "verified" if report.verified else "sent (not verified: --no-verify)"
        app.console.print(Text(f"OK: {n} request(s) {what}, no segment left behind", style="bold green"))
    elif report.unreachable:
        app.console.print(Text(f"FAILED: the receiver at {report.address} became unreachable", style="bold red"))
    else:
        app.console.print(Text(f"FAILED: {len(report.problems)} problem(s) in {n} request(s)", style="bold red"))
    table = Table()
    cols = ("path", "req", "tensors", "bytes", "fail", "wrong", "left", "p50 ms", "p90 ms", "p99 ms", "GB/s")
    for col in cols:
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=True, min_width=len(col))
    table.box = None  # the widest report still fits 80 columns
    for p in report.paths:
        table.add_row(
            p.path,
            str(p.requests),
            str(p.tensors),
            human_bytes(p.nbytes),
            str(p.failures),
            str(p.mismatches),
            str(p.leftovers),
            f"{p.p50_ms:.2f}",
            f"{p.p90_ms:.2f}",
            f"{p.p99_ms:.2f}",
            f"{p.gb_per_s:.2f}",
        )
    app.console.print(table)
    for prob in report.problems[:10]:
        app.console.print(Text(f"request {prob.request} {prob.key}: {prob.kind}: {prob.message}"))
    if len(report.problems) > 10:
        app.console.print(Text(f"... and {len(report.problems) - 10} more (see --json)"))
    if app.quiet:
        return
    kinds = {p.kind for p in report.problems}
    msgs = " ".join(p.message for p in report.problems)
    if "permission" in msgs:
        uid = report.receiver_uid
        fix = f"the receiver runs as uid {uid}; segments are 0600 and owned by this process's uid"
        app.err_console.print(Text("hint: ", style="cyan") + Text(fix))
    if "leftover" in kinds and not report.receiver_unlinks:
        app.err_console.print(
            Text("hint: ", style="cyan")
            + Text(
                "the receiver keeps segments (unlink after read is off); SMG's gateway relies on the worker to unlink "
                "after reading, so every SHM tensor would leak"
            )
        )
