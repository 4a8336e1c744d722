"""Human and JSONL output of ``smgshm watch``: a live dashboard, one line per interval, a summary."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.text import Text

from smgshm.cli.fmt import Trimmed, cause_fix, escape, fit_table, fix_line, kv_table, lossless, prose, safe, width
from smgshm.cli.jsonout import SCHEMA_VERSION, plain, plain_fields, write_line
from smgshm.core.units import human_duration, human_ms, human_rate, human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.core.gateway.rates import GatewayRates
    from smgshm.core.watch.figures import FlightTimes, IntervalStats, Orphan, WatchSummary
    from smgshm.core.watch.follow import SegmentLife, ShmEvent

_STATE_STYLE = {"leaked": "red", "hazard": "magenta", "stale": "yellow", "held": "cyan", "in_flight": "green"}


def flight_text(f: FlightTimes) -> str:
    if not f.count:
        return "none ended"  # said, never a bare "-"
    return f"p50 {human_ms(f.p50_ms)}, p90 {human_ms(f.p90_ms)}, p99 {human_ms(f.p99_ms)}, max {human_ms(f.max_ms)}"


def known(count: int, nbytes: int) -> str:
    """The bytes of ``count`` segments whose sizes are counted once known: '?' while none is (a size is
    known at close-after-write), never a '0 B' that reads as measured."""
    return "?" if count and not nbytes else human_size(nbytes)


def known_rate(per_s: float, bytes_per_s: float) -> str:
    return "?" if per_s and not bytes_per_s else human_rate(bytes_per_s)


def _pid(o: Orphan) -> str:
    if o.producer_pid is None:
        return "none in name"  # said, never a bare "-"
    return f"{o.producer_pid} ({ {True: 'alive', False: 'dead', None: 'unknown'}[o.producer_alive] })"


def gateway_text(gw: GatewayRates | None) -> Text:
    """The gateway's figures, without a prefix (empty when there are none); its strings escaped, once."""
    if gw is None:
        return Text()
    if gw.error:
        return Text("scrape failed: ") + safe(gw.error)  # the peer's words may be in it
    paths = sorted(set(gw.tensors_per_s) | set(gw.bytes_per_s))
    # A path is a label value of the peer's /metrics: its text, escaped like any stranger's.
    parts = [
        safe(p) + Text(f" {gw.tensors_per_s.get(p, 0):.1f}/s {human_rate(gw.bytes_per_s.get(p, 0))}") for p in paths
    ]
    text = Text(", ").join(parts) if parts else Text("no tensors")
    if gw.shm_byte_share is not None:
        text += Text(f", shm share {gw.shm_byte_share:.1%}")
    if gw.shm_write_failures:
        text += Text(f", shm write failures {gw.shm_write_failures_per_s:.1f}/s")
    return text


# -- piped: one line per interval ----------------------------------------------------------


def interval_line(app: App, st: IntervalStats) -> None:
    stamp = time.strftime("%H:%M:%S", time.localtime(st.t_unix_s))
    text = (
        f"{stamp} created {st.created_per_s:.1f}/s {known_rate(st.created_per_s, st.created_bytes_per_s)}, "
        f"consumed {st.consumed_per_s:.1f}/s {known_rate(st.consumed_per_s, st.consumed_bytes_per_s)}, "
        f"in flight {st.in_flight} ({known(st.in_flight, st.in_flight_bytes)}), "
        f"time in flight {flight_text(st.flight)}, orphans {st.orphans}"
    )
    line = Text(text, style="red" if st.orphans else "")
    if st.overflows:
        line.append(f", {st.overflows} queue overflow(s): rescanned", style="bold yellow")
    if st.dir_gone or not st.watching:
        line.append(", shm dir gone" + ("" if st.watching else ": waiting for it"), style="bold yellow")
    if st.gateway is not None:
        line.append(" | gateway: ")
        line.append(gateway_text(st.gateway))
    prose(app.console, line, 9)
    if st.gateway is not None and st.gateway.verdict:
        prose(app.console, Text("  " + st.gateway.verdict, style="bold yellow"), 4)
        if st.gateway.cause_info is not None:
            fix_line(app, cause_fix(st.gateway.cause_info), indent=4)


# -- a TTY: the live dashboard -------------------------------------------------------------


