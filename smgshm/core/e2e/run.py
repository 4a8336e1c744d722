"""``e2e``: real chat requests with an image through a real gateway, and which path the tensors took.

Against ``--gateway URL`` it reads what can be read about that gateway (its workers
and their labels, its metrics, its segments and the start-up line of the log it writes
when it runs here, its workers' receipts when they are smgshm serves). With no gateway
it starts the embedded default: one reference receiver and one real ``smg launch`` per
mode (shm, auto, inline), all on loopback, the requests sent round-robin so the
latencies are measured side by side, and everything stopped and checked gone at the
end, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smgshm.core.address import is_local_url
from smgshm.core.causes import Cause, Found, Where, found
from smgshm.core.e2e.evidence import (
    MetricsEvidence,
    ReceiptBaseline,
    ReceiptEvidence,
    SegmentWatch,
    ShmDirEvidence,
    listening_pid,
    metrics_delta,
    receipt_baseline,
    receipts_since,
)
from smgshm.core.e2e.owner import own_metrics
from smgshm.core.e2e.verdict import FAILURE_TEXT, Context, FailureClass, TensorPath, Verdict, expectation, judge
from smgshm.core.errors import HostError, Interrupted, SmgshmError
from smgshm.core.gateway.chat import ChatOutcome, first_model, make_png, send_chat
from smgshm.core.gateway.metrics import MM_FAMILIES, MetricsSnapshot, scrape
from smgshm.core.gateway.process import RunningGateway
from smgshm.core.host.capacity import shm_space
from smgshm.core.host.facts import HostFacts, namespace_id, writable_error
from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.stats import median
from smgshm.core.units import human_ms

if TYPE_CHECKING:
    from smgshm.core.receiver.modeldir import ModelDir

EMBEDDED_MODES = ("shm", "auto", "inline")


@dataclass(frozen=True)
class E2eOptions:
    image_size: int = 448
    requests: int = 3
    stream: str = "both"  # both (alternate) | on | off
    warmup: int = 1  # requests per gateway before the measured ones (not in the evidence)
    timeout_s: float = 60.0
    api_key: str | None = None
    model: str | None = None
    metrics_url: str | None = None
    expect: str | None = None  # shm | inline | any: the CI gate (None: what the gateway's known setting implies)
    shm_dir: str = DEFAULT_SHM_DIR
    modes: tuple[str, ...] = EMBEDDED_MODES  # embedded only
    advertise_namespace_id: str | None = None  # embedded only: the worker's advertised id
    model_dir: str | None = None  # embedded only
    keep_logs: bool = False  # embedded: keep the gateways' logs even when the run passes
    log_dir: str | None = None  # embedded: write the gateways' logs here (kept); None: the temp dir


@dataclass(frozen=True)
class GatewayRun:
    """One gateway's requests, the three accounts of them, and the verdict."""

    label: str  # the embedded mode, or "gateway"
    gateway_url: str
    metrics_url: str
    mode: str  # as configured (or as its log says); "" when it cannot be known
    shm_min_bytes: int | None
    engine: str
    worker_namespace_id: str
    workers: list[str]
    requests: list[ChatOutcome]
    p50_ms: float
    metrics: MetricsEvidence
    shm_dir: ShmDirEvidence
    receipts: ReceiptEvidence
    path: str  # which path its tensors took (a TensorPath)
    cause: str
    agree: bool
    shm_tensors_by_source: dict[str, int]
    failure_class: FailureClass  # the empty string: none
    failure: str
    expected: str  # the path expected ("" no expectation)
    as_expected: bool
    gateway_log: str = ""
    dev_writable: bool | None = None  # the gateway's own /dev/shm probe at start (None: not known)
    setting_source: str = ""  # where mode, shm_min_bytes and dev_writable were read ("" not known)
    cause_info: Found | None = None  # the catalogue's cause with its fix (None: SHM as configured)

    @property
    def failed_requests(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    @property
    def unreachable(self) -> bool:
        """Its requests failed behind a worker that does not answer (the cause worker_unreachable)."""
        return self.cause_info is not None and self.cause_info.code == Cause.WORKER_UNREACHABLE.value


@dataclass(frozen=True)
class E2eReport:
    embedded: bool
    model: str
    image_size: int
    image_bytes: int
    local_namespace_id: str
    runs: list[GatewayRun]
    removed_at_stop: list[str] = field(default_factory=list)  # embedded: the gateways' segments left at the end
    processes_left: list[int] = field(default_factory=list)  # embedded: pids that outlived stop (must be none)

    @property
    def undetermined(self) -> bool:
        return any(r.path == TensorPath.UNDETERMINED for r in self.runs)

    @property
    def unreachable(self) -> bool:
        """A gateway's worker does not answer (worker_unreachable): an endpoint unreachable, not SHM unused."""
        return any(r.unreachable for r in self.runs)

    @property
    def ok(self) -> bool:
        clean = not self.removed_at_stop and not self.processes_left
        return clean and all(r.as_expected and not r.failure_class for r in self.runs)


@dataclass
class _Target:
    label: str
    url: str
    metrics_url: str
    pid: int | None
    mode: str
    shm_min_bytes: int | None
    engine: str
    worker_ns: str
    workers: list[str]
    expected: str
    log: str = ""
    outcomes: list[ChatOutcome] = field(default_factory=list)
    dev_writable: bool | None = None  # the gateway's own /dev/shm probe at start, from its log
    setting_source: str = ""  # where mode and dev_writable come from ("" not known)
    metrics_owner: str = "the gateway smgshm started with this --prometheus-port"  # why its counters are its own


Progress = Callable[[str], None]
# Each request as it is answered: (target label, requests done, of how many, its outcome). Given, it
# replaces the line per request that ``say`` would get (a person at a terminal wants a bar instead).
RequestProgress = Callable[[str, int, int, ChatOutcome], None]


def _stream_for(opts: E2eOptions, i: int) -> bool:
    return opts.stream == "on" or (opts.stream == "both" and i % 2 == 1)


def _observe(
    targets: list[_Target],
    opts: E2eOptions,
    model: str,
    png: bytes,
    say: Progress,
    facts: HostFacts | None = None,
    on_request: RequestProgress | None = None,
) -> list[GatewayRun]:
    """Warm up, take baselines, send the requests round-robin, and collect every account."""
    for t in targets:
        for i in range(opts.warmup):
            send_chat(t.url, model, png, stream=_stream_for(opts, i), api_key=opts.api_key, timeout_s=opts.timeout_s)
    baselines = {id(t): receipt_baseline(t.workers, 5.0) for t in targets}
    before = {id(t): scrape(t.metrics_url, 10.0, MM_FAMILIES) for t in targets}
    watch: SegmentWatch | None = None
    watch_note = ""
    if any(t.pid is not None for t in targets):
        try:
            watch = SegmentWatch(opts.shm_dir).__enter__()
        except SmgshmError as err:
            watch_note = f"cannot watch {opts.shm_dir}: {err}"
    try:
        _send_requests(targets, opts, model, png, say, on_request)
        if watch is not None:
            watch.settle()
    finally:
        if watch is not None:
            watch.__exit__(None, None, None)
    # Without the caller's facts, read after the requests: what the shm dir is like now.
    local = _Local(namespace_id(opts.shm_dir, facts), writable_error(opts.shm_dir, facts) is None, watch, watch_note)
    return [_account(t, opts, before[id(t)], baselines[id(t)], local) for t in targets]


def _send_requests(
    targets: list[_Target],
    opts: E2eOptions,
    model: str,
    png: bytes,
    say: Progress,
    on_request: RequestProgress | None,
) -> None:
    """``opts.requests`` rounds, one request to each target per round; each outcome kept on its target."""
    total, done = opts.requests * len(targets), 0
    for i in range(opts.requests):
        for t in targets:
            out = send_chat(
                t.url, model, png, stream=_stream_for(opts, i), api_key=opts.api_key, timeout_s=opts.timeout_s
            )
            t.outcomes.append(out)
            done += 1
            if on_request is not None:
                on_request(t.label, done, total, out)
            else:
                say(f"{t.label}: request {i + 1}/{opts.requests}: HTTP {out.status} in {human_ms(out.elapsed_ms)}")


@dataclass(frozen=True)
class _Local:
    """What this host saw of the requests: its shm dir's namespace id and writability, the watch on it."""

    namespace_id: str
    writable: bool
    watch: SegmentWatch | None
    watch_note: str  # why there is no watch, when it could not be started


def _account(
    t: _Target, opts: E2eOptions, before: MetricsSnapshot, baseline: ReceiptBaseline, local: _Local
) -> GatewayRun:
    """One gateway's run: its metrics, shm dir and receipts accounts of the requests, judged."""
    m = dataclasses.replace(metrics_delta(before, scrape(t.metrics_url, 10.0, MM_FAMILIES)), owner=t.metrics_owner)
    # A gateway in another mount namespace (a container) writes its own tmpfs: this shm dir saw none
    # of it, and its space, id and writability are the gateway's, read through /proc.
    elsewhere = _gateway_tmpfs_elsewhere(t.pid, opts.shm_dir)
    d = _shm_dir_evidence(t, opts, local, elsewhere)
    r = receipts_since(baseline, 5.0)
    failed = sum(1 for o in t.outcomes if not o.ok)
    size, free = shm_space(elsewhere or opts.shm_dir) if t.pid is not None else (None, None)
    ns, can_write = local.namespace_id, local.writable
    if elsewhere:
        ns = read_namespace_id(proc_root=f"/proc/{t.pid}/root")
        can_write = writable_error(elsewhere) is None
    ctx = Context(
        t.mode, t.shm_min_bytes, t.engine, ns, t.worker_ns, can_write, opts.requests, failed, t.dev_writable, size, free
    )
    v: Verdict = judge(ctx, m, d, r)
    expected, as_expected = expectation(opts.expect, t.mode, t.expected, v)
    cause = _cause(v, t, opts, elsewhere or opts.shm_dir)
    if failed:
        # Failed requests behind a dead worker: that is the cause, whatever the counters say.
        cause = _unreachable_worker(t.workers, opts) or cause
    return GatewayRun(
        t.label,
        t.url,
        t.metrics_url,
        t.mode,
        t.shm_min_bytes,
        t.engine,
        t.worker_ns,
        t.workers,
        list(t.outcomes),
        median([o.elapsed_ms for o in t.outcomes if o.ok], empty=0.0),
        m,
        d,
        r,
        v.path,
        v.cause,
        v.agree,
        v.counts,
        v.failure_class,
        FAILURE_TEXT.get(v.failure_class, ""),
        expected,
        as_expected,
        t.log,
        t.dev_writable,
        t.setting_source,
        cause,
    )


def _shm_dir_evidence(t: _Target, opts: E2eOptions, local: _Local, elsewhere: str) -> ShmDirEvidence:
    """What the shm dir showed of the gateway's segments, or why it shows nothing."""
    if elsewhere:
        return ShmDirEvidence(
            False,
            f"the gateway writes another tmpfs than {opts.shm_dir}: watch it with --shm-dir {elsewhere}",
            opts.shm_dir,
            t.pid,
        )
    if local.watch is not None and t.pid is not None:
        return local.watch.evidence(t.pid)
    # A local address whose listener cannot be seen is another user's process, not another host's.
    remote = t.pid is None and not is_local_url(t.url)
    note = local.watch_note or ("the gateway is not on this host" if remote else "")
    return ShmDirEvidence(False, note or "the gateway's pid is not visible from here", opts.shm_dir, t.pid)


def _gateway_tmpfs_elsewhere(pid: int | None, shm_dir: str) -> str:
    """The gateway's own /dev/shm, seen through /proc, when it is another tmpfs than ``shm_dir``; "" when it is
    the same one, or when that cannot be told (then nothing changes)."""
    if pid is None:
        return ""
    theirs = f"/proc/{pid}/root{DEFAULT_SHM_DIR}"
    try:
        return theirs if os.stat(theirs).st_dev != os.stat(shm_dir).st_dev else ""
    except OSError:
        return ""


def _cause(v: Verdict, t: _Target, opts: E2eOptions, shm_dir: str) -> Found | None:
    """The verdict's cause from the catalogue, its next step naming this gateway and the shm dir it writes."""
    if v.code is None:
        return None
    return found(v.code, v.cause, Where(shm_dir, t.url, running="e2e"))


def _unreachable_worker(workers: list[str], opts: E2eOptions) -> Found | None:
    """The first of the gateway's gRPC workers that does not answer a connect (bounded), as a cause."""
    from smgshm.core.address import grpc_target
    from smgshm.core.errors import TransportError
    from smgshm.core.transport.channel import open_channel

    for address in workers[:16]:
        try:
            open_channel(grpc_target(address), min(opts.timeout_s, 2.0)).close()
        except TransportError as err:
            return found(Cause.WORKER_UNREACHABLE, f"worker {address} unreachable: {err}", Where(address=address))
        except SmgshmError:
            continue  # not an address smgshm can dial: say nothing rather than guess
    return None


def run_against(
    gateway_url: str,
    opts: E2eOptions,
    say: Progress = lambda _s: None,
    facts: HostFacts | None = None,
    on_request: RequestProgress | None = None,
) -> E2eReport:
    """e2e against a running gateway; TransportError when it (or its metrics) cannot be reached.

    ``facts``: this host's, when the caller has read them already (doctor). Ctrl-C: ``Interrupted``
    saying how far the requests got (nothing was started, so nothing else is to be said)."""
    answered: list[ChatOutcome] = []
    try:
        return _run_against(gateway_url, opts, say, facts, on_request, answered)
    except KeyboardInterrupt as err:
        if isinstance(err, Interrupted):
            raise
        raise Interrupted(
            f"stopped testing {gateway_url} with {len(answered)} of {opts.requests} measured request(s) answered; "
            "it started no gateway and made no log"
        ) from err


def _run_against(
    gateway_url: str,
    opts: E2eOptions,
    say: Progress,
    facts: HostFacts | None,
    on_request: RequestProgress | None,
    answered: list[ChatOutcome],
) -> E2eReport:
    from smgshm.core.gateway.admin import list_workers

    grpc_workers = [w for w in list_workers(gateway_url, opts.api_key, 5.0) if w.grpc]
    model = opts.model or first_model(gateway_url, opts.api_key, 5.0)
    w0 = grpc_workers[0] if grpc_workers else None
    pid = listening_pid(gateway_url) if is_local_url(gateway_url) else None
    target = _Target(
        "gateway",
        gateway_url.rstrip("/"),
        "",
        pid,
        "",
        None,
        w0.runtime_type if w0 else "",
        w0.label_namespace_id if w0 else "",
        [w.url for w in grpc_workers],
        "",
    )
    target.outcomes = answered  # the caller's list: how far it got, if interrupted
    if pid is not None:
        _read_setting(target, pid)
    # Before any chat request: its own counters, or a refusal (never a neighbour's on port 29000).
    owned = own_metrics(gateway_url, pid, _own_port_finder(pid), opts.metrics_url, opts.api_key, opts.timeout_s)
    target.metrics_url, target.metrics_owner = owned.url, owned.owner
    png = make_png(opts.image_size)
    runs = _observe([target], opts, model, png, say, facts, on_request)
    return E2eReport(False, model, opts.image_size, len(png), namespace_id(opts.shm_dir, facts), runs)


def _own_port_finder(pid: int | None) -> Callable[[], str]:
    """Finds the metrics port of process ``pid`` (its port answering /metrics with SMG's counters; "" none),
    as --running and doctor do; asked only when needed, since it asks each of the process's ports."""

    def find() -> str:
        from smgshm.core.gateway.running import inspect_gateway

        return inspect_gateway(pid).metrics_url if pid is not None else ""

    return find


def _read_setting(t: _Target, pid: int) -> None:
    """A gateway on this host: its transport line, from the log it writes (its open files), if any."""
    from smgshm.core.gateway.log import read_open_log
    from smgshm.core.gateway.running import inspect_gateway

    g = inspect_gateway(pid, probe=False)
    config = read_open_log(pid, [(log.fd, log.path) for log in g.logs])
    if config is not None:
        t.mode, t.shm_min_bytes, t.dev_writable = config.mode, config.shm_min_bytes, config.dev_writable
        t.setting_source = f"log {config.where}"


def run_embedded(
    opts: E2eOptions,
    say: Progress = lambda _s: None,
    facts: HostFacts | None = None,
    on_request: RequestProgress | None = None,
) -> E2eReport:
    """The embedded default: a receiver and a real gateway per mode, all stopped at the end.

    ``facts``: this host's, when the caller has read them already (doctor)."""
    from smgshm.core.gateway.process import find_smg

    find_smg()  # before anything starts: the one clear error when smg is missing
    # SMG's gateway writes /dev/shm whatever the caller's shm dir: watch and read there.
    opts = dataclasses.replace(opts, shm_dir=DEFAULT_SHM_DIR)
    from smgshm.core.receiver.modeldir import ensure_model_dir

    md = ensure_model_dir(opts.model_dir)
    local_ns = namespace_id(opts.shm_dir, facts)
    png = make_png(opts.image_size)
    gateways: list[RunningGateway] = []
    try:
        runs = _embedded(opts, md, png, gateways, say, facts, on_request)
    except KeyboardInterrupt as err:  # the gateways and receivers are stopped: say so, and of their logs
        raise _interrupted(opts, gateways) from err
    removed = [n for gw in gateways for n in gw.removed_segments]
    left = [gw.pid for gw in gateways if _group_alive(gw.pid)]
    report = E2eReport(
        True, opts.model or md.served_model_name, opts.image_size, len(png), local_ns, runs, removed, left
    )
    if report.ok and not opts.keep_logs and opts.log_dir is None:
        # Nothing to look at: a passing run leaves no log behind (a failing one names its logs).
        remove_logs([gw.log_path for gw in gateways])
        report = dataclasses.replace(report, runs=[dataclasses.replace(r, gateway_log="") for r in runs])
    return report


def _embedded(
    opts: E2eOptions,
    md: ModelDir,
    png: bytes,
    gateways: list[RunningGateway],
    say: Progress,
    facts: HostFacts | None,
    on_request: RequestProgress | None,
) -> list[GatewayRun]:
    """Start a receiver and a gateway per mode (each gateway appended to ``gateways`` as it starts), run the
    requests, and stop them all, whatever happens."""
    from smgshm.core.gateway.process import GatewayConfig, launch_gateway, stop_gateways, wait_ready
    from smgshm.core.receiver.reader import ReceiverConfig
    from smgshm.core.receiver.services import start_receiver

    with contextlib.ExitStack() as stack:
        # Registered first, so it runs last: after the receivers, all gateways at once.
        stack.callback(lambda: stop_gateways(gateways))
        targets = []
        for mode in opts.modes:
            cfg = ReceiverConfig(shm_dir=opts.shm_dir, model_dir=md.path, namespace_id=opts.advertise_namespace_id)
            rcv = start_receiver(cfg, "127.0.0.1:0")
            stack.callback(rcv.stop, 0)
            gcfg = GatewayConfig(
                worker_urls=(rcv.address,),
                model_path=md.path,
                transport=mode,
                log_mm_timing=True,
                shm_dir=opts.shm_dir,
                log_path=_new_log(opts.log_dir, mode),
            )
            gw = launch_gateway(gcfg)  # all launched from this thread, then awaited together
            gateways.append(gw)
            worker_ns = cfg.advertised_namespace_id()
            # inline expects inline; shm and auto expect SHM for every eligible tensor (expectation()).
            expected = "inline" if mode == "inline" else ""
            targets.append(
                _Target(
                    mode,
                    gw.http_url,
                    gw.metrics_url,
                    gw.pid,
                    mode,
                    None,
                    cfg.engine,
                    worker_ns,
                    [rcv.address],
                    expected,
                    gw.log_path,
                )
            )
        say(f"started {len(gateways)} gateways ({', '.join(opts.modes)}); waiting for them to be ready")
        for i, gw in enumerate(gateways):
            if not wait_ready(gw, 60.0, retry_bind=True):  # lost a port race: once more on new ports
                gw = launch_gateway(gw.cfg)
                gateways.append(gw)  # the lost one is stopped already; stopping it again is a no-op
                gateways[i], gateways[-1] = gw, gateways[i]
                targets[i].url, targets[i].metrics_url, targets[i].pid = gw.http_url, gw.metrics_url, gw.pid
                targets[i].log = gw.log_path
                wait_ready(gw, 60.0)
        for t, gw in zip(targets, gateways[: len(targets)], strict=True):
            setting = gw.transport_setting()
            if setting is not None:
                t.shm_min_bytes, t.dev_writable = setting.shm_min_bytes, setting.dev_writable
                t.setting_source = "its start-up log line"
        return _observe(targets, opts, opts.model or md.served_model_name, png, say, facts, on_request)


def _interrupted(opts: E2eOptions, gateways: list[RunningGateway]) -> Interrupted:
    """Ctrl-C, after every gateway and receiver was stopped: one line of what was stopped; the gateways'
    logs are removed (made in the temp dir, nothing to look at), or named when kept (--keep-logs,
    --gateway-log-dir)."""
    what = f"stopped {len(gateways)} gateway(s) ({', '.join(opts.modes)}) and their receivers"
    return interrupted(what, gateways, keep=opts.keep_logs or opts.log_dir is not None)


def interrupted(what: str, gateways: list[RunningGateway], *, keep: bool = False) -> Interrupted:
    """``what`` was stopped: the one line, with what became of the gateways' logs (removed, or named when
    ``keep``). Every run that starts gateways ends a Ctrl-C through here (e2e, its --sizes sweep)."""
    logs = list(dict.fromkeys(gw.log_path for gw in gateways if gw.log_path))
    if not logs:
        return Interrupted(what)
    if keep:
        return Interrupted(f"{what}; their logs are kept: {', '.join(logs)}")
    remove_logs(logs)
    return Interrupted(f"{what}; removed their {len(logs)} log(s)")


def _new_log(log_dir: str | None, mode: str) -> str | None:
    """A fresh log file in ``log_dir`` (None: the gateway launcher makes one in the temp dir)."""
    if log_dir is None:
        return None
    import tempfile

    try:
        fd, path = tempfile.mkstemp(prefix=f"smgshm-gateway-{mode}-", suffix=".log", dir=log_dir)
    except OSError as err:
        raise HostError("cannot create a gateway log", path=log_dir, detail=err.strerror or str(err)) from err
    os.close(fd)
    return path


def remove_logs(paths: list[str]) -> None:
    """Remove logs of gateways smgshm started itself (never a file it did not create)."""
    for path in dict.fromkeys(paths):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
