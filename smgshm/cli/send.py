"""``smgshm send``: push real test tensors and verify every byte and every cleanup."""

from __future__ import annotations

import math

import click

from smgshm.cli import send_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.extras import Extra, require
from smgshm.cli.params import BYTES, DURATION, RenamedOption, shm_dir_option, worker_addresses
from smgshm.cli.signals import stop_on_signals
from smgshm.core.engines import DEFAULT, SHM_ENGINES
from smgshm.core.units import human_size


def _shape(text: str | None, size: int | None, dtype: str, tensors: int, concurrency: int) -> tuple[int, ...]:
    """The tensor shape, refused before any allocation when SMG could not carry it or this run could not hold it."""
    from smgshm.core.client.send import MAX_SENDER_BYTES, MAX_TENSOR_BYTES
    from smgshm.core.transport.tensors import ITEMSIZE

    if text and size is not None:
        raise click.UsageError("--shape and --size are exclusive")
    hint = "--size" if size is not None else "--shape"
    if size is not None:
        if size % ITEMSIZE[dtype]:
            raise click.BadParameter(f"{size} is not a multiple of {dtype}'s item size", param_hint=hint)
        shape: tuple[int, ...] = (size // ITEMSIZE[dtype],)
    else:
        words = (text or "1024x1024").lower().replace(",", "x").split("x")
        if not all(w.isascii() and w.isdigit() for w in words):  # "3x-1" as "3xfoo": not a shape
            raise click.BadParameter(f"{text!r} is not a shape like 3x224x224", param_hint=hint)
        shape = tuple(int(w) for w in words)
    nbytes = math.prod(shape) * ITEMSIZE[dtype]
    if nbytes > MAX_TENSOR_BYTES:
        raise click.BadParameter(
            f"{human_size(nbytes)} per tensor is over the {human_size(MAX_TENSOR_BYTES)} a tensor may have",
            param_hint=hint,
        )
    if any(d > 2**32 - 1 for d in shape):
        raise click.BadParameter("a dimension over 2^32-1 (SMG's shape is repeated uint32)", param_hint=hint)
    if nbytes * tensors * concurrency > MAX_SENDER_BYTES:
        raise click.BadParameter(
            f"{tensors} tensor(s) x {concurrency} in flight x {human_size(nbytes)} is over the "
            f"{human_size(MAX_SENDER_BYTES)} this sender holds at once; send fewer or smaller tensors",
            param_hint=hint,
        )
    return shape


@click.command()
@click.argument("address", callback=worker_addresses)
@click.option(
    "--transport",
    type=click.Choice(["inline", "shm", "auto"]),
    default="shm",
    show_default=True,
    help="SMG's rule: shm/auto use SHM for tensors >= --shm-min-bytes (auto: only when ids match).",
)
@click.option(
    "--layout",
    type=click.Choice(SHM_ENGINES),
    default=DEFAULT,
    show_default=True,
    help="Which engine's MultimodalInputs carries the tensors.",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16", "uint8", "int64", "uint32"]),
    default="float32",
    show_default=True,
)
@click.option("--shape", help="Tensor shape, e.g. 3x224x224 (default 1024x1024); at most 4 GiB a tensor.")
@click.option("--size", type=BYTES, help="Instead of --shape: a 1-D tensor of this many bytes, e.g. 16MiB.")
@click.option(
    "--tensors",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Tensors per request: pixel values plus model-specific ones.",
)
@click.option(
    "-n",
    "--requests",
    "count",
    cls=RenamedOption,
    former=("--count",),
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Requests (formerly --count).",
)
@click.option("--duration", type=DURATION, help="A soak: keep sending for this long instead of -n requests.")
@click.option("-c", "--concurrency", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Tensors are reproducible from the seed.")
@click.option("--shm-min-bytes", type=BYTES, default="64KiB", show_default=True)
@click.option("--verify/--no-verify", default=True, show_default=True, help="Compare digests and check cleanup.")
@click.option("--timeout", type=DURATION, default="30s", show_default=True, help="Per request.")
@click.option("--connect-timeout", type=DURATION, default="5s", show_default=True)
@shm_dir_option
@click.pass_obj
def send(
    app: App,
    address: str,
    transport: str,
    layout: str,
    dtype: str,
    shape: str | None,
    size: int | None,
    tensors: int,
    count: int,
    duration: float | None,
    concurrency: int,
    seed: int,
    shm_min_bytes: int,
    verify: bool,
    timeout: float,
    connect_timeout: float,
    shm_dir: str,
) -> None:
    """Send test tensors to a smgshm receiver and verify every byte and every cleanup.

    Run `smgshm serve` where the worker runs (in its container) and send from
    where the gateway runs. Each request carries real vLLM or TokenSpeed
    MultimodalInputs; the receiver reads them as SMG's servicer does and returns
    a digest per tensor. By default every digest is compared, and every segment
    must be gone after the receiver answered; a segment the receiver kept is
    removed by the sender and reported. On a failed request the sender unlinks
    every segment it created for it.

    Ctrl-C, SIGTERM and SIGHUP stop it within a second: requests in flight are
    cancelled, every segment it created is unlinked, and the report of what was
    done is printed.

    Exit 0 when all verified, 1 when a request is refused before sending (an
    inline request over the receiver's message limit), 2 on bad arguments, 3 on
    a mismatch, a receiver error or a leftover segment, 4 when the receiver is
    unreachable, 5 when /dev/shm here is too small, full or not writable, 130/143/129 when
    stopped by SIGINT/SIGTERM/SIGHUP.

    \b
    Examples:
      smgshm send 127.0.0.1:50051
      smgshm send --transport inline --dtype bfloat16 --shape 3x448x448 \\
          -n 20 -c 4 127.0.0.1:50051
      smgshm send --layout tokenspeed --size 64MiB --tensors 3 worker:50051
      smgshm send --duration 10m -c 8 --size 4MiB 127.0.0.1:50051       # a soak
    """
    require(Extra.WORKER, "smgshm send")  # before anything runs: exit 2 naming the extra it needs
    from smgshm.core.client.send import SendOptions
    from smgshm.core.client.send import send as run_send
    from smgshm.core.gateway.setting import Mode
    from smgshm.core.transport.wire import Layout

    opts = SendOptions(
        Layout(layout),
        Mode(transport),
        dtype,
        _shape(shape, size, dtype, tensors, concurrency),
        tensors,
        count,
        concurrency,
        seed,
        shm_min_bytes,
        verify,
        timeout,
        connect_timeout,
        shm_dir,
        duration=duration,
    )
    progress, done = view.send_progress(app, opts)
    try:
        with stop_on_signals() as stop:
            report = run_send(address, opts, stop.event, progress)
    finally:
        done()
    code = ExitCode.UNREACHABLE if report.unreachable else ExitCode.OK if report.ok else ExitCode.CHECK_FAILED
    if stop.exit_code is not None:
        code = stop.exit_code
    click.get_current_context().exit(app.emit(report, view.send_report(stop.name), code))
