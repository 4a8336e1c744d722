"""Probe a worker: which engine, is it healthy, what id it advertises, what SMG would do.

Engine detection follows the gateway (smg-facts §2.1): HealthCheck per runtime,
tried in the gateway's order; UNIMPLEMENTED means "not this one".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from smgshm.core.address import grpc_target
from smgshm.core.causes import Cause, Found, Where, for_verdict, found
from smgshm.core.closed import Closed
from smgshm.core.engines import DETECT_ORDER, Engine, engine_named
from smgshm.core.errors import SmgshmError, TransportError
from smgshm.core.gateway.admin import GatewayWorker
from smgshm.core.gateway.setting import DEFAULT_SHM_MIN_BYTES, Mode
from smgshm.core.host.namespace import NamespaceComparison, compare_namespace_ids
from smgshm.core.names import GATEWAY_PROBE_PREFIX, probe_file_pid
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.transport.channel import open_channel
from smgshm.core.transport.decision import Decision, decide

if TYPE_CHECKING:
    from smgshm.core.host.facts import HostFacts

# probe --from-gateway dials at most this many of the workers a gateway lists (16 at a time): a
# listing of thousands, honest or not, would otherwise hold it for minutes. A warning counts the rest.
MAX_GATEWAY_WORKERS = 64


@dataclass(frozen=True)
class ProbeOptions:
    engine: str | None = None  # None: detect
    connect_timeout: float = 2.0
    timeout: float = 5.0
    shm_min_bytes: int = DEFAULT_SHM_MIN_BYTES
    shm_dir: str = DEFAULT_SHM_DIR
    verify: bool = False
    tensor_nbytes: int = 1024 * 1024  # the size the transport decisions are explained for


@dataclass(frozen=True)
class Health:
    engine_healthy: bool | None
    engine_message: str
    grpc_health: str  # SERVING, NOT_SERVING, NOT_FOUND, UNIMPLEMENTED, ...


@dataclass(frozen=True)
class VerifyResult:
    """A canary segment read back by a smgshm receiver."""

    ok: bool
    code: str
    message: str


class ProbeVerdict(Closed):
    """A worker's probe verdict: the namespace ids' (host.namespace.Sharing's values), or what the probe
    found past them (the canary unreadable), or what stopped it (no answer, no gRPC)."""

    SHARED = "shared"
    OTHER_HOST = "other_host"
    PRIVATE_TMPFS = "private_tmpfs"
    UNDETERMINED = "undetermined"
    SPELLING = "spelling"
    UNREACHABLE = "unreachable"
    UID_MISMATCH = "uid_mismatch"
    VERIFY_FAILED = "verify_failed"
    NOT_GRPC = "not_grpc"


@dataclass(frozen=True)
class WorkerReport:
    """One worker's probe: facts, the namespace verdict and SMG's three decisions."""

    address: str
    verdict: str  # a ProbeVerdict: the ids' (Sharing), or what the probe found past them, or what stopped it
    reason: str
    engine: str = ""
    health: Health | None = None
    namespace_id: str = ""
    comparison: NamespaceComparison | None = None
    decisions: dict[str, Decision] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    smgshm_receiver: bool = False
    verify: VerifyResult | None = None
    elapsed_ms: float = 0.0
    gateway_label: str | None = None  # what the gateway recorded at registration, with --from-gateway
    cause_info: Found | None = None  # the catalogue's cause when SHM is not usable (None: shared)


@dataclass(frozen=True)
class LocalChecks:
    """What equal ids do not prove, checked on this side."""

    namespace_id: str
    writable: bool
    writable_error: str
    leftover_probe_files: list[str]
    shm_free_bytes: int
    leftover_probe_files_hex: list[str] = field(default_factory=list)  # their exact bytes: names may be non-UTF-8
    # Names under the probe prefix that are no probe file's (no pid after it): no gateway's, blocking none.
    probe_lookalikes: list[str] = field(default_factory=list)
    probe_lookalikes_hex: list[str] = field(default_factory=list)


def local_checks(shm_dir: str = DEFAULT_SHM_DIR, facts: HostFacts | None = None) -> LocalChecks:
    """This host's id, the writability probe (both from ``facts`` when given), and leftover gateway probe files."""
    from smgshm.core.host.facts import namespace_id, writable_error

    err = writable_error(shm_dir, facts)
    try:
        # Every name under the probe prefix: those that parse are a gateway's leftover; a look-alike is
        # shown apart (escaped) for a person to judge, never as a gateway's.
        under = sorted(n for n in os.listdir(shm_dir) if n.startswith(GATEWAY_PROBE_PREFIX))
    except OSError:
        under = []
    leftovers = [n for n in under if probe_file_pid(n) is not None]
    lookalikes = [n for n in under if probe_file_pid(n) is None]
    try:
        st = os.statvfs(shm_dir)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    return LocalChecks(
        namespace_id(shm_dir, facts),
        err is None,
        err or "",
        leftovers,
        free,
        [os.fsencode(n).hex() for n in leftovers],
        lookalikes,
        [os.fsencode(n).hex() for n in lookalikes],
    )


def _stub(channel: Any, engine: Engine) -> tuple[Any, Any]:
    return engine.pb2(), getattr(engine.pb2_grpc(), f"{engine.service}Stub")(channel)


def _unreachable(address: str, err: Any, timeout: float) -> TransportError:
    import grpc

    code = err.code() if hasattr(err, "code") else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TransportError("deadline exceeded", endpoint=address, timeout_s=timeout)
    return TransportError("endpoint unreachable", endpoint=address, detail=(err.details() or "")[:120])


def _detect(channel: Any, address: str, opts: ProbeOptions) -> tuple[Engine, Any]:
    """(engine, HealthCheckResponse) of the first runtime that answers HealthCheck, tried in the
    gateway's detect_backend order."""
    import grpc

    engines = (engine_named(opts.engine),) if opts.engine else DETECT_ORDER
    for engine in engines:
        pb, stub = _stub(channel, engine)
        try:
            return engine, stub.HealthCheck(pb.HealthCheckRequest(), timeout=opts.timeout)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue
            raise _unreachable(address, err, opts.timeout) from err
    raise TransportError(
        "no SMG engine service answers here", endpoint=address, hint="is this a vLLM/TokenSpeed/SGLang gRPC port?"
    )


def _grpc_health(channel: Any, service: str, timeout: float) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as err:
        return str(err.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))


