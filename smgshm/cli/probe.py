"""``smgshm probe``: does this worker share /dev/shm with me, and if not, why."""

from __future__ import annotations

import click

from smgshm.cli import probe_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.extras import Extra, require
from smgshm.cli.params import BYTES, DURATION, HTTP_URL, shm_dir_option, worker_addresses
from smgshm.core.engines import DETECT_ORDER, ENGINES
from smgshm.core.units import human_size

_CODES = {
    "shared": ExitCode.OK,
    "not_grpc": ExitCode.OK,
    "undetermined": ExitCode.UNDETERMINED,
    "unreachable": ExitCode.UNREACHABLE,
}
_SEVERITY = [ExitCode.UNREACHABLE, ExitCode.CHECK_FAILED, ExitCode.UNDETERMINED, ExitCode.OK]


def verdict_code(verdict: str, expect: str) -> ExitCode:
    """A worker's exit code; --expect not-shared flips shared and not shared."""
    code = _CODES.get(verdict, ExitCode.CHECK_FAILED)
    if expect == "not-shared" and code in (ExitCode.OK, ExitCode.CHECK_FAILED):
        return ExitCode.CHECK_FAILED if code == ExitCode.OK else ExitCode.OK
    return code


@click.command()
@click.argument("addresses", nargs=-1, metavar="ADDRESS...", callback=worker_addresses)
@click.option(
    "--from-gateway", type=HTTP_URL, metavar="URL", help="Also probe every worker of this gateway (GET URL/workers)."
)
@click.option("--api-key", envvar="SMG_API_KEY", help="The gateway's --api-key, for --from-gateway.")
@click.option(
    "--engine",
    type=click.Choice([e.name for e in ENGINES]),
    help=f"Skip detection (the gateway tries {', '.join(e.name for e in DETECT_ORDER)} in turn).",
)
@click.option("--connect-timeout", type=DURATION, default="2s", show_default=True, help="Per worker, to connect.")
@click.option("--timeout", type=DURATION, default="5s", show_default=True, help="Per RPC.")
@click.option(
    "--shm-min-bytes",
    type=BYTES,
    default="64KiB",
    show_default=True,
    help="The gateway's --multimodal-shm-min-bytes, for the decisions shown.",
)
@click.option(
    "--tensor-bytes",
    type=BYTES,
    default="1MiB",
    show_default=True,
    help="Explain the decisions for a tensor of this size.",
)
@click.option("--need", type=BYTES, help="Fail when the shm dir has less free space than this.")
@click.option("--verify", is_flag=True, help="Prove the verdict: a smgshm receiver reads a canary segment.")
@click.option(
    "--expect",
    type=click.Choice(["shared", "not-shared"]),
    default="shared",
    show_default=True,
    help="Which verdict exits 0.",
)
@shm_dir_option
@click.pass_obj
def probe(
    app: App,
    addresses: tuple[str, ...],
    from_gateway: str | None,
    api_key: str | None,
    engine: str | None,
    connect_timeout: float,
    timeout: float,
    shm_min_bytes: int,
    tensor_bytes: int,
    need: int | None,
    verify: bool,
    expect: str,
    shm_dir: str,
) -> None:
    """Ask workers' GetServerInfo whether they share /dev/shm with this host.

    For each ADDRESS (host:port, grpc://host:port or unix:PATH) it detects the
    engine as SMG's gateway does, reads the advertised shm_namespace_id (vLLM
    field 10, TokenSpeed scheduler_info; SGLang, TRT-LLM and MLX advertise none),
    compares it with this host's, and says what the gateway would do under
    inline, shm and auto. It also checks what equal ids do not prove: that this
    host can create a 0600 segment, and that no leftover smg-tokenspeed-probe-<pid>
    file will silently turn a gateway's SHM off.

    Exit 0 when every worker shares /dev/shm (see --expect), 3 when one does not,
    4 when one is unreachable, 6 when one advertises no id; the worst wins. With
    --from-gateway: 4 when the gateway is unreachable, not ready (HTTP
    502/503/504) or redirects to another origin (never followed), 1 when it
    refuses (HTTP 401/403: pass --api-key) or is not SMG's admin API, 6
    (no_workers) when it lists no workers: nothing was judged, so nothing passed.

    \b
    Examples:
      smgshm probe 127.0.0.1:50051
      smgshm probe --verify grpc://worker-0:50051 grpc://worker-1:50051
      smgshm probe --from-gateway http://127.0.0.1:30000 --api-key "$SMG_API_KEY"
      # Kubernetes exec probe in the gateway's pod:
      #   command: [smgshm, -q, probe, --expect, shared, 127.0.0.1:50051]
    """
    require(Extra.WORKER, "smgshm probe")  # before anything runs: exit 2 naming the extra it needs
    from smgshm.core.client.probe import MAX_GATEWAY_WORKERS, ProbeOptions
    from smgshm.core.client.probe import probe as run_probe
    from smgshm.core.names import probe_file_pid

    if not addresses and not from_gateway:
        raise click.UsageError("give at least one ADDRESS or --from-gateway URL")
    gateway = None
    if from_gateway:
        from smgshm.core.gateway.admin import list_workers

        gateway = list_workers(from_gateway, api_key, timeout)  # none listed: the report says no_workers
        if len(gateway) > MAX_GATEWAY_WORKERS:
            app.warn(
                f"the gateway lists {len(gateway)} workers: probing the first {MAX_GATEWAY_WORKERS}, "
                f"{len(gateway) - MAX_GATEWAY_WORKERS} skipped (probe those by address)"
            )
            gateway = gateway[:MAX_GATEWAY_WORKERS]
    opts = ProbeOptions(engine, connect_timeout, timeout, shm_min_bytes, shm_dir, verify, tensor_bytes)
    report = run_probe(list(addresses), opts, gateway)
    for w in report.workers:
        if w.gateway_label is not None and w.namespace_id and w.gateway_label != w.namespace_id:
            app.warn(
                f"{w.address}: the gateway recorded shm_namespace_id {w.gateway_label or '(none)'!r} but the worker "
                f"advertises {w.namespace_id!r} now: a stale (labels are read once, at registration) or pinned label"
            )
    local_failures: list[str] = []
    if not report.local.writable:
        app.warn(f"this host cannot create a segment in {shm_dir}: {report.local.writable_error}")
        local_failures.append(f"this host cannot create a segment in {shm_dir}")
    for name in report.local.leftover_probe_files:
        pid = probe_file_pid(name)
        app.warn(f"leftover {name}: a gateway with pid {pid} will find /dev/shm unwritable and stay inline")
    for name in report.local.probe_lookalikes:
        app.warn(f"{name} is named like a gateway's probe file but carries no pid: no gateway's, none is blocked")
    codes = [verdict_code(w.verdict, expect) for w in report.workers]
    if need is not None and report.local.shm_free_bytes < need:
        free = report.local.shm_free_bytes
        what = f"{shm_dir} has {free} bytes ({human_size(free)}) free, less than --need {need} ({human_size(need)})"
        app.warn(what)
        local_failures.append(what)
        codes.append(ExitCode.CHECK_FAILED)
    if not report.local.writable:
        codes.append(ExitCode.HOST)
    if report.cause_info is not None:  # a gateway with no workers: its part judged nothing, never a pass
        codes.append(ExitCode.UNDETERMINED)
    if not codes:
        codes.append(ExitCode.OK)
    worst = min(codes, key=lambda c: _SEVERITY.index(c) if c in _SEVERITY else -1)
    click.get_current_context().exit(app.emit(report, view.probe_report(worst, expect, local_failures), worst))
