"""Output of ``smgshm gc``: a streamed JSON document, a summary for people, rows for scripts.

A crowded shm dir has a million entries and a stranger chooses every name, so:
- nothing keeps the listing: JSON and ``--raw`` rows are written as entries are judged, the
  human view keeps tallies and a bounded set of the entries that matter most, and ``--all``
  spools its rows to an unlinked temp file so the headline can still come first;
- no rich Table holds a name: a table would fold or cut it at 80 columns when piped. Rows
  are plain lines, the name last and whole, escaped (``fmt.escape``; in ``--raw`` spaces too,
  so ``awk`` sees one field);
- JSON carries the escaped display ``name`` and the lossless ``name_hex`` beside it.
"""

from __future__ import annotations

import functools
import heapq
import sys
import time
from typing import IO, TYPE_CHECKING, Any, TypeVar

from rich.text import Text

from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.fmt import command, display, escape, fill, hint, lossless, prose, width
from smgshm.cli.jsonout import dumpb as _dumpb
from smgshm.cli.jsonout import signals_held, write_bytes
from smgshm.core.units import human_duration, human_size

if TYPE_CHECKING:
    from rich.progress import Progress as Bar
    from rich.progress import TaskID

    from smgshm.cli.app import App
    from smgshm.core.host.holders import Holder
    from smgshm.core.segments.judge import SegmentInfo, Tally
    from smgshm.core.segments.scan import Deletion, Scan
    from smgshm.core.segments.sightings import Sightings

_STYLE = {"leaked": "red", "hazard": "magenta", "stale": "yellow", "held": "cyan", "in_flight": "green"}
# Which entries matter most in the summary: what blocks readers, then what can be reclaimed.
_RANK = {"hazard": 0, "leaked": 1, "held": 2, "stale": 3, "unknown": 4}
NOTABLE = 20
_FLUSH = 4096
_K = TypeVar("_K", bound=str)  # a tally's key: a state's value or a kind


def segment_docs(segs: list[SegmentInfo]) -> list[dict[str, Any]]:
    """The JSON objects of a batch of entries: one comprehension, no call per entry (a listing may
    have a million), display() and fmt.lossless inlined."""
    return [
        {
            "name": name if name.isascii() and name.isprintable() and "\\" not in name else escape(name),
            "name_hex": name.encode("utf-8", "surrogateescape").hex(),
            "kind": kind,
            "file_type": ftype,
            "nbytes": nbytes,
            "allocated_bytes": alloc,
            "age_s": age,
            "uid": uid,
            "producer_pid": pid,
            "producer_alive": alive,
            "holders": _holder_docs(held) if held else [],
            "state": state._value_,
            "reason": why,
            "ino": ino,
            "nlink": nlink,
            "seen_s": seen,
            "proven_dead": dead,
        }
        for name, kind, ftype, nbytes, alloc, age, uid, pid, alive, held, state, why, ino, nlink, _, seen, dead in segs
    ]


def _holder_docs(held: tuple[Holder, ...]) -> list[dict[str, Any]]:
    return [{"pid": h.pid, "comm": h.comm, "how": h.how} for h in held]


def segment_doc(s: SegmentInfo) -> dict[str, Any]:
    return segment_docs([s])[0]


def deletion_doc(d: Deletion) -> dict[str, Any]:
    return {
        "name": display(d.name),
        "name_hex": lossless(d.name),
        "nbytes": d.nbytes,
        "deleted": d.deleted,
        "reason": d.reason,
        "ino": d.ino,
        "freed_bytes": d.freed_bytes,
    }


