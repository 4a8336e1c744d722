"""Send test tensors to a smgshm receiver inline or through /dev/shm, and verify everything.

Verification is on by default, as in nccl-tests and nvbandwidth: every receipt's
digest must equal the sender's, and every segment must be gone after the request
(or, when the receiver keeps segments, the sender removes them and counts them).
On any failure to send, every segment created for that request is unlinked first.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smgshm.core.errors import HostError, MessageTooLargeError, NoSpaceError, SmgshmError, TransportError
from smgshm.core.fanout import result
from smgshm.core.gateway.setting import DEFAULT_SHM_MIN_BYTES, Mode
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.segments.io import ShmRef, WriteStrategy, no_space_error, unlink_segment, write_segment
from smgshm.core.stats import percentiles
from smgshm.core.transport.decision import decide
from smgshm.core.transport.tensors import digest, expected_nbytes, make_tensor, tensor_bytes
from smgshm.core.transport.verify import ProblemKind, Sent, judge, receipt_key
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal
from smgshm.core.units import gb_per_s

if TYPE_CHECKING:
    from smgshm.core.host.facts import HostFacts


@dataclass(frozen=True)
class SendOptions:
    layout: Layout = Layout.VLLM
    mode: Mode = Mode.SHM
    dtype: str = "float32"
    shape: tuple[int, ...] = (1024, 1024)
    tensors: int = 1  # per request: the primary plus tensors-1 model-specific ones
    count: int = 1
    concurrency: int = 1
    seed: int = 0
    shm_min_bytes: int = DEFAULT_SHM_MIN_BYTES
    verify: bool = True
    timeout: float = 30.0
    connect_timeout: float = 5.0
    shm_dir: str = DEFAULT_SHM_DIR
    strategy: WriteStrategy = "pwrite"
    duration: float | None = None  # a soak: keep sending until this many seconds passed, ``count`` ignored


@dataclass
class PathStats:
    """Per transport path: what went and how it went."""

    requests: int = 0
    tensors: int = 0
    nbytes: int = 0
    failures: int = 0
    mismatches: int = 0
    leftovers: int = 0  # segments still present after the receiver answered
    latencies_ns: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PathSummary:
    path: str
    requests: int
    tensors: int
    nbytes: int
    failures: int
    mismatches: int
    leftovers: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    gb_per_s: float  # GB = 1e9 bytes, over the summed request latencies


@dataclass(frozen=True)
class Problem:
    request: int
    key: str
    kind: ProblemKind
    message: str


@dataclass(frozen=True)
class SendReport:
    address: str
    layout: str
    mode: str
    dtype: str
    shape: tuple[int, ...]
    tensor_nbytes: int
    receiver_namespace_id: str
    receiver_unlinks: bool
    receiver_uid: int
    paths: list[PathSummary]
    problems: list[Problem]
    unreachable: bool
    verified: bool
    stopped: bool = False  # the caller's stop event ended the run early (Ctrl-C, SIGTERM)
    cancelled: int = 0  # requests in flight when it was stopped: cancelled, their segments unlinked

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unreachable and not self.stopped


# Bounds checked before anything is allocated (the CLI makes them usage errors): a tensor
# over 4 GiB is beyond any gRPC message and any sane SHM test, and the sender holds
# tensors x concurrency payloads (plus their inline copies) at once.
MAX_TENSOR_BYTES = 4 * 1024**3
MAX_SENDER_BYTES = 8 * 1024**3

STOP_POLL_S = 0.1  # how often an in-flight request looks at the stop event: Ctrl-C acts within this


class _StoppedError(Exception):
    """The caller's stop event was set while a request was being built or was in flight."""


def at_once_bytes(opts: SendOptions) -> int:
    """The SHM bytes a send holds at once, at most: each request's segments, ``concurrency`` requests."""
    return expected_nbytes(opts.shape, opts.dtype) * opts.tensors * opts.concurrency