def _server_info(channel: Any, engine: Engine, timeout: float, address: str = "") -> tuple[str, dict[str, Any]]:
    """(advertised id, useful facts) from GetServerInfo, read where each engine keeps it."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    pb, stub = _stub(channel, engine)
    try:
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout)
    except grpc.RpcError as err:
        # No answer is not "advertises no id": a worker that timed out, sent too much or went away
        # is unreachable (exit 4) with that reason; only an engine without the RPC advertises nothing.
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise TransportError("GetServerInfo deadline exceeded", endpoint=address, timeout_s=timeout) from err
        if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise TransportError(
                "GetServerInfo answer larger than the message limit",
                endpoint=address,
                detail=(err.details() or "")[:120],
            ) from err
        if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            raise _unreachable(address, err, timeout) from err
        return "", {"server_info_error": f"{err.code().name}: {err.details() or ''}"[:200]}
    d = MessageToDict(info, preserving_proto_field_name=True)
    ns = ""
    if engine.namespace_id_at == "field":
        ns = info.shm_namespace_id
    elif engine.namespace_id_at == "scheduler_info":
        value = d.get("scheduler_info", {}).get("shm_namespace_id")
        ns = value if isinstance(value, str) else ""  # the gateway takes only a non-empty string
    keep = (
        "uptime_seconds",
        "active_requests",
        "multimodal_encoder_dtype",
        "server_type",
        "tokenspeed_version",
        "sglang_version",
        "version",
        "backend",
        "model_dtype",
    )
    return ns, {k: d[k] for k in keep if k in d}


def _receiver_identity(channel: Any, timeout: float) -> Any | None:
    import grpc

    from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

    try:
        return diag_pb2_grpc.DiagnosticsStub(channel).Identity(diag_pb2.IdentityRequest(), timeout=timeout)
    except grpc.RpcError:
        return None


def verify_canary(channel: Any, opts: ProbeOptions) -> VerifyResult:
    """Write a 4 KiB segment, have the receiver read it, and always clean up."""
    from smgshm.core.segments.io import unlink_segment, write_segment
    from smgshm.core.transport.tensors import digest
    from smgshm.core.transport.verify import ProblemKind, Sent, judge, receipt_key
    from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal
    from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

    payload = os.urandom(4096)
    try:
        ref = write_segment(payload, shm_dir=opts.shm_dir)
    except SmgshmError as err:
        return VerifyResult(False, err.kind, str(err))
    try:
        msg = build_multimodal(Layout.VLLM, Request(OutTensor((4096,), "uint8", shm=ref)))
        req = diag_pb2.ReceiveRequest(
            request_id=f"canary-{ref.name}", layout=diag_pb2.LAYOUT_VLLM, multimodal_inputs=msg.SerializeToString()
        )
        resp = diag_pb2_grpc.DiagnosticsStub(channel).Receive(req, timeout=opts.timeout)
    except Exception as err:  # any failure here is the verdict, reported not raised
        return VerifyResult(False, "rpc_failed", str(err)[:200])
    finally:
        unlink_segment(ref.name, opts.shm_dir)
    verdict = judge([Sent(receipt_key(Layout.VLLM), digest(payload), "shm", len(payload))], resp.receipts)
    if verdict.ok:
        return VerifyResult(True, "ok", "the receiver read the canary segment byte-exactly")
    issue = verdict.issues[0]
    if issue.kind is ProblemKind.RECEIVER_ERROR:
        code, _, message = issue.message.partition(": ")
        return VerifyResult(False, code, message)
    return VerifyResult(False, "mismatch", f"{issue.key}: {issue.message}")


def probe_worker(address: str, opts: ProbeOptions, local: LocalChecks) -> WorkerReport:
    """Probe one worker; an unreachable one is a report, not an exception."""
    t0 = time.monotonic()
    target = grpc_target(address)
    try:
        channel = open_channel(target, opts.connect_timeout)
    except TransportError as err:
        return WorkerReport(address, ProbeVerdict.UNREACHABLE, str(err), elapsed_ms=(time.monotonic() - t0) * 1e3)
    try:
        engine, hc = _detect(channel, target, opts)
        grpc_health = _grpc_health(channel, engine.full_service, opts.timeout)
        # TRT-LLM answers {status} ("ok" is healthy), the others {healthy, message}.
        health = (
            Health(None, hc.status, grpc_health)
            if engine.health_status
            else Health(bool(hc.healthy), hc.message, grpc_health)
        )
        ns, facts = _server_info(channel, engine, opts.timeout, target)
        ident = _receiver_identity(channel, opts.timeout)
        verify = verify_canary(channel, opts) if opts.verify and ident is not None else None
    except TransportError as err:
        return WorkerReport(address, ProbeVerdict.UNREACHABLE, str(err), elapsed_ms=(time.monotonic() - t0) * 1e3)
    finally:
        channel.close()
    cmp = compare_namespace_ids(local.namespace_id, ns)
    verdict, reason = ProbeVerdict(cmp.sharing.value), cmp.reason
    if verify is not None and not verify.ok and cmp.shared:
        verdict = ProbeVerdict.UID_MISMATCH if verify.code == "permission" else ProbeVerdict.VERIFY_FAILED
        reason = verify.message
        if ident is not None and verify.code == "permission":
            reason = f"the receiver runs as uid {ident.uid}; segments are 0600 owned by uid {os.getuid()}"
    decisions = {
        m.value: decide(
            m,
            nbytes=opts.tensor_nbytes,
            engine=engine.name,
            local_ns=local.namespace_id,
            worker_ns=ns,
            writable=local.writable,
            shm_min_bytes=opts.shm_min_bytes,
        )
        for m in (Mode.INLINE, Mode.SHM, Mode.AUTO)
    }
    return WorkerReport(
        address=address,
        verdict=verdict,
        reason=reason,
        engine=engine.name,
        health=health,
        namespace_id=ns,
        comparison=cmp,
        decisions=decisions,
        facts=facts,
        smgshm_receiver=ident is not None,
        verify=verify,
        elapsed_ms=(time.monotonic() - t0) * 1e3,
    )


@dataclass(frozen=True)
class ProbeReport:
    local: LocalChecks
    workers: list[WorkerReport]
    cause_info: Found | None = None  # why nothing was judged: a gateway that lists no workers (no_workers)


def probe(
    addresses: list[str],
    opts: ProbeOptions,
    gateway: list[GatewayWorker] | None = None,
    facts: HostFacts | None = None,
) -> ProbeReport:
    """Probe every worker concurrently, each under its own timeouts.

    With ``gateway`` (from ``GET /workers``), its gRPC workers are probed too and each
    report carries the label the gateway recorded; HTTP workers are listed as not_grpc.
    A gateway that lists none makes the report's cause ``no_workers``: its part judged nothing.
    ``facts``: this host's, when the caller has read them already.
    """
    from smgshm.core.fanout import fan_out

    local = local_checks(opts.shm_dir, facts)
    jobs: list[tuple[str, GatewayWorker | None]] = [(a, None) for a in addresses]
    jobs += [(w.url, w) for w in gateway or []]

    def one(job: tuple[str, GatewayWorker | None]) -> WorkerReport:
        address, gw = job
        if gw is not None and not gw.grpc:
            reason = f"a {gw.connection_mode or 'non-gRPC'} worker: SMG sends it tensors inline only"
            report = WorkerReport(
                address, ProbeVerdict.NOT_GRPC, reason, engine=gw.runtime_type, gateway_label=gw.label_namespace_id
            )
            if gw.connection_mode == "zmq":  # SMG's direct-ZMQ lane refuses SHM payloads: its own cause
                report = replace(report, cause_info=found(Cause.ZMQ_LANE, f"{address}: {reason}"))
            return report
        report = probe_worker(address, opts, local)
        return replace(report, gateway_label=gw.label_namespace_id) if gw is not None else report

    def with_cause(report: WorkerReport) -> WorkerReport:
        if report.cause_info is not None:
            return report
        return replace(report, cause_info=cause_of(report, local, opts.shm_dir))

    # Ctrl-C (or SIGTERM as one) stops it at once: a worker that does not answer is never waited out.
    workers = [with_cause(w) for w in fan_out(one, jobs, 16, "smgshm-probe")]
    none = None
    if gateway is not None and not gateway:  # asked about a gateway's workers, and it has none: nothing judged
        none = found(Cause.NO_WORKERS, "the gateway lists no workers (GET /workers): nothing to probe, nothing judged")
    return ProbeReport(local, workers, none)


def cause_of(w: WorkerReport, local: LocalChecks, shm_dir: str = DEFAULT_SHM_DIR) -> Found | None:
    """A worker's verdict as the catalogue's cause, with its own sentence and a command where one applies."""
    code = for_verdict(w.verdict, local.namespace_id, w.engine)
    if code is None:
        return None
    return found(code, f"{w.address}: {w.reason}", Where(shm_dir, address=w.address, running="probe"))
