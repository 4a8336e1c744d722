"""doctor's checks of each gateway's own workers: ``GET /workers``, each worker probed as
``probe --from-gateway`` does, and what the configuration says before any request (the lint)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from smgshm.core.causes import Cause, Where, for_verdict
from smgshm.core.doctor.check import Check, cause_check
from smgshm.core.doctor.workers import PROBE_OUTCOMES
from smgshm.core.errors import GatewayNotReadyError, SmgshmError
from smgshm.core.fanout import fan_out
from smgshm.core.gateway.setting import SHM_MODES, Mode
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.units import human_duration

if TYPE_CHECKING:
    from smgshm.core.client.probe import LocalChecks, WorkerReport
    from smgshm.core.gateway.admin import GatewayWorker
    from smgshm.core.host.facts import HostFacts

# Bounds that keep doctor under 20 s however many gateways and workers answer slowly or not at all.
LIST_TIMEOUT_S = 3.0  # one GET /workers
RPC_TIMEOUT_S = 2.0  # each connect and RPC of a worker's probe
PROBE_BUDGET_S = 10.0  # every worker's probe together; what has not answered by then is said so
MAX_WORKERS = 64  # probed per doctor run; the rest are named as skipped
POOL = 32


@dataclass(frozen=True)
class JudgedGateway:
    """A gateway doctor judges: one found here (``gateway 4242``) or ``--from-gateway``'s."""

    who: str  # the checks' name prefix: "gateway 4242" | "gateway http://10.0.0.5:30000"
    http_url: str
    mode: Mode | None = None  # its transport as logged (None: not known)
    namespace_id: str = ""  # its own shm_namespace_id when known (a gateway here sharing the shm dir)
    probe: bool = True  # probe its workers (False: doctor probes them already, as --worker addresses)
    workers: tuple[GatewayWorker, ...] | None = None  # its GET /workers, when already asked (--from-gateway)


def _list(g: JudgedGateway, api_key: str | None, timeout: float) -> list[GatewayWorker] | SmgshmError:
    from smgshm.core.gateway.admin import list_workers

    if g.workers is not None:
        return list(g.workers)
    try:
        return list_workers(g.http_url, api_key, min(timeout, LIST_TIMEOUT_S))
    except SmgshmError as err:
        return err


def _probe_all(urls: list[str], local: LocalChecks, shm_dir: str, timeout: float) -> dict[str, WorkerReport]:
    """Each worker probed at once, each under its own timeouts, all under PROBE_BUDGET_S."""
    from smgshm.core.client.probe import ProbeOptions, probe_worker

    t = min(timeout, RPC_TIMEOUT_S)
    opts = ProbeOptions(connect_timeout=t, timeout=t, shm_dir=shm_dir)
    if not urls:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(POOL, len(urls)))
    futures = {pool.submit(probe_worker, u, opts, local): u for u in urls}
    done, _ = wait(futures, timeout=PROBE_BUDGET_S)
    # Never wait for the rest: each is bounded by its own timeouts and ends on its own.
    pool.shutdown(wait=False, cancel_futures=True)
    return {futures[f]: f.result() for f in done}


def check_gateway_workers(
    gateways: list[JudgedGateway], api_key: str | None, facts: HostFacts, timeout: float
) -> list[Check]:
    """For every gateway judged: its workers listed, each probed (a failure names the worker,
    the cause and the fix), then the lint of its configuration."""
    from smgshm.core.client.probe import local_checks

    if not gateways:
        return []
    listed = fan_out(lambda g: _list(g, api_key, timeout), gateways, 8, "smgshm-workers")
    urls: list[str] = []
    for g, workers in zip(gateways, listed, strict=True):
        if g.probe and isinstance(workers, list):
            urls += [w.url for w in workers if w.grpc and w.url not in urls]
    skipped = urls[MAX_WORKERS:]
    local = local_checks(facts.shm_dir, facts)
    t0 = time.monotonic()
    reports = _probe_all(urls[:MAX_WORKERS], local, facts.shm_dir, timeout)
    waited = time.monotonic() - t0
    out: list[Check] = []
    for g, workers in zip(gateways, listed, strict=True):
        if isinstance(workers, SmgshmError):
            not_ready = isinstance(workers, GatewayNotReadyError)
            cause = Cause.GATEWAY_NOT_READY if not_ready else Cause.WORKERS_UNLISTED
            out.append(cause_check(f"{g.who} workers", Status.WARN, f"cannot list its workers: {workers}", cause))
            continue
        if not workers:  # nothing to judge its SHM by: never a pass (exit 6), as probe --from-gateway says
            out.append(
                cause_check(
                    f"{g.who} workers",
                    Status.UNKNOWN,
                    f"no worker registered at {g.http_url}: nothing to judge its SHM by",
                    Cause.NO_WORKERS,
                    Outcome.UNDETERMINED,
                )
            )
            continue
        if g.probe:
            for w in workers:
                out.append(_worker_check(g, w, reports.get(w.url), w.url in skipped, waited, local.namespace_id))
        out += lint(g, workers)
    return out


