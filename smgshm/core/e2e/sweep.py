"""What SHM is worth in SMG itself: image sizes through the real gateway, inline against shm.

Two real gateways (``--multimodal-tensor-transport inline`` and ``shm``, both with
``--log-mm-timing``), each with its own reference receiver, take the same image in
alternation, so both sides see the same machine noise. Per size: the median latency
of each, their ratio, the gateway's own SHM write time (its ``smg_mm_timing
mm_shm_write`` log lines), the worker's read time (its receipts), and both against
this host's fresh-page floor (core/client/bench.py), the physical limit of writing a new
segment, which SMG's one-file-per-tensor design pays every time.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.stats import median
from smgshm.core.units import human_ms

if TYPE_CHECKING:
    from smgshm.core.gateway.process import RunningGateway
    from smgshm.core.receiver.modeldir import ModelDir
    from smgshm.core.receiver.services import RunningReceiver

DEFAULT_SIZES = (224, 448, 896, 1344, 1792, 2688)
_SHM_WRITE = re.compile(r"smg_mm_timing mm_shm_write .*?nbytes=(\d+) elapsed_ms=([0-9.]+)")
_PREPROCESS = re.compile(r"smg_mm_timing process_multimodal_plan .*?preprocess_ms=([0-9.]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class SweepRow:
    image_px: int
    pixel_nbytes: int  # pixel_values as the worker received it
    requests: int  # measured per transport
    failed: int
    inline_p50_ms: float
    shm_p50_ms: float
    speedup: float | None  # inline / shm
    shm_write_ms: float | None  # the gateway's own mm_shm_write (median)
    worker_read_ms: float | None  # the receiver's read of the segment (median)
    preprocess_ms: float | None  # the gateway's image preprocessing (median, both gateways)
    floor_ms: float  # pixel_nbytes at this host's fresh-page rate
    write_floor_fraction: float | None  # floor_ms / shm_write_ms: 1.0 would be the floor itself


@dataclass(frozen=True)
class SweepReport:
    rows: list[SweepRow]
    fresh_page_gb_per_s: float
    memcpy_gb_per_s: float
    model: str
    gateway_logs: list[str] = field(default_factory=list)


def _shm_writes(log: str) -> list[float]:
    """The gateway's own SHM write times (ms) of tensors big enough to go by SHM."""
    return [float(m.group(2)) for m in _SHM_WRITE.finditer(log) if int(m.group(1)) >= 65536]


