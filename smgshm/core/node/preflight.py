"""``smgshm preflight``: before SMG's gateway starts, reclaim what provably belongs to a previous
incarnation, then check that the gateway may start (its namespace id, its probe, the space it needs).

Why. A memory emptyDir outlives container restarts, and SMG's gateway never sweeps a name that
carries its own pid (smg-facts §3.3): a gateway restarted as pid 1 leaves every ``smg-tokenspeed-1-*``
of its previous life in place, and a leftover ``smg-tokenspeed-probe-1`` silently turns its SHM off.

What proves a name dead, without a clock (each proof is named in the report's ``proof``):

- **wrapper** (``preflight -- smg launch ...``): preflight is pid P, has written nothing, and
  replaces itself with the gateway (exec keeps P). So a name carrying P was written by an earlier
  process that held P *in this pid namespace*, and that process is dead. It holds only if every
  process that writes SMG names in this tmpfs is in this pid namespace. In the host's initial pid
  namespace gc's own walk (host/pidtrust.py) sees every other one; in a container's it cannot see
  its siblings, so the operator must say ``--pod-private``, and even then nothing is reclaimed by
  pid when a process preflight can see, in another pid namespace, reaches the tmpfs, or when this
  container shares the host's IPC namespace (``--ipc=host``, ``hostIPC``: its /dev/shm is the
  host's). Names of other pids are judged by gc's rules (segments/judge.py) under the same trust.
- **init container** (``preflight --init-container``): Kubernetes runs it before any app
  container of the pod, so no SMG process of this pod runs and every SMG name in the pod's tmpfs
  is a previous incarnation's. Refused (nothing reclaimed) when a process other than preflight and
  its parents reaches the tmpfs, or the IPC namespace is the host's.
- **standalone** (neither): gc's rules only, nothing by preflight's own pid.

What it reclaims, and when: the wrapper and the init container own the pod's tmpfs, so they reclaim;
a standalone run (a node-problem-detector check, a cron job, an operator's look) is read-only unless
asked by name (``reclaim``): it reports what it would reclaim and leaves it (a monitoring check must
never delete). Whoever reclaims keeps gc's owner rule: another user's segment goes only when root
says ``all_users``, as ``gc --delete --all-users``.

What it may touch: only entries whose names parse as SMG's (segments/judge.py), regular files, held
by nobody, unlinked by gc's set-aside-verify-unlink steps (segments/reaping.py); nothing else.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from smgshm.core.causes import Cause, Found, Where, found
from smgshm.core.host.holders import Holder, holder_index
from smgshm.core.host.identity import HostIdentity, probe_writable, read_host_identity
from smgshm.core.host.pidtrust import INIT_PID_NS, Trust, first_user, judge_trust, judge_visible_trust
from smgshm.core.host.proc import comm, live_pids
from smgshm.core.names import gateway_probe_name
from smgshm.core.paths import DEFAULT_SHM_DIR
from smgshm.core.segments import gcrun
from smgshm.core.segments.judge import Bounds, Judge, ScanOptions, SegmentInfo, State
from smgshm.core.segments.reaping import OTHER_USER, ReapReport, ReapRule, keep_reason, reapable
from smgshm.core.segments.scan import Scan
from smgshm.core.units import human_size

if TYPE_CHECKING:
    from smgshm.core.segments.sightings import Sightings

Mode = Literal["wrapper", "init_container", "standalone"]
Verdict = Literal["ok", "unknown", "fail"]
INIT_IPC_NS = "ipc:[4026531839]"  # PROC_IPC_INIT_INO: the host's IPC namespace (--ipc=host, hostIPC)
LISTED = 100  # names listed per group in a report; the counts cover the rest


@dataclass(frozen=True)
class PreflightRequest:
    shm_dir: str
    mode: Mode
    pod_private: bool = False
    inflight_bytes: int = 0
    tensor_bytes: tuple[int, ...] = ()
    min_age_s: float = 600.0  # for names judged by gc's rules only (as gc --delete); a proof needs no age
    timeout_s: float = 10.0
    reclaim: bool = False  # standalone: reclaim (else report only); the wrapper and init container always do
    all_users: bool = False  # as root, other users' segments too (gc's --all-users)
    # A failed check only degrades (SMG falls back to inline when its probe or SHM writes fail: speed, not
    # service), so the gateway may start; require_shm makes it a gate: a failed check means it must not.
    require_shm: bool = False

    @property
    def reclaims(self) -> bool:
        """Whether this run unlinks anything: asked by name, or a mode that owns the pod's tmpfs."""
        return self.reclaim or self.mode != "standalone"


