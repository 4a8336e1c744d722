"""``smgshm gc``: list SMG's segments with their story, and reap the provably leaked ones."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import click

from smgshm.cli import gc_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.params import DURATION, shm_dir_option

if TYPE_CHECKING:
    from smgshm.core.leaks import ScanOptions


@click.command()
@click.option("--delete", is_flag=True, help="Unlink the leaked segments (read-only without it).")
@click.option("--include-stale", is_flag=True, help="With --delete: also stale ones (producer alive but old).")
@click.option("--min-age", type=DURATION, default="10m", show_default=True, help="Never delete anything younger.")
@click.option(
    "--stale-after",
    type=DURATION,
    default="1h",
    show_default=True,
    help="A live producer's segment older than this is stale.",
)
@click.option("--assume-dead", is_flag=True, help="Judge by this pid namespace's pids even where that is unsafe.")
@click.option("--all-users", is_flag=True, help="As root, also delete other users' segments.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before deleting (a non-TTY run never asks).")
@click.option("--check", is_flag=True, help="Exit 3 when anything is leaked or hazardous (CI, cron).")
@click.option(
    "--prometheus",
    "prometheus_file",
    type=click.Path(dir_okay=False),
    help="Write counts and bytes per state in node_exporter textfile format.",
)
@click.option("--watch", type=DURATION, help="Re-scan every DURATION and show growth per state.")
@click.option("--watch-count", type=click.IntRange(1), help="With --watch: stop after this many scans.")
@shm_dir_option
@click.pass_obj
def gc(app: App, delete: bool, include_stale: bool, min_age: float, stale_after: float, assume_dead: bool,
       all_users: bool, yes: bool, check: bool, prometheus_file: str | None, watch: float | None,
       watch_count: int | None, shm_dir: str) -> None:  # fmt: skip
    """List every smg-* entry of the shm dir and say whether it leaked; reap leaks safely.

    Each entry gets its kind (gateway payload, gateway probe, smgshm, other),
    size, age, owner, producer pid (from its name), whether that producer lives
    (a process with that pid that started before the segment was written), who
    holds it open or mapped, and a state: in_flight, held, leaked, stale,
    hazard (a symlink, FIFO or directory named like a segment) or unknown
    (liveness cannot be trusted, e.g. another pid namespace shares this tmpfs).

    --delete unlinks only leaked (and with --include-stale, stale) regular
    files older than --min-age, owned by this uid, re-checking each right before
    it unlinks it. It never touches anything held, in flight, non-regular or
    outside SMG's names.

    \b
    Examples:
      smgshm gc
      smgshm gc --check --json
      smgshm gc --delete --yes
      # cron, every 10 minutes:
      #   */10 * * * * root smgshm -q gc --delete --check --prometheus /var/lib/node_exporter/smgshm.prom
    """
    from smgshm.core.leaks import Deletion, ScanOptions, reap, scan_segments

    opts = ScanOptions(shm_dir, stale_after, assume_dead)
    if watch is not None:
        if delete or check or prometheus_file:
            raise click.UsageError("--watch only lists: it does not combine with --delete, --check or --prometheus")
        _watch(app, opts, watch, watch_count)
        return
    with view.scan_progress(app) as progress:
        report = scan_segments(opts, progress)
    if not report.liveness_trusted and not assume_dead:
        app.warn(report.liveness_note)
    if delete:
        n = report.counts["leaked"] + (report.counts["stale"] if include_stale else 0)
        if n and not yes and sys.stdin.isatty() and not app.json:
            click.confirm(f"delete up to {n} segment(s)?", abort=True, err=True)

        def say(d: Deletion) -> None:
            app.info(f"{'deleted' if d.deleted else 'kept'} {d.name}: {d.reason}")

        report = reap(report, opts, include_stale=include_stale, min_age_s=min_age, all_users=all_users, on_action=say)
    if prometheus_file:
        view.write_prometheus(report, prometheus_file)
    bad = report.remaining_counts["leaked"] + report.remaining_counts["hazard"]
    code = ExitCode.CHECK_FAILED if check and bad > 0 else ExitCode.OK
    click.get_current_context().exit(app.emit(report, view.gc_report, code))


def _watch(app: App, opts: ScanOptions, every: float, count: int | None) -> None:
    """Re-scan until interrupted (or --watch-count scans): one line per scan, growth per state."""
    from smgshm.core.leaks import growth, scan_segments

    first = prev = scan_segments(opts)
    n = 1
    view.gc_watch_line(app, first, None)
    while count is None or n < count:
        time.sleep(every)
        cur = scan_segments(opts)
        view.gc_watch_line(app, cur, growth(prev, cur))
        prev, n = cur, n + 1
    if app.json:
        summary = {"scans": n, "first": first.counts, "last": prev.counts, "growth": growth(first, prev)}
        app.emit(summary, lambda _app, _result: None)
