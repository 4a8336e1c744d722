"""``smgshm doctor --node``: doctor's host checks on every pod's /dev/shm tmpfs the node view finds.

The tmpfs are the node view's (scan.py: found under the node root, tied to their pods and pid
namespaces), each listed and judged by gc's listing with the pod's judge (judge.py); the checks are
doctor's own functions (core/doctor), given each tmpfs's path and figures: the namespace id its
gateway advertises, usage and capacity (hostchecks.check_capacity; the container runtime's 64 MiB
default is a trap where an SMG gateway writes), leftover gateway probe files, leaked, stranded and
hazardous segments (leaks.leak_checks, whose fix here is ``gc --node``). Two things differ from
doctor's run on its own host, and why:

- writability is judged from the tmpfs's figures, not by creating a file: a node agent reads the
  kubelet's dirs through a read-only hostPath, and a file created as root proves nothing about the
  pod's uid. Read-only mount, less than a page free, or a dir no user of it may write to fail it;
- a tmpfs whose names cannot be judged by pid (namespaces that disagree, a process of its pod that
  cannot be read, a node agent without hostPID) is ``unknown``: never a failure, never a warning; one
  no process reaches (core/node/reach.py) holds only leaks.

Read-only: nothing is created, opened for writing or removed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

from smgshm.core.causes import write_failure
from smgshm.core.doctor.check import Check, cause_check
from smgshm.core.doctor.hostchecks import FixPlace, check_capacity
from smgshm.core.doctor.identity import check_namespace_id
from smgshm.core.doctor.leaks import STRANDED_AFTER_S, leak_checks, reap_wait
from smgshm.core.doctor.workers import probe_file_checks
from smgshm.core.errors import SmgshmError
from smgshm.core.gateway.running import gateway_pids
from smgshm.core.host.capacity import INFLIGHT_SOURCE, Need, recorded_needs, shm_usage
from smgshm.core.host.identity import HostIdentity, read_host_identity
from smgshm.core.host.proc import innermost_pid
from smgshm.core.names import GATEWAY_PROBE_PREFIX
from smgshm.core.node.scan import Tmpfs, TmpfsScan, gone, look, pod_label
from smgshm.core.node.volumes import ShmUser
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.paths import node_path, same_dir
from smgshm.core.segments.judge import ScanOptions, SegmentInfo, Tally
from smgshm.core.units import human_size

# Unlinked files still mapped this much of the size: gc cannot free them, and SMG's writes find the space gone.
HIDDEN_WARN_SHARE = 0.25
# A block's verdict: its worst check, worst first (ok: none of the others; info and skip count as ok).
VERDICTS = (Status.FAIL, Status.WARN, Status.UNKNOWN, Status.OK)
_RANK = {v: len(VERDICTS) - i for i, v in enumerate(VERDICTS)}


@dataclass(frozen=True)
class GatewayUse:
    """An SMG gateway (process title smg::router) whose /dev/shm is the tmpfs."""

    pid: int  # here
    ns_pid: int | None  # in its own pid namespace: the pid in its names


@dataclass(frozen=True)
class TmpfsCheckup:
    """One tmpfs's checks, the verdict they make, and the figures they were drawn from."""

    tmpfs: Tmpfs
    verdict: Status  # one of VERDICTS: the worst of its checks
    checks: list[Check]
    namespace_id: str = ""
    shm_total_bytes: int = 0
    shm_used_bytes: int = 0
    shm_free_bytes: int = 0
    leaked_bytes: int = 0  # what gc --node --delete would free (leaked, single link)
    counts: dict[str, int] = field(default_factory=dict)  # SMG names by state
    gateways: list[GatewayUse] = field(default_factory=list)

    def share(self, nbytes: int) -> float:
        """``nbytes`` as a share of the tmpfs's size (0.0 for a size of 0)."""
        return nbytes / self.shm_total_bytes if self.shm_total_bytes else 0.0


@dataclass(frozen=True)
class NodeCheckup:
    root: str
    pods_known: int
    tmpfs: list[TmpfsCheckup]
    node_checks: list[Check] = field(default_factory=list)  # a warning per thing the view cannot see (sight.py)

    @property
    def checks(self) -> list[Check]:
        return [*self.node_checks, *(c for t in self.tmpfs for c in t.checks)]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]


