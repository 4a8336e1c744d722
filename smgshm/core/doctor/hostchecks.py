"""doctor's host checks: the gateways running here, capacity and families, the page-size policy."""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from smgshm.core.causes import CATALOGUE, Cause, write_failure
from smgshm.core.doctor.check import AddChecks, Check
from smgshm.core.doctor.gatewayworkers import JudgedGateway, check_gateway_workers
from smgshm.core.errors import SmgshmError
from smgshm.core.gateway.admin import GatewayWorker
from smgshm.core.gateway.log import LogBudget, TransportConfig, read_open_log, read_transport_config
from smgshm.core.gateway.metrics import MM_FAMILIES, MmTraffic, mm_traffic, scrape
from smgshm.core.gateway.mode import ModeFinding, Verdict, judge
from smgshm.core.gateway.running import GATEWAY_TITLE, GatewayProcess, find_gateways
from smgshm.core.host.capacity import (
    DOCKER_DEFAULT_SHM,
    INFLIGHT_SOURCE,
    CapacityVerdict,
    Need,
    ShmUsage,
    assess_capacity,
    recorded_needs,
    shm_usage,
)
from smgshm.core.host.facts import HostFacts
from smgshm.core.host.pagesize import (
    ELSEWHERE,
    PagePolicy,
    load_last_what_if,
    page_policy,
    remount_argv,
)
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.paths import DEFAULT_SHM_DIR, node_path, smgshm_cmd
from smgshm.core.units import human_duration, human_size


@dataclass(frozen=True)
class GatewayFinding:
    gateway: GatewayProcess | None  # None: a --gateway-log no running gateway here has open
    log_path: str  # the log read ("" when none)
    log: TransportConfig | None
    traffic: MmTraffic | None
    finding: ModeFinding


@dataclass(frozen=True)
class HostFindings:
    """What doctor's host checks saw, for --json: the checks only summarise it."""

    gateways: list[GatewayFinding] = field(default_factory=list)
    shm_usage: ShmUsage | None = None
    capacity: CapacityVerdict | None = None
    page_policy: PagePolicy | None = None
    last_what_if: dict[str, Any] | None = None


def _same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _read_log(path: str) -> TransportConfig | None:
    try:
        return read_transport_config(path)
    except SmgshmError:
        return None


def _e2e_hint(http_url: str, metrics_url: str) -> str:
    """The e2e command for a gateway found here, naming the metrics port found with it: it works when pasted."""
    if not http_url or importlib.util.find_spec("smgshm.core.e2e.run") is None:
        return ""
    return shlex.join(["smgshm", "e2e", "--gateway", http_url, *(["--metrics", metrics_url] if metrics_url else [])])


def gateway_findings(logs: list[str], timeout: float, pids: tuple[int, ...] | None = None) -> list[GatewayFinding]:
    """Every gateway here (or those of ``pids``; none for ``()``) with the evidence about its
    transport; and each --gateway-log none of them has open."""
    out = []
    unclaimed = list(logs)
    found = find_gateways(timeout_s=min(timeout, 2.0), pids=pids) if pids != () else []
    budget = LogBudget()  # the logs of every gateway here together: a fake gateway's cannot hold doctor
    for g in found:
        if pids is not None and g.pid not in pids:
            continue
        # Its own open files first (/proc/PID/fd/N is the very file, even in another mount namespace).
        config = read_open_log(g.pid, [(log.fd, log.path) for log in g.logs], budget)
        log_path = config.path if config is not None else ""
        for path in list(unclaimed):
            if any(_same_file(path, f"/proc/{g.pid}/fd/{log.fd}") for log in g.logs):
                unclaimed.remove(path)
                named = _read_log(path)
                if named is not None:
                    config, log_path = named, path
        traffic = None
        if g.metrics_url:
            try:
                traffic = mm_traffic(scrape(g.metrics_url, timeout, MM_FAMILIES))
            except SmgshmError:
                traffic = None
        who = f"gateway pid {g.pid}"
        finding = judge(
            who,
            config,
            traffic,
            g.metrics_url,
            _e2e_hint(g.http_url, g.metrics_url),
            g.http_url,
            g.ns_pid if g.ns_pid is not None else g.pid,
        )
        out.append(GatewayFinding(g, log_path, config, traffic, finding))
    for path in unclaimed:
        try:
            config = read_transport_config(path)
        except SmgshmError as err:  # the operator named it: unreadable is a failure, said as such
            unreadable = ModeFinding(Verdict.UNKNOWN, Status.FAIL, str(err), "", Outcome.HOST)
            out.append(GatewayFinding(None, path, None, None, unreadable))
            continue
        out.append(GatewayFinding(None, path, config, None, judge(f"log {path}", config, None)))
    return out


