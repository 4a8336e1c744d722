"""``smgshm serve``: the reference receiver."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import click

from smgshm.cli import serve_view as view
from smgshm.cli import signals
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.extras import Extra, require
from smgshm.cli.params import BYTES, DURATION, complete_dirs, complete_files, listen_address, shm_dir_option
from smgshm.core.engines import DEFAULT, SERVED
from smgshm.core.receiver.faults import FAULTS, MAX_FAULT_DELAY_S

if TYPE_CHECKING:
    from smgshm.core.segments.io import ReaderMode

# In-flight calls get this long to finish after SIGTERM/SIGINT, then they are cancelled:
# serve is gone within 2 s of the signal.
STOP_GRACE_S = 1.0
FD_CHECK_S = 1.0  # how often serve looks at the descriptors it has open


@click.command()
@click.option(
    "--listen",
    default="127.0.0.1:50051",
    show_default=True,
    callback=listen_address,
    help="host:port or unix:PATH; port 0 picks one.",
)
@click.option(
    "--engine",
    type=click.Choice(SERVED),
    default=DEFAULT,
    show_default=True,
    help="Which worker to answer as for HealthCheck/GetModelInfo/GetServerInfo.",
)
@click.option(
    "--reader",
    type=click.Choice(["view", "copy"]),
    default="view",
    show_default=True,
    help="view: zero-copy mmap; copy: pread into a buffer, as SMG's servicer does today.",
)
@click.option(
    "--keep-segments", is_flag=True, help="Do not unlink after reading (like TOKENSPEED_UNLINK_MM_SHM_AFTER_READ=0)."
)
@click.option("--advertise-namespace-id", metavar="ID", help="Advertise this id instead of this host's (demos, tests).")
@click.option("--max-message-bytes", type=BYTES, default="256MiB", show_default=True, help="gRPC message limit.")
@click.option("--workers", type=click.IntRange(1, 256), default=8, show_default=True, help="RPC worker threads.")
@click.option(
    "--model-dir",
    metavar="DIR",
    shell_complete=complete_dirs,
    help="Serve this weight-less Qwen2-VL model directory (written when missing; pass the same DIR to "
    "`smg launch --model-path`), so a real gateway sends real image tensors in Generate.",
)
@click.option(
    "--worker-processing",
    is_flag=True,
    help="Accept media refs from a gateway run with --mm-processing worker (vLLM only): advertise a "
    "worker-side processor and make --model-dir a weight-less MiniMax-M3 directory, the family SMG lets "
    "a worker expand. The gateway then sends no tensors.",
)
@click.option(
    "--log-receipts",
    metavar="FILE|-",
    shell_complete=complete_files,
    help="Append one JSON line per Generate tensor receipt to FILE (- for stdout).",
)
@click.option(
    "--any-name",
    is_flag=True,
    help="Read (and unlink) handles of any name, as SMG's reader does. By default only SMG's family (smg-*) "
    "is read; anything else is refused unread and kept.",
)
@click.option(
    "--fault",
    type=click.Choice(list(FAULTS)),
    help="Fail every Generate on purpose, as the gateway's failure classes: die-before-read (the process is "
    "SIGKILLed before any response header), die-after-headers (after sending headers, before reading), "
    "die-after-read (after reading and unlinking every tensor), slow-read (wait --fault-delay, then read; "
    "Diagnostics Receive waits too).",
)
@click.option(
    "--fault-delay",
    type=DURATION,
    default="2s",
    show_default=True,
    help="slow-read: how long each Generate (and Diagnostics Receive) waits before reading (at most 60s).",
)
@shm_dir_option
@click.pass_obj
def serve(
    app: App,
    listen: str,
    engine: str,
    reader: ReaderMode,
    keep_segments: bool,
    advertise_namespace_id: str | None,
    max_message_bytes: int,
    workers: int,
    model_dir: str | None,
    worker_processing: bool,
    log_receipts: str | None,
    any_name: bool,
    fault: str | None,
    fault_delay: float,
    shm_dir: str,
) -> None:
    """Run the reference receiver that `send`, `bench` and `probe --verify` talk to.

    It answers as a vLLM worker (or TokenSpeed/SGLang with --engine) for the RPCs
    SMG's gateway calls at registration, advertising this host's shm_namespace_id;
    serves grpc.health.v1 and reflection (v1 and v1alpha); and serves smgshm's
    Diagnostics service, which reads every tensor exactly as SMG's servicer does
    (refusing symlinks, FIFOs and short segments without hanging) and returns a
    receipt per tensor.
    It binds loopback unless told otherwise and stops cleanly on SIGTERM/SIGINT.

    As a stand-in worker behind the real gateway (vLLM or TokenSpeed), it answers
    Generate (a chunk when streaming, then a complete), GetLoads and Abort, and
    GetModelInfo from --model-dir. Every tensor of a Generate is read through the
    same reader and gets a receipt (key, payload kind, segment, dtype, shape,
    bytes, digest, read time, unlinked, age since the gateway wrote it), kept in a
    bounded ring served by the Diagnostics RPCs Receipts and WatchReceipts.

    \b
    Examples:
      smgshm serve
      smgshm serve --listen 0.0.0.0:50051  # other hosts reach it: said loudly
      smg launch --worker-urls grpc://127.0.0.1:50051 \\
          --multimodal-tensor-transport auto
      smgshm serve --model-dir ~/.cache/smgshm/model-qwen2vl-tiny --log-receipts -
      smg launch --worker-urls grpc://127.0.0.1:50051 \\
          --model-path ~/.cache/smgshm/model-qwen2vl-tiny \\
          --multimodal-tensor-transport shm
    """
    require(Extra.WORKER, "smgshm serve")  # before anything runs: exit 2 naming the extra it needs
    from smgshm.core.address import is_loopback
    from smgshm.core.receiver.fds import MAX_CONNECTIONS, FdPressure, connection_cap, raise_fd_limit
    from smgshm.core.receiver.reader import MODEL_NAME, ReceiverConfig
    from smgshm.core.receiver.services import start_receiver

    if not 0 <= fault_delay <= MAX_FAULT_DELAY_S:
        raise click.BadParameter(f"at most {MAX_FAULT_DELAY_S:g}s", param_hint="--fault-delay")
    if worker_processing and engine != "vllm":
        raise click.BadParameter("only a vllm worker takes media refs", param_hint="--worker-processing")
    stop, stdout_gone = threading.Event(), threading.Event()

    def receipts_reader_left() -> None:
        stdout_gone.set()
        stop.set()

    cfg = ReceiverConfig(
        shm_dir=shm_dir,
        unlink_after_read=not keep_segments,
        reader=reader,
        engine=engine,
        namespace_id=advertise_namespace_id,
        max_message_bytes=max_message_bytes,
        workers=workers,
        model_dir=model_dir,
        worker_processing=worker_processing,
        on_receipt=view.receipt_logger(log_receipts, receipts_reader_left) if log_receipts else None,
        fault=fault,
        fault_delay_s=fault_delay,
        any_name=any_name,
    )
    if any_name:
        app.warn(f"--any-name: whoever reaches {listen} can make this process read and delete any file in {shm_dir}")
    if not is_loopback(listen):
        app.warn(f"listening on {listen}: NOT loopback; any host that reaches it can send tensors to it")
    soft, hard = raise_fd_limit()
    if connection_cap(soft) < MAX_CONNECTIONS:
        app.warn(
            f"only {soft} file descriptors (ulimit -n; hard limit {hard}): at most {connection_cap(soft)} "
            "connections at once"
        )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    running = start_receiver(cfg, listen)
    info = {
        "address": running.address,
        "engine": engine,
        "engine_service": running.engine_service,
        "namespace_id": cfg.advertised_namespace_id(),
        "reader": reader,
        "unlink_after_read": cfg.unlink_after_read,
        "shm_dir": shm_dir,
        "pid": running.state.identity().pid,
        "model_dir": running.state.model.path if running.state.model else None,
        "served_model_name": running.state.model.served_model_name if running.state.model else MODEL_NAME,
        "log_receipts": log_receipts,
        "fault": fault,
    }
    app.emit(info, view.serve_ready)
    pressure = FdPressure()
    while not stop.wait(FD_CHECK_S):
        if said := pressure.check():
            app.warn(said)
    app.info("smgshm serve: stopping")
    running.stop(STOP_GRACE_S)
    code = ExitCode.CLOSED_PIPE if stdout_gone.is_set() else ExitCode.OK  # the receipts' reader left
    if signals.PROCESS_ENTRY:  # os._exit: interpreter teardown (torch's, gRPC's) takes 2-3 s, past the promise above
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    click.get_current_context().exit(code)