class Out:
    """Buffered text to stdout; characters the locale cannot encode come out as escapes."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.buf: list[str] = []
        self.size = 0

    def write(self, text: str) -> None:
        self.buf.append(text)
        self.size += len(text)
        if self.size >= 1 << 18:  # bounded by size, not by count: a spool chunk is one write
            self.flush()

    def flush(self) -> None:
        if self.buf:
            data, self.buf, self.size = "".join(self.buf), [], 0
            enc = getattr(self.stream, "encoding", None) or "utf-8"
            self.stream.write(data.encode(enc, "backslashreplace").decode(enc))
            self.stream.flush()


_SIZES: dict[int, str] = {}
_AGES: dict[int, str] = {}


def _size(n: int) -> str:
    if n not in _SIZES:
        if len(_SIZES) > 65536:
            _SIZES.clear()  # bounded: sizes repeat, but a stranger can make them all differ
        _SIZES[n] = human_size(n)
    return _SIZES[n]


def _age(s: float) -> str:
    k = int(s)  # whole seconds: an age this coarse is all a listing needs
    if k not in _AGES:
        if len(_AGES) > 65536:
            _AGES.clear()
        _AGES[k] = human_duration(k)
    return _AGES[k]


_HEADS: dict[tuple[str, str, int, str, int | None, bool | None], str] = {}


def _row(s: SegmentInfo, state: str | None = None) -> str:
    name, kind, _, _, alloc, age_s, _, pid, alive, _, st, _, _, _, _, _, _ = s
    age = _AGES.get(int(age_s)) or _age(age_s)
    # Everything before the name, made once per (state, kind, size, shown age, pid): a crowded
    # dir repeats a handful of them (this runs once per row of --all).
    key = (state or st._value_, kind, alloc, age, pid, alive)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) > 65536:
            _HEADS.clear()  # bounded: a stranger can make every size differ
        shown = "no pid" if pid is None else f"{pid}{' (dead)' if alive is False else ''}"
        head = _HEADS[key] = f"{key[0]:<10}{kind:<14}{_size(alloc):>10} {age:>11} {shown:>14}  "
    return head + (name if name.isascii() and name.isprintable() and "\\" not in name else escape(name)) + "\n"


HEADER = f"{'STATE':<10}{'KIND':<14}{'SIZE':>10} {'AGE':>11} {'PID':>14}  NAME\n"
HEAD_WIDTH = len(HEADER) - len("NAME\n")  # every row's name starts here


def fit_row(line: str, cols: int) -> str:
    """A row (with its newline) as it fits ``cols``: whole, or its columns then the name on a line of its
    own (indented two), never cut or folded inside."""
    if len(line) <= cols + 1:
        return line
    # The name starts after the columns' two spaces (a pid wider than its column pushes it right).
    at = line.find("  ", HEAD_WIDTH - 2) + 2
    return line[:at].rstrip() + "\n  " + line[at:]


@functools.lru_cache(maxsize=1024)  # a crowded dir repeats a handful of reasons: each wrapped once
def why_line(reason: str, cols: int) -> str:
    return fill(f"{'':10}why: {display(reason)}", cols, 15) + "\n"


def raw_row(s: SegmentInfo) -> str:
    """STATE KIND ALLOCATED_BYTES AGE_S PID NAME: one entry, single spaces, no header, nothing humanised."""
    name, kind, _, _, alloc, age, _, pid, _, _, st, _, _, _, _, _, _ = s
    if not (name.isascii() and name.isprintable() and "\\" not in name):  # display(), inline: once per row
        name = escape(name)
    if " " in name:
        name = name.replace(" ", "\\x20")  # one field for awk
    return f"{st._value_} {kind} {alloc} {age:.0f} {'-' if pid is None else pid} {name}\n"


def _tally_cells(counts: dict[_K, int], sizes: dict[_K, int]) -> list[str]:
    """``state 3 (1.2 MiB)``: a tally's nonzero counts, with their bytes."""
    return [f"{k} {n} ({human_size(sizes[k])})" for k, n in counts.items() if n]