@dataclass(frozen=True)
class Proof:
    """The proof a run relies on (``pid``: the wrapper's, ``init_container``, ``none``) and whether it holds here."""

    rule: str
    holds: bool
    note: str


@dataclass(frozen=True)
class Entry:
    """A name reclaimed (``freed_bytes``) or kept (``state``, ``reason``: why not)."""

    name: str
    kind: str
    state: str
    nbytes: int
    producer_pid: int | None
    reason: str
    freed_bytes: int = 0


@dataclass
class PreflightReport:
    # fail: SHM will (or may) be off and the gateway serves inline: it may start all the same, unless require_shm
    verdict: Verdict  # ok: may start; unknown: may start, something could not be judged; fail: a check failed
    may_start: bool
    mode: Mode
    shm_dir: str
    pid: int  # preflight's, and in wrapper mode the gateway's
    pid_namespace: str
    ipc_namespace: str
    proof: Proof
    causes: list[Found] = field(default_factory=list)
    namespace_id: str = ""
    fstype: str = ""
    writable: bool | None = None
    write_error: str | None = None
    probe_file: str | None = None  # wrapper: the gateway's probe name, checked absent after reclaiming
    shm_total_bytes: int = 0
    shm_free_bytes: int = 0  # after reclaiming
    need_bytes: int = 0  # max(--inflight-bytes, largest --tensor-bytes), whole pages
    reclaimed_count: int = 0
    reclaimed_bytes: int = 0
    reclaimed: list[Entry] = field(default_factory=list)  # the first LISTED
    reclaims: bool = True  # false: a read-only run (standalone without --reclaim), which deletes nothing
    would_reclaim_count: int = 0  # read-only: what a reclaiming run would try to unlink
    would_reclaim_bytes: int = 0
    would_reclaim: list[Entry] = field(default_factory=list)  # the first LISTED
    kept_counts: dict[str, int] = field(default_factory=dict)  # by state
    kept_bytes: int = 0
    kept: list[Entry] = field(default_factory=list)  # the first LISTED, unknown ones first
    notes: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0
    require_shm: bool = False  # the run was a gate (--require-shm): a failed check stops the gateway
    # wrapper: the command exec'd once this document is written (argv[0]); that it starts is not known here
    exec_next: str | None = None
    _done: ReapReport | None = field(default=None, repr=False)  # for the textfile (segments/textfile.py); not JSON


# Every cause preflight's checks can find: each turns (or, not checked, may turn) the gateway's SHM off.
DEGRADING = (
    Cause.SHM_TOO_SMALL,
    Cause.SHM_FULL,
    Cause.SHM_PERMISSION,
    Cause.PROBE_FILE_LEFT,
    Cause.LOCAL_ID_UNREADABLE,
    Cause.PREFLIGHT_TIMEOUT,
)


def degraded_by(report: PreflightReport) -> dict[str, bool]:
    """Each cause preflight can find, and whether this run found it (its textfile's shm_degraded)."""
    codes = {c.code for c in report.causes}
    return {c.value: c.value in codes for c in DEGRADING}


SETTLE_S = 5.0  # after the deadline, how long a reclaim batch under way may take to finish


class _TimedOutError(Exception):
    """The deadline passed between two steps: nothing more is done."""


