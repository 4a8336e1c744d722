"""Human output of ``smgshm gc``, and its node_exporter textfile."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.fmt import human_age, human_bytes

if TYPE_CHECKING:
    from smgshm.cli.app import App

_STATE_STYLE = {"leaked": "red", "hazard": "magenta", "stale": "yellow", "held": "cyan", "in_flight": "green"}


def gc_report(app: App, report: Any) -> None:
    c = report.counts
    deleted = [d for d in report.deleted if d.deleted]
    head = f"{len(report.segments)} SMG segment(s) in {report.shm_dir}: "
    head += ", ".join(f"{n} {k}" for k, n in c.items() if n) or "none"
    now = report.remaining_counts
    style = "bold red" if now["leaked"] or now["hazard"] else "bold green"
    app.console.print(Text(head, style=style))
    if report.segments:
        table = Table(box=None)
        table.add_column("name", overflow="fold")
        for col in ("kind", "size", "age", "pid", "state"):
            table.add_column(col, no_wrap=True)
        for s in report.segments:
            mark = {True: "", False: " (dead)", None: ""}[s.producer_alive]
            pid = "-" if s.producer_pid is None else f"{s.producer_pid}{mark}"
            state = Text(s.state.value, style=_STATE_STYLE.get(s.state.value, ""))
            table.add_row(Text(s.name), s.kind, human_bytes(s.allocated_bytes), human_age(s.age_s), pid, state)
        app.console.print(table)
        for s in report.segments:
            if s.state.value in ("leaked", "hazard", "stale", "unknown", "held"):
                app.console.print(Text(f"{s.name}: ", style="bold") + Text(s.reason))
    app.console.print(
        Text(
            f"reclaimable {human_bytes(report.reclaimable_bytes)}; {report.shm_dir} "
            f"{human_bytes(report.shm_used_bytes)} used of {human_bytes(report.shm_total_bytes)}, "
            f"{human_bytes(report.shm_free_bytes)} free"
        )
    )
    if deleted:
        app.console.print(Text(f"deleted {len(deleted)}, freed {human_bytes(sum(d.nbytes for d in deleted))}"))
    if not app.quiet and c["leaked"] and not report.deleted:
        app.err_console.print(Text("hint: ", style="cyan") + Text("reap them with: smgshm gc --delete"))


def gc_watch_line(app: App, report: Any, growth: dict[str, int] | None) -> None:
    if app.json:
        return
    parts = [f"{k} {n}" + (f" ({growth[k]:+d})" if growth and growth.get(k) else "") for k, n in report.counts.items()]
    stamp = time.strftime("%H:%M:%S")
    app.console.print(Text(f"{stamp} {len(report.segments)} segments: " + ", ".join(parts)))


def write_prometheus(report: Any, path: str) -> None:
    """node_exporter textfile format, written atomically by prometheus_client."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    count = Gauge("smgshm_segments", "SMG segments in the shm dir, by state", ["shm_dir", "state"], registry=reg)
    size = Gauge(
        "smgshm_segment_bytes", "Allocated bytes of SMG segments, by state", ["shm_dir", "state"], registry=reg
    )
    free = Gauge("smgshm_shm_free_bytes", "Free bytes in the shm dir", ["shm_dir"], registry=reg)
    for state, n in report.remaining_counts.items():  # what is there now, after any --delete
        count.labels(report.shm_dir, state).set(n)
        size.labels(report.shm_dir, state).set(report.remaining_bytes_by_state[state])
    free.labels(report.shm_dir).set(report.shm_free_bytes)
    write_to_textfile(path, reg)


@contextlib.contextmanager
def scan_progress(app: App) -> Iterator[Callable[[int, int], None] | None]:
    """A transient progress bar for a large scan, on a TTY stderr only (never with --json/--quiet)."""
    if app.json or app.quiet or not app.err_console.is_terminal:
        yield None
        return
    from rich.progress import Progress

    with Progress(console=app.err_console, transient=True) as bar:
        task = bar.add_task("scanning", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