class JsonListing:
    """One JSON document, written as the scan goes: envelope, result with segments, then the rest."""

    def __init__(self, app: App, scan: Scan) -> None:
        from smgshm import __version__
        from smgshm.cli.jsonout import SCHEMA_VERSION

        self.app, self.first, self.scan = app, True, scan
        app.said = True  # the document is begun: a failure from here on adds no second one, it closes this one
        app.close_doc = self.abort
        self.pending: list[SegmentInfo] = []
        self.stream = sys.stdout
        head = {"smgshm_version": __version__, "schema_version": SCHEMA_VERSION, "command": app.command}
        result = {
            "shm_dir": display(scan.opts.shm_dir),
            "liveness_trusted": scan.trust.trusted,
            "liveness_note": scan.trust.note,
            "shm_total_bytes": scan.shm_total_bytes,
            "shm_used_bytes": scan.shm_total_bytes - scan.shm_free_bytes,
            "shm_free_bytes": scan.shm_free_bytes,
        }
        self._write(_dumpb(head)[:-1] + b',"result":' + _dumpb(result)[:-1] + b',"segments":[')

    def _write(self, data: bytes) -> None:
        write_bytes(data, self.stream)

    def _drain(self) -> None:
        if self.pending:
            # One encoder call per batch (a list), not per entry: its brackets are cut off. Marked written
            # before it is: a signal's handler may run at any bytecode (the signal taken by another thread),
            # and the document it closes (abort) must hold this batch once or not at all, never twice.
            batch, first = self.pending, self.first
            self.pending, self.first = [], False
            with signals_held():  # and never half of it (a write cut short by the handler)
                self._write((b"" if first else b",") + _dumpb(segment_docs(batch))[1:-1])

    def add(self, seg: SegmentInfo, row: int) -> None:
        pending = self.pending
        pending.append(seg)
        if len(pending) >= _FLUSH:
            self._drain()

    def finish(
        self,
        scan: Scan,
        before: Tally,
        after: Tally,
        deleted: list[Deletion],
        code: ExitCode,
        done_rows: set[int],
        usage: tuple[int, int],
    ) -> None:
        self.app.close_doc = None
        self._drain()
        rest = {
            "counts": before.counts,
            "bytes_by_state": before.bytes_by_state,
            "counts_by_kind": before.counts_by_kind,
            "bytes_by_kind": before.bytes_by_kind,
            "reclaimable_bytes": before.reclaimable_bytes,
            "scan_ms": float(scan.scan_ms),
            "deleted": [deletion_doc(d) for d in deleted],
            "remaining_counts": after.counts,
            "remaining_bytes_by_state": after.bytes_by_state,
            "remaining_shm_used_bytes": usage[0],
            "remaining_shm_free_bytes": usage[1],
            "sightings_stored": scan.sightings.stored,
        }
        self._close(rest, code == ExitCode.OK)

    def _close(self, rest: dict[str, Any], ok: bool) -> None:
        tail = {"ok": ok, "warnings": list(self.app.warnings)}
        self._write(b"]," + _dumpb(rest)[1:-1] + b"}," + _dumpb(tail)[1:] + b"\n")

    def abort(self, why: str) -> None:
        """The run failed after the document began (an error, Ctrl-C): close it whole, ok false, with what
        was judged by then and a warning saying so; the error itself goes to stderr and the exit code."""
        self._drain()
        scan, t = self.scan, self.scan.tally
        rest = {
            "counts": t.counts,
            "bytes_by_state": t.bytes_by_state,
            "counts_by_kind": t.counts_by_kind,
            "bytes_by_kind": t.bytes_by_kind,
            "reclaimable_bytes": t.reclaimable_bytes,
            "scan_ms": float(scan.scan_ms),
            "deleted": [],
            "remaining_counts": t.counts,
            "remaining_bytes_by_state": t.bytes_by_state,
            "remaining_shm_used_bytes": scan.shm_total_bytes - scan.shm_free_bytes,
            "remaining_shm_free_bytes": scan.shm_free_bytes,
            "sightings_stored": scan.sightings.stored,
        }
        self.app.warnings.append(
            f"stopped before its end ({why}): the listing holds what was judged by then; "
            "what a --delete under way did is not listed"
        )
        self._close(rest, False)


class RawListing:
    """``--raw``: one line per entry as it is judged, nothing else on stdout."""

    def __init__(self, app: App, scan: Scan) -> None:
        self.out = Out()

    def add(self, seg: SegmentInfo, row: int) -> None:
        self.out.write(raw_row(seg))

    def finish(
        self,
        scan: Scan,
        before: Tally,
        after: Tally,
        deleted: list[Deletion],
        code: ExitCode,
        done_rows: set[int],
        usage: tuple[int, int],
    ) -> None:
        self.out.flush()


