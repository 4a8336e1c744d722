"""``smgshm gc --node``: every pod's /dev/shm on this node, a block per tmpfs, judged in its pod's pid namespaces.

The listing, the choice of what to reap and the reaping are gc's (segments/reaping.py), run per
tmpfs; only the judge differs (core/node). Pod names, volume names and paths come from the node's
filesystem, so they are shown escaped like segment names.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli import gc_view
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.fmt import TMPFS_KINDS, command, display, fill, hint, lossless, prose, width
from smgshm.core.units import human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.core.node.scan import NodeLook, Tmpfs, TmpfsScan
    from smgshm.core.segments.judge import ScanOptions, SegmentInfo
    from smgshm.core.segments.reaping import Choice, ReapReport, ReapRule


@dataclass
class Block:
    """One tmpfs's scan, its entries as listed, what the rule chose there, and what reaping it did."""

    scan: TmpfsScan
    segments: list[SegmentInfo]
    choice: Choice
    done: ReapReport


def _into(segments: list[SegmentInfo]) -> Callable[[SegmentInfo, int], None]:
    """``reaping.choose``'s on_entry: each entry listed is kept in ``segments``."""
    return lambda seg, _row: segments.append(seg)


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
) -> int:
    """Look at the node, list and judge each tmpfs, ask once, reap per tmpfs, then show it all."""
    from smgshm.core.segments import reaping, textfile

    for stream in (sys.stdout, sys.stderr):  # any locale: what it cannot encode comes out escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if prometheus_file:
        textfile.check_writable(prometheus_file)  # exit 5 before anything is scanned or deleted
    started = time.time()
    node = _look(root, prometheus_file, started)
    listed = _choose(node, opts, rule)
    chosen = [seg for _, _, choice in listed for seg in choice.chosen]
    pods = [_whose(scan.tmpfs) for scan, _, choice in listed for _seg in choice.chosen]  # the question names pods
    if chosen and not gc_view.confirm_delete(app, chosen, yes, all_rows, pods):  # declined: every tmpfs is a listing
        listed = [(scan, segs, reaping.Choice([], choice.refused, {})) for scan, segs, choice in listed]
    blocks = [Block(scan, segs, choice, reaping.reap_choice(scan, choice)) for scan, segs, choice in listed]
    bad = sum(b.done.leaked_or_hazard for b in blocks)
    code = ExitCode.CHECK_FAILED if check and bad else ExitCode.OK
    if check and not bad and _nothing_judged(blocks):  # every entry on the node unknown: never a pass
        code = ExitCode.UNDETERMINED
        if app.json or raw:  # (people read it in the headline)
            n = sum(b.done.before.total for b in blocks)
            app.warn(f"check inconclusive: all {n} SMG segment(s) unknown; {_unjudged(blocks)}")
    if prometheus_file:  # what is there now, after any --delete: the exporter's series, one run's
        _write_textfile(prometheus_file, blocks, started)
    if npd:  # NPD's one line over every tmpfs (gc_view.npd's rules)
        return _npd(blocks)
    if app.json:
        app.emit_rendered(
            {
                "node_root": display(node.root),
                "pods_known": node.pods_known,
                "tmpfs": [_doc(b) for b in blocks],
                **_totals(blocks),
            },
            code,
        )
    elif raw:
        _raw(blocks)
    elif not app.silent(code):
        _human(app, node.root, blocks, check, code, all_rows)
    return code


def _nothing_judged(blocks: list[Block]) -> bool:
    """Every SMG entry of every tmpfs unknown, one at least: a --check of the node judged nothing."""
    return any(b.done.nothing_judged for b in blocks) and all(
        b.done.nothing_judged or not b.done.before.total for b in blocks
    )


def _unjudged(blocks: list[Block]) -> str:
    """Why: how many tmpfs could not be judged by pid (each block says why), else each entry's reason."""
    untrusted = sum(1 for b in blocks if b.done.nothing_judged and not b.scan.tmpfs.trust.trusted)
    why = f"{untrusted} tmpfs not judged by pid (each says why below)" if untrusted else "each entry's reason says why"
    return f"nothing could be judged: {why}"


def _look(root: str, prometheus_file: str | None, started: float) -> NodeLook:
    """The node under ``root``; when it cannot be looked at, the textfile says so before the error goes on."""
    from smgshm.core.errors import SmgshmError
    from smgshm.core.node import metrics
    from smgshm.core.node.scan import look

    try:
        return look(root)
    except SmgshmError:
        if prometheus_file:  # the run failed: its time and the error, no figures (zeros would lie)
            health = metrics.Health(time.time(), time.time() - started, 1)
            metrics.write_textfile(prometheus_file, [], health)
        raise