def judged_gateways(
    findings: list[GatewayFinding], from_gateway: str | None, from_gateway_workers: list[GatewayWorker] | None = None
) -> list[JudgedGateway]:
    """The gateways whose workers doctor probes and lints: each found here with an HTTP port, and ``from_gateway``
    (its ``GET /workers`` already asked: ``from_gateway_workers``)."""
    from smgshm.core.address import normalize_url
    from smgshm.core.host.namespace import read_namespace_id

    out = []
    remote = normalize_url(from_gateway).rstrip("/") if from_gateway else ""
    listed = tuple(from_gateway_workers) if from_gateway_workers is not None else None
    for f in findings:
        g = f.gateway
        if g is None or not g.http_url or g.inspect == "gone":
            continue
        mode = f.log.mode if f.log is not None else f.finding.mode
        mine = normalize_url(g.http_url).rstrip("/") == remote
        remote = "" if mine else remote
        own_id = read_namespace_id(proc_root=f"/proc/{g.pid}/root")  # its /dev/shm, as its mount namespace sees it
        out.append(
            JudgedGateway(
                f"gateway {g.pid}", g.http_url, mode, own_id, probe=not mine, workers=listed if mine else None
            )
        )
    if remote:
        out.append(JudgedGateway(f"gateway {remote}", remote, probe=False, workers=listed))
    return out


def check_gateways(findings: list[GatewayFinding], shm_dir: str = DEFAULT_SHM_DIR, largest: int = 0) -> list[Check]:
    """One check per gateway and one of its transport. ``largest``: the largest tensor known to have been
    written to ``shm_dir`` (0: none known), which tells a full dir from a too small one."""
    if not findings:
        return [Check("gateways", Status.OK, "no SMG gateway (process title smg::router) is visible here")]
    out = []
    for f in findings:
        g = f.gateway
        if g is None:
            if f.finding.status == "fail":
                out.append(Check(f"gateway log {f.log_path}", Status.FAIL, f.finding.summary, "", f.finding.code))
                continue
            if f.log is None:
                out.append(
                    Check(
                        f"gateway log {f.log_path}",
                        Status.WARN,
                        "no 'Multimodal tensor transport configured' line in it (rotated, or not SMG's log)",
                        "pass the log the gateway wrote at its start",
                    )
                )
                continue
            out.append(
                Check(
                    f"gateway log {f.log_path}",
                    f.finding.status,
                    f.finding.summary + " (no running gateway here has this log open)",
                    f.finding.fix,
                    f.finding.code,
                    cause=_cause(f.finding),
                )
            )
            continue
        parts = [f"uid {g.uid}" if g.uid is not None else "uid ?"]
        if g.uptime_s is not None:
            parts.append(f"up {human_duration(g.uptime_s)}")
        if g.http_url:
            parts.append(f"HTTP {g.http_url}")
        if g.metrics_url:
            parts.append(f"metrics {g.metrics_url}")
        other = [f"{p.address}:{p.port} ({p.role})" for p in g.ports if p.role not in ("http", "metrics")]
        if other:
            parts.append("other ports " + ", ".join(other))
        if g.logs:
            parts.append("log " + ", ".join(log.path for log in g.logs))
        if g.note:
            parts.append(g.note)
        if g.inspect == "permission_denied":
            out.append(
                Check(
                    f"gateway {g.pid}",
                    Status.WARN,
                    "cannot inspect: " + "; ".join(parts),
                    f"run smgshm as root or as uid {g.uid}",
                )
            )
            continue
        if g.inspect == "gone":
            out.append(Check(f"gateway {g.pid}", Status.SKIP, "exited while being inspected"))
            continue
        out.append(Check(f"gateway {g.pid}", Status.OK, "; ".join(parts)))
        finding = _write_failure(f.finding, g.pid, shm_dir, largest)
        out.append(
            Check(
                f"gateway {g.pid} transport",
                finding.status,
                finding.summary,
                finding.fix,
                finding.code if finding.status in ("fail", "unknown") else Outcome.OK,
                cause=_cause(finding),
            )
        )
    return out


