"""Human output of ``smgshm e2e``: a verdict per gateway, its evidence by source, the latencies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from smgshm.cli.fmt import cause_fix, fit_table, fix_line, prose, safe
from smgshm.core.stats import median
from smgshm.core.units import human_gb_per_s, human_ms, human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App

_STYLE = {"shm": "bold green", "inline": "bold yellow", "none": "bold", "undetermined": "bold red"}


@contextmanager
def request_progress(app: App) -> Iterator[Callable[[str, int, int, Any], None]]:
    """Requests as they are answered: a bar on a terminal's stderr; piped, a line at the first answer and at
    each quarter (never one per request); nothing under --json or --quiet."""
    if app.json or app.quiet:
        yield lambda *_: None
        return
    if app.err_console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(
            TextColumn("e2e requests"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=app.err_console,
            transient=True,
        )
        task = bar.add_task("e2e", total=None)
        with bar:
            yield lambda _label, done, total, _out: bar.update(task, completed=done, total=total)
        return
    failed = 0
    said: set[int] = set()

    def on_request(_label: str, done: int, total: int, out: Any) -> None:
        nonlocal failed
        failed += 0 if out.ok else 1
        quarter = 4 * done // total  # the first answer (traffic flows), then each quarter: five lines at most
        if quarter not in said and (quarter > 0 or done == 1):
            said.add(quarter)
            app.info(f"requests: {done}/{total} answered, {failed} failed")

    yield on_request


def _metrics_line(m: Any) -> Text:
    head = Text("metrics ", style="bold") + safe(m.url)
    if getattr(m, "owner", ""):  # why these counters are the tested gateway's own
        head += Text(" (") + safe(m.owner) + Text(")")
    head += Text(": ")
    if not m.available:
        return head + safe(m.note or "unavailable")
    # Paths and modes are label values of the peer's /metrics: escaped like any stranger's string.
    parts = [safe(p) + Text(f" {n} ({human_size(m.nbytes.get(p, 0))})") for p, n in sorted(m.tensors.items())]
    out = head + (Text(", ").join(parts) if parts else Text("no tensors"))
    out += Text(f"; shm write failures +{m.shm_write_failures}")
    if m.processing:
        out += Text("; processing ") + Text(", ").join(safe(k) + Text(f" {v}") for k, v in sorted(m.processing.items()))
    return out


def _shm_dir_line(d: Any) -> Text:
    head = Text("shm dir ", style="bold") + safe(d.shm_dir) + Text(": ")
    if not d.available:
        return head + safe(d.note or "unavailable")
    ends: dict[str, int] = {}
    for s in d.segments:
        ends[s.end] = ends.get(s.end, 0) + 1
    body = f"{len(d.segments)} segment(s) of pid {d.gateway_pid}"
    if d.name_pid is not None and d.name_pid != d.gateway_pid:
        body += f" ({d.name_pid} in its pid namespace)"
    if ends:
        body += " (" + ", ".join(f"{k} {v}" for k, v in sorted(ends.items())) + ")"
    consumed = [s.in_flight_ms for s in d.segments if s.end == "consumed"]
    if consumed:
        body += f", consumed in {human_ms(median(consumed, method='higher'))} (median)"
    out = head + Text(body)
    if d.probe_file_left:
        out += Text("; probe file left over: ") + safe(d.probe_file_left)
    return out


def _receipts_line(r: Any) -> Text:
    head = Text("receipts", style="bold") + Text(": ")
    if not r.available:
        return head + safe(r.note or "unavailable")
    kinds: dict[str, int] = {}
    for x in r.receipts:
        kinds[x.payload_kind] = kinds.get(x.payload_kind, 0) + 1
    errors = [x for x in r.receipts if x.error_code]
    # A payload kind is the worker's word (its receipts): escaped.
    body = Text(", ").join(safe(k) + Text(f" {v}") for k, v in sorted(kinds.items())) if kinds else Text("none")
    out = head + body + Text(" from ") + safe(", ".join(r.workers))
    if errors:
        out += Text(f"; {len(errors)} refused (first: ") + safe(f"{errors[0].error_code}: {errors[0].error_message}")
        out += Text(")")
    return out


def _mark(run: Any) -> tuple[str, str]:
    if run.path == "undetermined":
        return "????", "bold red"
    if run.as_expected and not run.failure_class:
        return "ok", "green"
    return "FAIL", "bold red"


def _unreachable(run: Any) -> bool:
    return bool(run.unreachable)


def _why_bad(run: Any) -> str:
    if _unreachable(run):  # a dead worker leads: nothing else said about the run matters until it answers
        return f"{run.label}: {run.cause_info.message} ({run.cause_info.code})"
    code = f" ({run.cause_info.code})" if run.cause_info is not None else ""
    if run.path == "undetermined":
        return f"{run.label} undetermined{code}"
    if run.failure_class:
        return f"{run.label} {run.failure_class}{code}"
    return f"{run.label} not {run.expected}{code}"


def headline(report: Any) -> Text:
    """The verdict line: every run as expected (or which not), and whether anything was left."""
    bad = [r for r in report.runs if _mark(r)[0] != "ok"]
    where = ", ".join(r.label for r in report.runs)
    if not bad:
        text = f"e2e: as expected ({where})"
    else:
        why = [_why_bad(r) for r in bad]
        text = "e2e: FAILED: " + ", ".join(why)
    if report.embedded:
        left = report.removed_at_stop or report.processes_left
        text += "; something was left behind" if left else "; nothing left behind"
    return Text(text, style="bold green" if report.ok and not bad else "bold red")


def e2e_report(app: App, report: Any) -> None:
    prose(app.console, headline(report), 2)
    for run in report.runs:
        _run_block(app, run, report.embedded)
    if len(report.runs) > 1:
        table = Table(box=None, pad_edge=False)
        for col in ("mode", "path", "p50", "requests"):
            table.add_column(col, justify="right" if col != "path" else "left", no_wrap=True)
        for run in report.runs:
            p50 = human_ms(run.p50_ms) if any(r.ok for r in run.requests) else "none ok"  # no latency to show
            table.add_row(run.label, run.path, p50, str(len(run.requests)))
        fit_table(app.console, table)
    img = f"{report.image_size}x{report.image_size} PNG ({human_size(report.image_bytes)})"
    prose(app.console, Text("image: ") + Text(img) + Text(", model ") + safe(report.model), 2)
    if report.embedded:
        if report.removed_at_stop or report.processes_left:
            prose(
                app.console,
                Text(
                    f"left behind: {len(report.removed_at_stop)} segment(s) (removed at stop), "
                    f"{len(report.processes_left)} process(es)",
                    style="bold red",
                ),
                2,
            )
        else:
            prose(app.console, Text("nothing left behind: every gateway and receiver stopped, no segment remains"), 2)


def _run_block(app: App, run: Any, embedded: bool) -> None:
    """One gateway's run: its verdict and cause (with the fix when it failed), its requests, its three accounts."""
    mark, style = _mark(run)
    label = f"mode {run.label}" if embedded else run.label
    head = Text(f"[{mark}] ", style=style) + Text(f"{label}: ", style="bold")
    if _unreachable(run):
        prose(app.console, head + safe(run.cause_info.message), indent=7)
    else:
        if not run.cause.lower().startswith(run.path):
            head += Text(run.path + ": ", style=_STYLE.get(run.path, ""))
        prose(app.console, head + safe(run.cause), indent=7)
    if run.cause_info is not None and mark != "ok":
        fix_line(app, cause_fix(run.cause_info))
    _requests_lines(app, run)
    for line_ in (_metrics_line(run.metrics), _shm_dir_line(run.shm_dir), _receipts_line(run.receipts)):
        prose(app.console, Text("       ") + line_, 9)
    if run.setting_source and not embedded:
        least = "unknown" if run.shm_min_bytes is None else human_size(run.shm_min_bytes)  # never raw bytes
        said = f"mode {run.mode}, shm_min_bytes {least}, dev_writable "
        said += "unknown" if run.dev_writable is None else str(run.dev_writable).lower()
        # The mode is the log's word: escaped with the rest.
        prose(app.console, Text("       setting ", style="bold") + safe(f"{said} ({run.setting_source})"), 9)
    if run.gateway_log:
        prose(app.console, Text("       gateway log: ") + safe(run.gateway_log), 9)


