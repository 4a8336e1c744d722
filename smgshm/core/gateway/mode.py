"""A running gateway's transport setting, established from evidence, each source named.

Sources, strongest first: its start-up log line (gatewaylog: the setting itself), its
metrics since start (what its tensors did: behaviour, not the setting), and for
certainty an e2e request. Metrics alone cannot tell "SHM is off" from "SHM is failing
quietly" unless the write-failure counter moved, so findings say which they cannot tell.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.closed import Closed
from smgshm.core.gateway.log import TransportConfig
from smgshm.core.gateway.metrics import CHAT_PATH, MmTraffic
from smgshm.core.gateway.setting import DEFAULT_SHM_MIN_BYTES, SHM_MODES, Mode
from smgshm.core.names import gateway_probe_name
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.units import human_size

FIX_FLAG = ["--multimodal-tensor-transport", "auto"]


@dataclass(frozen=True)
class Evidence:
    source: str  # "log /var/log/smg.log:12" | "metrics http://127.0.0.1:29000/metrics"
    says: str


class Verdict(Closed):
    """What a gateway's transport is, as its evidence shows it."""

    SHM = "shm"  # it writes SHM, and requests that carried it succeed
    INLINE = "inline"  # its tensors go inline, by its setting or despite it
    OFF_OR_FAILING = "off_or_failing"  # large tensors inline, and nothing tells off from failing quietly
    FAILING = "failing"  # SHM writes fail, or every request that carried SHM failed
    PROBE_FAILED = "probe_failed"  # its start-up probe of /dev/shm failed: inline for its life
    NO_TRAFFIC = "no_traffic"  # its setting is known, no multimodal tensor yet
    UNKNOWN = "unknown"  # nothing tells its setting (or tiny tensors, inline by design)


@dataclass(frozen=True)
class ModeFinding:
    """What can be said about one gateway's transport, with its evidence and fix."""

    verdict: Verdict
    status: Status  # doctor's: unknown judged nothing, and its code is UNDETERMINED
    summary: str
    fix: str = ""
    code: Outcome = Outcome.OK  # what a failing finding asks the run to end as (JSON: its exit code)
    evidence: list[Evidence] = field(default_factory=list)
    mode: Mode | None = None  # as logged, when a log was read
    mean_tensor_bytes: int | None = None  # over every path since start
    cause: Cause | None = None  # the catalogue's cause of a warning or failure (None: none, or not knowable here)


def write_errors_fix(config: TransportConfig | None) -> str:
    """The fix for SHM writes that fail, for a cause no shm dir tells (not full, not too small, not a permission
    this host sees): the catalogue's "read the gateway's log" where no log was read; where one was, its path and
    its own words, the last few write errors of the run since its start line (``TransportConfig.write_errors``:
    bounded, control characters replaced: a stranger's text), or that the part read holds none."""
    check = "then check the shm dir's space and permissions as the gateway's uid sees them"
    if config is None:
        return CATALOGUE[Cause.SHM_WRITES_FAILING].fix
    if not config.write_errors:
        read = "the part smgshm read of " if config.truncated else ""
        return f"read the gateway's log {config.path} for the write error ({read}it has none since its start); {check}"
    n = len(config.write_errors)
    said = "; ".join(f"\u201c{e}\u201d" for e in config.write_errors)
    return f"the gateway's log {config.path} says why (its last {n} write error(s)): {said}; {check}"


def _errors_said(config: TransportConfig) -> str:
    return f"; SHM write errors since: {' | '.join(config.write_errors)}" if config.write_errors else ""


def fix_text(mode: Mode = Mode.AUTO) -> str:
    flag = shlex.join([FIX_FLAG[0], mode])
    return f"restart the gateway with {flag} (or SMG_MM_TENSOR_TRANSPORT={shlex.quote(mode)}; the flag wins)"