def _choose(
    node: NodeLook, opts: ScanOptions, rule: ReapRule | None
) -> list[tuple[TmpfsScan, list[SegmentInfo], Choice]]:
    """Each tmpfs listed and judged, its entries as listed, and what the rule chose to reap there."""
    from smgshm.core.host.holders import holder_index_devs
    from smgshm.core.host.mounts import mount_points_of
    from smgshm.core.node.scan import TmpfsScan
    from smgshm.core.segments import reaping

    # One walk of /proc and one read of every mount namespace's table, for every tmpfs at once.
    holders = holder_index_devs(t.place.dev for t in node.tmpfs)
    mounted = mount_points_of(t.place.path for t in node.tmpfs)
    listed: list[tuple[TmpfsScan, list[SegmentInfo], Choice]] = []
    for tmpfs in node.tmpfs:
        scan = TmpfsScan(tmpfs, opts, holders=holders, mounted=mounted[tmpfs.place.path])
        segments: list[SegmentInfo] = []
        listed.append((scan, segments, reaping.choose(scan, rule, _into(segments))))
    return listed


def _write_textfile(prometheus_file: str, blocks: list[Block], started: float) -> None:
    from smgshm.core.node import metrics

    figures = [
        metrics.volume_figures(
            b.scan.tmpfs,
            b.done.after,
            b.scan.others,
            (b.scan.shm_total_bytes, b.done.used_bytes, b.done.free_bytes),
        )
        for b in blocks
    ]
    metrics.write_textfile(prometheus_file, figures, metrics.Health(time.time(), time.time() - started, 0))


def _npd(blocks: list[Block]) -> int:
    """NPD's one line, over every tmpfs."""
    from smgshm.core.segments.judge import Tally

    after = Tally()
    for b in blocks:
        for k, n in b.done.after.counts.items():
            after.counts[k] += n
            after.bytes_by_state[k] += b.done.after.bytes_by_state[k]
    gone = sum(d.deleted for b in blocks for d in b.done.deleted)
    untrusted = [b for b in blocks if not b.scan.tmpfs.trust.trusted]
    note = f"{len(untrusted)} of {len(blocks)} tmpfs not judged by pid" if untrusted else ""
    return gc_view.npd(after, gone, note, where=f"node, {len(blocks)} tmpfs")


def _raw(blocks: list[Block]) -> None:
    out = gc_view.Out()
    for b in blocks:
        head = f"{_field(_pod(b.scan.tmpfs))} {_field(_volume(b.scan.tmpfs))} "
        for seg in b.segments:
            out.write(head + gc_view.raw_row(seg))
    out.flush()


def _pod(t: Tmpfs) -> str:
    if t.pod is not None:
        return f"{t.pod.namespace}/{t.pod.name}"
    return t.pod_uid or "-"


def _whose(t: Tmpfs) -> str:
    """For people: ``pod NAMESPACE/NAME`` (or its uid), or ``no pod`` (the host's /dev/shm)."""
    return "no pod" if t.pod_uid is None else f"pod {_pod(t)}"


def _volume(t: Tmpfs) -> str:
    p = t.place
    return p.kind if p.volume is None else f"{p.kind}:{p.volume}"


def _field(text: str) -> str:
    """One awk field: escaped, spaces too."""
    return display(text).replace(" ", "\\x20")


