"""The three independent accounts of what a gateway did with a request's tensors.

- **metrics**: the gateway's own counters (``smg_mm_tensors_total`` and friends), as a
  delta of two scrapes around the requests;
- **shm dir**: the gateway pid's segments appearing and vanishing (inotify, core/shmwatch),
  when the gateway runs on this host;
- **receipts**: what a smgshm ``serve`` worker says it received, per tensor.

Each is collected on its own and may be unavailable (with the reason); e2e_verdict
compares them. None of them compares bytes: the gateway computes the pixels, so
this is evidence about the path, never a claim that the bytes were verified.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smgshm.core.address import UrlError, parse_url
from smgshm.core.closed import Closed
from smgshm.core.errors import SmgshmError
from smgshm.core.fanout import fan_out
from smgshm.core.gateway.metrics import MetricsSnapshot, UnusableCounterError, mm_delta
from smgshm.core.host.proc import comm
from smgshm.core.names import GATEWAY_PREFIX, gateway_probe_name
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.watch.life import End

if TYPE_CHECKING:
    from smgshm.core.watch.life import SegmentLife


@dataclass(frozen=True)
class MetricsEvidence:
    """The gateway's counters across the requests (a delta)."""

    url: str
    available: bool
    note: str = ""  # why it is unavailable, or what is odd
    tensors: dict[str, int] = field(default_factory=dict)  # by path: inline | shm | remote
    nbytes: dict[str, int] = field(default_factory=dict)
    shm_write_failures: int = 0
    processing: dict[str, int] = field(default_factory=dict)  # by mode: router | worker
    owner: str = ""  # why these counters are the tested gateway's own (e2e/owner.py)

    @property
    def total(self) -> int:
        return sum(self.tensors.values())


class Kept(Closed):
    """A segment e2e saw whose life had not ended when the requests had."""

    LEFT_BEHIND = "left_behind"  # still in the shm dir after the requests


@dataclass(frozen=True)
class SegmentSeen:
    """One gateway segment seen in the shm dir during the requests."""

    name: str  # os.fsdecode form; shown escaped
    nbytes: int | None
    in_flight_ms: float  # created until removed (or until the end, if still there)
    end: End | Kept
    reads: int = 0


@dataclass(frozen=True)
class ShmDirEvidence:
    available: bool
    note: str = ""
    shm_dir: str = DEFAULT_SHM_DIR
    gateway_pid: int | None = None
    segments: list[SegmentSeen] = field(default_factory=list)
    probe_file_left: str = ""  # smg-tokenspeed-probe-<pid>: the gateway's writability probe will fail
    # The pid its names carry: gateway_pid as its own pid namespace sees it (a container's 1).
    name_pid: int | None = None

    @property
    def left_behind(self) -> list[SegmentSeen]:
        return [s for s in self.segments if s.end == Kept.LEFT_BEHIND]

    @property
    def removed_unread(self) -> list[SegmentSeen]:
        """Segments the gateway itself removed before any reader: a failed write's partial file (SMG
        unlinks it and sends the bytes inline) or a handle it cleaned up after a failed send."""
        return [s for s in self.segments if s.end == End.CLEANED and not s.reads]


@dataclass(frozen=True)
class ReceiptSeen:
    worker: str
    key: str
    payload_kind: str
    nbytes: int
    shm_name: str = ""
    age_ms: float = 0.0  # gateway write to worker read (from the nanos in the name)
    read_ms: float = 0.0
    unlinked: bool = False
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True)
class ReceiptEvidence:
    available: bool
    note: str = ""
    workers: list[str] = field(default_factory=list)  # the smgshm workers whose receipts these are
    receipts: list[ReceiptSeen] = field(default_factory=list)
    # A worker that answered before the requests did not after (it died): its receipts are
    # missing, so the count cannot be compared, though what is here still tells a story.
    partial: bool = False

    def count(self, kind: str) -> int:
        return sum(1 for r in self.receipts if r.payload_kind == kind)


# -- metrics -------------------------------------------------------------------------------


def metrics_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> MetricsEvidence:
    try:
        t = mm_delta(before, after)
    except UnusableCounterError as err:  # a NaN/Inf counter: this account says nothing, and says why
        return MetricsEvidence(after.url, available=False, note=err.what)
    note = "" if t.exported else "the gateway exports no smg_mm_* counters (no multimodal tensor was ever metered)"
    return MetricsEvidence(
        after.url,
        available=t.exported,
        note=note,
        tensors={k: v for k, v in t.tensors.items() if v},
        nbytes={k: v for k, v in t.nbytes.items() if v},
        shm_write_failures=t.shm_write_failures,
        processing={k: v for k, v in t.processing.items() if v},
    )


# -- the shm dir -----------------------------------------------------------------------------


def listening_pid(url: str) -> int | None:
    """The pid listening on ``url``'s port on this host, if this user may see it."""
    import psutil

    try:
        port = parse_url(url).port
    except UrlError:
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    pids = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    return pids.pop() if len(pids) == 1 else None