def _shm_written(found: Callable[..., ModeFinding], t: MmTraffic, mode: Mode | None, certain: str) -> ModeFinding:
    """A gateway that wrote SHM since start: in use, unless no chat request of it succeeded (then every
    request that carried SHM failed: a failure, never "in use")."""
    shm_n, total = t.tensors.get("shm", 0), t.total_tensors
    if t.chat_responses and t.chat_errors == t.chat_responses:
        return found(
            Verdict.FAILING,
            Status.FAIL,
            f"SHM written since start ({shm_n:,} of {total:,} tensors via shm), but every one of its "
            f"{t.chat_responses:,} chat request(s) failed ({CHAT_PATH} answered no 2xx, metrics): "
            "no request that carried SHM succeeded",
            "its workers' checks say why (a worker on another tmpfs or host cannot open its segments: "
            "namespace_private_tmpfs, namespace_other_host); the gateway's log has each error" + certain,
            Outcome.CHECK_FAILED,
        )
    share = t.shm_byte_share
    return found(
        Verdict.SHM,
        Status.OK,
        f"SHM in use since start: {shm_n:,} of {total:,} tensors via shm"
        + (f", {share:.0%} of the bytes" if share is not None else "")
        + (f" (mode={mode}, log)" if mode else " (metrics)"),
    )


def _all_inline(
    found: Callable[..., ModeFinding], t: MmTraffic, mode: Mode | None, threshold: int, http_url: str, certain: str
) -> ModeFinding:
    """Every tensor since start went inline: what that says of the setting, by their mean size."""
    inline_n = t.tensors.get("inline", 0)
    inline_mean = t.nbytes.get("inline", 0) / inline_n
    if inline_mean >= threshold:
        if mode == Mode.AUTO:
            return found(
                Verdict.INLINE,
                Status.WARN,
                f"configured auto (log) but all {inline_n:,} tensors since start went inline "
                f"(mean {human_size(inline_mean)}): the worker's shm_namespace_id does not match the "
                "gateway's",
                "compare them: " + shlex.join(["smgshm", "probe", "--from-gateway", http_url or "URL"]) + certain,
            )
        if mode == Mode.SHM:  # a configured SHM path that does not happen: a failure, whatever the reason
            return found(
                Verdict.INLINE,
                Status.FAIL,
                f"configured shm (log) yet all {inline_n:,} tensors since start went inline "
                f"(mean {human_size(inline_mean)}) and no write failed: its workers do not take SHM",
                "see each worker's engine and lane (SGLang, TRT-LLM, MLX and the ZMQ lane take tensors inline "
                "only): " + shlex.join(["smgshm", "probe", "--from-gateway", http_url or "URL"]) + certain,
                Outcome.CHECK_FAILED,
            )
        return found(
            Verdict.OFF_OR_FAILING,
            Status.WARN,
            f"multimodal tensors went inline since start ({inline_n:,} tensors, mean "
            f"{human_size(inline_mean)}): SHM is off (the default is inline) or failing",
            fix_text(),
            cause=Cause.MODE_INLINE,
        )
    small = (
        f"{inline_n:,} tensors since start, all inline, mean {human_size(inline_mean)}: below "
        f"shm_min_bytes {human_size(threshold)}, inline by design"
    )
    if mode:
        return found(
            Verdict.UNKNOWN, Status.OK, f"{small} (mode={mode}, log){certain}", cause=Cause.BELOW_SHM_MIN_BYTES
        )
    return _setting_unknown(found, f"{small} whatever the setting, and no log read", certain)