def _totals(blocks: list[Block]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    remaining: dict[str, int] = {}
    for b in blocks:
        for k, n in b.done.before.counts.items():
            counts[k] = counts.get(k, 0) + n
        for k, n in b.done.after.counts.items():
            remaining[k] = remaining.get(k, 0) + n
    return {"counts": counts, "remaining_counts": remaining}


def _doc(b: Block) -> dict[str, Any]:
    t, scan, done = b.scan.tmpfs, b.scan, b.done
    pod = t.pod
    return {
        "kind": t.place.kind,
        "path": display(t.place.path),
        "path_hex": lossless(t.place.path),
        "volume": None if t.place.volume is None else display(t.place.volume),
        "pod_uid": None if t.pod_uid is None else display(t.pod_uid),
        "namespace": None if pod is None else display(pod.namespace),
        "pod": None if pod is None else display(pod.name),
        "shm_total_bytes": scan.shm_total_bytes,
        "shm_used_bytes": scan.shm_total_bytes - scan.shm_free_bytes,
        "shm_free_bytes": scan.shm_free_bytes,
        "hidden_bytes": t.hidden.nbytes,
        "hidden_files": t.hidden.files,
        "hidden_complete": t.hidden.complete,
        "processes": len(t.users),
        "pid_namespaces": [s.ns for s in t.spaces],
        "liveness_trusted": t.trust.trusted,
        "liveness_note": t.trust.note,
        "counts": done.before.counts,
        "bytes_by_state": done.before.bytes_by_state,
        "counts_by_kind": done.before.counts_by_kind,
        "bytes_by_kind": done.before.bytes_by_kind,
        "reclaimable_bytes": done.before.reclaimable_bytes,
        "other_families": [
            {"family": display(f), "count": n, "nbytes": scan.others.nbytes[f]}
            for f, n in sorted(scan.others.counts.items())
        ],
        "segments": gc_view.segment_docs(b.segments),
        "deleted": [gc_view.deletion_doc(d) for d in done.deleted],
        "remaining_counts": done.after.counts,
        "remaining_bytes_by_state": done.after.bytes_by_state,
        "remaining_shm_used_bytes": done.used_bytes,
        "remaining_shm_free_bytes": done.free_bytes,
        "scan_ms": float(scan.scan_ms),
    }


def headline(root: str, blocks: list[Block], check: bool, code: ExitCode) -> str:
    """The first line; it agrees with the exit code."""
    after = _totals(blocks)["remaining_counts"]
    states = ", ".join(f"{n} {k}" for k, n in after.items() if n) or "none"
    gone = sum(d.deleted for b in blocks for d in b.done.deleted)
    text = f"node {display(root)}: {len(blocks)} tmpfs, {sum(after.values())} SMG segment(s): {states}"
    if gone:
        text = f"deleted {gone}; " + text
    if check and code == ExitCode.UNDETERMINED:
        return f"check inconclusive: {text}; {_unjudged(blocks)}"
    if check:
        text = ("check passed: " if code == ExitCode.OK else "check failed: ") + text
    return text


def _human(app: App, root: str, blocks: list[Block], check: bool, code: ExitCode, all_rows: bool) -> None:
    after = _totals(blocks)["remaining_counts"]
    style = "bold green"
    if code == ExitCode.UNDETERMINED:
        style = "bold yellow"
    elif code != ExitCode.OK or after.get("leaked") or after.get("hazard"):
        style = "bold red"
    prose(app.console, Text(headline(root, blocks, check, code), style=style), 2)
    out, cols = gc_view.Out(), width(app.console)
    for b in blocks:
        app.console.file.flush()
        out.write("\n" + "".join(_block_lines(b, all_rows, cols)))
        out.flush()
    leaked = sum(b.done.after.counts["leaked"] for b in blocks)
    if leaked and not any(b.done.deleted for b in blocks) and not app.quiet:
        argv = ["smgshm", "gc", "--node", "--node-root", root, "--delete"]
        hint(app, "reap them with:")
        command(app.err_console, argv, 6)


def _block_lines(b: Block, all_rows: bool, cols: int = 80) -> list[str]:
    t, scan, done = b.scan.tmpfs, b.scan, b.done
    if done is None:
        raise RuntimeError("a block shown before it was reaped")
    who = "no pod" if t.pod_uid is None else f"pod {display(_pod(t))} (uid {display(t.pod_uid)})"
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
    rows = (
        b.segments
        if all_rows or len(b.segments) <= gc_view.NOTABLE
        else [s for s in b.segments if s.state.value != "in_flight"][: gc_view.NOTABLE]
    )
    if rows:
        gone = {d.ino for d in freed}
        lines.append("  " + gc_view.HEADER)
        for seg in rows:
            was = "deleted" if seg.ino in gone and seg.state.value in ("leaked", "stale") else None
            # gc's own row (one format for both views), indented: the name on its own line when it does not fit.
            for text in (gc_view.fit_row(gc_view._row(seg, was), cols - 2), gc_view.why_line(seg.reason, cols - 2)):
                lines.extend("  " + ln + "\n" for ln in text.splitlines())
        if len(rows) < len(b.segments):
            lines.append(f"  ... {len(b.segments) - len(rows)} more (--all lists every entry)\n")
    for d in done.deleted:
        if not d.deleted:
            lines.append(fill(f"  kept {display(d.name)}: {display(d.reason)}", cols, 4) + "\n")
    return lines


__all__ = ["headline", "run"]