def node_gc_cmd(root: str, *args: str) -> list[str]:
    """``smgshm gc --node`` as argv to suggest: it names ``root`` unless that is /, so pasting it acts on the
    node examined."""
    where = [] if same_dir(root, "/") else ["--node-root", root]  # (not by realpath: /proc/PID/root reads "/")
    return ["smgshm", "gc", "--node", *where, *args]


def run_node_doctor(
    root: str,
    inflight_bytes: int | None = None,
    stranded_after_s: float = STRANDED_AFTER_S,
    gateways: bool = True,
    state_dirs: Sequence[tuple[str, ...]] = (),
) -> NodeCheckup:
    """doctor's host checks on every tmpfs of the node under ``root`` (HostError when it cannot be opened).

    ``inflight_bytes``: the gateways' in-flight budget, a need of each tmpfs SMG writes (a gateway uses it, or it
    holds SMG names). ``gateways``: look for SMG gateways among each tmpfs's processes (``--no-gateways``: not)."""
    node = look(root, state_dirs=state_dirs)
    titled = set(gateway_pids()) if gateways else set()
    out = [_checkup(root, t, inflight_bytes, stranded_after_s, titled) for t in node.tmpfs]
    # A view that cannot see the whole node warns: what it shows may be all right, but it is not all.
    blind = [Check("node view", Status.WARN, f"unknown: {u.message}", u.hint) for u in node.unseen]
    return NodeCheckup(node.root, node.pods_known, out, blind)


def _checkup(root: str, t: Tmpfs, inflight: int | None, stranded_after_s: float, titled: set[int]) -> TmpfsCheckup:
    path = t.place.path
    if t.unread is not None:  # below a dir not read in time (layout.py): never touched, its path may stall
        said = f"not checked: {t.unread}"
        return TmpfsCheckup(t, Status.UNKNOWN, [Check("shm dir", Status.SKIP, said)], counts=dict(Tally().counts))
    try:
        ident = read_host_identity(path)
        scan = TmpfsScan(t, ScanOptions(path, stale_after_s=stranded_after_s))
        segments = list(scan)
        usage = shm_usage(path)
    except SmgshmError as err:  # gone or changed since the node was looked at: said, and the run goes on
        none = dict(Tally().counts)  # nothing listed: every state's count, 0
        if gone(t.place):  # unmounted since the look (its pod deleted): nothing is left there to check
            said = f"gone since the node was looked at (unmounted: its pod deleted): {err}"
            return TmpfsCheckup(t, Status.UNKNOWN, [Check("shm dir", Status.SKIP, said)], counts=none)
        failed = Check("shm dir", Status.FAIL, str(err), err.hint or "", Outcome.HOST)
        return TmpfsCheckup(t, Status.FAIL, [failed], counts=none)
    gws = [GatewayUse(u.pid, _ns_pid(u.pid)) for u in t.users if u.pid in titled]
    writers = [f"SMG gateway pid {g.ns_pid if g.ns_pid is not None else '?'} (pid {g.pid} here)" for g in gws]
    counts = dict(scan.tally.counts)
    needs: list[Need] = []
    if gws or segments:  # SMG writes here: the budget and the largest tensors seen here are this tmpfs's needs
        needs = ([Need(INFLIGHT_SOURCE, inflight)] if inflight else []) + recorded_needs(path, boot_id=ident.boot_id)
    checks = [check_namespace_id(ident, path)]
    capacity, _ = check_capacity(usage, needs, writers, FixPlace(pod=t.place.kind != "host", node_root=root))
    checks += capacity
    checks.append(_held(t, scan.tally.reclaimable_bytes, usage.total_bytes))
    checks.append(_writable(path, ident, t.users))
    leftovers = [s.name for s in segments if s.kind == "gateway_probe"]
    lookalikes = [s.name for s in segments if s.name.startswith(GATEWAY_PROBE_PREFIX) and s.kind != "gateway_probe"]
    where = f" in pod {pod_label(t)}" if t.pod_uid is not None else ""
    on_node = node_path(path, root)  # the rm is pasted on the node: its path there, not under --node-root
    checks += probe_file_checks(leftovers, lookalikes, on_node, node_gc_cmd(root, "--delete"), where)
    checks += leak_checks(
        counts,
        segments,
        scan.tally.reclaimable_bytes,
        lambda *a: node_gc_cmd(root, *a),
        stranded_after_s,
        reap_wait(segments, scan.sightings.stored),
    )
    checks.append(_liveness(t, segments))
    verdict = max((Status(c.status) for c in checks), key=lambda s: _RANK.get(s, 0), default=Status.OK)
    return TmpfsCheckup(
        t,
        verdict if verdict in _RANK else Status.OK,
        checks,
        ident.namespace_id,
        usage.total_bytes,
        usage.used_bytes,
        usage.free_bytes,
        scan.tally.reclaimable_bytes,
        counts,
        gws,
    )


