"""Human output of ``smgshm bench``: progress on a TTY, then the table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.fmt import fit_table, prose, safe
from smgshm.core.units import human_gb_per_s, human_ms, human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App


def bench_progress(app: App) -> tuple[Any, Any]:
    """(progress(done, total), on_size(result)) callbacks: a rich bar on a TTY stderr only."""
    if app.json or app.quiet or not app.err_console.is_terminal:
        return (lambda done, total: None), (lambda r: None)
    from rich.progress import Progress

    bar = Progress(console=app.err_console, transient=True)
    task = bar.add_task("bench", total=None)
    bar.start()

    def progress(done: int, total: int) -> None:
        if done < 0:
            bar.stop()
            return
        bar.update(task, completed=done, total=total)

    def on_size(r: Any) -> None:
        bar.console.print(
            Text(
                f"{human_size(r.nbytes)}: shm {human_ms(r.shm.p50_ms)}"
                + (f", inline {human_ms(r.inline.p50_ms)}" if r.inline else "")
            )
        )

    return progress, on_size


def bench_report(failed_gates: list[str] | None = None) -> Any:
    """The renderer; a failed --min-* gate (exit 3) is the first line, as a failure."""

    def render(app: App, report: Any) -> None:
        for gate in failed_gates or []:
            prose(app.console, Text("FAILED: ", style="bold red") + safe(gate), 8)
        _report(app, report)

    return render


def _report(app: App, report: Any) -> None:
    h = report.host
    prose(app.console, Text(report.recommendation, style="bold"), 2)
    table = Table(box=None, pad_edge=False)
    # Medians; the inline rate is in --json (the size over its latency says it too).
    for col in ("size", "inline", "shm", "x", "shm rate", "w/rpc/r ms", "memcpy"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in report.sizes:
        inl = r.inline
        table.add_row(
            human_size(r.nbytes),
            human_ms(inl.p50_ms) if inl else "too big",
            human_ms(r.shm.p50_ms),
            f"{r.speedup:.1f}x" if r.speedup else "no inline",
            human_gb_per_s(r.shm.gb_per_s),
            "/".join(f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" for ms in (r.shm_write_ms, r.shm_rpc_ms, r.shm_read_ms)),
            f"{r.shm_fraction_of_memcpy:.0%}",
        )
    fit_table(app.console, table)
    if any(r.inline is None for r in report.sizes):  # each unknown cell says why, here in full
        prose(app.console, "too big: larger than one gRPC message, so inline was not sent (no inline: no x)", 2)
    prose(
        app.console,
        f"host: {h.cpu_count} cpus; memcpy {human_gb_per_s(h.memcpy_gb_per_s)}; "
        f"fresh tmpfs pages {human_gb_per_s(h.fresh_page_gb_per_s)}; "
        f"writers: pwrite {human_gb_per_s(h.writer_pwrite_gb_per_s)}, "
        f"fallocate+mmap {human_gb_per_s(h.writer_mmap_gb_per_s)} (medians)",
        2,
    )
    top = max([r.shm.gb_per_s for r in report.sizes] + [r.inline.gb_per_s for r in report.sizes if r.inline] + [1e-9])
    app.console.print(Text("rate by size (# shm, = inline):"))
    for r in report.sizes:
        s = int(30 * r.shm.gb_per_s / top)
        i = int(30 * r.inline.gb_per_s / top) if r.inline else 0
        app.console.print(Text(f"{human_size(r.nbytes):>10} shm    {'#' * s} {human_gb_per_s(r.shm.gb_per_s)}"))
        inline = f"{'=' * i} {human_gb_per_s(r.inline.gb_per_s)}" if r.inline else "not sent (too big)"
        app.console.print(Text(f"{'':>10} inline {inline}"))


def what_if_report(app: App, report: Any) -> None:
    """``bench --what-if huge-pages``: each operation here and on huge pages, and the ratio."""
    p = report.policy
    prose(
        app.console,
        Text(
            f"huge-page what-if: {report.shm_dir} ({p.reason}) against a private tmpfs "
            f"({report.scratch_mount_options}); medians of {report.iterations} rounds",
            style="bold",
        ),
        2,
    )
    if not report.huge_pages_used:
        note = (
            "note: the kernel gave the scratch tmpfs no huge pages (ShmemHugePages did not grow): memory may be "
            "too fragmented; the figures are then 4 KiB against 4 KiB"
        )
        prose(app.console, Text(note), 2)
    for s in report.sizes:
        table = Table(box=None, pad_edge=False, title=f"{human_size(s.nbytes)}", title_justify="left")
        for col in ("operation", "4 KiB pages", "huge pages", "4 KiB rate", "huge rate", "x"):
            table.add_column(col, justify="left" if col == "operation" else "right", no_wrap=col != "operation")
        for op in s.pairs:
            table.add_row(
                op.label,
                human_ms(op.normal_ms),
                human_ms(op.huge_ms),
                human_gb_per_s(op.normal_gb_per_s),
                human_gb_per_s(op.huge_gb_per_s),
                f"{op.speedup:.2f}x",
            )
        fit_table(app.console, table)
        app.console.print(Text(f"end to end (SMG's path) at {human_size(s.nbytes)}: {s.end_to_end_speedup:.2f}x"))