def _cause(finding: ModeFinding) -> Cause | None:
    """A finding's cause, for a warning or failure only (an ok finding names none)."""
    return finding.cause if finding.status in ("warn", "fail") else None


def _write_failure(finding: ModeFinding, pid: int, shm_dir: str, largest: int = 0) -> ModeFinding:
    """Write failures of a gateway that writes to ``shm_dir``: full, too small or permission, as the dir tells
    (the largest tensor known here, else its mean since start: the largest is no less)."""
    if finding.cause is not Cause.SHM_WRITES_FAILING or not _shares_dir(pid, shm_dir):
        return finding
    from smgshm.core.host.capacity import shm_space
    from smgshm.core.host.identity import probe_writable

    size, free = shm_space(shm_dir)
    need = max(largest, finding.mean_tensor_bytes or 0)
    cause = write_failure(need, size, free, probe_writable(shm_dir) is None)
    if cause is Cause.SHM_WRITES_FAILING:
        return finding  # nothing the dir tells: the finding's fix (its log's own words, where it was read) stands
    return replace(finding, cause=cause, fix=CATALOGUE[cause].fix)


def _shares_dir(pid: int, shm_dir: str) -> bool:
    """Does gateway ``pid`` write into ``shm_dir``? (Its /dev/shm, as its mount namespace sees it.)"""
    try:
        return os.stat(f"/proc/{pid}/root/dev/shm").st_dev == os.stat(shm_dir).st_dev
    except OSError:
        return False


def capacity_needs(inflight_bytes: int | None, findings: list[GatewayFinding], facts: HostFacts) -> list[Need]:
    shm_dir = facts.shm_dir
    needs = []
    if inflight_bytes:
        needs.append(Need(INFLIGHT_SOURCE, inflight_bytes))
    needs += recorded_needs(shm_dir, boot_id=facts.boot_id or None)
    for f in findings:
        m = f.finding.mean_tensor_bytes
        if f.gateway is not None and m and _shares_dir(f.gateway.pid, shm_dir):
            needs.append(Need(f"gateway pid {f.gateway.pid}'s mean tensor since start; the largest is no less", m))
    return needs


@dataclass(frozen=True)
class FixPlace:
    """Where a capacity fix acts. A pod's tmpfs (a memory emptyDir, a runtime's sandbox shm) is sized in
    the pod's spec: a remount is undone at its next start, so none is offered. A path under a node root
    (``--node-root /host``) is said as the node itself sees it."""

    pod: bool = False
    node_root: str = "/"


