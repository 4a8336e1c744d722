"""``smgshm e2e``: real image requests through a real gateway, and which path the tensors took."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from smgshm.cli import e2e_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.extras import Extra, require
from smgshm.cli.params import DURATION, HTTP_URL, complete_pids, require_gateways, shm_dir_option
from smgshm.cli.signals import unwinds

if TYPE_CHECKING:
    from smgshm.core.e2e.run import E2eReport


@click.command()
@click.option("--gateway", type=HTTP_URL, metavar="URL", help="A running gateway; without it, the embedded default.")
@click.option(
    "--running", is_flag=True, help="The gateway running on this host, found by its process title (as doctor finds it)."
)
@click.option(
    "--gateway-pid",
    type=click.IntRange(1),
    metavar="PID",
    shell_complete=complete_pids,
    help="With --running: the gateway with this pid, when several run here.",
)
@click.option("--api-key", envvar="SMG_API_KEY", help="The gateway's --api-key (sent to that origin only).")
@click.option("--model", help="The model to ask (default: the gateway's first from /v1/models).")
@click.option(
    "--metrics",
    "metrics_url",
    type=HTTP_URL,
    metavar="URL",
    help="Its Prometheus endpoint (default: its own, when it runs here; else host:29000/metrics, "
    "used only once shown to be the gateway's).",
)
@click.option(
    "--image-size",
    type=click.IntRange(28, 4096),
    default=448,
    show_default=True,
    metavar="PX",
    help="Side of the generated square PNG.",
)
@click.option(
    "-n",
    "--requests",
    type=click.IntRange(1, 1000),
    default=3,
    show_default=True,
    help="Measured requests per gateway.",
)
@click.option(
    "--warmup",
    type=click.IntRange(0, 100),
    default=1,
    show_default=True,
    help="Requests per gateway before the measured ones (outside the evidence).",
)
@click.option("--stream/--no-stream", default=None, help="Only streaming / only non-streaming (default: alternate).")
@click.option(
    "--expect",
    type=click.Choice(["shm", "inline", "any"]),
    help="Exit 3 unless the tensors took this path; any: whatever path (default: SHM when the gateway's "
    "setting is known to be auto or shm).",
)
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(["shm", "auto", "inline"]),
    help="Embedded: the gateway modes to run (repeatable; default all three).",
)
@click.option(
    "--advertise-namespace-id",
    metavar="ID",
    help="Embedded: the worker advertises this id (see auto fall back to inline).",
)
@click.option("--model-dir", type=click.Path(file_okay=False), help="Embedded: the weight-less model directory.")
@click.option(
    "--sizes",
    metavar="PX,PX...",
    help="Embedded: sweep these image sizes through a shm and an inline gateway in alternation "
    "(e.g. 224,448,896,1344,1792,2688) and print what SHM is worth at each.",
)
@click.option("--keep-logs", is_flag=True, help="Embedded: keep the gateways' logs even when the run passes.")
@click.option(
    "--gateway-log-dir",
    type=click.Path(file_okay=False, exists=True),
    metavar="DIR",
    help="Embedded: write the gateways' logs in DIR (kept).",
)
@click.option("--timeout", type=DURATION, default="60s", show_default=True, help="Per request.")
@shm_dir_option
@click.pass_obj
# SIGTERM and SIGHUP unwind as Ctrl-C does (every gateway and receiver stopped, their logs removed or
# named), and each ends with the one line of what was stopped, then 130, 143 or 129.
@unwinds("stopped before any gateway was started or request sent; it made no log")
def e2e(
    app: App,
    gateway: str | None,
    running: bool,
    gateway_pid: int | None,
    api_key: str | None,
    model: str | None,
    metrics_url: str | None,
    image_size: int,
    requests: int,
    warmup: int,
    stream: bool | None,
    expect: str | None,
    modes: tuple[str, ...],
    advertise_namespace_id: str | None,
    model_dir: str | None,
    sizes: str | None,
    keep_logs: bool,
    gateway_log_dir: str | None,
    timeout: float,
    shm_dir: str,
) -> None:
    """Send real image chat requests through a gateway; say which path each tensor took and why.

    Each request is an OpenAI /v1/chat/completions with a generated PNG. The
    evidence, each source named: the delta of the gateway's smg_mm_* metrics
    across the requests; when the gateway runs on this host, its segments
    appearing and vanishing in the shm dir; when the worker is a smgshm serve,
    its receipts. The sources must agree, else the verdict is undetermined (exit
    6). The cause is the gateway's own rule (the one probe explains). The pixels
    are computed by the gateway, so this proves the path, not the bytes.

    The metrics are the gateway's own, never a neighbour's: on this host, its
    process's own /metrics port; otherwise --metrics (or host:29000) only once
    its request counter has counted exactly the few requests smgshm sends to an
    unknown route of the gateway first. Unproven, e2e sends no chat request and
    exits 4 naming --metrics.

    --running tests the gateway that runs on this host, found by its process
    title smg::router with its HTTP and metrics ports (--gateway-pid when
    several run). Without --gateway or --running, the embedded default starts one reference receiver and
    one real gateway (smg launch, from smgshm[gateway]) per mode on loopback,
    sends the requests round-robin, shows the latencies side by side, and stops
    everything, checking that no process and no segment is left. The gateways'
    logs are removed when the run passes and named in the report when it fails
    (--keep-logs or --gateway-log-dir keep them).

    Without --expect, a gateway whose setting is known (its start-up log line
    when it runs here; the embedded default's flags) to be auto or shm is
    expected to send SHM-eligible tensors by SHM: inline is a failure with its
    cause and fix (tensors below shm_min_bytes are inline by design).

    Exit 0 as expected, 3 not (or a request failed, or something leaked), 4
    gateway, metrics or a worker of the gateway unreachable (worker_unreachable),
    not ready (HTTP 502/503/504: its worker not registered yet) or redirecting to
    another origin, 1 when the gateway refuses
    (HTTP 401/403: pass --api-key), 5 local environment (smg not installed), 6
    undetermined; 130, 143 or 129 after Ctrl-C, SIGTERM or SIGHUP, with every
    process it started stopped first and one line saying what it stopped and
    what became of the gateways' logs.

    \b
    Examples:
      smgshm e2e
      smgshm e2e --gateway http://127.0.0.1:30000 --expect shm
      smgshm e2e --running --expect shm
      smgshm e2e --gateway http://gw:30000 --metrics http://gw:29000/metrics \\
          -n 10 --json
      smgshm e2e --sizes 224,448,1344,2688 -n 5
    """
    require(Extra.GATEWAY, "smgshm e2e")  # before anything runs: exit 2 naming the extra it needs
    from smgshm.core.e2e.run import EMBEDDED_MODES, E2eOptions, run_against, run_embedded

    if gateway_pid is not None:
        running = True
    if running and gateway:
        raise click.UsageError("--running finds the gateway itself; it takes no --gateway")
    if running and sizes is not None:  # before looking for it: --running makes `gateway` set below
        raise click.UsageError("--sizes runs the embedded pair of gateways; it takes no --running")
    if gateway_pid is not None:
        require_gateways((gateway_pid,))
    if running:
        gateway, found_metrics = _running_gateway(app, gateway_pid)
        metrics_url = metrics_url or found_metrics
    elif not gateway and sizes is None:
        _mention_running(app)
    if sizes is not None:
        if gateway:
            raise click.UsageError("--sizes runs the embedded pair of gateways; it takes no --gateway")
        _sweep(app, _pixel_sizes(sizes), requests, warmup, timeout)
    if gateway and (modes or advertise_namespace_id or model_dir or keep_logs or gateway_log_dir):
        raise click.UsageError(
            "--mode, --advertise-namespace-id, --model-dir, --keep-logs and --gateway-log-dir are for the embedded "
            "default only"
        )
    opts = E2eOptions(
        image_size=image_size,
        requests=requests,
        warmup=warmup,
        stream="both" if stream is None else "on" if stream else "off",
        timeout_s=timeout,
        api_key=api_key,
        model=model,
        metrics_url=metrics_url,
        expect=expect,
        shm_dir=shm_dir,
        modes=modes or EMBEDDED_MODES,
        advertise_namespace_id=advertise_namespace_id,
        model_dir=model_dir,
        keep_logs=keep_logs,
        log_dir=gateway_log_dir,
    )
    with view.request_progress(app) as on_request:
        report = (
            run_against(gateway, opts, app.info, on_request=on_request)
            if gateway
            else run_embedded(opts, app.info, on_request=on_request)
        )
    _record_largest_tensor(report, shm_dir)
    code = ExitCode.OK
    if report.unreachable:  # a dead worker: the endpoint's fault, whatever else the run says
        code = ExitCode.UNREACHABLE
    elif report.undetermined:
        code = ExitCode.UNDETERMINED
    elif not report.ok:
        code = ExitCode.CHECK_FAILED
    click.get_current_context().exit(app.emit(report, view.e2e_report, code))


def _pixel_sizes(sizes: str) -> tuple[int, ...]:
    """--sizes: a comma list of image sizes, each 28..4096 px; exit 2 otherwise."""
    try:
        pxs = tuple(int(x) for x in sizes.split(","))
    except ValueError:
        raise click.BadParameter("a comma list of pixel sizes, e.g. 224,448,1344", param_hint="--sizes") from None
    if not pxs or any(not 28 <= p <= 4096 for p in pxs):
        raise click.BadParameter("each size must be 28..4096 px", param_hint="--sizes")
    return pxs


def _sweep(app: App, pxs: tuple[int, ...], requests: int, warmup: int, timeout: float) -> None:
    """e2e --sizes: the embedded pair of gateways at each size, then exit (never returns)."""
    from smgshm.core.e2e.sweep import run_sweep

    sweep = run_sweep(pxs, requests=requests, warmup=warmup, say=app.info, timeout_s=max(timeout, 60.0))
    ok = all(r.failed == 0 for r in sweep.rows)
    code = ExitCode.OK if ok else ExitCode.CHECK_FAILED
    click.get_current_context().exit(app.emit(sweep, view.sweep_report, code))


def _record_largest_tensor(report: E2eReport, shm_dir: str) -> None:
    """doctor's capacity check quotes the largest tensor e2e saw (the receipts', the shm dir's)."""
    from smgshm.core.host.capacity import record_tensor_seen

    sizes = [x.nbytes for r in report.runs for x in r.receipts.receipts]
    sizes += [s.nbytes or 0 for r in report.runs for s in r.shm_dir.segments]
    if sizes:
        record_tensor_seen("smgshm e2e", max(sizes), shm_dir)


def _running_gateway(app: App, pid: int | None) -> tuple[str, str]:
    """The URL and metrics URL of the gateway running here; exit 2 naming them when several run."""
    from smgshm.cli.fmt import quote_cmd
    from smgshm.core.gateway.running import GatewayChoiceError, choose_running, find_gateways

    try:
        g = choose_running(find_gateways(pids=None if pid is None else (pid,)), pid)
    except GatewayChoiceError as err:
        first = err.fields["pids"].split(",")[0]
        raise click.UsageError(f"{err.what}, e.g. {quote_cmd(['smgshm', 'e2e', '--gateway-pid', first])}") from None
    app.info(f"testing gateway pid {g.pid} at {g.http_url}" + (f" (metrics {g.metrics_url})" if g.metrics_url else ""))
    return g.http_url, g.metrics_url


def _mention_running(app: App) -> None:
    """The embedded default says when gateways run here (a cheap /proc scan: no port is asked)."""
    if app.json or app.quiet:
        return
    from smgshm.core.gateway.running import find_gateways

    found = find_gateways(probe=False)
    if found:
        pids = ", ".join(str(g.pid) for g in found)
        app.info(
            f"{len(found)} SMG gateway(s) run on this host (pid {pids}): "
            "smgshm e2e --running tests one; now starting the embedded default"
        )
