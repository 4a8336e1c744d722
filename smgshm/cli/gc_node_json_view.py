"""``gc --node --json`` written as the run goes: each tmpfs's segments as they are listed, not one document
built whole (300,000 entries in one tmpfs made that 764 MiB). The document is the one ``_doc`` of
gc_node_view describes, key for key: what is known of a tmpfs before its listing, its segments in
batches, then its figures once it is listed (a listing reaps nothing, so they are final); the node's
totals, ``ok`` and the warnings close it. A failure mid-run closes it whole, ok false, as gc's
``JsonListing`` does. A ``--delete`` run keeps its listing until the one confirmation (gcrun.py), so
it writes the document at the end (gc_node_view).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from smgshm.cli import gc_view
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.fmt import display, tmpfs_fields
from smgshm.cli.jsonout import dumpb, signals_held, write_bytes

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.core.node.scan import NodeLook, TmpfsScan
    from smgshm.core.segments.gcrun import GcRun, OnEntry, Part
    from smgshm.core.segments.judge import SegmentInfo, Tally
    from smgshm.core.segments.reaping import ReapReport

_FLUSH = 4096  # entries encoded per call (gc_view's batch)


def head(scan: TmpfsScan) -> dict[str, Any]:
    """A tmpfs's fields known before its listing, in the document's order."""
    t = scan.tmpfs
    return {
        **tmpfs_fields(t),
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
    }


def figures(scan: TmpfsScan, before: Tally) -> dict[str, Any]:
    """A tmpfs's figures of its listing (the fields between its head and its segments)."""
    return {
        "counts": before.counts,
        "bytes_by_state": before.bytes_by_state,
        "counts_by_kind": before.counts_by_kind,
        "bytes_by_kind": before.bytes_by_kind,
        "reclaimable_bytes": before.reclaimable_bytes,
        "other_families": [
            {"family": display(f), "count": n, "nbytes": scan.others.nbytes[f]}
            for f, n in sorted(scan.others.counts.items())
        ],
    }


def tail(scan: TmpfsScan, done: ReapReport) -> dict[str, Any]:
    """A tmpfs's fields after its segments: what reaping did, and how its scan went."""
    return {
        "deleted": [gc_view.deletion_doc(d) for d in done.deleted],
        "remaining_counts": done.after.counts,
        "remaining_bytes_by_state": done.after.bytes_by_state,
        "remaining_shm_used_bytes": done.used_bytes,
        "remaining_shm_free_bytes": done.free_bytes,
        "scan_ms": float(scan.scan_ms),
        "sightings_stored": scan.sightings.stored,
        "scan_error": None if scan.error is None else display(scan.error),
        "scan_failure": None if scan.failure is None else scan.failure.value,
        "gone": scan.gone,
    }


def _inner(obj: dict[str, Any]) -> bytes:
    """An object's members without its braces ("" for an empty one)."""
    return dumpb(obj)[1:-1]


class NodeJsonListing:
    """The one document of ``gc --node --json``, written as the run goes (see the module)."""

    def __init__(self, app: App, node: NodeLook) -> None:
        from smgshm import __version__
        from smgshm.cli.jsonout import SCHEMA_VERSION
        from smgshm.core.segments.judge import State

        self.app, self.first = app, True
        self.open_scan: TmpfsScan | None = None
        self.pending: list[SegmentInfo] = []
        self.first_seg = True
        self.counts = {s.value: 0 for s in State}  # the closed tmpfs' counts, summed (what an abort reports)
        app.said = True  # the document is begun: a failure from here on closes it, never adds a second
        app.close_doc = self.abort
        env = {"smgshm_version": __version__, "schema_version": SCHEMA_VERSION, "command": app.command}
        result = {"node_root": display(node.root), "pods_known": node.pods_known}
        self.unseen = [{"reason": u.reason, "message": u.message, "hint": u.hint} for u in node.unseen]
        self._write(dumpb(env)[:-1] + b',"result":' + dumpb(result)[:-1] + b',"tmpfs":[')

    def _write(self, data: bytes) -> None:
        write_bytes(data, sys.stdout)

    def _drain(self) -> None:
        if self.pending:
            batch, first = list(self.pending), self.first_seg  # marked written first (gc_view.JsonListing._drain)
            self.pending.clear()  # the same list: the listing's callback holds it
            self.first_seg = False
            with signals_held():
                self._write((b"" if first else b",") + dumpb(gc_view.segment_docs(batch))[1:-1])

    def listing(self, scan: TmpfsScan) -> OnEntry:
        """Begin a tmpfs's object; its entries, as the scan streams them, go to the callback returned."""
        self._write((b"" if self.first else b",") + dumpb(head(scan))[:-1] + b',"segments":[')
        self.first, self.open_scan, self.first_seg = False, scan, True
        pending = self.pending

        def add(seg: SegmentInfo, _row: int) -> None:
            pending.append(seg)
            if len(pending) >= _FLUSH:
                self._drain()

        return add

    def part_done(self, part: Part[TmpfsScan]) -> None:
        """Close the tmpfs's object: its figures and what its reaping (none in a listing) did."""
        self._drain()
        self._write(b"]," + _inner({**figures(part.scan, part.report.before), **tail(part.scan, part.report)}) + b"}")
        self.open_scan = None
        self._add(self.counts, part.report.before.counts)

    def finish(self, done: GcRun[TmpfsScan], code: ExitCode) -> None:
        self.app.close_doc = None
        self._close(done.before.counts, done.after.counts, code == ExitCode.OK)

    def _close(self, counts: dict[str, int], remaining: dict[str, int], ok: bool) -> None:
        rest = {"unseen": self.unseen, "counts": counts, "remaining_counts": remaining}
        end = {"ok": ok, "warnings": list(self.app.warnings)}
        self._write(b"]," + _inner(rest) + b"}," + dumpb(end)[1:] + b"\n")

    def abort(self, why: str) -> None:
        """The run failed after the document began (an error, Ctrl-C): the tmpfs under way closed with what was
        listed of it by then, the document closed whole, ok false, a warning saying so."""
        scan = self.open_scan
        if scan is not None:
            self._drain()
            t = scan.tally
            rest = {
                **figures(scan, t),
                "deleted": [],
                "remaining_counts": t.counts,
                "remaining_bytes_by_state": t.bytes_by_state,
                "remaining_shm_used_bytes": scan.shm_total_bytes - scan.shm_free_bytes,
                "remaining_shm_free_bytes": scan.shm_free_bytes,
                "scan_ms": float(scan.scan_ms),
                "sightings_stored": False,
                "scan_error": None,
                "scan_failure": None,
                "gone": False,
            }
            self._write(b"]," + _inner(rest) + b"}")
            self.open_scan = None
            self._add(self.counts, t.counts)
        self.app.warnings.append(f"stopped before its end ({why}): the listing holds what was judged by then")
        self._close(self.counts, self.counts, False)

    @staticmethod
    def _add(into: dict[str, int], counts: dict[str, int]) -> None:
        for k, n in counts.items():
            into[k] = into.get(k, 0) + n


__all__ = ["NodeJsonListing", "figures", "head", "tail"]
