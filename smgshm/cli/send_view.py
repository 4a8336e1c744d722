"""Human output of ``smgshm send``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.fmt import fit_table, hint, prose, safe
from smgshm.core.units import human_gb_per_s, human_ms, human_size

if TYPE_CHECKING:
    from collections.abc import Callable

    from smgshm.cli.app import App
    from smgshm.core.client.send import SendOptions


def send_progress(app: App, opts: SendOptions) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """(on_progress(requests_done), close): a bar on a TTY stderr only; by time for --duration."""
    if app.json or app.quiet or not app.err_console.is_terminal:
        return None, lambda: None
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("send"),
        BarColumn(),
        MofNCompleteColumn() if opts.duration is None else TextColumn("{task.fields[requests]} requests"),
        TimeRemainingColumn(),
        console=app.err_console,
        transient=True,
    )
    total = float(opts.duration) if opts.duration is not None else float(opts.count)
    task = bar.add_task("send", total=total, requests=0)
    t0 = time.monotonic()
    bar.start()

    def on_progress(done: int) -> None:
        completed = min(total, time.monotonic() - t0) if opts.duration is not None else float(done)
        bar.update(task, completed=completed, requests=done)

    return on_progress, bar.stop


def send_report(signal_name: str = "") -> Callable[[App, Any], None]:
    """The renderer; ``signal_name`` when a signal stopped the run (the headline says so)."""

    def render(app: App, report: Any) -> None:
        _render(app, report, signal_name)

    return render


def _render(app: App, report: Any, signal_name: str) -> None:
    n = sum(p.requests for p in report.paths)
    if report.stopped:
        head = f"STOPPED by {signal_name or 'the caller'}: {n} request(s) done"
        if report.cancelled:
            head += f", {report.cancelled} cancelled in flight (their segments unlinked)"
        prose(app.console, Text(head, style="bold yellow"), 2)
    elif report.ok:
        what = "verified" if report.verified else "sent (not verified: --no-verify)"
        prose(app.console, Text(f"OK: {n} request(s) {what}, no segment left behind", style="bold green"), 2)
    elif report.unreachable:
        prose(
            app.console,
            Text("FAILED: the receiver at ", style="bold red")
            + safe(report.address, "bold red")
            + Text(" became unreachable", style="bold red"),
            2,
        )
    else:
        app.console.print(Text(f"FAILED: {len(report.problems)} problem(s) in {n} request(s)", style="bold red"))
    # One space between columns; p90 and the exact figures are in --json.
    table = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("path", "req", "tensors", "bytes", "fail", "wrong", "left", "p50", "p99", "rate"):
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=True)
    for p in report.paths:
        table.add_row(
            p.path,
            str(p.requests),
            str(p.tensors),
            human_size(p.nbytes),
            str(p.failures),
            str(p.mismatches),
            str(p.leftovers),
            human_ms(p.p50_ms),
            human_ms(p.p99_ms),
            human_gb_per_s(p.gb_per_s),
        )
    fit_table(app.console, table)
    for prob in report.problems[:10]:
        key = Text(" ") + safe(prob.key) if prob.key else Text("")
        prose(app.console, Text(f"request {prob.request}") + key + Text(f": {prob.kind}: ") + safe(prob.message), 2)
    if len(report.problems) > 10:
        app.console.print(Text(f"... and {len(report.problems) - 10} more (see --json)"))
    if app.quiet:
        return
    from smgshm.core.transport.verify import ProblemKind

    kinds = {p.kind for p in report.problems}
    msgs = " ".join(p.message for p in report.problems)
    if "permission" in msgs:
        uid = report.receiver_uid
        hint(app, f"the receiver runs as uid {uid}; segments are 0600 and owned by this process's uid")
    if ProblemKind.LEFTOVER in kinds and not report.receiver_unlinks:
        hint(
            app,
            "the receiver keeps segments (unlink after read is off); SMG's gateway relies on the worker to unlink "
            "after reading, so every SHM tensor would leak",
        )