class HumanListing:
    """Tallies and the entries that matter most (bounded); with ``--all`` every row, spooled."""

    def __init__(self, app: App, scan: Scan, all_rows: bool, check: bool, min_age_s: float = 600.0) -> None:
        self.app, self.check, self.min_age_s = app, check, min_age_s
        self.youngest_unproven: float | None = None  # age of the youngest leaked entry --min-age still keeps
        self.notable: list[tuple[tuple[int, int, int], SegmentInfo, int]] = []  # min-heap: least notable on top
        # Unlinked at creation, closed in finish(): --all keeps its rows on disk, not in memory.
        self.spool: IO[str] | None = None
        if all_rows:
            import tempfile  # only --all spools: not part of every gc's start-up

            self.spool = tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape")  # noqa: SIM115
        self.spool_buf: list[str] = []

    def add(self, seg: SegmentInfo, row: int) -> None:
        state = seg.state._value_
        if state == "leaked" and not seg.proven_dead:
            young = self.youngest_unproven
            if young is None or seg.age_s < young:
                self.youngest_unproven = seg.age_s
        rank = _RANK.get(state)
        if rank is not None:
            notable = self.notable
            if len(notable) < NOTABLE:
                heapq.heappush(notable, ((-rank, seg.allocated_bytes, -row), seg, row))
            else:
                # Rows only grow, so a later entry never beats an equal one: rank, then bytes decide
                # (the key of the heap, compared without building a tuple per entry).
                least = notable[0][0]
                if -rank > least[0] or (-rank == least[0] and seg.allocated_bytes > least[1]):
                    heapq.heapreplace(notable, ((-rank, seg.allocated_bytes, -row), seg, row))
        if self.spool is not None:
            self.spool_buf.append(_row(seg))
            if len(self.spool_buf) >= _FLUSH:
                self.spool.write("".join(self.spool_buf))
                self.spool_buf = []

    def finish(
        self,
        scan: Scan,
        before: Tally,
        after: Tally,
        deleted: list[Deletion],
        code: ExitCode,
        done_rows: set[int],
        usage: tuple[int, int],
    ) -> None:
        app, out = self.app, Out()
        if app.silent(code):
            return
        app.console.file.flush()
        gone = [d for d in deleted if d.deleted]
        done_inos = {d.ino for d in gone}
        style = "bold green"
        if code == ExitCode.UNDETERMINED:
            style = "bold yellow"
        elif code != ExitCode.OK or after.counts["leaked"] or after.counts["hazard"]:
            style = "bold red"
        cols = width(app.console)
        prose(app.console, Text(headline(scan, before, after, deleted, self.check, code), style=style), 2)
        for title, cells in (
            ("state", _tally_cells(after.counts, after.bytes_by_state)),
            ("kind", _tally_cells(after.counts_by_kind, after.bytes_by_kind)),
        ):
            if gone and title == "state":
                cells.append(f"deleted {len(gone)} ({human_size(sum(d.freed_bytes for d in gone))} freed)")
            prose(app.console, Text(f"by {title}: " + (", ".join(cells) or "none")), 4)
        top = [(seg, row) for _, seg, row in sorted(self.notable, reverse=True)]
        listed: set[int] = set()  # the inodes of the rows marked deleted below: their deletion is said once
        if self.spool is not None:
            # One listing: every row once, the reason under each entry that matters most.
            why = {row: seg.reason for seg, row in top}
            self.spool.write("".join(self.spool_buf))
            self.spool.seek(0)
            out.write(HEADER)
            for i, line in enumerate(self.spool):  # the scan's story, with what --delete did to it
                out.write(fit_row(f"{'deleted':<10}{line[10:]}" if i in done_rows else line, cols))
                if i in why:
                    out.write(why_line(why[i], cols))
            out.flush()
            self.spool.close()
        elif top:
            more = f"{len(top)} of {before.total - before.counts['in_flight']}"
            app.console.print(Text(f"entries that matter most ({more}; --all lists every entry):"))
            out.write(HEADER)
            for seg, _ in top:
                was = "deleted" if seg.ino in done_inos and seg.state.value in ("leaked", "stale") else None
                if was:
                    listed.add(seg.ino)
                out.write(fit_row(_row(seg, was), cols))
                out.write(why_line(seg.reason, cols))
            out.flush()
        _deletions(app, deleted, all_rows=self.spool is not None, listed=listed)
        used, free = usage  # read again after any delete
        prose(
            app.console,
            Text(
                f"{display(scan.opts.shm_dir)}: {human_size(used)} used of {human_size(scan.shm_total_bytes)}, "
                f"{human_size(free)} free; "
                f"reclaimable now {human_size(after.reclaimable_bytes)}"
            ),
            2,
        )
        if after.counts["leaked"] and not app.quiet:
            self._reap_hint(scan, deleted)

    def _reap_hint(self, scan: Scan, deleted: list[Deletion]) -> None:
        """How to reap what is left leaked, and when: a later run reaps at once what a pid check proves dead
        and this run saw (it stored its sightings); --min-age waits for the rest (--assume-dead proves nothing)."""
        argv = ["smgshm", "gc", "--shm-dir", scan.opts.shm_dir, "--delete"]
        argv += ["--assume-dead"] if scan.opts.assume_dead else []
        proves = not scan.opts.assume_dead and scan.sightings.stored
        young = [d for d in deleted if d.kept == "too_young"]
        if deleted and (not young or self.youngest_unproven is None):
            return  # the leaked left were kept for another reason (another user's, held since): each line says
        if proves and deleted:
            hint(
                self.app,
                "the leaked kept by --min-age were first seen by this run, after its pid check; the next run's "
                "check comes after this sighting, so it reaps them at once:",
            )
        elif proves:
            hint(
                self.app, "reap them with (at once, whatever their age: this run saw them before that run's pid check):"
            )
        elif self.youngest_unproven is not None:
            wait = human_duration(max(0.0, self.min_age_s - self.youngest_unproven))
            why = (
                "--assume-dead proves no producer dead"
                if scan.opts.assume_dead
                else "this run could not store its sightings"
            )
            hint(
                self.app,
                f"{why}, so --min-age ({human_duration(self.min_age_s)}) keeps each until it is that old: "
                f"the youngest is reclaimable in {wait}; reap them with:",
            )
        else:
            hint(self.app, "reap them with:")
        command(self.app.err_console, argv, 6)


