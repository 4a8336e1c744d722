"""``smgshm gc``: list SMG's segments with their story, and reap the provably leaked ones."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from smgshm.cli import gc_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode, for_outcome
from smgshm.cli.fmt import display
from smgshm.cli.params import DURATION, NODE_RULE, runtime_state_dir_option, shm_dir_option

if TYPE_CHECKING:
    from smgshm.core.segments.gcrun import GcRun
    from smgshm.core.segments.judge import ScanOptions, SegmentInfo
    from smgshm.core.segments.reaping import ReapRule
    from smgshm.core.segments.scan import Scan


@click.command()
@click.option("--delete", is_flag=True, help="Unlink the leaked segments (read-only without it).")
@click.option("--include-stale", is_flag=True, help="With --delete: also stale ones (producer alive but old).")
@click.option(
    "--min-age",
    type=DURATION,
    default="10m",
    show_default=True,
    help="Delete nothing younger, except a leaked segment proven so: its producer's pid is dead in the pid "
    "namespace that wrote it, and an earlier scan (gc, doctor, watch) saw it before this run's pid check.",
)
@click.option(
    "--stale-after",
    type=DURATION,
    default="1h",
    show_default=True,
    help="A live producer's segment gc scans have seen for this long is stale (boot clock: the wall clock can be "
    "stepped).",
)
@click.option("--assume-dead", is_flag=True, help="Judge by this pid namespace's pids even where that is unsafe.")
@click.option(
    "--all-users",
    is_flag=True,
    help=(
        "Also delete other users' segments: as root, or with CAP_FOWNER and CAP_SYS_PTRACE "
        "(the node image's smgshm-reclaim)."
    ),
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask before deleting (a non-TTY run never asks).")
@click.option(
    "--check",
    is_flag=True,
    help="Exit 3 when anything is leaked or hazardous (CI, cron); 6 when every entry is unknown (nothing judged), "
    "or, with --node, when the node view cannot see the whole node (no kubelet or runtime dir under --node-root, "
    "or not in the host's pid namespace: no hostPID).",
)
@click.option(
    "--prometheus",
    "prometheus_file",
    type=click.Path(dir_okay=False),
    help="Write what the run found, reclaimed and kept, when it ran and whether it succeeded, in node_exporter's "
    "textfile format (written beside FILE, then renamed over it); with --node, the exporter's series per tmpfs.",
)
@click.option(
    "--npd",
    is_flag=True,
    help="With --check: a node-problem-detector plugin's output, one line "
    "of at most 80 characters; exit 0 OK, 1 leaked or hazardous, 2 unknown or error.",
)
@click.option(
    "--watch",
    type=DURATION,
    help="Re-scan every DURATION and show growth per state; Ctrl-C or SIGTERM ends it with its summary, exit 0.",
)
@click.option("--watch-count", type=click.IntRange(1), help="With --watch: stop after this many scans.")
@click.option(
    "--all",
    "all_rows",
    is_flag=True,
    help="List every entry (the default summarises: counts, bytes, and the entries that matter most).",
)
@click.option(
    "--raw",
    "--no-headers",
    "raw",
    is_flag=True,
    help="For scripts: one header-less line per entry, "
    "STATE KIND ALLOCATED_BYTES AGE_S PID NAME (the name escaped, spaces included: one field), "
    "nothing else.",
)
@shm_dir_option
@click.option(
    "--node",
    is_flag=True,
    help="Every pod's /dev/shm on this node (kubelet emptyDirs; containerd's, k3s/RKE2's, k0s' and CRI-O's "
    "sandbox shm; the host's), a block per tmpfs." + NODE_RULE,
)
@click.option(
    "--node-root",
    default="/",
    show_default=True,
    type=click.Path(file_okay=False),
    help="With --node: where the host's / is mounted (a DaemonSet's hostPath, e.g. /host).",
)
@runtime_state_dir_option
@click.pass_obj
def gc(
    app: App,
    delete: bool,
    include_stale: bool,
    min_age: float,
    stale_after: float,
    assume_dead: bool,
    all_users: bool,
    yes: bool,
    check: bool,
    prometheus_file: str | None,
    watch: float | None,
    watch_count: int | None,
    all_rows: bool,
    raw: bool,
    shm_dir: str,
    node: bool,
    node_root: str,
    state_dirs: tuple[tuple[str, ...], ...],
    npd: bool,
) -> None:
    """List every smg-* entry of the shm dir and say whether it leaked; reap leaks safely.

    Each entry gets its kind (gateway payload, gateway probe, smgshm, other),
    size, age, owner, producer pid (from its name), whether that producer lives
    (a process with that pid that started before the segment was written), who
    holds it open or mapped (by inode, whatever name it was opened by), and a
    state: in_flight, held, leaked, stale, hazard (a symlink, FIFO, directory
    or mount point named like a segment) or unknown (liveness cannot be trusted: a process in
    another pid namespace can reach this filesystem, at whatever path; or only the wall clock,
    which can be stepped, says the pid was reused or the segment is stale).

    Nothing is deleted on the wall clock alone: each scan records when it first saw each
    segment on the boot clock (kept in /run/smgshm for root, the user's cache dir for others).
    A pid whose process started after a scan first saw the segment is proven reused (leaked);
    a segment first seen --stale-after ago is proven stale.

    The default view summarises (counts and bytes per state and kind, then the
    entries that matter most); --all lists every entry; --raw prints one plain
    line per entry for scripts; --json one document, written as it goes.

    --delete unlinks only leaked (and with --include-stale, stale) regular
    files owned by this uid: a leaked one at any age once its producer is
    proven dead (its pid judged in the pid namespace that wrote it, not with
    --assume-dead, and the segment seen by an earlier scan: gc, doctor or
    watch), anything else only when older than --min-age. It shows what it will delete,
    asks on a TTY unless --yes (an answer other than y, or none, deletes nothing
    and is no error: exit 0), sets each aside under a private name, checks that
    it is the very inode judged (still regular, held by nobody) and only then
    unlinks it; anything else is put back (on Ctrl-C, SIGTERM and SIGHUP too).
    What a killed gc left set aside is put back under its name first, once that
    gc is provably dead, and judged as any entry. It never touches anything held,
    in flight, non-regular or outside SMG's names.

    \b
    Examples:
      smgshm gc
      smgshm gc --all
      smgshm gc --raw | awk '$1 == "leaked"'
      smgshm gc --check --json
      smgshm gc --delete --yes
      smgshm gc --node --node-root /host --delete --yes
      smgshm gc --check --npd        # a node-problem-detector custom plugin
      # cron, every 10 minutes (/etc/cron.d/smgshm; cron sets PROM for the line):
      #   PROM=/var/lib/node_exporter/smgshm.prom
      #   */10 * * * * root smgshm -q gc --delete --check --prometheus $PROM
    """
    from smgshm.core.segments.judge import ScanOptions

    opts = ScanOptions(shm_dir, stale_after, assume_dead)
    app.npd = npd
    if watch is None:  # SIGTERM/SIGHUP unwind as Ctrl-C: a batch set aside goes back under its names, and a
        # --json listing closes its one document (--npd: its one line), never cut off mid-stream
        from smgshm.cli.signals import unwind_on_signals

        click.get_current_context().with_resource(unwind_on_signals())
    if npd:
        if not check or watch is not None or raw or app.json or prometheus_file:
            raise click.UsageError("--npd needs --check and takes no --watch, --raw, --json or --prometheus")
        app.quiet, yes = True, True  # one line on stdout; a plugin is never asked anything
    if node:
        _node(
            app,
            opts,
            node_root,
            delete=delete,
            include_stale=include_stale,
            min_age=min_age,
            all_users=all_users,
            yes=yes,
            check=check,
            all_rows=all_rows,
            raw=raw,
            prometheus_file=prometheus_file,
            others=(watch is not None, assume_dead),
            npd=npd,
            state_dirs=state_dirs,
        )
        return
    if watch is not None:
        if delete or check or prometheus_file:
            raise click.UsageError("--watch only lists: it does not combine with --delete, --check or --prometheus")
        _watch(app, opts, watch, watch_count)
        return
    if raw and app.json:
        raise click.UsageError("--raw and --json are two outputs: pick one")
    if npd:
        click.get_current_context().exit(_npd(opts, _rule(delete, include_stale, min_age, all_users, opts.assume_dead)))
    code = run(
        app,
        opts,
        delete=delete,
        include_stale=include_stale,
        min_age=min_age,
        all_users=all_users,
        yes=yes,
        check=check,
        prometheus_file=prometheus_file,
        all_rows=all_rows,
        raw=raw,
    )
    click.get_current_context().exit(code)


def run(
    app: App,
    opts: ScanOptions,
    *,
    delete: bool,
    include_stale: bool,
    min_age: float,
    all_users: bool,
    yes: bool,
    check: bool,
    prometheus_file: str | None,
    all_rows: bool,
    raw: bool,
) -> ExitCode:
    """Scan (streamed into the chosen listing), then the shared gc run (core/segments/gcrun.py), then finish
    the listing."""
    from smgshm.core.errors import HostError, SmgshmError
    from smgshm.core.segments import textfile

    if prometheus_file:
        textfile.check_writable(prometheus_file)  # exit 5 before anything is scanned or deleted
    started = time.time()
    try:
        listing, done = _scan_and_reap(
            app,
            opts,
            _rule(delete, include_stale, min_age, all_users, opts.assume_dead),
            yes=yes,
            all_rows=all_rows,
            raw=raw,
            check=check,
            min_age=min_age,
        )
    except SmgshmError:
        if prometheus_file:  # the run failed: said with its time, no figures (the error follows, as without it)
            with contextlib.suppress(HostError):
                record = textfile.RunRecord("gc", display(opts.shm_dir), started, time.time(), None)
                textfile.write_textfile(prometheus_file, record)
        raise
    (part,) = done.parts
    scan, report = part.scan, part.report
    app.warn_lock()
    code = for_outcome(done.outcome) if check else ExitCode.OK
    if code == ExitCode.UNDETERMINED and (app.json or raw):  # (people read it in the headline)
        app.warn(f"check inconclusive: all {done.before.total} SMG segment(s) unknown; {view.unjudged(scan)}")
    if prometheus_file:
        try:  # what is there now, after any --delete, and what the run did
            textfile.write_textfile(
                prometheus_file, textfile.RunRecord("gc", display(opts.shm_dir), started, time.time(), report)
            )
        except HostError as err:  # checked up front; still possible (a full disk): one document, exit 5
            app.warn(str(err))
            code = ExitCode.HOST
    # --all marks the deleted rows: never "deleted X", then "leaked X"
    listing.finish(
        scan,
        report.before,
        report.after,
        report.deleted,
        code,
        report.done_rows,
        (report.used_bytes, report.free_bytes),
    )
    return code


def _rule(
    delete: bool, include_stale: bool, min_age: float, all_users: bool, assume_dead: bool = False
) -> ReapRule | None:
    """gc's reap rule (None without --delete: a listing)."""
    from smgshm.core.segments.reaping import ReapRule

    if not delete:
        return None
    return ReapRule.of(include_stale=include_stale, min_age_s=min_age, all_users=all_users, assume_dead=assume_dead)


def _scan_and_reap(
    app: App,
    opts: ScanOptions,
    rule: ReapRule | None,
    *,
    yes: bool,
    all_rows: bool,
    raw: bool,
    check: bool,
    min_age: float,
) -> tuple[view.JsonListing | view.RawListing | view.HumanListing, GcRun[Scan]]:
    from smgshm.core.segments import gcrun
    from smgshm.core.segments.scan import Scan

    for stream in (sys.stdout, sys.stderr):  # any locale: what it cannot encode comes out escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    progress = view.Progress(app, stdout_streams=app.json or raw)
    if rule is not None:
        _put_back(app, opts.shm_dir)
    scan = Scan(opts, progress)
    if not scan.trust.trusted and not opts.assume_dead:
        app.warn(scan.trust.note)
    view.warn_sightings(app, [scan.sightings])
    listing: view.JsonListing | view.RawListing | view.HumanListing = (
        view.JsonListing(app, scan)
        if app.json
        else view.RawListing(app, scan)
        if raw
        else view.HumanListing(app, scan, all_rows, check, min_age)
    )

    def confirm(chosen: Sequence[tuple[Scan, SegmentInfo]]) -> bool:
        progress.stop()  # a question or a list under a live bar would be drawn over
        return view.confirm_delete(app, [seg for _, seg in chosen], yes, all_rows)

    try:
        with _no_cycle_collector():
            return listing, gcrun.run(
                [scan], rule, lambda _scan: listing.add, confirm, lambda n, of: progress(n, of, "deleted")
            )
    finally:
        progress.stop()


def _put_back(app: App | None, shm_dir: str) -> None:
    """Before a --delete scans: what a killed gc left set aside goes back under its name, to be judged as any
    entry (core/segments/asides.py); said on stderr (``app`` None: not at all, as NPD's one line)."""
    from smgshm.core.segments.asides import restore

    done = restore(shm_dir)
    if app is None:
        return
    if back := sum(r.restored for r in done):
        app.info(f"put back under their names {back} entries a killed gc had set aside")
    for r in done:
        if not r.restored:
            app.warn(f"{display(r.aside)}: {r.reason}")


def _npd(opts: ScanOptions, rule: ReapRule | None) -> int:
    """gc --check --npd: the shared gc run (never asked), then NPD's one line (cli/npd.py)."""
    from smgshm.core.segments import gcrun
    from smgshm.core.segments.scan import Scan

    if rule is not None:
        _put_back(None, opts.shm_dir)
    scan = Scan(opts)
    done = gcrun.run([scan], rule)
    note = "" if scan.trust.trusted or opts.assume_dead else scan.trust.note
    return view.npd(done.after, done.deleted, note)


def _node(
    app: App,
    opts: ScanOptions,
    root: str,
    *,
    delete: bool,
    include_stale: bool,
    min_age: float,
    all_users: bool,
    yes: bool,
    check: bool,
    all_rows: bool,
    raw: bool,
    prometheus_file: str | None,
    others: tuple[Any, ...],
    npd: bool = False,
    state_dirs: tuple[tuple[str, ...], ...] = (),
) -> None:
    """gc --node: the node view (cli/gc_node_view.py) under gc's own reap rule."""
    from smgshm.cli import gc_node_view as node_view

    if any(others):
        raise click.UsageError("--node does not combine with --watch or --assume-dead")
    if raw and app.json:
        raise click.UsageError("--raw and --json are two outputs: pick one")
    rule = _rule(delete, include_stale, min_age, all_users)
    with _no_cycle_collector():  # as gc's own listing: a tenth of the time, for nothing
        code = node_view.run(
            app,
            root,
            opts,
            rule,
            yes=yes,
            check=check,
            all_rows=all_rows,
            raw=raw,
            npd=npd,
            prometheus_file=prometheus_file,
            state_dirs=state_dirs,
        )
    click.get_current_context().exit(code)


@contextmanager
def _no_cycle_collector() -> Iterator[None]:
    """The listing makes a few short-lived tuples and dicts per entry, none of them cyclic:
    refcounting frees each at once, and the cyclic collector's passes over the young ones were
    a tenth of a 100k-entry --json gc (benchmarks/gc_scan.py). Memory stays flat without them."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _watch(app: App, opts: ScanOptions, every: float, count: int | None) -> None:
    """Re-scan until interrupted (or --watch-count scans): one line per scan, growth per state.

    Ctrl-C and SIGTERM are how a watch without --watch-count ends (as ``smgshm watch``): the scan under
    way finishes, then the summary, and exit 0; SIGHUP ends it the same way with its own code (129)."""
    import signal

    from smgshm.cli.signals import stop_on_signals
    from smgshm.core.segments.scan import Scan

    def counts() -> tuple[int, dict[str, int]]:
        scan = Scan(opts)
        for _ in scan:  # tallies only: a watch keeps no listing
            pass
        return scan.tally.total, dict(scan.tally.counts)

    with stop_on_signals() as stop:
        total, first = counts()
        prev, n = first, 1
        view.gc_watch_line(app, total, first, None)
        while (count is None or n < count) and not stop.event.wait(every):
            total, cur = counts()
            view.gc_watch_line(app, total, cur, {k: cur[k] - prev[k] for k in cur})
            prev, n = cur, n + 1
    growth = {k: prev[k] - first[k] for k in prev}
    if stop.signum is not None:
        view.gc_watch_stopped(app, stop.name, n, growth)
    code = ExitCode.HANGUP if stop.signum == signal.SIGHUP else ExitCode.OK
    summary = {"scans": n, "first": first, "last": prev, "growth": growth}
    click.get_current_context().exit(app.emit_rendered(summary, code))  # for people, each scan's line was the output
