"""``smgshm doctor``: every check in one run, with the fix for each failure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from smgshm.cli import doctor_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import for_outcome
from smgshm.cli.extras import Extra, require
from smgshm.cli.params import (
    BYTES,
    DURATION,
    HTTP_URL,
    NODE_RULE,
    complete_pids,
    require_gateways,
    runtime_state_dir_option,
    shm_dir_option,
    worker_addresses,
)
from smgshm.cli.signals import unwinds
from smgshm.core.errors import Interrupted

if TYPE_CHECKING:
    from smgshm.core.doctor.check import Check


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
@click.option(
    "--metrics",
    "metrics_url",
    type=HTTP_URL,
    metavar="URL",
    help="The --from-gateway gateway's Prometheus endpoint, for its e2e check (default: as e2e finds it).",
)
@click.option(
    "--e2e/--no-e2e",
    default=True,
    show_default=True,
    help="Real image requests through --from-gateway, or (no worker) the embedded real gateway.",
)
@click.option(
    "--gateway-pid",
    "gateway_pids",
    multiple=True,
    type=click.IntRange(1),
    metavar="PID",
    shell_complete=complete_pids,
    help="Judge only this gateway running here (repeatable); default: every one found.",
)
@click.option(
    "--stranded-after",
    "stranded_after_s",
    type=DURATION,
    default="5m",
    show_default=True,
    help="A live gateway's segment this old that nobody holds is stranded.",
)
@click.option(
    "--no-gateways", is_flag=True, help="Do not look at the gateways running here (another team's, on a shared host)."
)
@shm_dir_option
@click.option(
    "--node",
    is_flag=True,
    help="The host checks on every pod's /dev/shm on this node (kubelet "
    "emptyDirs, runtime sandbox shm, the host's), a block per tmpfs." + NODE_RULE,
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
# SIGTERM and SIGHUP unwind as Ctrl-C does (its e2e part's gateways stopped, their logs removed or named),
# and each ends with one line of what was stopped, then 130, 143 or 129.
@unwinds("doctor stopped before its checks began; it had started nothing and made no log")
def doctor(
    app: App,
    workers: tuple[str, ...],
    from_gateway: str | None,
    api_key: str | None,
    timeout: float,
    gateway_logs: tuple[str, ...],
    inflight_bytes: int | None,
    metrics_url: str | None,
    e2e: bool,
    gateway_pids: tuple[int, ...],
    stranded_after_s: float,
    no_gateways: bool,
    shm_dir: str,
    node: bool,
    node_root: str,
    state_dirs: tuple[tuple[str, ...], ...],
) -> None:
    """Check everything SMG's SHM transport needs here, and say how to fix what fails.

    In order: this host's namespace id and shm dir (tmpfs, size, Docker's 64 MiB
    default, free space, writable as the gateway's probe needs); each worker's
    probe, verified with a canary segment; a verified send of inline and SHM
    tensors where the worker is a smgshm receiver; a gc scan (leaks, hazards,
    leftover probe files, and segments a live gateway stranded: SMG never
    removes its own while it lives); the SMG gateways running here (process
    title smg::router: pid, uid, uptime, HTTP and metrics ports) and their
    transport from evidence (the start-up log line, metrics since start); for
    each gateway judged (and --from-gateway's), its workers from GET /workers,
    each probed as probe --from-gateway does (bounded, concurrent), and a lint
    of its configuration before any request (one model on workers of mixed or
    empty namespace ids under auto/shm: a retry can send a handle to a worker
    that cannot open it; per-worker transport settings, which SMG ignores; a PD
    decode worker in another namespace, which turns auto inline); what fills the
    shm dir by family and whether its free space holds the in-flight budget; the
    page-size policy (huge= and shmem_enabled) with what huge pages would gain;
    and reapers that would delete live segments (systemd-logind RemoveIPC,
    tmpfiles rules on /dev/shm). With no worker it starts the reference receiver
    in-process on loopback (the embedded default). With --from-gateway, real
    image chat requests go through that gateway and the check says which path
    their tensors took and why (smgshm e2e); with no worker and smg installed,
    the same through the embedded real gateway under shm, auto and inline.

    The verdict comes first, then one line per check ([info] lines are advice,
    never counted as warnings). The probe of the embedded receiver is labelled
    so: it says this host can read its own segments, nothing about a real
    worker.

    Page size: on 4 KiB pages doctor shows what huge=within_size would gain and
    the remount command. huge=within_size allocates 2 MiB pages only inside each
    file's size, so small files stay on 4 KiB pages (huge=always rounds every
    file up to 2 MiB of memory); huge pages need free contiguous memory, else
    the kernel falls back to 4 KiB pages; in a container only a privileged one
    (or the host, for --ipc=host or a bind mount) can remount; Docker's
    --shm-size mount and a Kubernetes emptyDir (medium: Memory) take no huge=
    option, so there set shmem_enabled=force on the node (it applies to every
    tmpfs and shared memory) or mount a huge tmpfs on the host and bind it;
    emptyDir medium: HugePages is hugetlbfs (pre-reserved pages, no write(2)),
    not the same thing. smgshm never remounts.

    --node (with --node-root, as gc --node): the host checks on every pod's
    /dev/shm of a Kubernetes node instead, a block per tmpfs (its pod, its
    figures, each check that is not plain ok, with its cause and fix): the
    namespace id, usage and capacity (the container runtime's 64 MiB default is
    a warning where an SMG gateway writes: shm_too_small; --inflight-bytes is
    the need of each tmpfs SMG writes), leaked and hidden bytes as shares of
    its size, writability judged from its figures (nothing is written),
    leftover probe files, and leaks judged in the pod's own pid namespaces
    (fix: gc --node --delete). A tmpfs whose names cannot be judged by pid
    (namespaces that disagree, a process of its pod that cannot be read) is
    unknown: never a failure, never a pass; one no process reaches holds only
    leaks.

    Exit with the worst code of the checks: 4, 5, 3, 6, 1, then 0. A check
    that judged nothing (a gateway with no workers, every segment unknown, no
    log and no tensor that shows a gateway's setting) is unknown with code 6:
    never a pass. 130, 143 or 129 after Ctrl-C, SIGTERM or SIGHUP, with one
    line saying what it stopped (and what became of its e2e gateways' logs).

    \b
    Examples:
      smgshm doctor
      smgshm doctor --worker 127.0.0.1:50051
      smgshm doctor --from-gateway http://127.0.0.1:30000 --json
      smgshm doctor --gateway-log /var/log/smg/gateway.log --inflight-bytes 2GiB
      smgshm doctor --gateway-pid 4242
      smgshm doctor --node --node-root /host --inflight-bytes 2GiB
    """
    from smgshm.core.doctor.check import run_outcome

    if node:
        _node(app, node_root, inflight_bytes, stranded_after_s, no_gateways, state_dirs)
    # Its probe and verified sends speak gRPC to a worker (or to the embedded receiver it starts): without
    # the worker extra, exit 2 naming it before any check runs (--node, above, is the slim install's doctor).
    require(Extra.WORKER, "smgshm doctor")
    from smgshm.core.doctor.run import run_doctor

    if no_gateways and gateway_pids:
        raise click.UsageError("--no-gateways and --gateway-pid contradict each other")
    require_gateways(gateway_pids)
    addresses = list(workers)
    listed = None
    if from_gateway:
        from smgshm.core.gateway.admin import list_workers

        listed = list_workers(from_gateway, api_key, timeout)
        # None listed is the gateway's state, not a usage error: its checks say so (no_workers), and its
        # e2e check meets a gateway not ready (gateway_not_ready).
        addresses += [w.url for w in listed if w.grpc]
    done: list[str] = []  # the checks finished, for the line an interrupt ends with

    with view.progress(app) as say:

        def on_check(check: Check) -> None:
            done.append(check.name)
            say(check)

        try:
            report = run_doctor(
                addresses,
                shm_dir=shm_dir,
                timeout=timeout,
                on_check=on_check,
                gateway_logs=list(gateway_logs),
                inflight_bytes=inflight_bytes,
                gateway=from_gateway,
                api_key=api_key,
                e2e=e2e,
                metrics_url=metrics_url,
                gateway_pids=() if no_gateways else (gateway_pids or None),
                stranded_after_s=stranded_after_s,
                gateway_workers=listed,
            )
        except KeyboardInterrupt as err:
            raise _interrupted(err, done) from err
    worst = for_outcome(run_outcome(report.checks))
    if app.silent(worst):  # --quiet and nothing failed: nothing to say
        click.get_current_context().exit(worst)
    click.get_current_context().exit(app.emit(report, view.report, worst))


# Options that choose what doctor checks on this host: --node checks the node's pod tmpfs instead.
_HOST_ONLY = ("workers", "from_gateway", "gateway_logs", "metrics_url", "e2e", "gateway_pids", "shm_dir", "api_key")


def _node(
    app: App,
    root: str,
    inflight_bytes: int | None,
    stranded_after_s: float,
    no_gateways: bool,
    state_dirs: tuple[tuple[str, ...], ...],
) -> None:
    """doctor --node: doctor's host checks on every pod tmpfs of the node (core/node/doctor.py)."""
    from smgshm.cli import doctor_node_view as node_view
    from smgshm.core.doctor.check import run_outcome
    from smgshm.core.node.doctor import run_node_doctor

    ctx = click.get_current_context()
    typed = click.core.ParameterSource.COMMANDLINE
    given = [
        p.opts[-1] for p in ctx.command.params if p.name in _HOST_ONLY and ctx.get_parameter_source(p.name) == typed
    ]
    if given:
        raise click.UsageError(f"--node checks the node's pod tmpfs: it does not combine with {', '.join(given)}")
    try:
        report = run_node_doctor(
            root, inflight_bytes, stranded_after_s, gateways=not no_gateways, state_dirs=state_dirs
        )
    except KeyboardInterrupt as err:  # it reads and judges; it starts, writes and deletes nothing
        raise Interrupted("doctor --node stopped while judging the node's tmpfs; it had changed nothing") from err
    worst = for_outcome(run_outcome(report.checks))
    if app.json:
        ctx.exit(app.emit_rendered(node_view.doc(report), worst))
    if not app.silent(worst):
        node_view.report(app, report)
    ctx.exit(worst)


def _interrupted(stop: KeyboardInterrupt, done: list[str]) -> Interrupted:
    """doctor's one line after an interrupt: where it stopped, and what it had started (its e2e part says
    its own: the gateways and receivers stopped, their logs removed or named)."""
    after = f"after {len(done)} check(s)" + (f" (the last: {done[-1]})" if done else "")
    said = getattr(stop, "said", None)
    if said:
        return Interrupted(f"doctor stopped at its e2e check {after}: {said}")
    return Interrupted(f"doctor stopped {after}; everything it had started is stopped, and it made no log")