def headline(scan: Scan, before: Tally, after: Tally, deleted: list[Deletion], check: bool, code: ExitCode) -> str:
    """The first line; it agrees with the exit code (a --check verdict says passed, failed or inconclusive)."""
    where = display(scan.opts.shm_dir)
    states = ", ".join(f"{n} {k}" for k, n in after.counts.items() if n) or "none"
    gone = [d for d in deleted if d.deleted]
    if deleted:
        freed = human_size(sum(d.freed_bytes for d in gone))
        kept = len(deleted) - len(gone)
        text = (
            f"deleted {len(gone)}, freed {freed}{f', kept {kept}' if kept else ''}; "
            f"{after.total} SMG segment(s) left in {where}: {states}"
        )
    else:
        text = f"{after.total} SMG segment(s) in {where}: {states}"
    if check and code == ExitCode.UNDETERMINED:
        return f"check inconclusive: {text}; {unjudged(scan)}"
    if check:
        bad = after.counts["leaked"] + after.counts["hazard"]
        text = ("check failed: " if code != ExitCode.OK else "check passed: ") + text
        if bad:
            text += f" ({bad} leaked or hazardous)"
    return text


def warn_sightings(app: App, stores: list[Sightings]) -> None:
    """Said once a run: a state dir refused (not this user's private dir: nothing stored; it is never
    chmod'ed), and each store that was full (the first sightings it dropped)."""
    for refused in dict.fromkeys(s.refused for s in stores if s.refused):
        app.warn_state_dir(refused)
    for s in stores:  # the store is bounded (sightings.MAX_RECORDS): what it could not hold is said, not lost silently
        if s.dropped:
            app.warn(f"sightings store of {display(s.shm_dir)} full: {s.dropped} first sightings not stored")


def unjudged(scan: Scan) -> str:
    """Why a --check whose entries are all unknown judged nothing: the reason pids could not be trusted
    when that is it (the same for every entry), else each entry's own (listed under it)."""
    trust = scan.trust
    if not trust.trusted and not scan.opts.assume_dead:
        why = trust.note
    elif trust.doubt_uids and not scan.opts.assume_dead:
        uids = ", ".join(map(str, sorted(trust.doubt_uids)))
        why = f"the pid namespaces of uid {uids}'s processes cannot be read"
    else:
        why = "each entry's reason says why"
    return f"nothing could be judged: {why}"


def _deletions(app: App, deleted: list[Deletion], all_rows: bool, listed: set[int]) -> None:
    """What --delete did, each segment once: --all marked every deleted row in its listing, the entries
    that matter most marked theirs (``listed``): here what was kept, and why, and any deleted not marked."""
    if all_rows:
        deleted = [d for d in deleted if not d.deleted]
    deleted = [d for d in deleted if not (d.deleted and d.ino in listed)]
    if not deleted:
        return
    out, cols = Out(), width(app.console)
    shown = deleted if all_rows else deleted[:NOTABLE]
    for d in shown:
        if d.deleted:
            out.write(
                fill(f"deleted {display(d.name)}: freed {human_size(d.freed_bytes)} ({escape(d.reason)})", cols, 2)
                + "\n"
            )
        else:
            out.write(fill(f"kept {display(d.name)}: {escape(d.reason)}", cols, 2) + "\n")
    if not all_rows and len(shown) < len(deleted):
        out.write(f"... and {len(deleted) - len(shown)} more (--all lists them, --json has them all)\n")
    out.flush()


