"""Human renderers: one per result type. Remote and user strings are never markup."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.core.host import HostIdentity
    from smgshm.core.namespace import NamespaceComparison


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _kv_table(rows: list[tuple[str, Any]]) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, Text(str(v)))
    return table


def identity(app: App, ident: HostIdentity) -> None:
    verdict = ident.namespace_id or "(unreadable: auto will stay inline)"
    app.console.print(Text("shm_namespace_id: ", style="bold") + Text(verdict))
    used = ident.shm_total_bytes - ident.shm_free_bytes
    app.console.print(
        _kv_table(
            [
                ("boot_id", ident.boot_id),
                ("shm dir", f"{ident.shm_dir} (st_dev {ident.shm_dev}, {ident.fstype or '?'})"),
                (
                    "size",
                    f"{human_bytes(ident.shm_total_bytes)}, {human_bytes(used)} used, "
                    f"{human_bytes(ident.shm_free_bytes)} free",
                ),
                ("mount options", ident.mount_options or "?"),
                ("pid", f"{ident.pid} ({ident.pid_namespace or 'pid namespace unknown'})"),
                ("uid/gid", f"{ident.uid}/{ident.gid}"),
                ("hostname", ident.hostname),
            ]
        )
    )


def comparison(app: App, cmp: NamespaceComparison) -> None:
    style = "green" if cmp.shared else "red"
    head = "shared" if cmp.shared else f"not shared ({cmp.sharing.value})"
    if cmp.sharing.value == "undetermined":
        head, style = "undetermined", "yellow"
    app.console.print(Text(f"/dev/shm {head}: ", style=f"bold {style}") + Text(cmp.reason))  # noqa: S108 - prose, not a path
    app.console.print(_kv_table([("a", cmp.peer or "(empty)"), ("b", cmp.local or "(empty)")]))
    fix = sharing_fix(cmp.sharing.value)
    if fix and not app.quiet:
        app.err_console.print(Text("hint: ", style="cyan") + Text(fix))


def sharing_fix(sharing: str) -> str:
    """The fix an operator can paste, per verdict."""
    return {
        "other_host": "SHM needs gateway and worker on one host; keep --multimodal-tensor-transport inline "
        "(or auto) for remote workers.",
        "private_tmpfs": "share one tmpfs: docker --ipc=host or --ipc=container:<gateway>, a shared volume at "
        "/dev/shm, or a Kubernetes emptyDir {medium: Memory} mounted at /dev/shm in both containers.",
        "spelling": "advertise the id exactly as `smgshm ns` prints it (or as SMG's servicer computes it).",
        "undetermined": "the worker must advertise shm_namespace_id (vLLM field 10, TokenSpeed scheduler_info); "
        "SGLang, TRT-LLM and MLX never do and always get inline.",
    }.get(sharing, "")


def serve_ready(app: App, info: dict[str, Any]) -> None:
    line = (
        f"smgshm serve: ready on {info['address']} as a {info['engine']} worker "
        f"(namespace {info['namespace_id'] or 'unreadable'}, reader {info['reader']}, "
        f"unlink after read {'on' if info['unlink_after_read'] else 'off'})"
    )
    app.console.print(Text(line))


def probe_report(app: App, report: Any) -> None:
    from rich.table import Table

    shared = [w for w in report.workers if w.verdict == "shared"]
    n = len(report.workers)
    if len(shared) == n:
        head, style = f"SHM usable: /dev/shm is shared with {'the worker' if n == 1 else f'all {n} workers'}", "green"
    else:
        head, style = f"SHM not usable for {n - len(shared)} of {n} worker(s)", "red"
    app.console.print(Text(head, style=f"bold {style}"))
    table = Table(show_lines=False)
    labelled = any(w.gateway_label is not None for w in report.workers)
    for col in ("worker", "engine", "health", "verdict", "auto", *(("gw label",) if labelled else ())):
        table.add_column(col, no_wrap=True)
    for w in report.workers:
        health = "-"
        if w.health is not None:
            ok = w.health.engine_healthy is not False and w.health.grpc_health == "SERVING"
            health = "ok" if ok else f"{'healthy' if w.health.engine_healthy else 'unhealthy'}/{w.health.grpc_health}"
        auto = w.decisions["auto"].path if w.decisions else "-"
        label = () if not labelled else (("same" if w.gateway_label == w.namespace_id else w.gateway_label or "-"),)
        table.add_row(Text(w.address), w.engine or "-", health, w.verdict, auto, *label)
    app.console.print(table)
    for w in report.workers:
        why = w.reason + (f"; verify: {w.verify.message}" if w.verify is not None else "")
        auto = f"; under auto the gateway sends {w.decisions['auto'].path}" if w.decisions else ""
        app.console.print(Text(f"{w.address}: ", style="bold") + Text(why + auto))
    if app.quiet:
        return
    for w in report.workers:
        fix = sharing_fix(w.verdict)
        if w.verdict == "unreachable":
            fix = "check the address and that the worker's gRPC server is up (--connect-timeout to wait longer)"
        if w.verdict == "uid_mismatch":
            fix = "run the gateway and the worker as the same uid (segments are created 0600)"
        if fix:
            app.err_console.print(Text("hint: ", style="cyan") + Text(f"{w.address}: {fix}"))


def send_report(app: App, report: Any) -> None:
    from rich.table import Table

    n = sum(p.requests for p in report.paths)
    if report.ok:
        what = "verified" if report.verified else "sent (not verified: --no-verify)"
        app.console.print(Text(f"OK: {n} request(s) {what}, no segment left behind", style="bold green"))
    elif report.unreachable:
        app.console.print(Text(f"FAILED: the receiver at {report.address} became unreachable", style="bold red"))
    else:
        app.console.print(Text(f"FAILED: {len(report.problems)} problem(s) in {n} request(s)", style="bold red"))
    table = Table()
    cols = ("path", "req", "tensors", "bytes", "fail", "wrong", "left", "p50 ms", "p90 ms", "p99 ms", "GB/s")
    for col in cols:
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=True, min_width=len(col))
    table.box = None  # the widest report still fits 80 columns
    for p in report.paths:
        table.add_row(
            p.path,
            str(p.requests),
            str(p.tensors),
            human_bytes(p.nbytes),
            str(p.failures),
            str(p.mismatches),
            str(p.leftovers),
            f"{p.p50_ms:.2f}",
            f"{p.p90_ms:.2f}",
            f"{p.p99_ms:.2f}",
            f"{p.gb_per_s:.2f}",
        )
    app.console.print(table)
    for prob in report.problems[:10]:
        app.console.print(Text(f"request {prob.request} {prob.key}: {prob.kind}: {prob.message}"))
    if len(report.problems) > 10:
        app.console.print(Text(f"... and {len(report.problems) - 10} more (see --json)"))
    if app.quiet:
        return
    kinds = {p.kind for p in report.problems}
    msgs = " ".join(p.message for p in report.problems)
    if "permission" in msgs:
        uid = report.receiver_uid
        fix = f"the receiver runs as uid {uid}; segments are 0600 and owned by this process's uid"
        app.err_console.print(Text("hint: ", style="cyan") + Text(fix))
    if "leftover" in kinds and not report.receiver_unlinks:
        app.err_console.print(
            Text("hint: ", style="cyan")
            + Text(
                "the receiver keeps segments (unlink after read is off); SMG's gateway relies on the worker to unlink "
                "after reading, so every SHM tensor would leak"
            )
        )


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


_STATE_STYLE = {"leaked": "red", "hazard": "magenta", "stale": "yellow", "held": "cyan", "in_flight": "green"}


def gc_report(app: App, report: Any) -> None:
    from rich.table import Table

    c = report.counts
    deleted = [d for d in report.deleted if d.deleted]
    head = f"{len(report.segments)} SMG segment(s) in {report.shm_dir}: "
    head += ", ".join(f"{n} {k}" for k, n in c.items() if n) or "none"
    now = report.remaining_counts
    style = "bold red" if now["leaked"] or now["hazard"] else "bold green"
    app.console.print(Text(head, style=style))
    if report.segments:
        table = Table(box=None)
        table.add_column("name", overflow="fold")
        for col in ("kind", "size", "age", "pid", "state"):
            table.add_column(col, no_wrap=True)
        for s in report.segments:
            mark = {True: "", False: " (dead)", None: ""}[s.producer_alive]
            pid = "-" if s.producer_pid is None else f"{s.producer_pid}{mark}"
            state = Text(s.state.value, style=_STATE_STYLE.get(s.state.value, ""))
            table.add_row(Text(s.name), s.kind, human_bytes(s.allocated_bytes), human_age(s.age_s), pid, state)
        app.console.print(table)
        for s in report.segments:
            if s.state.value in ("leaked", "hazard", "stale", "unknown", "held"):
                app.console.print(Text(f"{s.name}: ", style="bold") + Text(s.reason))
    app.console.print(
        Text(
            f"reclaimable {human_bytes(report.reclaimable_bytes)}; {report.shm_dir} "
            f"{human_bytes(report.shm_used_bytes)} used of {human_bytes(report.shm_total_bytes)}, "
            f"{human_bytes(report.shm_free_bytes)} free"
        )
    )
    if deleted:
        app.console.print(Text(f"deleted {len(deleted)}, freed {human_bytes(sum(d.nbytes for d in deleted))}"))
    if not app.quiet and c["leaked"] and not report.deleted:
        app.err_console.print(Text("hint: ", style="cyan") + Text("reap them with: smgshm gc --delete"))


def gc_watch_line(app: App, report: Any, growth: dict[str, int] | None) -> None:
    if app.json:
        return
    parts = [f"{k} {n}" + (f" ({growth[k]:+d})" if growth and growth.get(k) else "") for k, n in report.counts.items()]
    stamp = time.strftime("%H:%M:%S")
    app.console.print(Text(f"{stamp} {len(report.segments)} segments: " + ", ".join(parts)))


def write_prometheus(report: Any, path: str) -> None:
    """node_exporter textfile format, written atomically by prometheus_client."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    count = Gauge("smgshm_segments", "SMG segments in the shm dir, by state", ["shm_dir", "state"], registry=reg)
    size = Gauge(
        "smgshm_segment_bytes", "Allocated bytes of SMG segments, by state", ["shm_dir", "state"], registry=reg
    )
    free = Gauge("smgshm_shm_free_bytes", "Free bytes in the shm dir", ["shm_dir"], registry=reg)
    for state, n in report.remaining_counts.items():  # what is there now, after any --delete
        count.labels(report.shm_dir, state).set(n)
        size.labels(report.shm_dir, state).set(report.remaining_bytes_by_state[state])
    free.labels(report.shm_dir).set(report.shm_free_bytes)
    write_to_textfile(path, reg)


