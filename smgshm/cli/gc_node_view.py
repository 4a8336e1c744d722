"""``smgshm gc --node``: every pod's /dev/shm on this node, a block per tmpfs, judged in its pod's pid namespaces.

The listing, the choice of what to reap and the reaping are gc's (segments/reaping.py), run per
tmpfs; only the judge differs (core/node). Pod names, volume names and paths come from the node's
filesystem, so they are shown escaped like segment names.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli import gc_view
from smgshm.cli.exitcodes import ExitCode, for_outcome
from smgshm.cli.fmt import TMPFS_KINDS, command, display, fill, hint, prose, width
from smgshm.core.node.scan import Unscanned, pod_label
from smgshm.core.units import human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.cli.gc_node_json_view import NodeJsonListing
    from smgshm.core.node.scan import NodeLook, Tmpfs, TmpfsScan
    from smgshm.core.node.sight import Unseen
    from smgshm.core.segments import gcrun
    from smgshm.core.segments.gcrun import GcRun
    from smgshm.core.segments.judge import ScanOptions, SegmentInfo
    from smgshm.core.segments.reaping import Choice, ReapReport, ReapRule


@dataclass
class Block:
    """One tmpfs's scan, its entries as listed, what the rule chose there, and what reaping it did."""

    scan: TmpfsScan
    segments: list[SegmentInfo]  # every entry listed; for the summary, only those it may show (``_Shown``)
    listed: int  # how many entries were listed
    choice: Choice
    done: ReapReport


class _Shown:
    """What the summary (no --all) may show of one tmpfs's entries, as they are listed: the first NOTABLE, and
    the first NOTABLE not in flight; and their count. A node of 100,000 entries keeps 40, not all of them."""

    def __init__(self, scan: TmpfsScan) -> None:
        self.scan = scan
        self.first: list[SegmentInfo] = []
        self.notable: list[SegmentInfo] = []
        self.open = True  # until NOTABLE notable ones are kept (the first NOTABLE are, by then): then it does nothing

    @property
    def count(self) -> int:
        """How many were listed: the scan's tally counts each one it hands on."""
        return self.scan.tally.total

    def add(self, seg: SegmentInfo, _row: int) -> None:
        if self.open:
            if len(self.first) < gc_view.NOTABLE:
                self.first.append(seg)
            if seg.state._value_ != "in_flight":
                self.notable.append(seg)
                self.open = len(self.notable) < gc_view.NOTABLE

    @property
    def rows(self) -> list[SegmentInfo]:
        """Every entry when they are few, else the first not in flight (as the summary shows them)."""
        return self.first if self.count <= gc_view.NOTABLE else self.notable


def run(
    app: App,
    root: str,
    opts: ScanOptions,
    rule: ReapRule | None,
    *,
    yes: bool,
    check: bool,
    all_rows: bool,
    raw: bool,
    npd: bool = False,
    prometheus_file: str | None = None,
    state_dirs: Sequence[tuple[str, ...]] = (),
) -> int:
    """Look at the node, then the shared gc run over its tmpfs (core/segments/gcrun.py), then show it all."""
    from smgshm.core.node.scan import tmpfs_scans
    from smgshm.core.segments import gcrun

    for stream in (sys.stdout, sys.stderr):  # any locale: what it cannot encode comes out escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if prometheus_file:
        from smgshm.core.segments import textfile  # (its imports: only a run that writes one pays them)

        textfile.check_writable(prometheus_file)  # exit 5 before anything is scanned or deleted
    started = time.time()
    node = _look(root, prometheus_file, started, state_dirs)
    if rule is not None:  # what a killed gc left set aside goes back first, on every tmpfs (core/segments/asides.py)
        from smgshm.core.segments.asides import restore

        # (not on a tmpfs below a dir not read in time: its path may stall, and nothing of it is reaped)
        back = sum(r.restored for t in node.tmpfs if t.unread is None for r in restore(t.place.path))
        if back and not npd:
            app.info(f"put back under their names {back} entries a killed gc had set aside")
    summary = not (app.json or raw or all_rows or npd)
    stream, listed, listing = _listings(app, node, rule, npd, summary)

    def confirm(chosen: Sequence[tuple[TmpfsScan, SegmentInfo]]) -> bool:  # the question names each one's pod
        pods = [_whose(scan.tmpfs) for scan, _ in chosen]
        return gc_view.confirm_delete(app, [seg for _, seg in chosen], yes, all_rows, pods)

    done = gcrun.run(tmpfs_scans(node, opts), rule, listing, confirm, on_part=stream.part_done if stream else None)
    blocks = [Block(p.scan, *listed[id(p.scan)], p.choice, p.report) for p in done.parts]
    code = _check_code(done, blocks, node.unseen) if check else ExitCode.OK
    _warn(app, node.unseen, blocks, npd)
    if code == ExitCode.UNDETERMINED and (app.json or raw) and not node.unseen:  # (people read it in the headline)
        said = f"all {done.before.total} SMG segment(s) unknown" if done.nothing_judged else "not every tmpfs scanned"
        app.warn(f"check inconclusive: {said}; {_unjudged(blocks)}")
    if prometheus_file:  # what is there now, after any --delete: the exporter's series, one run's
        _write_textfile(prometheus_file, blocks, started, node.unseen)
    if npd:  # NPD's one line over every tmpfs (gc_view.npd's rules)
        return _npd(blocks, done, node.unseen)
    if stream is not None:
        stream.finish(done, code)
    elif app.json:
        app.emit_rendered(
            {
                "node_root": display(node.root),
                "pods_known": node.pods_known,
                "tmpfs": [_doc(b) for b in blocks],
                "unseen": [{"reason": u.reason, "message": u.message, "hint": u.hint} for u in node.unseen],
                "counts": done.before.counts,
                "remaining_counts": done.after.counts,
            },
            code,
        )
    elif raw:
        _raw(blocks)
    elif not app.silent(code):
        _human(app, node, blocks, done, check, code, all_rows)
    return code