class _Run:
    def __init__(
        self,
        opts: SendOptions,
        stub: Any,
        pb: Any,
        local_ns: str,
        peer_ns: str,
        writable: bool,
        stop: threading.Event | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.opts, self.stub, self.pb = opts, stub, pb
        self.stop = stop or threading.Event()
        self.on_progress = on_progress
        self.cancelled = 0
        self.local_ns, self.peer_ns, self.writable = local_ns, peer_ns, writable
        self.stats: dict[str, PathStats] = {}
        self.problems: list[Problem] = []
        self.unreachable = False
        self.lock = threading.Lock()
        self.numbers = itertools.count()
        self.nbytes = expected_nbytes(opts.shape, opts.dtype)
        self.at_once = at_once_bytes(opts)

    def _path_for(self) -> str:
        engine = self.opts.layout.value
        d = decide(
            self.opts.mode,
            nbytes=self.nbytes,
            engine=engine,
            local_ns=self.local_ns,
            worker_ns=self.peer_ns,
            writable=self.writable,
            shm_min_bytes=self.opts.shm_min_bytes,
        )
        return d.path

    def worker(self) -> None:
        """One of ``concurrency`` loops: take the next request number until the count or the time is up."""
        deadline = None if self.opts.duration is None else time.monotonic() + self.opts.duration
        while not self.unreachable and not self.stop.is_set():
            with self.lock:
                i = next(self.numbers)
            if (deadline is None and i >= self.opts.count) or (deadline is not None and time.monotonic() >= deadline):
                return
            self.one(i)
            if self.on_progress is not None:
                with self.lock:
                    done = sum(st.requests for st in self.stats.values())
                self.on_progress(done)

    def _wait(self, call: Any) -> Any:
        """The call's response; cancelled within ``STOP_POLL_S`` once ``stop`` is set."""
        import grpc

        while True:
            try:
                return call.result(timeout=STOP_POLL_S)
            except grpc.FutureTimeoutError:
                if self.stop.is_set():
                    call.cancel()
                    raise _StoppedError from None

    def one(self, i: int) -> None:
        import grpc

        from smgshm.rpc.v1 import diag_pb2

        if self.unreachable:
            return  # the receiver is gone: writing more segments only to unlink them helps nobody
        o = self.opts
        path = self._path_for()
        created: list[ShmRef] = []
        tensors = [make_tensor(o.shape, o.dtype, o.seed + i * o.tensors + k) for k in range(o.tensors)]
        views = [tensor_bytes(t) for t in tensors]
        want = [digest(v) for v in views] if o.verify else []
        try:
            outs: list[OutTensor] = []
            for v in views:
                if path == "shm":
                    try:
                        ref = write_segment(v, shm_dir=o.shm_dir, strategy=o.strategy)
                    except NoSpaceError:  # too small or full by what this run holds at once, not one segment
                        raise no_space_error(o.shm_dir, self.nbytes, self.at_once) from None
                    created.append(ref)
                    outs.append(OutTensor(o.shape, o.dtype, shm=ref))
                else:
                    outs.append(OutTensor(o.shape, o.dtype, inline=bytes(v)))
            req = Request(outs[0], {f"extra_{k}": t for k, t in enumerate(outs[1:], 1)})
            msg = build_multimodal(o.layout, req).SerializeToString()
            layout = o.layout.engine.diag_layout  # the enum value's name, as the message takes it
            if self.stop.is_set():
                raise _StoppedError
            t0 = time.perf_counter_ns()
            call = self.stub.Receive.future(
                diag_pb2.ReceiveRequest(request_id=f"send-{os.getpid()}-{i}", layout=layout, multimodal_inputs=msg),
                timeout=o.timeout,
            )
            resp = self._wait(call)
            elapsed = time.perf_counter_ns() - t0
        except _StoppedError:
            for ref in created:  # stopped mid-request: nothing of ours may outlive the run
                unlink_segment(ref.name, ref.shm_dir)
            with self.lock:
                self.cancelled += 1
            return
        except grpc.RpcError as err:
            for ref in created:  # the leak class SMG fixed twice: clean up on send failure
                unlink_segment(ref.name, ref.shm_dir)
            dead = err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            with self.lock:
                self.unreachable |= dead
                st = self.stats.setdefault(path, PathStats())
                st.requests += 1
                st.failures += 1
                self.problems.append(
                    Problem(i, "", ProblemKind.RPC_FAILED, f"{err.code().name}: {err.details() or ''}"[:200])
                )
            return
        except BaseException:
            for ref in created:
                unlink_segment(ref.name, ref.shm_dir)
            raise
        self._check(i, path, resp, want, created, elapsed)

    def _check(self, i: int, path: str, resp: Any, want: list[bytes], created: list[ShmRef], elapsed: int) -> None:
        # Matched by key, exactly one receipt each (core/transport/verify.py): receipts come back in the
        # receiver's order, and a receiver that repeats or invents receipts must not pass.
        sent = [
            Sent(
                receipt_key(self.opts.layout, None if k == 0 else f"extra_{k}"),
                want[k] if want else None,
                path,
                self.nbytes,
            )
            for k in range(self.opts.tensors)
        ]
        verdict = judge(sent, resp.receipts)
        problems = [Problem(i, x.key, x.kind, x.message) for x in verdict.issues]
        mismatches, failures = verdict.mismatches, verdict.receiver_errors
        leftovers = 0
        for ref in created:
            if unlink_segment(ref.name, ref.shm_dir):  # still there: the receiver kept or refused it
                leftovers += 1
                problems.append(
                    Problem(i, ref.name, ProblemKind.LEFTOVER, "segment still present after the receiver answered")
                )
        with self.lock:
            st = self.stats.setdefault(path, PathStats())
            st.requests += 1
            st.tensors += len(sent)
            st.nbytes += self.nbytes * self.opts.tensors
            st.failures += failures
            st.mismatches += mismatches
            st.leftovers += leftovers
            st.latencies_ns.append(elapsed)
            self.problems.extend(problems)


SMG_MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # SMG's Python servers' limit, for receivers that do not say
ENVELOPE_BYTES = 64 * 1024  # headroom for the request around the tensor bytes


def _refuse_oversize_inline(run: _Run, limit: int, target: str) -> None:
    """Refuse before sending what the receiver would refuse only after reading all of it."""
    payload = run.nbytes * run.opts.tensors
    if run._path_for() == "inline" and payload + ENVELOPE_BYTES > limit:
        raise MessageTooLargeError(
            "inline request exceeds the receiver's gRPC message limit",
            endpoint=target,
            nbytes=payload,
            limit=limit,
            hint="SMG would fail this request the same way; use --transport shm, or fewer or smaller tensors",
        )


def send(
    address: str,
    opts: SendOptions,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
    facts: HostFacts | None = None,
) -> SendReport:
    """Run ``opts.count`` requests (``opts.concurrency`` at a time) against a smgshm receiver.

    Setting ``stop`` (from a signal handler, say) ends the run within ``STOP_POLL_S``: no new
    request starts, in-flight ones are cancelled, their segments unlinked, and the report
    (``stopped``) covers what was done. ``on_progress(requests_done)`` is called after each.
    ``facts``: this host's, when the caller has read them already (its namespace id is used).
    """
    import grpc

    from smgshm.core.address import grpc_target
    from smgshm.core.host.facts import namespace_id
    from smgshm.core.transport.channel import open_channel
    from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

    target = grpc_target(address)
    channel = open_channel(target, opts.connect_timeout, 512 * 1024 * 1024)
    try:
        stub = diag_pb2_grpc.DiagnosticsStub(channel)
        try:
            ident = stub.Identity(diag_pb2.IdentityRequest(), timeout=opts.timeout)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise TransportError(
                    "not a smgshm receiver", endpoint=target, hint="run `smgshm serve` in the worker's container"
                ) from err
            raise TransportError("endpoint unreachable", endpoint=target, detail=err.code().name) from err
        writable = True
        if opts.mode is not Mode.INLINE:
            try:  # the gateway's probe, through the writer itself: a full dir raises NoSpaceError
                ref = write_segment(b"x", shm_dir=opts.shm_dir)
                unlink_segment(ref.name, ref.shm_dir)
            except NoSpaceError:
                if opts.mode is Mode.SHM:  # named by what the run would hold at once: too small, or full
                    raise no_space_error(opts.shm_dir, 1, at_once_bytes(opts)) from None
                writable = False  # auto: the gateway would stay inline, and so do we
            except HostError:
                if opts.mode is Mode.SHM:
                    raise
                writable = False
        run = _Run(
            opts, stub, diag_pb2, namespace_id(opts.shm_dir, facts), ident.namespace_id, writable, stop, on_progress
        )
        _refuse_oversize_inline(run, ident.max_message_bytes or SMG_MAX_MESSAGE_BYTES, target)
        with ThreadPoolExecutor(max_workers=opts.concurrency) as pool:
            for fut in [pool.submit(run.worker) for _ in range(opts.concurrency)]:
                result(fut)  # re-raise a HostError (full shm dir) from any request; a signal seen (fanout.py)
    except SmgshmError:
        raise
    finally:
        channel.close()
    sent = sum(st.requests for st in run.stats.values())
    stopped = run.stop.is_set()
    if opts.duration is None and sent < opts.count:
        why = "the run was stopped" if stopped else "the receiver became unreachable"
        run.problems.append(Problem(sent, "", ProblemKind.NOT_SENT, f"{opts.count - sent} request(s) not sent: {why}"))
    elif stopped:
        run.problems.append(Problem(sent, "", ProblemKind.NOT_SENT, "the run was stopped before its --duration was up"))
    paths = []
    for p, s in sorted(run.stats.items()):
        p50, p90, p99 = percentiles(s.latencies_ns, (0.5, 0.9, 0.99), "nearest", empty=0.0)
        paths.append(
            PathSummary(
                p,
                s.requests,
                s.tensors,
                s.nbytes,
                s.failures,
                s.mismatches,
                s.leftovers,
                p50 / 1e6,
                p90 / 1e6,
                p99 / 1e6,
                gb_per_s(s.nbytes, sum(s.latencies_ns)),
            )
        )
    return SendReport(
        address,
        opts.layout.value,
        opts.mode.value,
        opts.dtype,
        opts.shape,
        run.nbytes,
        ident.namespace_id,
        ident.unlink_after_read,
        ident.uid,
        paths,
        sorted(run.problems, key=lambda p: p.request),
        run.unreachable,
        opts.verify,
        stopped,
        run.cancelled,
    )


__all__ = ["SendOptions", "SendReport", "send"]