_MARK = {"ok": ("ok  ", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red"), "skip": ("skip", "dim")}


def doctor_check(app: App, check: Any) -> None:
    """One line per check as it finishes, then its fix on the next line."""
    mark, style = _MARK.get(check.status, (check.status, ""))
    app.console.print(Text(f"[{mark}] ", style=style) + Text(f"{check.name}: ", style="bold") + Text(check.summary))
    if check.fix and check.status in ("fail", "warn"):
        app.console.print(Text("       fix: ", style="cyan") + Text(check.fix))


def bench_progress(app: App) -> tuple[Any, Any]:
    """(progress(done, total), on_size(result)) callbacks: a rich bar on a TTY stderr only."""
    if app.json or app.quiet or not app.err_console.is_terminal:
        return (lambda done, total: None), (lambda r: None)
    from rich.progress import Progress

    bar = Progress(console=app.err_console, transient=True)
    task = bar.add_task("bench", total=None)
    bar.start()

    def progress(done: int, total: int) -> None:
        if done < 0:
            bar.stop()
            return
        bar.update(task, completed=done, total=total)

    def on_size(r: Any) -> None:
        bar.console.print(
            Text(
                f"{human_bytes(r.nbytes)}: shm {r.shm.p50_ms:.2f} ms"
                + (f", inline {r.inline.p50_ms:.2f} ms" if r.inline else "")
            )
        )

    return progress, on_size


def bench_report(app: App, report: Any) -> None:
    from rich.table import Table

    h = report.host
    app.console.print(Text(report.recommendation, style="bold"))
    table = Table(box=None, pad_edge=False)  # fits 80 columns, the width of a pipe
    for col in ("size", "inline ms", "shm ms", "x", "in GB/s", "shm GB/s", "w/rpc/r ms", "memcpy"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for r in report.sizes:
        inl = r.inline
        table.add_row(
            human_bytes(r.nbytes),
            f"{inl.p50_ms:.2f}" if inl else "n/a",
            f"{r.shm.p50_ms:.2f}",
            f"{r.speedup:.1f}x" if r.speedup else "-",
            f"{inl.gb_per_s:.2f}" if inl else "n/a",
            f"{r.shm.gb_per_s:.2f}",
            "/".join(f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" for ms in (r.shm_write_ms, r.shm_rpc_ms, r.shm_read_ms)),
            f"{r.shm_fraction_of_memcpy:.0%}",
        )
    app.console.print(table)
    app.console.print(
        Text(
            f"host: {h.cpu_count} cpus; memcpy {h.memcpy_gb_per_s:.1f} GB/s; "
            f"fresh tmpfs pages {h.fresh_page_gb_per_s:.2f} GB/s; "
            f"writers: pwrite {h.writer_pwrite_gb_per_s:.2f}, fallocate+mmap {h.writer_mmap_gb_per_s:.2f} GB/s "
            f"(GB = 1e9 B; medians)"
        )
    )
    top = max([r.shm.gb_per_s for r in report.sizes] + [r.inline.gb_per_s for r in report.sizes if r.inline] + [1e-9])
    app.console.print(Text("GB/s by size (# shm, = inline):"))
    for r in report.sizes:
        s = int(30 * r.shm.gb_per_s / top)
        i = int(30 * r.inline.gb_per_s / top) if r.inline else 0
        app.console.print(Text(f"{human_bytes(r.nbytes):>10} shm    {'#' * s} {r.shm.gb_per_s:.2f}"))
        app.console.print(
            Text(f"{'':>10} inline {'=' * i} {r.inline.gb_per_s:.2f}" if r.inline else f"{'':>10} inline n/a")
        )


@contextlib.contextmanager
def scan_progress(app: App) -> Iterator[Callable[[int, int], None] | None]:
    """A transient progress bar for a large scan, on a TTY stderr only (never with --json/--quiet)."""
    if app.json or app.quiet or not app.err_console.is_terminal:
        yield None
        return
    from rich.progress import Progress

    with Progress(console=app.err_console, transient=True) as bar:
        task = bar.add_task("scanning", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
