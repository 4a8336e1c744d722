"""doctor's e2e check: which path real image requests take through a gateway (``smgshm e2e``)."""

from __future__ import annotations

import shlex

from smgshm.core.causes import Cause, Found
from smgshm.core.doctor.check import Check
from smgshm.core.errors import GatewayNotReadyError, SmgshmError
from smgshm.core.host.facts import HostFacts
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.paths import smgshm_cmd
from smgshm.core.units import human_ms


def check_e2e(
    gateway: str | None, api_key: str | None, facts: HostFacts, timeout: float, metrics_url: str | None = None
) -> list[Check]:
    """``smgshm e2e``: which path real image requests take through ``gateway`` (or the embedded one)."""
    from smgshm.core.e2e.run import E2eOptions, run_against, run_embedded
    from smgshm.core.gateway.process import PIP_HINT, find_smg

    shm_dir = facts.shm_dir

    opts = E2eOptions(
        requests=2, api_key=api_key, shm_dir=shm_dir, timeout_s=max(timeout, 30.0), metrics_url=metrics_url
    )
    if gateway is None:
        try:
            find_smg()
        except SmgshmError:
            return [Check("e2e", Status.SKIP, "skipped: SMG's gateway is not installed here", PIP_HINT)]
    try:
        report = run_against(gateway, opts, facts=facts) if gateway else run_embedded(opts, facts=facts)
    except SmgshmError as err:
        cause = Cause.GATEWAY_NOT_READY if isinstance(err, GatewayNotReadyError) else None
        return [Check("e2e", Status.FAIL, str(err), err.hint or "", err.outcome, cause=cause)]
    out = []
    for run in report.runs:
        # The metrics it read (the gateway's own, found or proven): the command works when pasted.
        args = ["--gateway", gateway, "--metrics", run.metrics_url] if gateway else []
        fix_cmd = shlex.join(smgshm_cmd(shm_dir, "e2e", *args))
        name = f"e2e {run.label}" if report.embedded else f"e2e {gateway}"
        evidence = ", ".join(run.shm_tensors_by_source) or "none"
        summary = f"{run.cause} (p50 {human_ms(run.p50_ms)}; evidence: {evidence})"
        if run.unreachable:  # a dead worker: the endpoint's fault (4), with its cause and its own fix
            fix, step = _as_doctor(run.cause_info) if run.cause_info is not None else (f"see {fix_cmd}", [])
            out.append(
                Check(
                    name,
                    Status.FAIL,
                    summary,
                    fix,
                    Outcome.UNREACHABLE,
                    fix_cmd=step or None,
                    cause=Cause.WORKER_UNREACHABLE,
                )
            )
        elif run.path == "undetermined":
            out.append(Check(name, Status.FAIL, summary, f"see {fix_cmd} for each source", Outcome.UNDETERMINED))
        elif run.failure_class:
            log = f"; gateway log: {run.gateway_log}" if run.gateway_log else ""
            cause = Cause(run.cause_info.code) if run.cause_info is not None else None
            fix = f"{run.cause_info.fix}; " if run.cause_info is not None else ""
            out.append(
                Check(
                    name,
                    Status.FAIL,
                    f"{run.failure} ({summary})",
                    f"{fix}see {fix_cmd}{log}",
                    Outcome.CHECK_FAILED,
                    cause=cause,
                )
            )
        elif run.expected and not run.as_expected:
            out.append(
                Check(name, Status.FAIL, f"expected {run.expected}: {summary}", f"see {fix_cmd}", Outcome.CHECK_FAILED)
            )
        elif run.path != "shm" and not report.embedded and run.cause_info is not None:
            fix, step = _as_doctor(run.cause_info)
            out.append(Check(name, Status.WARN, summary, fix, fix_cmd=step or None, cause=Cause(run.cause_info.code)))
        elif run.path != "shm" and not report.embedded:
            each = ["smgshm", "probe", "--from-gateway", gateway] if gateway else []
            out.append(
                Check(
                    name,
                    Status.WARN,
                    summary,
                    "probe the gateway's workers: it names each one's cause",
                    fix_cmd=each or None,
                )
            )
        else:
            out.append(Check(name, Status.OK, summary))
    kept = [f"{run.label}: {run.gateway_log}" for run in report.runs if run.gateway_log]
    if kept:  # say where the logs it kept are, whatever the verdict
        out.append(Check("e2e logs", Status.INFO, "gateway logs kept: " + "; ".join(kept)))
    if report.removed_at_stop or report.processes_left:
        what = f"{len(report.removed_at_stop)} segment(s), {len(report.processes_left)} process(es)"
        out.append(
            Check(
                "e2e cleanup", Status.FAIL, f"left behind: {what}", "a bug in smgshm: report it", Outcome.CHECK_FAILED
            )
        )
    return out


def _as_doctor(info: Found) -> tuple[str, list[str]]:
    """e2e's cause as doctor's check gives it: the catalogue's fix, and e2e's next step for it unless that only
    runs doctor again (doctor's own checks of the shm dir are in this run)."""
    step = info.fix_cmd or []
    return info.fix, [] if step[1:2] == ["doctor"] else step
