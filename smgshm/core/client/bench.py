"""Inline vs SHM, measured side by side on the same payloads, against the host's limits.

Both transports alternate on every iteration so that drift on a noisy machine hits
them alike; figures are medians. GB means 1e9 bytes throughout.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smgshm.core.errors import SmgshmError, TransportError, VerificationError
from smgshm.core.names import floor_name
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.segments.io import WriteStrategy, unlink_segment, write_segment
from smgshm.core.stats import median, percentiles
from smgshm.core.transport.tensors import digest
from smgshm.core.transport.verify import ProblemKind, Sent, judge, receipt_key
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal
from smgshm.core.units import gb_per_s, human_size

MESSAGE_OVERHEAD = 64 * 1024  # headroom under the gRPC limit for the envelope around an inline payload


@dataclass(frozen=True)
class BenchOptions:
    sizes: tuple[int, ...]
    warmup: int = 2
    iterations: int = 10
    verify: bool = True
    shm_dir: str = DEFAULT_SHM_DIR
    strategy: WriteStrategy = "pwrite"
    max_message_bytes: int = 256 * 1024 * 1024
    timeout: float = 60.0


@dataclass(frozen=True)
class Stats:
    p50_ms: float
    p90_ms: float
    p99_ms: float
    gb_per_s: float  # at the median


@dataclass(frozen=True)
class SizeResult:
    nbytes: int
    inline: Stats | None  # None when the payload does not fit in one gRPC message
    shm: Stats
    shm_write_ms: float  # medians of the SHM path's parts
    shm_rpc_ms: float
    shm_read_ms: float
    speedup: float | None  # inline p50 / shm p50
    shm_fraction_of_memcpy: float
    samples_ns: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostFigures:
    cpu_count: int
    python: str
    torch: str
    memcpy_gb_per_s: float
    fresh_page_gb_per_s: float  # create + fill a new file in the shm dir: every new segment pays this
    writer_pwrite_gb_per_s: float
    writer_mmap_gb_per_s: float


@dataclass(frozen=True)
class BenchReport:
    address: str
    reader: str
    host: HostFigures
    sizes: list[SizeResult]
    crossover_bytes: int | None
    recommended_shm_min_bytes: int | None
    recommendation: str
    verified: bool


def _ms(ns: float) -> float:
    return ns / 1e6


def _stats(ns: list[int], nbytes: int) -> Stats:
    p50, p90, p99 = percentiles(ns, (0.5, 0.9, 0.99), "nearest")
    return Stats(_ms(p50), _ms(p90), _ms(p99), gb_per_s(nbytes, median(ns)))


def _gbps(nbytes: int, fn: Callable[[], None], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return gb_per_s(nbytes, median(times))


def measure_host(shm_dir: str, nbytes: int = 64 * 1024 * 1024) -> HostFigures:
    """memcpy bandwidth, the fresh-page floor and both writers, on ``nbytes``."""
    import torch

    src = bytearray(os.urandom(1024)) * (nbytes // 1024)
    dst = bytearray(len(src))
    view_src, view_dst = memoryview(src), memoryview(dst)

    def memcpy() -> None:
        view_dst[:] = view_src

    def write_with(strategy: WriteStrategy) -> Callable[[], None]:
        def run() -> None:
            ref = write_segment(view_src, shm_dir=shm_dir, strategy=strategy)
            unlink_segment(ref.name, shm_dir)

        return run

    def fresh_pages() -> None:
        # The floor: one new file, fallocate + one pwrite, no tensor and no checks.
        path = os.path.join(shm_dir, floor_name())
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.posix_fallocate(fd, 0, len(src))
            os.pwrite(fd, view_src, 0)
        finally:
            os.close(fd)
            os.unlink(path)

    return HostFigures(
        cpu_count=os.cpu_count() or 1,
        python=platform.python_version(),
        torch=torch.__version__,
        memcpy_gb_per_s=_gbps(len(src), memcpy),
        fresh_page_gb_per_s=_gbps(len(src), fresh_pages),
        writer_pwrite_gb_per_s=_gbps(len(src), write_with("pwrite")),
        writer_mmap_gb_per_s=_gbps(len(src), write_with("mmap")),
    )


def crossover(results: list[SizeResult]) -> int | None:
    """The smallest size from which SHM's median beats inline's at every larger measured size."""
    best = None
    for r in sorted(results, key=lambda r: r.nbytes, reverse=True):
        if r.inline is None:
            continue
        if r.shm.p50_ms < r.inline.p50_ms:
            best = r.nbytes
        else:
            break
    return best


def recommend(results: list[SizeResult]) -> tuple[int | None, int | None, str]:
    """(crossover, recommended shm_min_bytes, the reasoning in one line)."""
    x = crossover(results)
    if x is None:
        return None, None, "SHM never beat inline at the measured sizes: keep --multimodal-tensor-transport inline"
    # SMG sends a tensor by SHM when nbytes >= shm_min_bytes. Below the crossover SHM lost or was
    # not measured, so the threshold is the crossover itself, never a size under it.
    rec = x
    why = (
        f"SHM's median beats inline from {human_size(x)} ({x} B) on, and at every larger size measured; "
        f"set --multimodal-shm-min-bytes {rec} (SMG's default is 65536)"
    )
    return x, rec, why


class _Bench:
    def __init__(self, stub: Any, pb: Any, opts: BenchOptions) -> None:
        self.stub, self.pb, self.opts = stub, pb, opts

    def _rpc(self, out: OutTensor) -> Any:
        msg = build_multimodal(Layout.VLLM, Request(out)).SerializeToString()
        req = self.pb.ReceiveRequest(request_id="bench", layout=self.pb.LAYOUT_VLLM, multimodal_inputs=msg)
        return self.stub.Receive(req, timeout=self.opts.timeout)

    def _check(self, resp: Any, want: bytes | None, kind: str, nbytes: int) -> None:
        verdict = judge([Sent(receipt_key(Layout.VLLM), want, kind, nbytes)], resp.receipts)
        for issue in verdict.issues:
            if issue.kind is ProblemKind.RECEIVER_ERROR:
                raise SmgshmError(f"the receiver refused the payload: {issue.message}")
            raise VerificationError(f"{kind} payload not verified: {issue.message}", key=issue.key, nbytes=nbytes)

    def inline(self, payload: bytes, want: bytes | None) -> int:
        t0 = time.perf_counter_ns()
        resp = self._rpc(OutTensor((len(payload),), "uint8", inline=payload))
        elapsed = time.perf_counter_ns() - t0
        self._check(resp, want, "inline", len(payload))
        return elapsed

    def shm(self, payload: memoryview, want: bytes | None) -> tuple[int, int, int, int]:
        t0 = time.perf_counter_ns()
        ref = write_segment(payload, shm_dir=self.opts.shm_dir, strategy=self.opts.strategy)
        t1 = time.perf_counter_ns()
        try:
            resp = self._rpc(OutTensor((payload.nbytes,), "uint8", shm=ref))
        finally:
            t2 = time.perf_counter_ns()
            leftover = unlink_segment(ref.name, ref.shm_dir)  # always: a bench never leaks
        self._check(resp, want, "shm", payload.nbytes)
        if leftover:
            raise SmgshmError("the receiver did not unlink the segment after reading it", name=ref.name)
        return t2 - t0, t1 - t0, t2 - t1, int(resp.receipts[0].read_ns)


# One round's expected cost in bytes-equivalent: a fixed per-RPC cost (~0.5 ms, the bytes
# SHM moves meanwhile) plus the payload once for SHM and about ten times over for inline,
# which runs near 0.1 GB/s against SHM's ~1 (README, "What SHM is worth here").
_RPC_COST_BYTES = 512 * 1024
_INLINE_COST = 10


def _round_weight(size: int, opts: BenchOptions) -> int:
    fits = size + MESSAGE_OVERHEAD <= opts.max_message_bytes
    return _RPC_COST_BYTES * (2 if fits else 1) + size * (1 + (_INLINE_COST if fits else 0))


def run_bench(
    address: str,
    opts: BenchOptions,
    reader: str = "",
    progress: Callable[[int, int], None] | None = None,
    on_size: Callable[[SizeResult], None] | None = None,
) -> BenchReport:
    """Sweep ``opts.sizes`` against a smgshm receiver, alternating inline and SHM."""
    import grpc

    from smgshm.core.transport.channel import open_channel
    from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

    channel = open_channel(address, 5.0, opts.max_message_bytes + MESSAGE_OVERHEAD)
    try:
        host = measure_host(opts.shm_dir, min(max(opts.sizes), 64 * 1024 * 1024))
        bench = _Bench(diag_pb2_grpc.DiagnosticsStub(channel), diag_pb2, opts)
        # Progress in expected work, not in rounds: a 256 MiB round takes thousands of times a
        # 4 KiB one, so counting rounds made the ETA wildly optimistic early on.
        rounds = opts.warmup + opts.iterations
        total = sum(_round_weight(s, opts) for s in opts.sizes) * rounds
        done = 0
        results = []
        for size in opts.sizes:
            payload = os.urandom(size)
            view = memoryview(payload)
            want = digest(payload) if opts.verify else None
            fits = size + MESSAGE_OVERHEAD <= opts.max_message_bytes
            inl: list[int] = []
            parts: dict[str, list[int]] = {"shm": [], "write": [], "rpc": [], "read": []}
            for i in range(opts.warmup + opts.iterations):
                try:
                    a = bench.inline(payload, want) if fits else 0
                    b = bench.shm(view, want)
                except grpc.RpcError as err:
                    raise TransportError(f"bench RPC failed: {err.code().name}", endpoint=address) from err
                if i >= opts.warmup:
                    if fits:
                        inl.append(a)
                    for k, v in zip(("shm", "write", "rpc", "read"), b, strict=True):
                        parts[k].append(v)
                done += _round_weight(size, opts)
                if progress:
                    progress(done, total)
            shm = _stats(parts["shm"], size)
            inline = _stats(inl, size) if inl else None
            r = SizeResult(
                size,
                inline,
                shm,
                _ms(median(parts["write"])),
                _ms(median(parts["rpc"])),
                _ms(median(parts["read"])),
                (inline.p50_ms / shm.p50_ms) if inline and shm.p50_ms else None,
                shm.gb_per_s / host.memcpy_gb_per_s if host.memcpy_gb_per_s else 0.0,
                {"inline": inl, "shm": parts["shm"]},
            )
            results.append(r)
            if on_size:
                on_size(r)
    finally:
        channel.close()
    x, rec, why = recommend(results)
    return BenchReport(address, reader, host, results, x, rec, why, opts.verify)