def dashboard(st: IntervalStats, summary: WatchSummary) -> Group:
    where = safe(f"{summary.shm_dir} ({summary.prefix}*), {human_duration(summary.duration_s)}")
    run = (
        f"{summary.created} created, {summary.consumed} consumed, {summary.cleaned} cleaned, "
        f"{summary.unknown} unknown; time in flight {flight_text(summary.flight)}"
    )
    rows: list[tuple[str, Any]] = [
        ("watching", where + Text("" if st.watching else ", shm dir gone: waiting for it")),
        ("created", f"{st.created_per_s:.1f}/s  {known_rate(st.created_per_s, st.created_bytes_per_s)}"),
        ("consumed", f"{st.consumed_per_s:.1f}/s  {known_rate(st.consumed_per_s, st.consumed_bytes_per_s)}"),
        ("in flight", f"{st.in_flight}  {known(st.in_flight, st.in_flight_bytes)}"),
        ("time in flight", flight_text(st.flight)),
        ("run", run),
        ("orphans", f"{st.orphans} now ({known(st.orphans, st.orphan_bytes)}), {summary.orphans_seen} seen"),
    ]
    if summary.overflows or summary.dir_gone or summary.untracked:
        rows.append(
            ("lost", f"{summary.overflows} overflow(s), {summary.dir_gone} dir gone, {summary.untracked} untracked")
        )
    if st.gateway is not None:
        rows.append(("gateway", gateway_text(st.gateway)))
        if st.gateway.verdict:
            rows.append(("", Text(st.gateway.verdict, style="bold yellow")))
        if st.gateway.cause_info is not None:
            rows.append(("", Text("fix: ", style="cyan") + cause_fix(st.gateway.cause_info)))
    if st.cause_info is not None:
        rows.append(("", Text("fix: ", style="cyan") + cause_fix(st.cause_info)))
    parts: list[Any] = [Trimmed(kv_table(rows))]
    if st.orphan_list:
        parts.append(OrphanRows(st.orphan_list[:10]))
    return Group(*parts)


ORPHAN_HEADER = f"{'KIND':<14}{'SIZE':>10} {'AGE':>11} {'PRODUCER':>18} {'GC STATE':<12} NAME"


def orphan_row(o: Orphan, cols: int = 10**6) -> list[Text]:
    """One orphan on one line for a pipe: fixed columns, then the name whole and escaped."""
    head = f"{o.kind:<14}{human_size(o.nbytes):>10} {human_duration(o.age_s):>11} {_pid(o):>18} "
    row = Text(head) + Text(f"{o.state:<12}", style=_STATE_STYLE.get(o.state, "")) + Text(" ") + safe(o.name)
    if row.cell_len <= cols:
        return [row]
    # The name does not fit after the columns: on a line of its own, whole (gc's rows do the same).
    cells = row[: len(head) + 12]
    cells.rstrip()
    return [cells, Text("  ") + safe(o.name)]


class OrphanRows:
    """The live view's orphans, as a pipe shows them (orphan_row): fixed columns, then each name whole on its
    row, or on a line of its own when the terminal is too narrow for it (a table column folded it)."""

    def __init__(self, orphans: list[Orphan]) -> None:
        self.orphans = orphans

    def __rich_console__(self, _console: Any, options: Any) -> Iterator[Text]:
        yield Text("orphans (oldest first)", style="italic")
        yield Text(ORPHAN_HEADER)
        for o in self.orphans:
            yield from orphan_row(o, options.max_width)


# -- the end: the whole run ------------------------------------------------------------------


def summary_report(app: App, s: WatchSummary) -> None:
    style = "bold red" if s.orphans_seen else "bold green"
    head = (
        f"watched {escape(s.shm_dir)} for {human_duration(s.duration_s)}: {s.created} segment(s) created, "
        f"{s.consumed} consumed, {s.cleaned} cleaned by their producer, {s.unknown} ended unknown; "
        f"{s.orphans_seen} orphan(s) seen"
    )
    prose(app.console, Text(head, style=style), 2)
    rows: list[tuple[str, Any]] = [
        (
            "bytes",
            f"{known(s.created, s.created_bytes)} created, {known(s.consumed, s.consumed_bytes)} consumed "
            "(known sizes)",
        ),
        ("time in flight", flight_text(s.flight) + f" ({s.flight.count} consumed)"),
        ("in flight now", f"{s.in_flight} ({known(s.in_flight, s.in_flight_bytes)}), {s.listed} found by listings"),
    ]
    for kind, ends in s.ends_by_kind.items():
        rows.append((f"  {kind}", ", ".join(f"{n} {e}" for e, n in ends.items())))
    if s.gateway is not None:
        rows.append(("gateway", gateway_text(s.gateway)))
    fit_table(app.console, kv_table(rows))
    if s.gateway is not None and s.gateway.verdict:
        prose(app.console, Text(s.gateway.verdict, style="bold yellow"), 2)
        if s.gateway.cause_info is not None:
            fix_line(app, cause_fix(s.gateway.cause_info), indent=2)
    if s.orphan_list:
        # Rows as gc's, the name last and whole (a table would fold a long name across lines), on a
        # terminal as in a pipe: a name that does not fit after the columns gets a line of its own.
        app.console.print("orphans (oldest first)", soft_wrap=True)
        app.console.print(ORPHAN_HEADER, soft_wrap=True)
        cols = width(app.console)
        for o in s.orphan_list:
            for line in orphan_row(o, cols):
                app.console.print(line, soft_wrap=True)
        for o in s.orphan_list:
            prose(app.console, safe(o.name, "bold") + Text(": ") + safe(o.reason), 2)
    if s.cause_info is not None:
        prose(app.console, safe(s.cause_info.message, "bold red"), 2)
        fix_line(app, cause_fix(s.cause_info), indent=2)
    for note in s.notes:
        prose(app.console, Text("note: " + note, style="yellow"), 6)