class _Listed:
    """Each tmpfs's entries, by its scan's id, kept for the end: all of them, or what the summary shows."""

    def __init__(self) -> None:
        self.every: dict[int, list[SegmentInfo]] = {}
        self.shown: dict[int, _Shown] = {}

    def __getitem__(self, scan_id: int) -> tuple[list[SegmentInfo], int]:
        """(the entries kept, how many were listed)."""
        if scan_id in self.shown:
            return self.shown[scan_id].rows, self.shown[scan_id].count
        kept = self.every.get(scan_id, [])
        return kept, len(kept)


def _listings(
    app: App, node: NodeLook, rule: ReapRule | None, npd: bool, summary: bool
) -> tuple[NodeJsonListing | None, _Listed, Callable[[TmpfsScan], gcrun.OnEntry]]:
    """Where each tmpfs's entries go as they are listed: a --json listing (no --delete) writes them as it goes
    and keeps none (gc_node_json_view.py); the ``summary`` keeps what it may show; otherwise each tmpfs's are
    kept, by its scan's id, for the end."""
    listed = _Listed()
    stream = None
    if app.json and rule is None and not npd:
        from smgshm.cli.gc_node_json_view import NodeJsonListing

        stream = NodeJsonListing(app, node)

    def listing(scan: TmpfsScan) -> gcrun.OnEntry:
        segments = listed.every[id(scan)] = []
        if stream is not None:
            return stream.listing(scan)
        if summary:
            del listed.every[id(scan)]
            shown = listed.shown[id(scan)] = _Shown(scan)
            return shown.add
        return lambda seg, _row: segments.append(seg)

    return stream, listed, listing


def _check_code(done: GcRun[TmpfsScan], blocks: list[Block], unseen: Sequence[Unseen]) -> ExitCode:
    """--check's code: the gc run's, and never a pass for a blind view (core/node/sight.py) or a tmpfs that
    could not be scanned and is not gone."""
    code = for_outcome(done.outcome)
    if code == ExitCode.OK and (unseen or _unread(blocks)):
        return ExitCode.UNDETERMINED
    return code


def _warn(app: App, unseen: Sequence[Unseen], blocks: list[Block], npd: bool) -> None:
    """What the view could not see (stderr and --json's warnings, whatever the check), sightings not stored, a
    held lock."""
    if not npd:
        for u in unseen:
            app.warn(f"node view unknown: {u.message}; hint: {u.hint}")
    gc_view.warn_sightings(app, [b.scan.sightings for b in blocks])
    app.warn_lock()


def _unread(blocks: list[Block]) -> list[Block]:
    """The tmpfs that could not be scanned though still mounted (one gone since the look leaks nothing)."""
    return [b for b in blocks if b.scan.error is not None and not b.scan.gone]


def _unjudged(blocks: list[Block]) -> str:
    """Why: how many tmpfs could not be judged by pid (each block says why), else each entry's reason."""
    if unread := _unread(blocks):
        return f"{len(unread)} tmpfs could not be scanned (each says why below)"
    untrusted = sum(1 for b in blocks if b.done.nothing_judged and not b.scan.tmpfs.trust.trusted)
    why = f"{untrusted} tmpfs not judged by pid (each says why below)" if untrusted else "each entry's reason says why"
    return f"nothing could be judged: {why}"