def _ns_pid(pid: int) -> int | None:
    try:
        return innermost_pid(pid)
    except OSError:
        return None  # gone since the node was looked at


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "?"


def _held(t: Tmpfs, leaked: int, total: int) -> Check:
    """What the tmpfs holds that nothing will use: leaked names (gc frees them) and hidden bytes (unlinked but
    still mapped: only the mapping process's exit frees them), each as a share of its size."""
    h = t.hidden
    at_least = "at least " if not h.complete else ""
    summary = (
        f"leaked {human_size(leaked)} ({_pct(leaked, total)} of the size); hidden {at_least}"
        f"{human_size(h.nbytes)} ({_pct(h.nbytes, total)}) in {h.files} unlinked file(s) still mapped"
    )
    if total and h.nbytes >= HIDDEN_WARN_SHARE * total:
        return Check(
            "held bytes",
            Status.WARN,
            summary + ": gc cannot free them; SMG's writes find the space gone",
            "find the process that maps them (its /proc/PID/maps lists the file as deleted): the space "
            "comes back when it unmaps them or exits",
        )
    return Check("held bytes", Status.OK, summary)


def _may_write(st: os.stat_result, uid: int) -> bool | None:
    """Whether ``uid`` may create a file in the dir of ``st`` (None: it depends on its groups, not read)."""
    mode = st.st_mode
    if uid == 0 or mode & stat.S_IWOTH or (uid == st.st_uid and mode & stat.S_IWUSR):
        return True
    return None if mode & stat.S_IWGRP else False


def _writable(path: str, ident: HostIdentity, users: tuple[ShmUser, ...]) -> Check:
    """Whether a gateway of the pod could create its probe file, from the figures (see the module)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, free = ident.shm_total_bytes, ident.shm_free_bytes
    try:
        st = os.stat(path)
    except OSError as err:
        return Check("writable", Status.FAIL, f"cannot read the tmpfs's dir: {err.strerror}", "", Outcome.HOST)
    mode = f"mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"
    ro = "ro" in ident.mount_options.split(",")
    denied = sorted({u.uid for u in users if _may_write(st, u.uid) is False})
    if ro or denied or free < page:
        cause = write_failure(page, total, free, False if ro or denied else None)
        if ro:
            why = "it is mounted read-only"
        elif denied:
            why = f"uid(s) {', '.join(map(str, denied))} of its processes may not create files in it ({mode})"
        else:
            why = f"{human_size(free)} free, less than a page"
        # The catalogue's fix, and no command: its path here is under --node-root, not as the node sees it.
        return cause_check(
            "writable", Status.FAIL, f"a gateway's probe file cannot be created: {why}", cause, Outcome.HOST
        )
    maybe = sorted({u.uid for u in users if _may_write(st, u.uid) is None})
    if maybe:
        return Check(
            "writable",
            Status.WARN,
            f"uid(s) {', '.join(map(str, maybe))} of its processes may create files "
            f"in it only through a group ({mode}); not judged from here",
            "mode 1777 lets every uid of the pod write (a memory emptyDir is)",
        )
    return Check(
        "writable",
        Status.OK,
        f"{mode}, {human_size(free)} free: a gateway's probe file can be created "
        "(judged from the figures: nothing was written)",
    )


def _liveness(t: Tmpfs, segments: list[SegmentInfo]) -> Check:
    """Whether the names could be judged by pid: unknown (never a failure) where they could not."""
    unknown = [s for s in segments if s.state.value == "unknown" and s.producer_pid is not None]
    if not t.trust.trusted and not any(s.producer_pid is not None for s in segments):
        return Check("liveness", Status.SKIP, f"no SMG name to judge; and none could be: {t.trust.note}")
    if not t.trust.trusted:
        return Check("liveness", Status.UNKNOWN, f"unknown, {len(unknown)} SMG name(s) kept: {t.trust.note}")
    if unknown:
        return Check("liveness", Status.UNKNOWN, f"{len(unknown)} SMG name(s) unknown, kept: {unknown[0].reason}")
    return Check("liveness", Status.OK, t.trust.note)


__all__ = ["GatewayUse", "NodeCheckup", "TmpfsCheckup", "node_gc_cmd", "run_node_doctor"]