class SegmentWatch:
    """Follows the gateway prefix in the shm dir on a thread while requests run."""

    def __init__(self, shm_dir: str = DEFAULT_SHM_DIR) -> None:
        from smgshm.core.watch.follow import SegmentTracker, ShmWatcher

        self.shm_dir = shm_dir
        self.watcher = ShmWatcher(shm_dir, GATEWAY_PREFIX, listing=True)
        self.tracker = SegmentTracker(max_tracked=10_000)
        self.done: list[SegmentLife] = []
        self.error = ""
        self.writers: dict[int, tuple[int, bool | None]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smgshm-e2e-watch", daemon=True)

    def __enter__(self) -> SegmentWatch:
        self.writers = _gateway_writers(self.shm_dir)  # a gateway that exits meanwhile still counts
        self.watcher.open()
        self.done.extend(self.tracker.feed(self.watcher.events(0)))  # the listing of what was there
        self.start_ns = time.time_ns()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.done.extend(self.tracker.feed(self.watcher.events(0.05)))
        except SmgshmError as err:
            self.error = str(err)

    def settle(self, quiet_s: float = 0.15) -> None:
        """Give events already on their way a moment to arrive (bounded)."""
        time.sleep(quiet_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(SmgshmError):
            self.done.extend(self.tracker.feed(self.watcher.events(0)))
        self.watcher.close()

    def evidence(self, pid: int | None) -> ShmDirEvidence:
        """The segments of producer ``pid`` whose creation was seen, and what became of them."""
        import os

        if self.error:
            return ShmDirEvidence(False, f"watching {self.shm_dir} failed: {self.error}", self.shm_dir, pid)
        if pid is None:
            return ShmDirEvidence(False, "the gateway's pid is not visible from here", self.shm_dir, None)
        name_pid = _name_pid(pid)
        lives = [lv for lv in self.done if getattr(lv, "producer_pid", None) == name_pid]
        lives += [lv for lv in self.tracker.in_flight() if lv.producer_pid == name_pid]
        seen = []
        for lv in lives:
            if not lv.observed or lv.kind != "gateway":  # there before we looked, or the probe file
                continue
            end = (lv.end or End.UNKNOWN) if lv.removed_ns is not None else Kept.LEFT_BEHIND
            seen.append(SegmentSeen(lv.name, lv.nbytes, lv.in_flight_ns / 1e6, end, lv.reads))
        doubt = self._doubt(pid, name_pid) if seen else ""
        if doubt:
            return ShmDirEvidence(False, doubt, self.shm_dir, pid, name_pid=name_pid)
        probe = gateway_probe_name(name_pid)
        left = probe if os.path.lexists(os.path.join(self.shm_dir, probe)) else ""
        return ShmDirEvidence(True, "", self.shm_dir, pid, sorted(seen, key=lambda s: s.name), left, name_pid)

    def _doubt(self, pid: int, name_pid: int) -> str:
        """Why the segments named with ``name_pid`` cannot be credited to gateway ``pid`` ("" when they can).

        A name carries only the pid its writer has in its own pid namespace: two containers' pid-1
        gateways over one shm dir write the same pid. A segment is credited only when no other gateway
        (one seen at the start of the watch or now) could have written it: one whose names carry
        another pid, or whose /dev/shm is another filesystem, could not; one that cannot be looked
        at could. Never a guess: in doubt, the shm dir is no evidence."""
        writers = {**self.writers, **_gateway_writers(self.shm_dir)}
        if writers.get(pid, (name_pid, _writes_into(pid, self.shm_dir)))[1] is False:
            return f"gateway pid {pid} writes another /dev/shm: the segments named with pid {name_pid} here are not its"
        rivals = sorted(p for p, (n, into) in writers.items() if p != pid and n == name_pid and into is not False)
        if rivals:
            return (
                f"cannot tell its segments from those of gateway pid {', '.join(map(str, rivals))}: each is pid "
                f"{name_pid} in its own pid namespace and may write {self.shm_dir}"
            )
        # Any process can write SMG's names, titled smg::router or not: one with the same pid in its own
        # namespace that may write here is as much a writer of them as a gateway.
        others = _same_pid_writers(pid, name_pid, self.shm_dir)
        if not others:
            return ""
        shown = ", ".join(f"{p} ({comm(p)})" for p in others[:3]) + (", ..." if len(others) > 3 else "")
        return (
            f"cannot tell its segments from those of process(es) {shown}: each is pid {name_pid} in its own "
            f"pid namespace and may write {self.shm_dir}"
        )


def _writes_into(pid: int, shm_dir: str) -> bool | None:
    """Whether process ``pid``'s /dev/shm (where SMG's gateway writes, whatever else) is ``shm_dir``'s
    filesystem; None when that cannot be told (gone, or its root is not ours to look at)."""
    try:
        here = os.stat(shm_dir).st_dev
        there = os.stat(f"/proc/{pid}/root/dev/shm").st_dev
    except (FileNotFoundError, NotADirectoryError):
        return False if os.path.exists(f"/proc/{pid}") else None  # no /dev/shm where it lives
    except OSError:
        return None
    return here == there


def _gateway_writers(shm_dir: str) -> dict[int, tuple[int, bool | None]]:
    """Every gateway (``smg::router``) visible here: (the pid its names carry, whether it writes ``shm_dir``)."""
    from smgshm.core.gateway.running import gateway_pids

    out = {}
    for pid in gateway_pids():
        name_pid = _name_pid(pid)
        out[pid] = (name_pid, _writes_into(pid, shm_dir))
    return out


def _same_pid_writers(pid: int, name_pid: int, shm_dir: str) -> list[int]:
    """Every other process here that has ``name_pid`` in its own pid namespace and whose /dev/shm is
    ``shm_dir``'s filesystem: each could write the names credited to gateway ``pid``. Kernel threads write
    no files. Unlike a gateway's (titled smg::router, counted when it cannot be looked at), an untitled
    process counts only when its /dev/shm is seen to be this one: a process whose root cannot be read (one
    outside this user namespace, as some VMs' pid 1) would otherwise make every pid-1 gateway's names
    doubtful forever."""
    from smgshm.core.host.proc import innermost_pid, is_kernel_thread, live_pids

    out = []
    for p in live_pids():
        if p == pid:
            continue
        try:
            if innermost_pid(p) != name_pid:
                continue
        except OSError:
            continue  # gone
        if not is_kernel_thread(p) and _writes_into(p, shm_dir) is True:
            out.append(p)
    return out


def _name_pid(pid: int) -> int:
    """The pid gateway ``pid`` writes in its names: its own in its pid namespace (NSpid)."""
    from smgshm.core.host.proc import innermost_pid

    try:
        inner = innermost_pid(pid)
    except OSError:  # gone meanwhile: its names, if any, carry the pid it had here or inside
        return pid
    return pid if inner is None else inner


# -- receipts ----------------------------------------------------------------------------------


MAX_RECEIPT_WORKERS = 16  # workers asked for receipts, all at once; a gateway listing more gets the rest skipped


@dataclass(frozen=True)
class ReceiptBaseline:
    """Where each worker's receipts stood before the requests, and how many workers were not asked."""

    next_seq: dict[str, int]  # the workers that answered as smgshm serves (others are left out)
    skipped: int = 0  # workers past MAX_RECEIPT_WORKERS


def _ask_all(after: dict[str, int], timeout_s: float) -> dict[str, tuple[list[Any], int] | SmgshmError]:
    """fetch_receipts on every address at once: the whole takes one ``timeout_s``, not one per worker."""
    from smgshm.core.receiver.receipts import fetch_receipts

    def one(addr: str) -> tuple[list[Any], int] | SmgshmError:
        try:
            return fetch_receipts(addr, after[addr], timeout_s)
        except SmgshmError as err:
            return err

    if not after:
        return {}
    return dict(zip(after, fan_out(one, list(after), len(after), "smgshm-receipts"), strict=True))


def receipt_baseline(addresses: list[str], timeout_s: float) -> ReceiptBaseline:
    """The next receipt seq of each worker that is a smgshm serve, asking at most MAX_RECEIPT_WORKERS."""
    unique = list(dict.fromkeys(addresses))
    asked = unique[:MAX_RECEIPT_WORKERS]
    got = _ask_all(dict.fromkeys(asked, 0), timeout_s)
    return ReceiptBaseline(
        {a: r[1] for a, r in got.items() if not isinstance(r, SmgshmError)}, len(unique) - len(asked)
    )


def receipts_since(baseline: ReceiptBaseline, timeout_s: float) -> ReceiptEvidence:
    skipped = (
        f"{baseline.skipped} more worker(s) not asked (at most {MAX_RECEIPT_WORKERS} are)" if baseline.skipped else ""
    )
    if not baseline.next_seq:
        note = "no worker answers smgshm's Receipts RPC (not a smgshm serve)"
        return ReceiptEvidence(False, "; ".join(n for n in (note, skipped) if n))
    seen: list[ReceiptSeen] = []
    notes = []
    answered = []
    for addr, got in _ask_all(baseline.next_seq, timeout_s).items():
        if isinstance(got, SmgshmError):
            notes.append(f"{addr}: {got}")  # e.g. a worker that died mid-request
            continue
        answered.append(addr)
        for r in got[0]:
            seen.append(
                ReceiptSeen(
                    addr,
                    r.key,
                    r.payload_kind,
                    r.nbytes,
                    r.shm_name,
                    r.age_ns / 1e6,
                    r.read_ns / 1e6,
                    r.unlinked,
                    r.error_code,
                    r.error_message,
                )
            )
    if skipped:
        notes.append(skipped)  # their receipts are missing: the count cannot be compared
    if not answered:
        return ReceiptEvidence(False, "; ".join(notes))
    return ReceiptEvidence(True, "; ".join(notes), answered, seen, partial=bool(notes))