def _look(root: str, prometheus_file: str | None, started: float, state_dirs: Sequence[tuple[str, ...]]) -> NodeLook:
    """The node under ``root``; when it cannot be looked at, the textfile says so before the error goes on."""
    from smgshm.core.errors import SmgshmError
    from smgshm.core.node.scan import look

    try:
        return look(root, state_dirs=state_dirs)
    except SmgshmError:
        if prometheus_file:  # the run failed: its time and the error, no figures (zeros would lie)
            from smgshm.core.node import metrics

            health = metrics.Health(time.time(), time.time() - started, 1)
            metrics.write_textfile(prometheus_file, [], health)
        raise


def _write_textfile(prometheus_file: str, blocks: list[Block], started: float, unseen: Sequence[Unseen]) -> None:
    from smgshm.core.node import metrics

    figures = [
        metrics.volume_figures(
            b.scan.tmpfs,
            b.done.after,
            b.scan.others,
            (b.scan.shm_total_bytes, b.done.used_bytes, b.done.free_bytes),
        )
        if not isinstance(b.scan, Unscanned)
        else metrics.unscanned_figures(b.scan.tmpfs, b.scan.failure)
        for b in blocks
        if not b.scan.gone  # unmounted since the look: nothing of it is left to show (as the exporter drops it)
    ]
    failed = sum(1 for b in blocks if b.scan.error is not None)
    health = metrics.Health(time.time(), time.time() - started, failed, unseen=tuple(u.reason for u in unseen))
    metrics.write_textfile(prometheus_file, figures, health)


def _npd(blocks: list[Block], done: GcRun[TmpfsScan], unseen: Sequence[Unseen]) -> int:
    """NPD's one line over every tmpfs (core/node/npd.py's node_verdict, as the exporter's --npd-file)."""
    from smgshm.cli.npd import npd_say
    from smgshm.core.node.npd import node_verdict

    return npd_say(
        node_verdict(
            done.after.counts,
            done.after.bytes_by_state,
            deleted=done.deleted,
            tmpfs=len(blocks),
            untrusted=sum(1 for b in blocks if not b.scan.tmpfs.trust.trusted),
            unread=len(_unread(blocks)),
            blind=[u.reason for u in unseen],
        )
    )


def _raw(blocks: list[Block]) -> None:
    out = gc_view.Out()
    for b in blocks:
        head = f"{_field(pod_label(b.scan.tmpfs))} {_field(_volume(b.scan.tmpfs))} "
        for seg in b.segments:
            out.write(head + gc_view.raw_row(seg))
    out.flush()


def _whose(t: Tmpfs) -> str:
    """For people: ``pod NAMESPACE/NAME`` (or its uid), or ``no pod`` (the host's /dev/shm)."""
    return "no pod" if t.pod_uid is None else f"pod {pod_label(t)}"


def _volume(t: Tmpfs) -> str:
    p = t.place
    return p.kind if p.volume is None else f"{p.kind}:{p.volume}"


def _field(text: str) -> str:
    """One awk field: escaped, spaces too."""
    return display(text).replace(" ", "\\x20")


def _doc(b: Block) -> dict[str, Any]:
    """A tmpfs's block, as the streamed document has it (gc_node_json_view): head, figures, segments, tail."""
    from smgshm.cli.gc_node_json_view import figures, head, tail

    scan, done = b.scan, b.done
    return {
        **head(scan),
        **figures(scan, done.before),
        "segments": gc_view.segment_docs(b.segments),
        **tail(scan, done),
    }


def headline(
    root: str,
    blocks: list[Block],
    done: GcRun[TmpfsScan],
    check: bool,
    code: ExitCode,
    unseen: Sequence[Unseen] = (),
) -> str:
    """The first line; it agrees with the exit code."""
    after = done.after
    states = ", ".join(f"{n} {k}" for k, n in after.counts.items() if n) or "none"
    text = f"node {display(root)}: {len(blocks)} tmpfs, {after.total} SMG segment(s): {states}"
    if done.deleted:
        text = f"deleted {done.deleted}; " + text
    if check and code == ExitCode.UNDETERMINED and unseen:
        return f"check inconclusive: {text}; the node view is unknown: {display(unseen[0].message)}"
    if check and code == ExitCode.UNDETERMINED:
        return f"check inconclusive: {text}; {_unjudged(blocks)}"
    if check:
        text = ("check passed: " if code == ExitCode.OK else "check failed: ") + text
    return text


