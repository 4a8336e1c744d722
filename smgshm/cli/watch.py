"""``smgshm watch``: SHM traffic as it happens, per interval, with orphans and the gateway's view."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from smgshm.cli import watch_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.params import (
    BYTES,
    DURATION,
    HTTP_URL,
    NODE_RULE,
    metrics_listen,
    runtime_state_dir_option,
    shm_dir_option,
    web_config,
)
from smgshm.core.names import SMG_FAMILY_PREFIX

if TYPE_CHECKING:
    from smgshm.core.watch.figures import IntervalStats
    from smgshm.core.watch.session import WatchSession
    from smgshm.core.watch.webconfig import WebConfig


@click.command()
@click.option("--interval", type=DURATION, default="1s", show_default=True, help="Report every DURATION.")
@click.option(
    "--orphan-after",
    type=DURATION,
    default="30s",
    show_default=True,
    help="A segment still in flight this long is an orphan.",
)
@click.option(
    "--metrics",
    "metrics_url",
    type=HTTP_URL,
    metavar="URL",
    help="Also scrape this gateway Prometheus endpoint each interval (e.g. http://127.0.0.1:29000/metrics).",
)
@click.option(
    "--shm-min-bytes",
    type=BYTES,
    default="64KiB",
    show_default=True,
    help="The gateway's --multimodal-shm-min-bytes: inline tensors averaging this much were SHM-eligible.",
)
@click.option(
    "--jsonl",
    is_flag=True,
    help="One JSON record per line: each segment's life, orphans, events, intervals, then the summary.",
)
@click.option("--duration", type=DURATION, help="Stop after DURATION.")
@click.option("--count", type=click.IntRange(1), help="Stop after this many intervals.")
@click.option("--check", is_flag=True, help="Exit 3 when an orphan was seen.")
@click.option(
    "--serve-metrics",
    metavar="[HOST:]PORT",
    callback=metrics_listen,
    help="Expose the figures for Prometheus at http://HOST:PORT/metrics (HOST defaults to 127.0.0.1), "
    "and the scans' health at /healthz (200 ok, 503 with the reason).",
)
@click.option(
    "--web-config",
    "web_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="With --serve-metrics: TLS and basic auth, in the web config file format Prometheus exporters "
    "share (tls_server_config: cert_file, key_file, client_ca_file, client_auth_type; basic_auth_users: "
    "user: bcrypt hash). /healthz asks no credentials.",
)
@click.option("--prefix", default=SMG_FAMILY_PREFIX, show_default=True, help="Follow only names starting with PREFIX.")
@click.option(
    "--max-tracked",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="Follow at most this many segments in flight at once (memory stays bounded).",
)
@click.option("--assume-dead", is_flag=True, help="As gc: judge orphans by this pid namespace's pids even if unsafe.")
@shm_dir_option
@click.option(
    "--node",
    is_flag=True,
    help="Follow every pod's /dev/shm on this node (as gc --node finds them), "
    "for --serve-metrics: a series set per tmpfs." + NODE_RULE,
)
@click.option(
    "--node-root",
    default="/",
    show_default=True,
    type=click.Path(file_okay=False),
    help="With --node: where the host's / is mounted (a DaemonSet's hostPath, e.g. /host).",
)
@runtime_state_dir_option
@click.option(
    "--rescan-every",
    type=DURATION,
    default="30s",
    show_default=True,
    help="With --node: look for pods and judge every tmpfs afresh (reading /proc) this often.",
)
@click.option(
    "--max-volumes",
    type=click.IntRange(1, 4096),
    default=256,
    show_default=True,
    help="With --node: follow at most this many tmpfs (one inotify watch each).",
)
@click.option(
    "--npd-file",
    metavar="PATH",
    type=click.Path(dir_okay=False),
    help="With --node: after each full scan, write gc --node --check --npd's verdict (NPD's status, its "
    "one line, the boot clock and boot id) to PATH, atomically, mode 0644, for node-problem-detector's "
    "plugin deploy/npd/smgshm-npd.sh (NPD's image has no Python).",
)
@click.pass_obj
def watch(
    app: App,
    interval: float,
    orphan_after: float,
    metrics_url: str | None,
    shm_min_bytes: int,
    jsonl: bool,
    duration: float | None,
    count: int | None,
    check: bool,
    serve_metrics: tuple[str, int] | None,
    web_file: str | None,
    prefix: str,
    max_tracked: int,
    assume_dead: bool,
    shm_dir: str,
    node: bool,
    node_root: str,
    state_dirs: tuple[tuple[str, ...], ...],
    rescan_every: float,
    max_volumes: int,
    npd_file: str | None,
) -> None:
    """Follow the shm dir live: every SMG segment from creation to unlink, per interval.

    Uses inotify. For each segment: its producer (pid and kind from its name:
    gateway, gateway_probe, smgshm), its size, its time in flight, and how it
    ended: consumed (someone other than its creator opened it, then it was
    unlinked: a worker read it), cleaned (unlinked unread: its producer cleaned
    up), or unknown (it predates the watch, events were lost to a queue
    overflow, it was renamed, or the shm dir went away).

    Each interval: segments and bytes per second created and consumed, what is
    in flight, time in flight p50/p90/p99/max of the consumed ones, and orphans:
    segments in flight longer than --orphan-after, each with gc's judgement
    (is its producer alive? does anyone hold it?). With --metrics, the
    gateway's own counters beside them: tensors and bytes per second by path,
    SHM write failures, SHM's share of the bytes, and a plain sentence when
    SHM-eligible tensors went inline.

    A TTY gets a live dashboard; a pipe one line per interval; --jsonl one
    record per line. Ctrl-C (or SIGTERM) ends the run like --duration: the
    summary of the whole run, then the exit code.
    An inotify queue overflow is said and followed by a rescan; the shm dir
    removed or mounted over is said and watched again. Exit 3 with --check
    and an orphan seen; 4 when --serve-metrics cannot listen (a failed --metrics
    scrape, the first too, is said and survived: the next answer counts);
    5 when the shm dir cannot be watched.

    \b
    --node follows every pod's /dev/shm tmpfs of a Kubernetes node instead
    (emptyDirs, sandbox shm, the host's; see gc --node), for --serve-metrics:
    per tmpfs its pod, capacity, hidden bytes and SMG segments by gc's state,
    judged in its pod's pid namespaces. /proc is read every --rescan-every;
    between, inotify activity in a tmpfs updates it (at most every --interval).
    --npd-file PATH: after each full scan, the verdict gc --node --check --npd
    would give, for node-problem-detector's sh plugin (README: NPD).

    \b
    Examples:
      smgshm watch
      smgshm watch --metrics http://127.0.0.1:29000/metrics
      smgshm watch --duration 60s --check --json          # CI: orphans -> exit 3
      smgshm watch --jsonl | jq -c 'select(.type=="segment")'
      smgshm watch --serve-metrics 9464 -q                # a per-node exporter
      # a DaemonSet's, for every pod's /dev/shm on its node:
      smgshm watch --node --node-root /host --serve-metrics 0.0.0.0:9464 -q
      # ... and NPD's verdict file, read by deploy/npd/smgshm-npd.sh:
      smgshm watch --node --node-root /host --npd-file /run/smgshm-npd/gc -q
    """
    from smgshm.core.watch.figures import WatchOptions
    from smgshm.core.watch.session import WatchSession

    if web_file is not None and serve_metrics is None:
        raise click.UsageError("--web-config configures --serve-metrics: give both")
    web = web_config(web_file)
    if npd_file is not None and not node:
        raise click.UsageError("--npd-file writes the node view's verdict: give --node")
    if node:
        _refuse_with_node(
            click.get_current_context(),
            (
                "metrics_url",
                "jsonl",
                "check",
                "prefix",
                "max_tracked",
                "assume_dead",
                "shm_dir",
                "orphan_after",
                "shm_min_bytes",
            ),
        )
        _node(
            app,
            node_root,
            interval,
            (rescan_every, max_volumes, npd_file),
            (serve_metrics, web),
            duration,
            count,
            state_dirs,
        )
        return
    if app.json and jsonl:
        raise click.UsageError("--json and --jsonl are two output formats: choose one")
    if app.json and duration is None and count is None:
        raise click.UsageError("--json writes one summary at the end: give --duration or --count")
    if interval <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--interval")
    opts = WatchOptions(
        shm_dir=shm_dir,
        prefix=prefix,
        interval_s=interval,
        orphan_after_s=orphan_after,
        metrics_url=metrics_url,
        metrics_timeout_s=max(0.5, min(5.0, interval)),
        shm_min_bytes=shm_min_bytes,
        max_tracked=max_tracked,
        assume_dead=assume_dead,
    )
    hooks: dict[str, Any] = {}
    if jsonl:
        hooks = {"on_life": view.jsonl_life, "on_event": view.jsonl_event, "on_orphan": view.jsonl_orphan}
    session = WatchSession(opts, **hooks)
    _store_warnings(app, start=True)
    with session, _exporter(app, session, serve_metrics, web, jsonl), _stop_on_sigterm():
        if session.first_scrape_error:  # survived as any later failed scrape: the next answer is the baseline
            app.warn(f"--metrics: the first scrape failed, watching on: {session.first_scrape_error}")
        _run(app, session, jsonl, duration, count)
    _store_warnings(app, start=False)
    summary = session.summary()
    code = ExitCode.CHECK_FAILED if check and summary.orphans_seen else ExitCode.OK
    if jsonl:
        view.jsonl_summary(summary)
    elif not app.silent(code):  # --quiet and no orphan failed a --check: nothing to say
        app.emit(view.summary_record(summary) if app.json else summary, view.summary_report, code)
    click.get_current_context().exit(code)


def _store_warnings(app: App, *, start: bool) -> None:
    """The sightings store's troubles, said once (as gc says them): a refused state dir at the start, a lock
    held past the run's one wait at the end."""
    from smgshm.core.segments import sightings

    if start and (refused := sightings.refused()):
        app.warn_state_dir(refused)
    elif not start:
        app.warn_lock()


def _run(app: App, session: WatchSession, jsonl: bool, duration: float | None, count: int | None) -> None:
    """Intervals until --duration, --count or Ctrl-C; Ctrl-C is a normal end here."""
    deadline = None if duration is None else time.monotonic() + duration
    live = None
    if not jsonl and not app.json and not app.quiet and app.console.is_terminal:
        from rich.live import Live

        live = Live(console=app.console, auto_refresh=False, transient=True)
        live.start()
    n = 0
    try:
        while count is None or n < count:
            if deadline is not None and time.monotonic() >= deadline:
                break
            st = session.step()
            n += 1
            _show(app, session, st, jsonl, live)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()


def _show(app: App, session: WatchSession, st: IntervalStats, jsonl: bool, live: Any) -> None:
    if jsonl:
        view.jsonl_interval(st)
    elif live is not None:
        live.update(view.dashboard(st, session.summary()), refresh=True)
    elif not app.json and not app.quiet:
        view.interval_line(app, st)


@contextmanager
def _exporter(
    app: App, session: WatchSession, where: tuple[str, int] | None, web: WebConfig | None, jsonl: bool
) -> Iterator[None]:
    if where is None:
        yield
        return
    from smgshm.core.address import is_loopback_host
    from smgshm.core.watch.export import WatchExporter

    host, port = where
    if not is_loopback_host(host) and not (web is not None and web.guarded):
        app.warn(f"--serve-metrics on {host}: NOT loopback; any host that reaches it can read this host's SHM traffic")
    exporter = WatchExporter(session, host, port, web)
    if jsonl:
        view.jsonl_exporter(exporter.url)
    app.info(f"watch: metrics at {exporter.url}")
    try:
        yield
    finally:
        exporter.stop()


def _refuse_with_node(ctx: click.Context, names: tuple[str, ...]) -> None:
    from click.core import ParameterSource

    given = [
        f"--{n.replace('_', '-')}" for n in names if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT, None)
    ]
    if given:
        raise click.UsageError(f"--node does not combine with {', '.join(given)}")
    if ctx.obj.json:
        raise click.UsageError("--node has no --json document: its figures are the metrics (--serve-metrics)")