class _LogTail:
    """The lines a gateway appended to its log since the last call (bounded per call)."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            f.seek(0, 2)
            self.offset = f.tell()

    def new_text(self, max_bytes: int = 16 * 1024 * 1024) -> str:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            raw = f.read(max_bytes)
            self.offset = f.tell()
        return _ANSI.sub("", raw.decode("utf-8", errors="replace"))


def run_sweep(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    requests: int = 5,
    warmup: int = 1,
    say: Callable[[str], None] = lambda _s: None,
    timeout_s: float = 120.0,
) -> SweepReport:
    """The sweep on the embedded pair of gateways; everything stopped at the end (Ctrl-C too)."""
    from smgshm.core.client.bench import measure_host
    from smgshm.core.gateway.process import find_smg, stop_gateways

    find_smg()
    from smgshm.core.receiver.modeldir import ensure_model_dir

    md = ensure_model_dir(None)
    say("measuring this host's fresh-page floor")
    host = measure_host(DEFAULT_SHM_DIR)
    floor_bps = host.fresh_page_gb_per_s * 1e9
    gateways: list[RunningGateway] = []
    rows: list[SweepRow] = []
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(lambda: stop_gateways(gateways))
            pair = _start_pair(stack, gateways, md)
            for px in sizes:
                row = _measure_size(pair, px, requests, warmup, timeout_s, floor_bps)
                rows.append(row)
                say(f"{px} px: inline {human_ms(row.inline_p50_ms)}, shm {human_ms(row.shm_p50_ms)}")
    except KeyboardInterrupt as err:  # all stopped by now: say so, and remove their logs (made in the temp dir)
        from smgshm.core.e2e.run import interrupted

        what = f"stopped the sweep's {len(gateways)} gateway(s) and their receivers"
        raise interrupted(f"{what} after {len(rows)} of {len(sizes)} size(s)", gateways) from err
    logs = [g.log_path for g in gateways]
    if all(r.failed == 0 for r in rows):  # a passing sweep leaves no log behind; a failing one names them
        from smgshm.core.e2e.run import remove_logs

        remove_logs(logs)
        logs = []
    return SweepReport(rows, host.fresh_page_gb_per_s, host.memcpy_gb_per_s, md.served_model_name, logs)


@dataclass(frozen=True)
class _Pair:
    """The embedded pair: per mode ("inline", "shm") its gateway and its receiver; the model they serve."""

    gateways: dict[str, RunningGateway]
    receivers: dict[str, RunningReceiver]
    model: str


def _start_pair(stack: contextlib.ExitStack, gateways: list[RunningGateway], md: ModelDir) -> _Pair:
    """A receiver and a gateway per mode, each stopped by ``stack`` (the gateways: by the caller's,
    through ``gateways``), ready for requests."""
    from smgshm.core.gateway.process import GatewayConfig, launch_gateway, wait_ready
    from smgshm.core.receiver.reader import ReceiverConfig
    from smgshm.core.receiver.services import start_receiver

    rcv = {}
    for mode in ("inline", "shm"):
        r = start_receiver(ReceiverConfig(model_dir=md.path), "127.0.0.1:0")
        stack.callback(r.stop, 0)
        rcv[mode] = r
        gateways.append(
            launch_gateway(
                GatewayConfig(
                    worker_urls=(r.address,),
                    model_path=md.path,
                    transport=mode,
                    log_mm_timing=True,
                    shutdown_grace_s=1,
                )
            )
        )
    for gw in gateways:
        wait_ready(gw, 60.0)
    return _Pair(dict(zip(("inline", "shm"), gateways, strict=True)), rcv, md.served_model_name)


def _measure_size(pair: _Pair, px: int, requests: int, warmup: int, timeout_s: float, floor_bps: float) -> SweepRow:
    """One image size through both gateways: latencies, the gateway's writes, the worker's reads."""
    from smgshm.core.gateway.chat import make_png, send_chat
    from smgshm.core.receiver.receipts import fetch_receipts

    png = make_png(px)
    rcv = pair.receivers
    for mode in ("inline", "shm"):
        for _ in range(warmup):
            send_chat(pair.gateways[mode].http_url, pair.model, png, stream=False, timeout_s=timeout_s)
    seq = {m: fetch_receipts(rcv[m].address, 0, 10.0)[1] for m in rcv}
    tails = {m: _LogTail(g.log_path) for m, g in pair.gateways.items()}
    lat, failed = _alternate(pair, png, requests, timeout_s)
    shm_log, inline_log = tails["shm"].new_text(), tails["inline"].new_text()
    shm_log = _with_every_write(tails["shm"], shm_log, len(lat["shm"]))
    writes = _shm_writes(shm_log)
    pre = [float(m.group(1)) for m in _PREPROCESS.finditer(shm_log + inline_log)]
    got = {m: fetch_receipts(rcv[m].address, seq[m], 10.0)[0] for m in rcv}
    pix = [r for r in got["shm"] if r.key == "pixel_values" and r.payload_kind == "shm" and not r.error_code]
    nbytes = max((r.nbytes for r in got["shm"] + got["inline"] if r.key == "pixel_values"), default=0)
    read = median([r.read_ns / 1e6 for r in pix], empty=None)
    w = median(writes, empty=None)
    floor_ms = nbytes / floor_bps * 1000 if floor_bps else 0.0
    i50, s50 = median(lat["inline"], empty=0.0), median(lat["shm"], empty=0.0)
    return SweepRow(
        px,
        nbytes,
        requests,
        failed,
        i50,
        s50,
        i50 / s50 if s50 and i50 else None,
        w,
        read,
        median(pre, empty=None),
        floor_ms,
        floor_ms / w if w else None,
    )


def _alternate(pair: _Pair, png: bytes, requests: int, timeout_s: float) -> tuple[dict[str, list[float]], int]:
    """``requests`` to each gateway, in alternation: the latencies of those that passed, per mode, and
    how many failed."""
    from smgshm.core.gateway.chat import send_chat

    lat: dict[str, list[float]] = {"inline": [], "shm": []}
    failed = 0
    for i in range(requests):
        order = ("inline", "shm") if i % 2 == 0 else ("shm", "inline")  # alternate who goes first
        for mode in order:
            out = send_chat(pair.gateways[mode].http_url, pair.model, png, stream=False, timeout_s=timeout_s)
            if out.ok:
                lat[mode].append(out.elapsed_ms)
            else:
                failed += 1
    return lat, failed


def _with_every_write(tail: _LogTail, log: str, passed: int) -> str:
    """The shm gateway's log with one mm_shm_write line per SHM request that passed, or what came in 10 s.

    The gateway's logger writes from a background thread: its last line can land after the
    response. Wait (bounded) for them; the bound is generous (a loaded host), and costs nothing
    when the lines are there.
    """
    deadline = time.monotonic() + 10.0
    while len(_shm_writes(log)) < passed and time.monotonic() < deadline:
        time.sleep(0.05)
        log += tail.new_text()
    return log