def _requests_lines(app: App, run: Any) -> None:
    """How many requests passed (their p50), the first that failed, and the failure class."""
    ok = sum(1 for r in run.requests if r.ok)
    line = f"       {ok}/{len(run.requests)} requests ok"
    if ok:  # no latency of zero successful requests
        line += f", p50 {human_ms(run.p50_ms)}"
    if run.expected:
        line += f"; expected {run.expected}"
    prose(app.console, Text(line), 9)
    for r in run.requests:
        if not r.ok:
            prose(app.console, Text(f"       HTTP {r.status}: ") + safe(r.error), 9)
            break
    if run.failure:
        prose(app.console, Text("       failure: ", style="bold red") + safe(run.failure), indent=9)


def sweep_report(app: App, report: Any) -> None:
    """One row per image size: latencies side by side, the gateway's write, the worker's read, the floor."""
    prose(
        app.console,
        Text("What SHM is worth through the real gateway (medians; inline and shm in alternation)", style="bold"),
        2,
    )
    table = Table(box=None, pad_edge=False)
    for col in ("px", "pixels", "inline ms", "shm ms", "x", "write ms", "read ms", "floor ms", "prep ms"):
        table.add_column(col, justify="right", no_wrap=True)

    def ms(v: float | None) -> str:  # None: the log or the receipts showed none
        return "not seen" if v is None else f"{v:.1f}" if v < 100 else f"{v:.0f}"

    for r in report.rows:
        table.add_row(
            str(r.image_px),
            human_size(r.pixel_nbytes),
            ms(r.inline_p50_ms) if r.inline_p50_ms else "none ok",
            ms(r.shm_p50_ms) if r.shm_p50_ms else "none ok",
            f"{r.speedup:.2f}x" if r.speedup else "none ok",  # one side had no successful request
            ms(r.shm_write_ms),
            ms(r.worker_read_ms),
            ms(r.floor_ms),
            ms(r.preprocess_ms),
        )
    fit_table(app.console, table)
    legend = (
        f"x = inline/shm; write = the gateway's mm_shm_write; read = the worker's; floor = the pixels at this "
        f"host's fresh-page rate ({human_gb_per_s(report.fresh_page_gb_per_s)}; memcpy "
        f"{human_gb_per_s(report.memcpy_gb_per_s)}); "
        "prep = the gateway's image preprocessing"
    )
    prose(app.console, Text(legend))