def _worker_check(
    g: JudgedGateway, w: GatewayWorker, r: WorkerReport | None, skipped: bool, waited: float, local_id: str = ""
) -> Check:
    name = f"{g.who} worker {w.url}"
    at = Where(address=w.url)  # a next step names the worker
    if not w.grpc:
        # Configured for SHM, the gateway still sends this worker every tensor inline: said, with its cause.
        cause = Cause.ZMQ_LANE if w.connection_mode == "zmq" else Cause.NOT_GRPC
        return cause_check(
            name,
            Status.WARN if g.mode in SHM_MODES else Status.SKIP,
            f"a {w.connection_mode or 'non-gRPC'} worker: SMG sends it tensors inline only",
            cause,
        )
    if skipped:
        return Check(
            name,
            Status.SKIP,
            f"not probed: doctor probes the first {MAX_WORKERS} workers",
            "probe it alone:",
            fix_cmd=["smgshm", "probe", w.url],
        )
    if r is None:
        waited_s = human_duration(waited)
        return cause_check(name, Status.WARN, f"no answer to the probe within {waited_s}", Cause.WORKER_SLOW, where=at)
    inline = g.mode in (Mode.INLINE, Mode.RDMA)
    if r.verdict in ("shared", "other_host", "private_tmpfs", "undetermined") and g.namespace_id:
        # What counts is the gateway's own namespace, not the one of the shm dir doctor was given.
        from smgshm.core.host.namespace import compare_namespace_ids

        cmp = compare_namespace_ids(g.namespace_id, r.namespace_id)
        reason = cmp.reason.replace("this host", "the gateway").replace(" here", " at the gateway")
        r = replace(r, verdict=cmp.sharing.value, reason=reason)
    if r.verdict == "unreachable":
        return cause_check(
            name,
            Status.FAIL,
            f"worker {w.url} unreachable: {r.reason}; the gateway's requests to it fail",
            Cause.WORKER_UNREACHABLE,
            PROBE_OUTCOMES["unreachable"],
            at,
        )
    if r.verdict == "shared":
        label = w.label_namespace_id  # what the gateway decides by: its record, not what the worker says now
        if g.mode == Mode.AUTO and label != r.namespace_id:
            return cause_check(
                name,
                Status.FAIL,
                f"the gateway recorded shm_namespace_id {label or '(none)'!r} at registration "
                f"but the worker advertises {r.namespace_id!r}: under auto it stays inline (labels are read "
                "once)",
                Cause.STALE_NAMESPACE_LABEL,
                Outcome.CHECK_FAILED,
            )
        return Check(name, Status.OK, f"{r.engine}: /dev/shm shared with this host (ids match)")
    code = PROBE_OUTCOMES.get(r.verdict, Outcome.CHECK_FAILED)
    # Judged against the gateway's id, else this host's; its fix is the catalogue's.
    verdict_cause = for_verdict(r.verdict, g.namespace_id or local_id, r.engine or w.runtime_type)
    summary = f"worker {w.url}: {r.verdict}: {r.reason}"
    if inline:  # the gateway sends it nothing through SHM: a fact, not a failure
        return Check(name, Status.OK, f"{summary} (the gateway is {g.mode}: no SHM is sent)")
    if verdict_cause is None:
        return Check(name, Status.FAIL, summary, "", code)
    if r.verdict == "undetermined" and g.mode == Mode.SHM:  # shm makes no namespace check: it may still read
        return cause_check(name, Status.WARN, summary, verdict_cause, where=at)
    return cause_check(name, Status.FAIL, summary, verdict_cause, code, at)


def lint(g: JudgedGateway, workers: list[GatewayWorker]) -> list[Check]:
    """What the configuration says before any request: each a warning or failure with its fix."""
    out: list[Check] = []
    shm = g.mode in SHM_MODES or not g.mode
    under = g.mode or "auto/shm (if so configured)"
    for w in workers:
        if w.transport_override:
            out.append(
                cause_check(
                    f"{g.who} config {w.url}",
                    Status.WARN,
                    f"worker {w.url} sets {w.transport_override}: SMG ignores per-worker transport settings although "
                    f"its docs promise them; the gateway's setting ({g.mode or 'not known'}) applies",
                    Cause.WORKER_OVERRIDE_IGNORED,
                )
            )
    if not shm:
        return out
    by_model: dict[str, list[GatewayWorker]] = {}
    for w in workers:
        if w.grpc:
            by_model.setdefault(w.model_id or "(unnamed)", []).append(w)
    for model, ws in sorted(by_model.items()):
        ids = sorted({w.label_namespace_id for w in ws})
        if len(ws) > 1 and (len(ids) > 1 or ids == [""]):
            shown = ", ".join(f"{w.url} {w.label_namespace_id or '(none)'}" for w in ws)
            out.append(
                cause_check(
                    f"{g.who} config model {model}",
                    Status.WARN,
                    f"model {model} is served by workers of mixed or empty namespace ids ({shown}): under {under} a "
                    "retry can send an SHM handle to a worker that cannot open it",
                    Cause.MIXED_NAMESPACE_IDS,
                )
            )
        prefill = {w.label_namespace_id for w in ws if w.worker_type == "prefill"}
        own = g.namespace_id or (next(iter(prefill)) if len(prefill) == 1 else "")
        for w in ws:
            if g.mode == Mode.AUTO and w.worker_type == "decode" and own and w.label_namespace_id != own:
                out.append(
                    cause_check(
                        f"{g.who} config {w.url}",
                        Status.FAIL,
                        f"PD decode worker {w.url} is in namespace {w.label_namespace_id or '(none)'}, not {own}: "
                        "under auto every request of this pair goes inline, although decode never gets pixels",
                        Cause.PD_DECODE_NAMESPACE,
                        Outcome.CHECK_FAILED,
                    )
                )
    return out
