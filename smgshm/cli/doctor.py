"""``smgshm doctor``: every check in one run, with the fix for each failure."""

from __future__ import annotations

import click

from smgshm.cli import doctor_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import for_outcome
from smgshm.cli.params import BYTES, DURATION, HTTP_URL, shm_dir_option, worker_addresses


@click.command()
@click.option(
    "-w",
    "--worker",
    "workers",
    multiple=True,
    metavar="ADDRESS",
    callback=worker_addresses,
    help="Check this worker (repeatable); without it, an embedded reference receiver.",
)
@click.option("--from-gateway", type=HTTP_URL, metavar="URL", help="Check every worker registered with this gateway.")
@click.option("--api-key", envvar="SMG_API_KEY", help="The gateway's --api-key, for --from-gateway.")
@click.option("--timeout", type=DURATION, default="5s", show_default=True, help="Per RPC and per connect.")
@click.option(
    "--gateway-log",
    "gateway_logs",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A gateway's log (repeatable): its start-up line states the transport. Logs a running gateway "
    "writes are found without it.",
)
@click.option("--inflight-bytes", type=BYTES, help="The in-flight budget the shm dir must hold (e.g. 2GiB).")
@click.option("--metrics", "metrics_url", type=HTTP_URL, metavar="URL",
              help="The --from-gateway gateway's Prometheus endpoint, for its e2e check (default: as e2e finds it).")
@click.option("--e2e/--no-e2e", default=True, show_default=True,
              help="Real image requests through --from-gateway, or (no worker) the embedded real gateway.")  # fmt: skip
@click.option("--gateway-pid", "gateway_pids", multiple=True, type=click.IntRange(1), metavar="PID",
              help="Judge only this gateway running here (repeatable); default: every one found.")  # fmt: skip
@click.option("--no-gateways", is_flag=True,
              help="Do not look at the gateways running here (another team's, on a shared host).")  # fmt: skip
@shm_dir_option
@click.pass_obj
def doctor(app: App, workers: tuple[str, ...], from_gateway: str | None, api_key: str | None, timeout: float,
           gateway_logs: tuple[str, ...], inflight_bytes: int | None, metrics_url: str | None, e2e: bool,
           gateway_pids: tuple[int, ...], no_gateways: bool, shm_dir: str) -> None:  # fmt: skip
    """Check everything SMG's SHM transport needs here, and say how to fix what fails.

    In order: this host's namespace id and shm dir (tmpfs, size, Docker's 64 MiB
    default, free space, writable as the gateway's probe needs); each worker's
    probe, verified with a canary segment; a verified send of inline and SHM
    tensors where the worker is a smgshm receiver; a gc scan (leaks, hazards,
    leftover probe files); the SMG gateways running here (process title
    smg::router: pid, uid, uptime, HTTP and metrics ports) and their transport
    from evidence (the start-up log line, metrics since start); what fills the
    shm dir by family and whether its free space holds the in-flight budget; the
    page-size policy (huge= and shmem_enabled) with what huge pages would gain;
    and reapers that would delete live segments (systemd-logind RemoveIPC,
    tmpfiles rules on /dev/shm). With no worker it starts the reference receiver
    in-process on loopback (the embedded default). With --from-gateway, real
    image chat requests go through that gateway and the check says which path
    their tensors took and why (smgshm e2e); with no worker and smg installed,
    the same through the embedded real gateway under shm, auto and inline.

    Exit with the worst code of the checks: 4, 5, 3, 6, 1, then 0.

    \b
    Examples:
      smgshm doctor
      smgshm doctor --worker 127.0.0.1:50051
      smgshm doctor --from-gateway http://127.0.0.1:30000 --json
      smgshm doctor --gateway-log /var/log/smg/gateway.log --inflight-bytes 2GiB
      smgshm doctor --gateway-pid 4242
    """
    from smgshm.core import outcomes
    from smgshm.core.doctor.run import run_doctor

    if no_gateways and gateway_pids:
        raise click.UsageError("--no-gateways and --gateway-pid contradict each other")
    addresses = list(workers)
    if from_gateway:
        from smgshm.core.gateway.admin import list_workers

        addresses += [w.url for w in list_workers(from_gateway, api_key, timeout) if w.grpc]
        if not addresses:
            raise click.UsageError(f"the gateway at {from_gateway} has no gRPC workers to check")
    live = not app.json

    def say(c: object) -> None:
        if live and not app.quiet:
            view.doctor_check(app, c)

    report = run_doctor(addresses, shm_dir=shm_dir, timeout=timeout, on_check=say, gateway_logs=list(gateway_logs),
                        inflight_bytes=inflight_bytes, gateway=from_gateway, api_key=api_key, e2e=e2e,
                        metrics_url=metrics_url,
                        gateway_pids=() if no_gateways else (gateway_pids or None))  # fmt: skip
    worst = for_outcome(outcomes.worst(c.code for c in report.failed))
    if live:
        view.headline(app, report)
    click.get_current_context().exit(app.emit_rendered(report, worst))