def _ns(kind: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


def _parents() -> set[int]:
    """This process and its parent chain, as far as /proc shows it (ppid 0: outside this pid namespace)."""
    chain, pid = set(), os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def decide_proof(req: PreflightRequest) -> tuple[Proof, Trust]:
    """Which proof this run may use, and the trust the pid judgement runs under (see the module)."""
    shm_dir, mine, ipc = req.shm_dir, _ns("pid"), _ns("ipc")
    host_ipc = mine != INIT_PID_NS and ipc == INIT_IPC_NS
    shared = (
        "this container shares the host's IPC namespace (--ipc=host, hostIPC): its /dev/shm is the host's, "
        "written by processes of other pid namespaces"
    )
    if req.mode == "init_container":
        if host_ipc:
            return Proof("init_container", False, shared), Trust(False, shared)
        user = first_user(shm_dir, (p for p in live_pids() if p not in _parents()))
        if user is not None:
            pid, how = user
            why = (
                f"pid {pid} ({comm(pid) or '?'}) {how}: an SMG process of this pod may be running, so the "
                "init-container proof does not hold"
            )
            return Proof("init_container", False, why), Trust(False, why)
        why = (
            "init container: no process but preflight and its parents uses this tmpfs, and Kubernetes starts no "
            "app container before it ends: every SMG name here is a previous incarnation's"
        )
        return Proof("init_container", True, why), Trust(True, why)
    rule = "pid" if req.mode == "wrapper" else "none"
    if mine == INIT_PID_NS:
        trust = judge_trust(shm_dir)  # the host's pid namespace: the walk sees every other one
    elif not req.pod_private:
        trust = Trust(
            False,
            (
                "preflight runs in a container's pid namespace and cannot see the other containers' that may write "
                "SMG names in this tmpfs: pass --pod-private if every such process is in this pid namespace"
            ),
        )
    elif host_ipc:
        trust = Trust(False, f"{shared}; --pod-private cannot hold")
    else:
        seen = judge_visible_trust(shm_dir)
        trust = (
            seen
            if not seen.trusted
            else Trust(
                True,
                (
                    "--pod-private: every process that writes SMG names here is in this pid namespace (the operator's "
                    "word), and no process preflight can see in another pid namespace reaches the tmpfs"
                ),
                seen.doubt_uids,
                seen.since_ns,
            )
        )
    if rule == "none":
        return Proof("none", trust.trusted, _no_flag(trust.note)), trust
    pid = os.getpid()
    if trust.trusted:
        why = (
            f"preflight is pid {pid}, has written nothing and execs the gateway, which keeps pid {pid}: every "
            f"name carrying pid {pid} was written by an earlier, dead process of this pid namespace ({trust.note})"
        )
    else:
        why = f"names carrying pid {pid} are not judged by it: {_no_flag(trust.note)}"
    return Proof("pid", trust.trusted, why), trust


def _no_flag(note: str) -> str:
    """gc's trust note without its advice to pass gc's --assume-dead, which preflight has not."""
    return note.replace("pass --assume-dead to judge by this namespace's pids anyway", "nothing is judged by pid")


class _Judge(Judge):
    """gc's judge, with the proof's pids dead whatever the clock says: ``dead_pid`` (the wrapper's P),
    or every pid (the init container's)."""

    def __init__(
        self,
        opts: ScanOptions,
        trust: Trust,
        holders: dict[tuple[int, int], list[Holder]],
        dev: int,
        sightings: Sightings | None,
        dead_pid: int | None,
        all_dead: bool,
    ) -> None:
        super().__init__(opts, trust, holders, dev, sightings)
        self.dead_pid, self.all_dead = dead_pid, all_dead

    def bounds(self, pid: int) -> Bounds | None:
        return None if self.all_dead or pid == self.dead_pid else super().bounds(pid)

    def _dead_reason(self, kind: str, pid: int) -> str:
        if self.all_dead:
            reason = "no SMG process of this pod runs before its init container ends: a previous incarnation's"
        elif pid == self.dead_pid:
            reason = (
                f"pid {pid} is preflight's and the gateway's it execs: an earlier process of this pid "
                "namespace that held it wrote this, and is dead"
            )
        else:
            return super()._dead_reason(kind, pid)
        self.said["dead", pid, kind] = reason
        return reason


class _Scan(Scan):
    def __init__(self, opts: ScanOptions, trust: Trust, dead_pid: int | None, all_dead: bool) -> None:
        self._given, self._dead_pid, self._all_dead = trust, dead_pid, all_dead
        super().__init__(opts)

    def make_judge(self) -> tuple[Trust, Judge]:
        trust = self._given
        judge = _Judge(
            self.opts, trust, holder_index(self.dev), self.dev, self.sightings, self._dead_pid, self._all_dead
        )
        return trust, judge


@dataclass(frozen=True)
class _ProofRule(ReapRule):
    """gc's rule for the leaked, with preflight's proof: a name it proves dead (the wrapper's pid, or every
    name in an init container) needs no age, and gc's sentences name preflight's flags, not gc's."""

    proven_pid: int | None = None
    all_proven: bool = False

    def keep(self, seg: SegmentInfo) -> tuple[str, str] | None:
        proven = self.all_proven or seg.producer_pid == self.proven_pid
        why = keep_reason(seg, uid=self.uid, all_users=self.all_users, min_age_s=0.0 if proven else self.min_age_s)
        if why and why[0] == OTHER_USER:  # (gc's sentence names gc's --all-users, which preflight has not)
            why = (
                OTHER_USER,
                f"owned by uid {seg.uid}: preflight runs as uid {self.uid}, and only root removes another's",
            )
        return None if why is None else (why[0], f"{seg.reason}; kept: {why[1]}")


def _entry(seg: SegmentInfo, reason: str | None = None, freed: int = 0) -> Entry:
    return Entry(
        seg.name, seg.kind, seg.state.value, seg.allocated_bytes, seg.producer_pid, reason or seg.reason, freed
    )


class _Run:
    """One preflight, step by step; ``check`` between steps stops it once the deadline has passed."""

    def __init__(self, req: PreflightRequest, deadline: float, cancel: threading.Event) -> None:
        self.req, self.deadline, self.cancel = req, deadline, cancel
        self.pid = os.getpid()
        self.reaping = threading.Event()  # set while a batch may hold entries set aside (segments/reaping.py)
        # Taken by the worker to start reaping and by the caller to stop it: a stop never misses a start.
        self.lock = threading.Lock()
        self.kept_class: dict[str, str] = {}  # why gc's steps kept a chosen name (reaping.KEPT_REASONS), by name
        self.would: list[SegmentInfo] = []  # read-only: what was chosen and left

    def check(self) -> None:
        if self.cancel.is_set() or time.monotonic() >= self.deadline:
            raise _TimedOutError

    def __call__(self) -> PreflightReport:
        req = self.req
        self.check()
        ident = read_host_identity(req.shm_dir)  # HostError (exit 5) when the dir cannot be read at all
        self.check()
        proof, trust = decide_proof(req)
        self.check()
        report = PreflightReport(
            "ok",
            True,
            req.mode,
            req.shm_dir,
            self.pid,
            _ns("pid"),
            _ns("ipc"),
            proof,
            namespace_id=ident.namespace_id,
            fstype=ident.fstype,
            reclaims=req.reclaims,
            require_shm=req.require_shm,
        )
        if req.reclaims:  # what a killed gc (or preflight) left set aside goes back first, to be judged as any entry
            from smgshm.core.segments.asides import restore

            owned = req.mode == "init_container" and proof.holds  # no gc runs over the pod's tmpfs either
            proven = "preflight's init-container proof: nothing else uses this tmpfs" if owned else ""
            put = restore(req.shm_dir, proven)
            if back := sum(r.restored for r in put):
                report.notes.append(f"put back under their names {back} entries a killed gc had set aside")
            report.notes.extend(f"{r.aside}: {r.reason}" for r in put if not r.restored)
            self.check()
        dead_pid = self.pid if req.mode == "wrapper" and proof.holds else None
        scan = _Scan(ScanOptions(req.shm_dir), trust, dead_pid, req.mode == "init_container" and proof.holds)
        rule = _ProofRule(
            frozenset({State.LEAKED}),
            req.min_age_s,
            req.all_users,
            proven_pid=dead_pid,
            all_proven=req.mode == "init_container",
        )
        segs: list[SegmentInfo] = []
        try:  # gc's run (segments/gcrun.py): list, choose by the proof's rule, reap, count; preflight never asks
            run = gcrun.run([scan], rule, lambda _scan: lambda seg, _row: segs.append(seg), self._go, self._between)
        finally:
            self.reaping.clear()
        done = report._done = run.parts[0].report
        want = reapable(rule.states)
        kept = [_entry(seg) for seg in segs if not want(seg)]  # never a candidate: kept as judged
        gone = {d.ino for d in done.deleted if d.deleted}
        by_ino = {s.ino: s for s in segs}
        for d in done.deleted:
            seg = by_ino[d.ino]
            if d.deleted:
                report.reclaimed_count += 1
                report.reclaimed_bytes += d.freed_bytes
                if len(report.reclaimed) < LISTED:
                    report.reclaimed.append(_entry(seg, freed=d.freed_bytes))
            else:
                kept.append(_entry(seg, d.reason))
                self.kept_class[seg.name] = d.kept
        for seg in self.would:
            report.would_reclaim_count += 1
            report.would_reclaim_bytes += seg.allocated_bytes
            if len(report.would_reclaim) < LISTED:
                report.would_reclaim.append(_entry(seg))
        self._kept(report, kept, gone)
        self._gate(report, ident, done)
        return report

    def _go(self, chosen: Sequence[tuple[Scan, SegmentInfo]]) -> bool:
        """gc's confirmation, for preflight: no question (nothing asks before a gateway starts), only the deadline
        and whether this run reclaims at all (a read-only one keeps what was chosen, as a declined gc does);
        from here a batch may hold entries set aside (``reaping``)."""
        with self.lock:
            self.check()
            if not self.req.reclaims:
                self.would = [seg for _scan, seg in chosen]
                return False
            self.reaping.set()
        return True

    def stop(self) -> bool:
        """Stop at the next step; whether a reclaim may be under way (then the caller lets its batch settle)."""
        with self.lock:
            self.cancel.set()
            return self.reaping.is_set()

    def _between(self, _tried: int, _chosen: int) -> None:
        # Called after each batch's entries are settled (none is left aside): a safe place to stop.
        if time.monotonic() >= self.deadline or self.cancel.is_set():
            raise _TimedOutError

    def _kept(self, report: PreflightReport, kept: list[Entry], gone: set[int]) -> None:
        kept.sort(key=lambda e: (e.state != "unknown", e.name))
        for e in kept:
            report.kept_counts[e.state] = report.kept_counts.get(e.state, 0) + 1
            report.kept_bytes += e.nbytes
        report.kept = kept[:LISTED]

    def _gate(self, report: PreflightReport, ident: HostIdentity, done: ReapReport) -> None:
        """What decides whether the gateway may start, after reclaiming."""
        req, page = self.req, os.sysconf("SC_PAGE_SIZE")
        total, free = ident.shm_total_bytes, done.free_bytes
        report.shm_total_bytes, report.shm_free_bytes = total, free
        if ident.fstype and ident.fstype != "tmpfs":
            report.notes.append(f"the shm dir is {ident.fstype}, not tmpfs: segments are written to that filesystem")
        if not ident.namespace_id:
            report.causes.append(
                found(
                    Cause.LOCAL_ID_UNREADABLE,
                    (
                        "the boot id or the shm dir's st_dev cannot be read: the gateway's shm_namespace_id is empty, "
                        "so auto stays inline"
                    ),
                )
            )
        if req.mode == "wrapper":
            report.probe_file = gateway_probe_name(self.pid)
            if _exists(os.path.join(req.shm_dir, report.probe_file)):
                entry = next((e for e in report.kept if e.name == report.probe_file), None)
                why = entry.reason if entry is not None else "it could not be removed"
                report.causes.append(
                    found(
                        Cause.PROBE_FILE_LEFT,
                        (
                            f"{report.probe_file} is still there ({why}): the gateway preflight starts keeps pid "
                            f"{self.pid}, its writability probe will fail (EEXIST) and SHM stays off for its life"
                        ),
                        fix=self._probe_fix(report, entry),
                    )
                )
        err = probe_writable(req.shm_dir)
        report.writable, report.write_error = err is None, err
        if err is not None:
            cause = Cause.SHM_TOO_SMALL if total < page else Cause.SHM_FULL if free < page else Cause.SHM_PERMISSION
            report.causes.append(found(cause, f"the gateway's writability probe would fail: {err}"))
        largest = max(req.tensor_bytes, default=0)
        need = max(req.inflight_bytes, largest)
        report.need_bytes = need = math.ceil(need / page) * page
        what = (
            f"--inflight-bytes {human_size(req.inflight_bytes)}"
            if req.inflight_bytes >= largest
            else f"the largest --tensor-bytes {human_size(largest)}"
        )
        if need and total < need:
            report.causes.append(
                found(
                    Cause.SHM_TOO_SMALL,
                    (
                        f"the shm dir is {human_size(total)}, smaller than {what}: the gateway's SHM writes would fail "
                        "however empty it is"
                    ),
                    fix=(
                        f"give the pod a /dev/shm of at least {human_size(need)}: an emptyDir {{medium: Memory, "
                        "sizeLimit} at /dev/shm (and container memory limits that cover it), or "
                        "docker/podman --shm-size"
                    ),
                )
            )
        elif need and free < need:
            held = (
                f"; still there: {human_size(report.kept_bytes)} of SMG names preflight could not reclaim"
                if report.kept_bytes
                else ""
            )
            if report.would_reclaim_bytes:
                held += f"; {human_size(report.would_reclaim_bytes)} of it reclaimable by preflight --reclaim"
            now = "after reclaiming" if req.reclaims else "now (nothing reclaimed: a read-only run)"
            report.causes.append(
                found(
                    Cause.SHM_FULL,
                    f"{now}, {human_size(free)} of the shm dir's {human_size(total)} is free, less than {what}{held}",
                    Where(req.shm_dir),
                )
            )
        if report.causes:  # SHM off (SMG falls back to inline): a gate only when asked
            report.verdict, report.may_start = "fail", not req.require_shm
        elif report.kept_counts.get("unknown"):  # a proof that does not hold where nothing needs it: ok
            report.verdict = "unknown"

    def _probe_fix(self, report: PreflightReport, entry: Entry | None) -> str:
        """The fix for the gateway's probe file left in place: the one for the cause that holds here. The
        proof by pid does not hold because the container shares the host's IPC namespace (whatever the flags),
        for want of --pod-private (a container's pid namespace), or despite it (a process of another pid
        namespace that reaches the tmpfs; in the host's pid namespace, gc's walk says which), or it holds
        and the file was kept for its own sake (held open, not a regular file, another uid's)."""
        name, pid = report.probe_file or gateway_probe_name(self.pid), self.pid
        by_hand = f"remove {name} by hand once no gateway with pid {pid} runs"
        start = "then start the gateway"
        if not report.proof.holds:
            container = report.pid_namespace != INIT_PID_NS
            if container and report.ipc_namespace == INIT_IPC_NS:
                return (
                    "--pod-private cannot hold while this container shares the host's IPC namespace (--ipc=host, "
                    "hostIPC: its /dev/shm is the host's, which processes of other pid namespaces write): give it a "
                    f"{DEFAULT_SHM_DIR} of its own (no --ipc=host or hostIPC; a memory emptyDir there), or {by_hand} "
                    f"in any pid namespace on this host, {start}"
                )
            if container and not self.req.pod_private:
                return (
                    f"if every process that writes SMG names in this tmpfs is in this pid namespace, pass "
                    f"--pod-private; else {by_hand} in any pid namespace that writes there, {start}"
                )
            return (
                f"the proof by pid does not hold here ({report.proof.note}): end that reach, or {by_hand} in any "
                f"pid namespace that reaches this tmpfs, {start}"
            )
        # The proof holds (pid {pid} is preflight's own): the file itself was kept.
        state = entry.state if entry is not None else ""
        kept = self.kept_class.get(name, "")
        if state == "held":
            return (
                f"end the process that holds it ({entry.reason if entry else ''}), or have it close the file, {start}"
            )
        if state == "hazard":
            return (
                f"it is no file a gateway wrote: inspect and remove it by hand (unmount what is mounted on it), {start}"
            )
        if kept == OTHER_USER:
            return f"run preflight as root, or as the uid that owns {name}; or remove it by hand as that uid, {start}"
        return f"remove {name} by hand (no gateway has pid {pid}: it is preflight's, which execs the gateway), {start}"


def _exists(path: str) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: the gateway's create may fail too
    return True


def _timed_out(req: PreflightRequest, started: float) -> PreflightReport:
    report = PreflightReport(
        "fail",
        not req.require_shm,  # nothing checked: SHM may be off, and the gateway serves inline then
        req.mode,
        req.shm_dir,
        os.getpid(),
        _ns("pid"),
        _ns("ipc"),
        Proof("none", False, "not decided: the deadline passed first"),
        require_shm=req.require_shm,
    )
    report.causes.append(
        found(
            Cause.PREFLIGHT_TIMEOUT,
            (
                f"preflight did not finish within --timeout {req.timeout_s:g} s: what it reclaimed by then is not "
                "reported, and nothing was checked"
            ),
        )
    )
    report.elapsed_ms = (time.monotonic() - started) * 1e3
    return report


def run_preflight(req: PreflightRequest, clock: Callable[[], float] = time.monotonic) -> PreflightReport:
    """Run preflight within ``req.timeout_s``: a report whose ``may_start`` says whether the gateway may start
    (a failed check stops it only under ``req.require_shm``: else SHM is off and the gateway serves inline).

    The steps run in a thread, so that a read of /proc that blocks (a process stuck in D state holds
    its maps) cannot hold the gateway back past the deadline: then the report fails with
    ``preflight_timeout``, and the thread stops at its next step (between two reclaim batches at
    the latest: nothing is left set aside by a stop there). A KeyboardInterrupt in the caller's thread stops it
    the same way before it is raised on. SmgshmError is raised as is.
    """
    started = clock()
    deadline = started + req.timeout_s
    cancel = threading.Event()
    out: dict[str, Any] = {}
    run = _Run(req, deadline, cancel)
    finished = threading.Event()

    def work() -> None:
        try:
            out["report"] = run()
        except _TimedOutError:
            out["timeout"] = True
        except BaseException as err:  # handed to the caller's thread, raised there
            out["error"] = err
        finally:
            finished.set()

    # Waited for on an Event, not Thread.join: a join cut short by a signal handler's exception leaves the thread
    # marked stopped while it runs (CPython 3.11's bpo-45274 repair), so a second join would not wait.
    threading.Thread(target=work, name="smgshm-preflight", daemon=True).start()
    try:
        finished.wait(max(0.0, deadline - clock()))
    except BaseException:  # Ctrl-C (or SIGTERM/SIGHUP raised as it by the CLI): stop as at the deadline
        if run.stop():
            finished.wait(SETTLE_S)
        raise
    if not finished.is_set() or "timeout" in out:
        if run.stop():
            # Mid-batch, entries may sit under their aside names: let the batch settle (it stops at the next
            # batch's edge), or a timeout would strand them where no gc reaps them. Bounded: tmpfs is quick.
            finished.wait(SETTLE_S)
        return _timed_out(req, started)
    if "error" in out:
        raise out["error"]  # a SmgshmError keeps its outcome; anything else is a bug (exit 70)
    report: PreflightReport = out["report"]
    report.elapsed_ms = (clock() - started) * 1e3
    return report


__all__ = [
    "DEGRADING",
    "INIT_IPC_NS",
    "Entry",
    "PreflightReport",
    "PreflightRequest",
    "Proof",
    "decide_proof",
    "degraded_by",
    "run_preflight",
]