# -- --node ----------------------------------------------------------------------------------


def node_line(app: App, nw: Any, done: Any) -> None:
    """One line per full scan or update: what is followed and what the node holds (not under -q)."""
    if app.quiet:
        return
    vols, health = nw.figures()
    counts: dict[str, int] = {}
    for v in vols:
        for k, n in v.counts.items():
            counts[k] = counts.get(k, 0) + n
    states = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"
    what = "full scan" if done is None or done.full else f"{done.updated} updated"
    stamp = time.strftime("%H:%M:%S")
    text = (
        f"{stamp} {what}: {len(vols)} tmpfs, SMG segments {states}, "
        f"hidden {human_size(sum(v.hidden_bytes for v in vols))}"
    )
    if health.unfollowed:
        text += f", {health.unfollowed} tmpfs not followed (--max-volumes)"
    prose(app.console, Text(text, style="red" if counts.get("leaked") else ""), 9)
    for err in [*done.errors, *done.notes] if done is not None else ():
        prose(app.console, safe("  " + err, "yellow"), 4)


def node_unseen(app: App, unseen: list[Any], before: list[Any] | None) -> None:
    """A log line on stderr when what the node view cannot see changes (and at the first full scan): each thing,
    naming the mount or privilege missing, or that it sees the whole node again. Said under -q too: an
    exporter run quiet in a DaemonSet otherwise shows a blind node as a quiet one (its metric says it too)."""
    said = [(u.reason, u.message) for u in unseen]
    if before is not None and said == [(u.reason, u.message) for u in before]:
        return
    stamp = time.strftime("%H:%M:%S")
    for u in unseen:
        line = f"{stamp} warning: node view unknown ({u.reason}): {u.message}; hint: {u.hint}"
        app.err_console.print(safe(line, "yellow"), soft_wrap=True)
    if not unseen and before:
        app.err_console.print(safe(f"{stamp} node view sees the whole node again"), soft_wrap=True)


def node_news(app: App, news: list[tuple[bool, str]]) -> None:
    """A log line on stderr for each tmpfs newly not scanned (with why), then scanned again or gone: each said
    once, under -q too (as node_unseen: its series say it all along, smgshm_node_volume_scanned)."""
    stamp = time.strftime("%H:%M:%S")
    for problem, what in news:
        line = f"{stamp} {'warning: ' if problem else ''}{what}"
        app.err_console.print(safe(line, "yellow" if problem else ""), soft_wrap=True)


# -- --jsonl ---------------------------------------------------------------------------------


def _line(record: dict[str, Any]) -> None:
    write_line(record)


def name_fields(name: str) -> dict[str, str]:
    """A name both ways: shown escaped, and its exact bytes in hex (names are not UTF-8 by law)."""
    return {"name": escape(name), "name_hex": lossless(name)}


def jsonl_life(life: SegmentLife) -> None:
    rec = {"type": "segment", "schema_version": SCHEMA_VERSION, **plain(life), **name_fields(life.name)}
    _line(rec)


def jsonl_event(e: ShmEvent) -> None:
    _line({"type": e.kind, "schema_version": SCHEMA_VERSION, "t_unix_ns": e.t_ns, "detail": e.detail})


def jsonl_orphan(o: Orphan) -> None:
    _line({"type": "orphan", "schema_version": SCHEMA_VERSION, **plain(o), **name_fields(o.name)})


def interval_record(st: IntervalStats) -> dict[str, Any]:
    rec = plain_fields(st)
    rec["orphan_list"] = [{**plain(o), **name_fields(o.name)} for o in st.orphan_list]
    return rec


def summary_record(s: WatchSummary) -> dict[str, Any]:
    rec = plain_fields(s)
    rec["orphan_list"] = [{**plain(o), **name_fields(o.name)} for o in s.orphan_list]
    rec["shm_dir"] = escape(s.shm_dir)
    return rec


def jsonl_interval(st: IntervalStats) -> None:
    _line({"type": "interval", "schema_version": SCHEMA_VERSION, **interval_record(st)})


def jsonl_summary(s: WatchSummary) -> None:
    _line({"type": "summary", "schema_version": SCHEMA_VERSION, **summary_record(s)})


def jsonl_exporter(url: str) -> None:
    _line({"type": "exporter", "schema_version": SCHEMA_VERSION, "url": url})