def _human(
    app: App, node: NodeLook, blocks: list[Block], done: GcRun[TmpfsScan], check: bool, code: ExitCode, all_rows: bool
) -> None:
    root = node.root
    style = "bold green"
    if code == ExitCode.UNDETERMINED or node.unseen:
        style = "bold yellow"
    if code not in (ExitCode.OK, ExitCode.UNDETERMINED) or done.leaked_or_hazard:
        style = "bold red"
    prose(app.console, Text(headline(root, blocks, done, check, code, node.unseen), style=style), 2)
    out, cols = gc_view.Out(), width(app.console)
    for b in blocks:
        app.console.file.flush()
        out.write("\n" + "".join(_block_lines(b, all_rows, cols)))
        out.flush()
    if done.after.counts["leaked"] and not any(b.done.deleted for b in blocks) and not app.quiet:
        argv = ["smgshm", "gc", "--node", "--node-root", root, "--delete"]
        hint(app, "reap them with:")
        command(app.err_console, argv, 6)


def _shown_rows(segments: list[SegmentInfo]) -> list[SegmentInfo]:
    """``_Shown.rows`` of entries all kept (the summary's are already)."""
    if len(segments) <= gc_view.NOTABLE:
        return segments
    return list(islice((s for s in segments if s.state._value_ != "in_flight"), gc_view.NOTABLE))


def _block_lines(b: Block, all_rows: bool, cols: int = 80) -> list[str]:
    t, scan, done = b.scan.tmpfs, b.scan, b.done
    if done is None:
        raise RuntimeError("a block shown before it was reaped")
    who = "no pod" if t.pod_uid is None else f"pod {display(pod_label(t))} (uid {display(t.pod_uid)})"
    what = TMPFS_KINDS[t.place.kind] + ("" if t.place.volume is None else f" {display(t.place.volume)}")
    hidden = f"hidden {human_size(t.hidden.nbytes)}"
    if t.hidden.files:
        hidden += f" ({t.hidden.files} unlinked file(s) still mapped)"
    if not t.hidden.complete:
        hidden += " (at least: a process's maps was too long to read whole)"
    lines = [
        fill(ln, cols, 4) + "\n"
        for ln in (
            f"{who}, {what}: {display(t.place.path)}",
            f"  size {human_size(scan.shm_total_bytes)}, used {human_size(done.used_bytes)}, {hidden}",
            f"  liveness: {display(t.trust.note)}",
        )
    ]
    if scan.error is not None:
        why = "gone since the look (unmounted): nothing left there" if scan.gone else "not scanned"
        lines.append(fill(f"  {why}: {display(scan.error)}", cols, 4) + "\n")
    states = ", ".join(
        f"{k} {n} ({human_size(done.after.bytes_by_state[k])})" for k, n in done.after.counts.items() if n
    )
    freed = [d for d in done.deleted if d.deleted]
    if freed:
        states += f"{', ' if states else ''}deleted {len(freed)} ({human_size(sum(d.freed_bytes for d in freed))})"
    lines.append(fill(f"  SMG segments: {states or 'none'}", cols, 4) + "\n")
    fams = ", ".join(
        f"{display(f)} {n} ({human_size(scan.others.nbytes[f])})" for f, n in sorted(scan.others.counts.items())
    )
    lines.append(fill(f"  other families: {fams or 'none'}", cols, 4) + "\n")
    rows = b.segments if all_rows else _shown_rows(b.segments)  # (the summary kept those only: ``_Shown``)
    if rows:
        gone = {d.ino for d in freed}
        lines.append("  " + gc_view.HEADER)
        for seg in rows:
            was = "deleted" if seg.ino in gone and seg.state.value in ("leaked", "stale") else None
            # gc's own row (one format for both views), indented: the name on its own line when it does not fit.
            for text in (gc_view.fit_row(gc_view._row(seg, was), cols - 2), gc_view.why_line(seg.reason, cols - 2)):
                lines.extend("  " + ln + "\n" for ln in text.splitlines())
        if len(rows) < b.listed:
            lines.append(f"  ... {b.listed - len(rows)} more (--all lists every entry)\n")
    for d in done.deleted:
        if not d.deleted:
            lines.append(fill(f"  kept {display(d.name)}: {display(d.reason)}", cols, 4) + "\n")
    return lines


__all__ = ["headline", "run"]
