"""``smgshm bench``: what SHM is worth here, and the shm_min_bytes to set."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.text import Text

from smgshm.cli import bench_view as view
from smgshm.cli import jsonout
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.extras import Extra, require
from smgshm.cli.fmt import safe
from smgshm.cli.params import BYTES, RenamedOption, shm_dir_option, worker_addresses
from smgshm.cli.signals import stop_on_signals
from smgshm.core.units import human_gb_per_s, human_size, parse_size

if TYPE_CHECKING:
    from smgshm.core.client.bench import BenchReport
    from smgshm.core.segments.io import ReaderMode


def _sizes(lo: int, hi: int, factor: int, explicit: str | None) -> tuple[int, ...]:
    if explicit:
        try:
            return tuple(parse_size(s) for s in explicit.split(","))
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--sizes") from None
    if lo <= 0 or hi < lo or factor < 2:
        raise click.UsageError("need 0 < --min <= --max and --factor >= 2")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return tuple(out)


@click.command()
@click.argument("address", required=False, callback=worker_addresses)
@click.option("--min", "min_", type=BYTES, default="4KiB", show_default=True, help="Smallest size of the sweep.")
@click.option(
    "--max",
    "max_",
    type=BYTES,
    default="256MiB",
    show_default=True,
    help="Largest size of the sweep (inline is n/a where a payload exceeds the 256 MiB message limit).",
)
@click.option("--factor", type=click.IntRange(2), default=4, show_default=True)
@click.option("--sizes", help="Instead of the sweep: a comma list, e.g. 1MiB,16MiB,64MiB.")
@click.option(
    "--warmup",
    type=click.IntRange(0),
    default=2,
    show_default=True,
    help="Unmeasured requests per size and transport first.",
)
@click.option(
    "-n",
    "--requests",
    "iterations",
    cls=RenamedOption,
    former=("--iterations",),
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="Measured requests per size and transport (--what-if: rounds per size); formerly --iterations.",
)
@click.option("--verify/--no-verify", default=True, show_default=True, help="Digest-check every payload.")
@click.option(
    "--reader",
    type=click.Choice(["view", "copy"]),
    default="view",
    show_default=True,
    help="The embedded receiver's read: zero-copy mmap, or SMG's pread copy.",
)
@click.option("--jsonl", is_flag=True, help="One JSON record per size as it finishes (stdout).")
@click.option(
    "--min-shm-speedup",
    type=float,
    help="Exit 3 unless SHM is this many times faster at the largest size both transports ran.",
)
@click.option("--min-gbps", type=float, help="Exit 3 unless SHM reaches this many GB/s at the largest size.")
@click.option(
    "--what-if",
    "what_if",
    type=click.Choice(["huge-pages"]),
    help="Instead: SMG's SHM path on a private huge=within_size tmpfs beside the shm dir (root only).",
)
@shm_dir_option
@click.pass_obj
def bench(
    app: App,
    address: str | None,
    min_: int,
    max_: int,
    factor: int,
    sizes: str | None,
    warmup: int,
    iterations: int,
    verify: bool,
    reader: ReaderMode,
    jsonl: bool,
    min_shm_speedup: float | None,
    min_gbps: float | None,
    what_if: str | None,
    shm_dir: str,
) -> None:
    """Time inline against SHM across sizes, find the crossover, recommend shm_min_bytes.

    Without ADDRESS it starts the reference receiver in-process on loopback (the
    embedded default). Both transports run on the same payloads in alternation;
    the SHM path is split into write, RPC and read; and the same run measures
    this host's memcpy bandwidth and fresh-page floor, so every SHM figure is seen
    against the physical limit. GB is 1e9 bytes. Figures are medians: these
    machines are noisy, so compare ratios, not absolutes.

    --what-if huge-pages (root only; otherwise exit 5 with the reason) mounts a
    private tmpfs with huge=within_size in a private mount namespace (so no exit
    path can leave the mount behind; the host's mounts are never changed) and
    times there, beside the shm dir, on the same payloads: SMG's writer
    (fallocate+mmap), smgshm's (pwrite), SMG's reader (pread), the zero-copy
    reader, the unlink, and SMG's whole path; each pair with its ratio. Sizes
    default to a 448x448 image's pixel_values, 16 MiB and 64 MiB; --sizes and -n
    apply. doctor quotes the last result. Ctrl-C, SIGTERM or SIGHUP stop it
    cleanly (exit 130, 143, 129): the child is ended, its segments and scratch
    dir removed.

    \b
    Examples:
      smgshm bench
      smgshm bench --sizes 1MiB,16MiB,64MiB -n 20 --reader copy
      smgshm bench worker:50051 --min-shm-speedup 4 --json     # a CI gate
      sudo smgshm bench --what-if huge-pages -n 5
    """
    if what_if:
        _what_if(app, what_if, _sizes(min_, max_, factor, sizes) if sizes else None, iterations, shm_dir)
    require(Extra.WORKER, "smgshm bench")  # exit 2 naming the extra (--what-if times the shm dir alone)
    from smgshm.core.client.bench import BenchOptions, run_bench

    opts = BenchOptions(_sizes(min_, max_, factor, sizes), warmup, iterations, verify, shm_dir)
    embedded = None
    if address is None:
        from smgshm.core.receiver.reader import ReceiverConfig
        from smgshm.core.receiver.services import start_receiver

        embedded = start_receiver(ReceiverConfig(shm_dir=shm_dir, reader=reader), "127.0.0.1:0")
        address = embedded.address
    progress, on_size = view.bench_progress(app)

    def emit_line(r: object) -> None:
        if jsonl:
            jsonout.write_line(jsonout.plain(r))
        on_size(r)

    try:
        report = run_bench(address, opts, reader if embedded else "", progress, emit_line)
    finally:
        if embedded is not None:
            embedded.stop(0)
        progress(-1, -1)
    from smgshm.core.host.capacity import record_tensor_seen

    # doctor's capacity check quotes the largest tensor bench moved through this shm dir.
    record_tensor_seen("smgshm bench", max(s.nbytes for s in report.sizes), shm_dir)
    code = ExitCode.OK
    failed_gates = _failed_gates(report, min_shm_speedup, min_gbps)
    if failed_gates:
        code = ExitCode.CHECK_FAILED
        # JSON keeps them in "warnings" as before (schema 1); a person sees a failure, first.
        app.warnings.extend(failed_gates)
        if jsonl:
            for g in failed_gates:
                app.err_console.print(Text("FAILED: ", style="bold red") + safe(g))
    if jsonl:
        click.get_current_context().exit(code)
    click.get_current_context().exit(app.emit(report, view.bench_report(failed_gates), code))


def _what_if(app: App, what_if: str, sizes: tuple[int, ...] | None, iterations: int, shm_dir: str) -> None:
    """bench --what-if: the run in a private tmpfs beside the shm dir, then exit (never returns)."""
    from smgshm.core.client.whatif import DEFAULT_SIZES, run_what_if

    chosen = sizes or DEFAULT_SIZES
    app.info(f"what-if {what_if}: {len(chosen)} sizes x {iterations} rounds in each dir")
    with stop_on_signals() as stop:  # SIGTERM/SIGHUP unwind like Ctrl-C: child ended, scratch removed
        report = run_what_if(chosen, iterations, shm_dir, stop=stop.event)
    if report is None:
        msg = f"what-if stopped by {stop.name}: nothing measured; its child, segments and scratch dir are gone"
        if app.json:
            jsonout.write_error(app, "interrupted", msg, None)
        elif not app.quiet:
            click.echo(msg, err=True)
        click.get_current_context().exit(stop.exit_code or ExitCode.INTERRUPTED)
    click.get_current_context().exit(app.emit(report, view.what_if_report))


def _failed_gates(report: BenchReport, min_shm_speedup: float | None, min_gbps: float | None) -> list[str]:
    """The CI gates (--min-shm-speedup, --min-gbps) the run did not pass, each in a sentence."""
    failed_gates: list[str] = []
    last = max(report.sizes, key=lambda s: s.nbytes)
    both = max((s for s in report.sizes if s.speedup is not None), key=lambda s: s.nbytes, default=None)
    if min_shm_speedup is not None and (both is None or both.speedup is None or both.speedup < min_shm_speedup):
        at = (
            f"{both.speedup:.2f}x at {human_size(both.nbytes)} ({both.nbytes} B)"
            if both
            else "not measurable (inline ran at no size)"
        )
        failed_gates.append(f"SHM speedup {at} is below --min-shm-speedup {min_shm_speedup}")
    if min_gbps is not None and last.shm.gb_per_s < min_gbps:
        failed_gates.append(
            f"SHM {last.shm.gb_per_s:.2f} GB/s ({human_gb_per_s(last.shm.gb_per_s)}) at "
            f"{human_size(last.nbytes)} ({last.nbytes} B) is below --min-gbps {min_gbps} (GB = 1e9 B)"
        )
    return failed_gates