def check_capacity(
    usage: ShmUsage, needs: list[Need], writers: Sequence[str] = (), at: FixPlace = FixPlace()
) -> tuple[list[Check], CapacityVerdict]:
    """The shm dir's usage by family, then whether its free space holds the largest need. ``writers``: the SMG
    gateways known to write here (as a sentence names them): at the runtime's 64 MiB default that is a trap
    (shm_too_small) even when no need is known. ``at``: where its fix acts."""
    v = assess_capacity(usage, needs)
    fams = ", ".join(f"{f.family} {f.count:,} ({human_size(f.nbytes)})" for f in usage.families) or "empty"
    hidden = (
        f"; {human_size(usage.unattributed_bytes)} held by no name (unlinked files still open or mapped, or "
        "inside directories)"
        if usage.unattributed_bytes >= 2**20
        else ""
    )
    cut = f" (stopped after {usage.entries:,} entries)" if usage.truncated else ""
    out = [
        Check(
            "shm usage",
            Status.OK,
            f"{usage.shm_dir}: {human_size(usage.used_bytes)} used of {human_size(usage.total_bytes)}; "
            f"by family: {fams}{hidden}{cut}",
        )
    ]
    docker = " (Docker's 64 MiB default)" if v.docker_default else ""
    # A container runtime's default /dev/shm where an SMG gateway writes: a few images' tensors fill it.
    trap = v.docker_default and bool(writers)
    written = f"; {', '.join(writers)} writes here" if trap else ""
    if v.largest is None and trap:
        out.append(
            Check(
                "capacity",
                Status.WARN,
                f"{human_size(v.free_bytes)} free of the container runtime's 64 MiB default{written}: 64 MiB holds "
                "a few images' tensors at most, and SMG's writes then fail and go inline",
                _enlarge(usage, DOCKER_DEFAULT_SHM, at, free_first=False),
                fix_cmd=_enlarge_cmd(usage, DOCKER_DEFAULT_SHM, at),
                cause=Cause.SHM_TOO_SMALL,
            )
        )
    elif v.largest is None:
        out.append(
            Check(
                "capacity",
                Status.OK,
                f"{human_size(v.free_bytes)} free{docker}; no in-flight budget known",
                "pass --inflight-bytes (the gateway's --multimodal-max-inflight-bytes)",
            )
        )
    elif v.fits:
        times = v.free_bytes / v.largest.nbytes if v.largest.nbytes else float("inf")
        status = Status.WARN if v.docker_default else Status.OK
        out.append(
            Check(
                "capacity",
                status,
                f"{human_size(v.free_bytes)} free{docker} holds the largest need "
                f"{times:,.1f} times: {human_size(v.largest.nbytes)} ({v.largest.source}){written}",
                _enlarge(usage, v.largest.nbytes, at, free_first=not trap) if v.docker_default else "",
                fix_cmd=_enlarge_cmd(usage, v.largest.nbytes, at) if v.docker_default else None,
                cause=Cause.SHM_TOO_SMALL if trap else None,
            )
        )
    else:
        # Too small when even the empty dir could not hold it (gc frees nothing then), else full.
        cause = write_failure(v.largest.nbytes, usage.total_bytes, v.free_bytes, None)
        # Only the operator's own budget fails the run; an inferred need that does not fit is a warning.
        out.append(
            Check(
                "capacity",
                Status.FAIL if v.explicit_unmet else Status.WARN,
                f"{human_size(v.free_bytes)} free{docker} is below the largest need "
                f"{human_size(v.largest.nbytes)} ({v.largest.source}): SMG's writes fail and go inline",
                _enlarge(usage, v.largest.nbytes, at, free_first=cause is not Cause.SHM_TOO_SMALL),
                Outcome.CHECK_FAILED if v.explicit_unmet else Outcome.OK,
                fix_cmd=_enlarge_cmd(usage, v.largest.nbytes, at),
                cause=cause,
            )
        )
    return out, v


