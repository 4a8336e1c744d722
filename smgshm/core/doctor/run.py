"""``doctor``: every check in one run, each with the fix for its failure.

With no worker given it starts the reference receiver in this process on loopback
(the embedded default), so a fresh machine gets a full answer with no setup.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smgshm.core.errors import SmgshmError
from smgshm.core.names import probe_file_pid
from smgshm.core.paths import DEFAULT_SHM_DIR, smgshm_cmd

DOCKER_DEFAULT_SHM = 64 * 1024 * 1024


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    summary: str
    fix: str = ""
    code: int = 0  # the exit code this check asks for (house table)
    # The command of the fix as argv (shown shell-quoted, so pasting it does only what it says),
    # and the exact bytes (hex) of the entry names the check is about: names may be invalid UTF-8.
    fix_cmd: list[str] = field(default_factory=list)
    names_hex: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DoctorReport:
    checks: list[Check]
    embedded_receiver: str = ""  # its address when doctor started one
    workers: list[str] = field(default_factory=list)
    host: Any = None  # hostchecks.HostFindings: gateways here, shm usage, capacity, page size

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]


def check_identity(shm_dir: str) -> list[Check]:
    from smgshm.core.host.identity import probe_writable, read_host_identity

    try:
        ident = read_host_identity(shm_dir)
    except SmgshmError as err:
        return [Check("shm dir", "fail", str(err), err.hint or "mount a tmpfs at /dev/shm", 5)]
    from smgshm.core.host.namespace import parse_namespace_id

    out = []
    if ident.namespace_id and parse_namespace_id(ident.namespace_id) is None:
        out.append(Check("namespace id", "fail", f"{ident.namespace_id!r} is malformed: the gateway stays inline",
                         "check /proc/sys/kernel/random/boot_id (a UUID) and the shm dir", 6))  # fmt: skip
    elif ident.namespace_id:
        out.append(Check("namespace id", "ok", f"{ident.namespace_id} (boot_id:st_dev of {shm_dir})"))
    else:
        out.append(
            Check(
                "namespace id",
                "fail",
                "unreadable: under auto the gateway stays inline",
                "make /proc/sys/kernel/random/boot_id and the shm dir readable",
                6,
            )
        )
    size = f"{ident.shm_total_bytes / 2**20:.0f} MiB, {ident.shm_free_bytes / 2**20:.0f} MiB free"
    if ident.fstype and ident.fstype != "tmpfs":
        out.append(
            Check(
                "shm dir",
                "warn",
                f"{shm_dir} is {ident.fstype}, not tmpfs ({size})",
                "mount a tmpfs at /dev/shm: SHM through a disk filesystem is slow",
            )
        )
    elif ident.shm_total_bytes == DOCKER_DEFAULT_SHM:
        out.append(
            Check(
                "shm dir",
                "warn",
                f"{shm_dir} is 64 MiB: Docker's default --shm-size ({size})",
                "give the gateway's container --shm-size=8g (or --ipc=host); one 64 MiB tensor fills it",
            )
        )
    elif ident.shm_free_bytes < ident.shm_total_bytes // 10:
        out.append(Check("shm dir", "warn", f"{shm_dir} is nearly full ({size})", "reap leaks, or enlarge it:",
                         fix_cmd=smgshm_cmd(shm_dir, "gc", "--delete")))  # fmt: skip
    else:
        out.append(Check("shm dir", "ok", f"{shm_dir}: {ident.fstype or '?'}, {size}"))
    err = probe_writable(shm_dir)
    if err:
        full = "No space" in err
        fix = (
            "enlarge the tmpfs (docker --shm-size, emptyDir sizeLimit) or free space:"
            if full
            else "run as a uid that may write the shm dir; SMG's gateway would stay inline"
        )
        out.append(Check("writable", "fail", f"cannot create a 0600 segment: {err}", fix, 5,
                         fix_cmd=smgshm_cmd(shm_dir, "gc", "--delete") if full else []))  # fmt: skip
    else:
        out.append(Check("writable", "ok", "a 0600 segment can be created and removed, as the gateway's probe does"))
    return out


def check_workers(addresses: list[str], shm_dir: str, timeout: float) -> list[Check]:
    from smgshm.core.client.probe import ProbeOptions, probe

    report = probe(addresses, ProbeOptions(timeout=timeout, connect_timeout=timeout, shm_dir=shm_dir, verify=True))
    out = []
    for name in report.local.leftover_probe_files:
        pid = probe_file_pid(name)
        out.append(
            Check(
                "probe files",
                "fail",
                f"leftover {name}: a gateway with pid {pid} will stay inline",
                f"{shlex.join(smgshm_cmd(shm_dir, 'gc', '--delete', '--min-age', '0'))}, "
                f"or once no gateway has pid {pid}, remove it:",
                3,
                fix_cmd=["rm", "--", os.path.join(shm_dir, name)],
                names_hex=[os.fsencode(name).hex()],
            )
        )
    fixes = {
        "other_host": ("SHM needs gateway and worker on one host", 3),
        "private_tmpfs": (
            "share one tmpfs: --ipc=host, --ipc=container:<gateway>, or an emptyDir "
            "{medium: Memory} mounted at /dev/shm in both containers",
            3,
        ),
        "uid_mismatch": ("run the gateway and the worker as the same uid (segments are 0600)", 3),
        "verify_failed": ("see the reason; the worker could not read a segment this host wrote", 3),
        "undetermined": ("the worker must advertise shm_namespace_id; SGLang/TRT-LLM/MLX always get inline", 6),
        "unreachable": ("check the address and that the worker's gRPC server is up", 4),
    }
    for w in report.workers:
        if w.verdict == "shared":
            how = "verified with a canary segment" if w.verify and w.verify.ok else "ids match"
            out.append(Check(f"probe {w.address}", "ok", f"{w.engine}: /dev/shm shared ({how})"))
        else:
            fix, code = fixes.get(w.verdict, ("", 3))
            out.append(Check(f"probe {w.address}", "fail", f"{w.verdict}: {w.reason}", fix, code))
    return out


def check_send(address: str, shm_dir: str, timeout: float, label: str = "") -> list[Check]:
    from smgshm.core.client.send import SendOptions, send
    from smgshm.core.transport.decision import Mode

    out = []
    for mode in (Mode.INLINE, Mode.SHM):
        opts = SendOptions(mode=mode, shape=(256, 1024), tensors=2, count=4, timeout=timeout, shm_dir=shm_dir)
        try:
            r = send(address, opts)
        except SmgshmError as err:
            out.append(
                Check(
                    f"send {mode.value}{label}",
                    "fail",
                    str(err),
                    err.hint or "",
                    5 if err.kind in ("host", "no_space") else 4,
                )
            )
            continue
        if r.ok:
            p = r.paths[0]
            out.append(
                Check(
                    f"send {mode.value}{label}",
                    "ok",
                    f"{p.requests} requests, {p.tensors} tensors byte-exact via "
                    f"{p.path}, nothing left behind (p50 {p.p50_ms:.1f} ms)",
                )
            )
        else:
            first = r.problems[0] if r.problems else None
            what = f"{first.kind}: {first.message}" if first else "unreachable"
            fix = (
                "the receiver must unlink after reading (SMG's gateway relies on it)"
                if first and first.kind == "leftover"
                else ""
            )
            out.append(Check(f"send {mode.value}{label}", "fail", what, fix, 4 if r.unreachable else 3))
    return out


def check_leaks(shm_dir: str) -> list[Check]:
    from smgshm.core.segments.judge import ScanOptions
    from smgshm.core.segments.scan import scan_segments

    try:
        r = scan_segments(ScanOptions(shm_dir))
    except SmgshmError as err:
        return [Check("leaks", "fail", str(err), err.hint or "", 5)]
    c = r.counts
    out = []
    if c["leaked"]:
        out.append(
            Check(
                "leaks",
                "fail",
                f"{c['leaked']} leaked segment(s), {r.reclaimable_bytes} bytes reclaimable",
                "reap them:",
                3,
                fix_cmd=smgshm_cmd(shm_dir, "gc", "--delete"),
            )
        )
    else:
        out.append(Check("leaks", "ok", f"{len(r.segments)} SMG segment(s), none leaked"))
    if c["hazard"]:
        out.append(
            Check(
                "hazards",
                "fail",
                f"{c['hazard']} non-regular entr(ies) or mount points named like segments (SMG's reader refuses them; "
                "a FIFO hangs it)",
                "inspect and remove them by hand; they are listed by:",
                3,
                fix_cmd=smgshm_cmd(shm_dir, "gc", "--all"),
            )
        )
    if not r.liveness_trusted:
        out.append(Check("liveness", "warn", r.liveness_note))
    return out


def check_reapers(uid: int | None = None) -> list[Check]:
    """systemd-logind RemoveIPC and tmpfiles rules that would delete live segments."""
    uid = os.getuid() if uid is None else uid
    out = []
    remove_ipc = None
    for path in ["/etc/systemd/logind.conf", *sorted(glob.glob("/etc/systemd/logind.conf.d/*.conf"))]:
        try:
            text = open(path, encoding="utf-8").read()  # noqa: SIM115 - tiny config files
        except OSError:
            continue
        for m in re.finditer(r"^\s*RemoveIPC\s*=\s*(\S+)", text, re.M):
            remove_ipc = m.group(1).lower() in ("yes", "true", "1", "on")
    logind = os.path.exists("/run/systemd/seats") or os.path.exists("/lib/systemd/systemd-logind")
    if logind and remove_ipc is not False and uid >= 1000:
        out.append(
            Check(
                "reaper: RemoveIPC",
                "warn",
                f"systemd-logind RemoveIPC is on and uid {uid} is not a system "
                "user: its /dev/shm segments vanish when its last session ends",
                "set RemoveIPC=no in /etc/systemd/logind.conf, or run the gateway as a system user",
            )
        )
    else:
        why = "no systemd-logind" if not logind else "off" if remove_ipc is False else f"uid {uid} is a system user"
        out.append(Check("reaper: RemoveIPC", "ok", f"not a risk here ({why})"))
    rules: list[str] = []
    for d in ("/etc/tmpfiles.d", "/run/tmpfiles.d", "/usr/lib/tmpfiles.d"):
        for path in sorted(glob.glob(f"{d}/*.conf")):
            try:
                lines = open(path, encoding="utf-8").read().splitlines()  # noqa: SIM115
            except OSError:
                continue
            for ln in lines:
                f = ln.split()
                # type path mode user group age: an age on a rule for the shm dir deletes by time.
                if len(f) >= 6 and not f[0].startswith("#") and f[1].startswith(DEFAULT_SHM_DIR) and f[5] != "-":
                    rules.append(f"{path}: {ln.strip()}")
    aging = rules
    if aging:
        out.append(
            Check(
                "reaper: tmpfiles",
                "warn",
                f"tmpfiles ages out /dev/shm: {aging[0]}",
                "exclude smg-* with an x line, e.g. 'x /dev/shm/smg-*'",
            )
        )
    else:
        out.append(Check("reaper: tmpfiles", "ok", "no tmpfiles rule ages out /dev/shm"))
    return out


def run_doctor(
    workers: list[str],
    *,
    shm_dir: str = DEFAULT_SHM_DIR,
    timeout: float = 5.0,
    on_check: Callable[[Check], None] | None = None,
    gateway_logs: list[str] | None = None,
    inflight_bytes: int | None = None,
    gateway: str | None = None,
    api_key: str | None = None,
    e2e: bool = True,
    metrics_url: str | None = None,
    gateway_pids: tuple[int, ...] | None = None,
) -> DoctorReport:
    """Run every check in order; with no workers, against an embedded reference receiver.

    With ``e2e``: real image requests through ``gateway`` (``smgshm e2e --gateway``), or,
    with no workers and no gateway, through the embedded real gateway when smg is installed.
    """
    checks: list[Check] = []

    def add(new: list[Check]) -> None:
        for c in new:
            checks.append(c)
            if on_check:
                on_check(c)

    add(check_identity(shm_dir))
    if any(c.name == "shm dir" and c.status == "fail" for c in checks):
        # Nothing below can mean anything without a shm dir; say so instead of failing obscurely.
        for name in ("probe", "send", "leaks"):
            add([Check(name, "skip", f"skipped: {shm_dir} is not usable")])
        add(check_reapers())
        return DoctorReport(checks, "", list(workers))
    embedded = None
    if not workers:
        from smgshm.core.receiver.reader import ReceiverConfig
        from smgshm.core.receiver.services import start_receiver

        embedded = start_receiver(ReceiverConfig(shm_dir=shm_dir), "127.0.0.1:0")
        workers = [embedded.address]
    try:
        add(check_workers(workers, shm_dir, timeout))
        for w in workers:
            if embedded is not None or _is_smgshm(w, timeout):
                add(check_send(w, shm_dir, timeout, f" {w}" if len(workers) > 1 else ""))
    finally:
        if embedded is not None:
            embedded.stop(0)
    if e2e and (gateway or embedded is not None):
        if os.path.realpath(shm_dir) == DEFAULT_SHM_DIR or gateway:
            add(check_e2e(gateway, api_key, shm_dir, timeout, metrics_url))
        else:  # SMG's gateway always writes /dev/shm: an embedded one would say nothing about this dir
            add([Check("e2e", "skip", f"skipped: SMG's gateway writes {DEFAULT_SHM_DIR}, not {shm_dir}")])
    add(check_leaks(shm_dir))
    from smgshm.core.doctor.hostchecks import run_host_checks

    host = run_host_checks(add, shm_dir, timeout, gateway_logs, inflight_bytes, gateway_pids)
    add(check_reapers())
    return DoctorReport(checks, embedded.address if embedded else "", workers, host)


def check_e2e(gateway: str | None, api_key: str | None, shm_dir: str, timeout: float,
              metrics_url: str | None = None) -> list[Check]:  # fmt: skip
    """``smgshm e2e``: which path real image requests take through ``gateway`` (or the embedded one)."""
    from smgshm.core.e2e.run import E2eOptions, run_against, run_embedded
    from smgshm.core.gateway.process import PIP_HINT, find_smg

    opts = E2eOptions(requests=2, api_key=api_key, shm_dir=shm_dir, timeout_s=max(timeout, 30.0),
                      metrics_url=metrics_url)  # fmt: skip
    if gateway is None:
        try:
            find_smg()
        except SmgshmError:
            return [Check("e2e", "skip", "skipped: SMG's gateway is not installed here", PIP_HINT)]
    try:
        report = run_against(gateway, opts) if gateway else run_embedded(opts)
    except SmgshmError as err:
        code = 4 if err.kind == "transport" else 5 if err.kind in ("host", "no_space") else 1
        return [Check("e2e", "fail", str(err), err.hint or "", code)]
    fix_cmd = shlex.join(smgshm_cmd(shm_dir, "e2e", *(["--gateway", gateway] if gateway else [])))
    out = []
    for run in report.runs:
        name = f"e2e {run.label}" if report.embedded else f"e2e {gateway}"
        summary = f"{run.cause} (p50 {run.p50_ms:.0f} ms; evidence: {', '.join(run.shm_tensors_by_source) or 'none'})"
        if run.path == "undetermined":
            out.append(Check(name, "fail", summary, f"see {fix_cmd} for each source", 6))
        elif run.failure_class:
            log = f"; gateway log: {run.gateway_log}" if run.gateway_log else ""
            out.append(Check(name, "fail", f"{run.failure} ({summary})", f"see {fix_cmd}{log}", 3))
        elif run.expected and not run.as_expected:
            out.append(Check(name, "fail", f"expected {run.expected}: {summary}", f"see {fix_cmd}", 3))
        elif run.path != "shm" and not report.embedded:
            out.append(Check(name, "warn", summary, "see the cause; smgshm probe --from-gateway shows each worker"))
        else:
            out.append(Check(name, "ok", summary))
    if report.removed_at_stop or report.processes_left:
        what = f"{len(report.removed_at_stop)} segment(s), {len(report.processes_left)} process(es)"
        out.append(Check("e2e cleanup", "fail", f"left behind: {what}", "a bug in smgshm: report it", 3))
    return out


def _is_smgshm(address: str, timeout: float) -> bool:
    import grpc

    from smgshm.core.transport.channel import grpc_target
    from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

    with grpc.insecure_channel(grpc_target(address)) as ch:
        try:
            diag_pb2_grpc.DiagnosticsStub(ch).Identity(diag_pb2.IdentityRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return True