def _node(
    app: App,
    root: str,
    interval: float,
    pace: tuple[float, int, str | None],
    serve: tuple[tuple[str, int] | None, WebConfig | None],
    duration: float | None,
    count: int | None,
    state_dirs: tuple[tuple[str, ...], ...] = (),
) -> None:
    """watch --node: full scans and updates until --duration, --count (full scans) or Ctrl-C/SIGTERM."""
    from smgshm.core.node.follow import NodeWatch, NodeWatchOptions

    rescan_every, max_volumes, npd_file = pace
    if interval <= 0 or rescan_every <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--interval/--rescan-every")
    opts = NodeWatchOptions(
        root=root,
        rescan_every_s=rescan_every,
        update_every_s=interval,
        max_volumes=max_volumes,
        state_dirs=state_dirs,
        npd_file=npd_file,
    )
    nw = NodeWatch(opts)
    deadline = None if duration is None else time.monotonic() + duration
    with nw, _node_exporter(app, nw, *serve), _stop_on_sigterm():
        view.node_line(app, nw, None)
        view.node_unseen(app, nw.unseen, None)
        view.node_news(app, nw.take_news())
        said = nw.unseen
        scans = 1
        try:
            while count is None or scans < count:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    break
                done = nw.step(min(1.0, left))
                if done is not None:
                    scans += done.full
                    view.node_line(app, nw, done)
                    view.node_unseen(app, nw.unseen, said)
                    said = nw.unseen
                view.node_news(app, nw.take_news())  # an unmount seen between steps too
        except KeyboardInterrupt:
            pass
    click.get_current_context().exit(ExitCode.OK)


@contextmanager
def _node_exporter(app: App, nw: Any, where: tuple[str, int] | None, web: WebConfig | None) -> Iterator[None]:
    if where is None:
        yield
        return
    from smgshm.core.address import is_loopback_host
    from smgshm.core.node.metrics import collector
    from smgshm.core.watch.httpserver import MetricsServer

    host, port = where
    if not is_loopback_host(host) and not (web is not None and web.guarded):
        app.warn(
            f"--serve-metrics on {host}: NOT loopback; any host that reaches it can read this node's pods' shm figures"
        )
    server = MetricsServer(collector(nw.figures), host, port, web, nw.verdict)
    app.info(f"watch: metrics at {server.url}")
    try:
        yield
    finally:
        server.stop()


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (systemd, kubectl) ends the run as Ctrl-C does: with the summary."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
