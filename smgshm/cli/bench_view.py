"""Human output of ``smgshm bench``: progress on a TTY, then the table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.fmt import prose, safe
from smgshm.core.units import binary_size

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
                f"{binary_size(r.nbytes)}: shm {r.shm.p50_ms:.2f} ms"
                + (f", inline {r.inline.p50_ms:.2f} ms" if r.inline else "")
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
    table = Table(box=None, pad_edge=False)  # fits 80 columns, the width of a pipe
    for col in ("size", "inline ms", "shm ms", "x", "in GB/s", "shm GB/s", "w/rpc/r ms", "memcpy"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for r in report.sizes:
        inl = r.inline
        table.add_row(
            binary_size(r.nbytes),
            f"{inl.p50_ms:.2f}" if inl else "n/a",
            f"{r.shm.p50_ms:.2f}",
            f"{r.speedup:.1f}x" if r.speedup else "-",
            f"{inl.gb_per_s:.2f}" if inl else "n/a",
            f"{r.shm.gb_per_s:.2f}",
            "/".join(f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" for ms in (r.shm_write_ms, r.shm_rpc_ms, r.shm_read_ms)),
            f"{r.shm_fraction_of_memcpy:.0%}",
        )
    app.console.print(table)
    prose(
        app.console,
        f"host: {h.cpu_count} cpus; memcpy {h.memcpy_gb_per_s:.1f} GB/s; "
        f"fresh tmpfs pages {h.fresh_page_gb_per_s:.2f} GB/s; "
        f"writers: pwrite {h.writer_pwrite_gb_per_s:.2f}, fallocate+mmap {h.writer_mmap_gb_per_s:.2f} GB/s "
        f"(GB = 1e9 B; medians)",
        2,
    )
    top = max([r.shm.gb_per_s for r in report.sizes] + [r.inline.gb_per_s for r in report.sizes if r.inline] + [1e-9])
    app.console.print(Text("GB/s by size (# shm, = inline):"))
    for r in report.sizes:
        s = int(30 * r.shm.gb_per_s / top)
        i = int(30 * r.inline.gb_per_s / top) if r.inline else 0
        app.console.print(Text(f"{binary_size(r.nbytes):>10} shm    {'#' * s} {r.shm.gb_per_s:.2f}"))
        app.console.print(
            Text(f"{'':>10} inline {'=' * i} {r.inline.gb_per_s:.2f}" if r.inline else f"{'':>10} inline n/a")
        )


def what_if_report(app: App, report: Any) -> None:
    """``bench --what-if huge-pages``: each operation here and on huge pages, and the ratio."""
    p = report.policy
    app.console.print(
        Text(f"huge-page what-if: {report.shm_dir} ({p.reason}) against a private tmpfs "
             f"({report.scratch_mount_options}); medians of {report.iterations} rounds, GB = 1e9 B", style="bold")
    )  # fmt: skip
    if not report.huge_pages_used:
        app.console.print(Text("note: the kernel gave the scratch tmpfs no huge pages (ShmemHugePages did not grow): "
                               "memory may be too fragmented; the figures are then 4 KiB against 4 KiB"))  # fmt: skip
    for s in report.sizes:
        table = Table(box=None, pad_edge=False, title=f"{binary_size(s.nbytes)}", title_justify="left")
        for col in ("operation", "4 KiB ms", "huge ms", "4 KiB GB/s", "huge GB/s", "x"):
            table.add_column(col, justify="left" if col == "operation" else "right", no_wrap=col != "operation")
        for op in s.pairs:
            table.add_row(op.label, f"{op.normal_ms:.2f}", f"{op.huge_ms:.2f}", f"{op.normal_gb_per_s:.2f}",
                          f"{op.huge_gb_per_s:.2f}", f"{op.speedup:.2f}x")  # fmt: skip
        app.console.print(table)
        app.console.print(Text(f"end to end (SMG's path) at {binary_size(s.nbytes)}: {s.end_to_end_speedup:.2f}x"))