def confirm_delete(
    app: App, chosen: list[SegmentInfo], yes: bool, all_rows: bool, pods: list[str] | None = None
) -> bool:
    """gc's one question, for ``gc --delete`` and ``gc --node --delete`` alike: say what will be deleted
    and, at a terminal without --yes, ask once. False when the answer was not yes (said on stderr): a
    declined delete is a listing, exit 0 (3 with --check), never click's "Aborted!" and exit 1."""
    ask = not yes and sys.stdin.isatty() and not app.json
    if ask or not (app.json or app.quiet):  # a question always comes with what it is about
        will_delete(app, chosen, all_rows, pods)
    if ask and not app.confirm(f"delete these {len(chosen)} segment(s)?"):
        app.err_console.print(Text("nothing deleted: the answer was not yes"))
        return False
    return True


def will_delete(app: App, chosen: list[SegmentInfo], all_rows: bool, pods: list[str] | None = None) -> None:
    """Before anything is deleted, on stderr: which entries, and what they hold; with ``pods`` (gc --node:
    each entry's ``pod namespace/name``, or ``no pod``) which pod's tmpfs each is in."""
    total = sum(s.frees_bytes for s in chosen)
    app.err_console.print(Text(f"will delete {len(chosen)} segment(s), {human_size(total)}:"))
    shown = chosen if all_rows else chosen[:NOTABLE]
    err, cols = Out(sys.stderr), width(app.err_console)
    for i, s in enumerate(shown):
        where = "" if pods is None else f" in {display(pods[i])}"
        line = f"  {display(s.name)}{where}  {human_size(s.allocated_bytes)}, {s.state.value}: {escape(s.reason)}"
        err.write(fill(line, cols, 4) + "\n")
    if len(shown) < len(chosen):
        err.write(f"  ... and {len(chosen) - len(shown)} more (--all lists them)\n")
    err.flush()


def gc_watch_line(app: App, total: int, counts: dict[str, int], growth: dict[str, int] | None) -> None:
    if app.json:
        return
    parts = [f"{k} {n}" + (f" ({growth[k]:+d})" if growth and growth.get(k) else "") for k, n in counts.items()]
    stamp = time.strftime("%H:%M:%S")
    prose(app.console, Text(f"{stamp} {total} segments: " + ", ".join(parts)), 9)


def gc_watch_stopped(app: App, signame: str, scans: int, growth: dict[str, int]) -> None:
    """On stderr, once a signal ended gc --watch: after how many scans, and what grew since the first."""
    if app.json or app.quiet:
        return
    grew = ", ".join(f"{k} {n:+d}" for k, n in growth.items() if n) or "none"
    prose(
        app.err_console,
        Text(f"gc --watch: stopped by {signame} after {scans} scan(s); growth since the first: {grew}"),
        2,
    )


class Progress:
    """Progress on a TTY stderr for the whole run (scan, then delete); it appears only once the
    run has taken half a second, so a handful of entries never shows a bar."""

    DELAY_S = 0.5

    def __init__(self, app: App, stdout_streams: bool) -> None:
        self.enabled = not (app.json or app.quiet or not app.err_console.is_terminal) and not (
            stdout_streams and app.console.is_terminal
        )
        self.app, self.t0 = app, time.monotonic()
        self.bar: Bar | None = None
        self.task: TaskID | None = None
        self.phase = ""

    def __call__(self, done: int, total: int | None = None, phase: str = "scanned") -> None:
        if not self.enabled or time.monotonic() - self.t0 < self.DELAY_S:
            return
        bar = self.bar
        if bar is None:
            from rich.progress import Progress as Bar

            bar = self.bar = Bar(console=self.app.err_console, transient=True)
            bar.start()
        if phase != self.phase or self.task is None:  # (the first call's phase is never "": a task then)
            self.task = bar.add_task(phase, total=total)
            self.phase = phase
        bar.update(self.task, completed=done, total=total)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


__all__ = [
    "HEADER",
    "HEAD_WIDTH",
    "HumanListing",
    "JsonListing",
    "Progress",
    "RawListing",
    "confirm_delete",
    "deletion_doc",
    "display",
    "fit_row",
    "gc_watch_line",
    "gc_watch_stopped",
    "headline",
    "raw_row",
    "segment_doc",
    "segment_docs",
    "why_line",
    "will_delete",
]


def npd(after: Tally, deleted: int, untrusted: str, where: str = "") -> int:
    """gc --check --npd's line and status (core/node/npd.py's gc_verdict, said once)."""
    from smgshm.cli.npd import npd_say
    from smgshm.core.node.npd import gc_verdict

    return npd_say(gc_verdict(after.counts, after.bytes_by_state, deleted, untrusted, where))