def judge(
    who: str,
    config: TransportConfig | None,
    traffic: MmTraffic | None,
    metrics_url: str = "",
    e2e_hint: str = "",
    http_url: str = "",
    name_pid: int | None = None,
) -> ModeFinding:
    """The finding for gateway ``who`` ("gateway pid 4242") from what is known about it.

    ``name_pid``: its pid in its own pid namespace (NSpid), the one its probe file is named by."""
    ev: list[Evidence] = []
    if config is not None:
        ev.append(
            Evidence(
                f"log {config.where}",
                f"mode={config.mode} shm_min_bytes={config.shm_min_bytes} "
                f"dev_writable={str(config.dev_writable).lower()}"
                + ("; part of the log was not read (a later start may be there)" if config.truncated else "")
                + _errors_said(config),
            )
        )
    threshold = config.shm_min_bytes if config and config.shm_min_bytes is not None else DEFAULT_SHM_MIN_BYTES
    t = traffic
    total = t.total_tensors if t else 0
    mean = round(sum(t.nbytes.values()) / total) if t and total else None
    if t is not None:
        paths = ", ".join(f"{k} {v:,}" for k, v in sorted(t.tensors.items())) or "none"
        ev.append(
            Evidence(
                f"metrics {metrics_url}",
                f"tensors since start by path: {paths}; shm write failures {t.shm_write_failures}",
            )
        )
    mode = config.mode if config else None
    certain = f"; for certainty: {e2e_hint}" if e2e_hint else ""

    def found(
        verdict: Verdict,
        status: Status,
        summary: str,
        fix: str = "",
        code: Outcome = Outcome.OK,
        cause: Cause | None = None,
    ) -> ModeFinding:
        return ModeFinding(verdict, status, f"{who}: {summary}", fix, code, ev, mode, mean, cause)

    # The setting itself first: the log is the only source that states it.
    if config is not None and mode in SHM_MODES and config.dev_writable is False:
        return found(
            Verdict.PROBE_FAILED,
            Status.FAIL,
            f"configured {mode} but its /dev/shm probe failed (dev_writable=false, log): "
            "every tensor goes inline for the life of this process",
            f"a leftover {gateway_probe_name('<pid>' if name_pid is None else name_pid)} (the gateway removes "
            "it as its probe fails, unless it is another uid's) or a /dev/shm it cannot write: smgshm gc, then "
            "restart the gateway",
            Outcome.HOST,
            Cause.GATEWAY_PROBE_FAILED,
        )
    if t is not None and t.shm_write_failures:
        return found(
            Verdict.FAILING,
            Status.FAIL,
            f"{t.shm_write_failures:,} SHM write failure(s) since start (metrics): those tensors went inline",
            # Full, too small or permission: doctor tells them apart when the gateway writes to its shm dir.
            write_errors_fix(config),
            Outcome.CHECK_FAILED,
            Cause.SHM_WRITES_FAILING,
        )
    shm_n = t.tensors.get("shm", 0) if t else 0
    inline_n = t.tensors.get("inline", 0) if t else 0
    if shm_n and t is not None:
        return _shm_written(found, t, mode, certain)
    if mode == Mode.INLINE:
        return found(
            Verdict.INLINE,
            Status.WARN,
            "configured inline (log): SHM is off"
            + (f"; {inline_n:,} tensors went inline since start" if inline_n else ""),
            fix_text(),
            cause=Cause.MODE_INLINE,
        )
    if mode == Mode.RDMA:
        return found(Verdict.INLINE, Status.OK, "configured rdma (log): tensors go by RDMA or inline, never SHM")
    if inline_n and t is not None:
        return _all_inline(found, t, mode, threshold, http_url, certain)
    if mode in SHM_MODES:
        return found(Verdict.NO_TRAFFIC, Status.OK, f"configured {mode} (log); no multimodal tensor since start yet")
    if t is not None:
        worker = t.processing.get("worker", 0)
        if worker:
            why = f"{worker:,} request(s) preprocessed by the worker (--mm-processing worker): no gateway SHM"
            return found(Verdict.NO_TRAFFIC, Status.OK, why + certain)
        return _setting_unknown(found, "no multimodal tensor since start (metrics) and no log read", certain)
    return _setting_unknown(found, "no log and no metrics at hand", certain)


def _setting_unknown(found: Callable[..., ModeFinding], why: str, certain: str) -> ModeFinding:
    """Nothing shows the gateway's transport setting: a check that judged nothing, never a pass (exit 6)."""
    return found(
        Verdict.UNKNOWN,
        Status.UNKNOWN,
        f"{why}: its transport setting is unknown",
        "pass the log it wrote at its start: smgshm doctor --gateway-log FILE" + certain,
        Outcome.UNDETERMINED,
    )