def _gib(usage: ShmUsage, need: int) -> int:
    return -(-max(usage.total_bytes, usage.used_bytes + 2 * need) // 2**30)


def _enlarge(usage: ShmUsage, need: int, at: FixPlace, free_first: bool = True) -> str:
    gib = _gib(usage, need)
    free = f"free space ({shlex.join(smgshm_cmd(usage.shm_dir, 'gc', '--delete'))}) or " if free_first else ""
    if at.pod:
        return (
            f"{free}give the pod a larger /dev/shm in its spec: emptyDir medium: Memory sizeLimit: {gib}Gi mounted "
            "there (and container memory limits that cover it); a remount would not outlive the pod's next start"
        )
    return (
        f"{free}enlarge the tmpfs (as root, below); containers: docker run "
        f"--shm-size={gib}g, Kubernetes emptyDir medium: Memory sizeLimit: {gib}Gi"
    )


def _enlarge_cmd(usage: ShmUsage, need: int, at: FixPlace) -> list[str] | None:
    """The remount that enlarges the tmpfs, where it is mounted (core/host/place.py says why never by the
    path as given) and as the node sees it; None for a pod's tmpfs, or when that cannot be told."""
    from smgshm.core.host.place import place_of, remount_argv

    if at.pod:
        return None
    try:
        argv = remount_argv(place_of(usage.shm_dir), f"size={_gib(usage, need)}G")
    except OSError:
        return None
    if not argv or at.node_root == "/":
        return argv or None
    inside = node_path(argv[-1], at.node_root)  # the mount point without the node root's prefix
    return None if inside is None or argv[0] != "mount" else [*argv[:-1], inside]


def check_page_policy(facts: HostFacts) -> tuple[list[Check], PagePolicy | None, dict[str, Any] | None]:
    shm_dir = facts.shm_dir
    try:
        p = page_policy(shm_dir, identity=facts.identity)
    except SmgshmError as err:
        return [Check("page size", Status.SKIP, str(err))], None, None
    last = load_last_what_if(boot_id=facts.boot_id or None)
    if p.huge_pages or p.huge_pages is None:
        return [Check("page size", Status.OK, f"{shm_dir}: {p.reason}")], p, last
    if not p.shmem_enabled or p.shmem_enabled == "deny":
        return (
            [Check("page size", Status.OK, f"{shm_dir}: 4 KiB pages ({p.reason}); nothing to gain by a remount")],
            p,
            last,
        )
    a, b = (last or ELSEWHERE)["smg_writer_gb_per_s"]
    where = "measured here" if last else "measured elsewhere"
    # Advice, not a warning, in two lines at most (this and the command); what it costs is in doctor --help.
    summary = f"4 KiB pages; huge: SMG's writer {b / a:.1f}x faster ({where})"
    return [Check("page size", Status.INFO, summary, fix_cmd=remount_argv(shm_dir) or None)], p, last


def run_host_checks(
    add: AddChecks,
    facts: HostFacts,
    timeout: float,
    gateway_logs: list[str] | None = None,
    inflight_bytes: int | None = None,
    gateway_pids: tuple[int, ...] | None = None,
    api_key: str | None = None,
    from_gateway: str | None = None,
    from_gateway_workers: list[GatewayWorker] | None = None,
) -> HostFindings:
    """doctor's host checks in order, each reported through ``add`` as it finishes.

    ``facts``: this host's, as the run read them once. ``gateway_pids`` limits the gateway checks
    to those pids (``()``: none; None: every one here). Each gateway judged, and ``from_gateway``,
    has its workers listed, probed (those of ``from_gateway`` are probed already, as doctor's
    workers) and its configuration linted.
    """
    findings = gateway_findings(list(gateway_logs or []), timeout, gateway_pids)
    needs = capacity_needs(inflight_bytes, findings, facts)
    # A tensor size, not the in-flight budget (a sum of many): what a single write needed.
    largest = max((n.nbytes for n in needs if n.source != INFLIGHT_SOURCE), default=0)
    if gateway_pids == ():
        add([Check("gateways", Status.SKIP, "skipped (--no-gateways): the gateways running here were not looked at")])
    elif findings or not gateway_pids:  # a --gateway-pid not found is said below, not as "none here"
        add(check_gateways(findings, facts.shm_dir, largest))
    seen = {f.gateway.pid for f in findings if f.gateway is not None}
    for pid in sorted(set(gateway_pids or ()) - seen):
        add(
            [
                Check(
                    f"gateway {pid}",
                    Status.FAIL,
                    f"no SMG gateway (process title {GATEWAY_TITLE}) runs here with pid {pid}",
                    "list them with smgshm doctor (without --gateway-pid)",
                    Outcome.UNREACHABLE,
                )
            ]
        )
    add(check_gateway_workers(judged_gateways(findings, from_gateway, from_gateway_workers), api_key, facts, timeout))
    usage, verdict = None, None
    try:
        usage = shm_usage(facts.shm_dir)
    except SmgshmError as err:
        add([Check("shm usage", Status.FAIL, str(err), err.hint or "", Outcome.HOST)])
    if usage is not None:
        checks, verdict = check_capacity(usage, needs)
        add(checks)
    checks, policy, last = check_page_policy(facts)
    add(checks)
    return HostFindings(findings, usage, verdict, policy, last)
