"""Which path a gateway's tensors took, and why: the evidence judged, the cause named.

The cause comes from core/transport/decision.py's ``decide`` (the gateway's rule, the one
probe uses) applied to what is known about the gateway and its worker; the path
comes from the evidence, and the sources must agree. Disagreement, or no source at
all, is "undetermined": never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from smgshm.core.causes import Cause, for_verdict, write_failure
from smgshm.core.closed import Closed
from smgshm.core.e2e.evidence import MetricsEvidence, ReceiptEvidence, ReceiptSeen, ShmDirEvidence
from smgshm.core.gateway.setting import DEFAULT_SHM_MIN_BYTES, Mode, parse_mode
from smgshm.core.host.namespace import NamespaceComparison, Sharing, compare_namespace_ids
from smgshm.core.names import gateway_probe_name
from smgshm.core.stats import median
from smgshm.core.transport.decision import Decision, decide
from smgshm.core.units import human_ms, human_size
from smgshm.core.watch.life import End


@dataclass(frozen=True)
class Context:
    """What is known about the gateway and its worker, for the gateway's own rule."""

    mode: str  # the gateway's transport mode; "" when it cannot be known (a remote gateway)
    shm_min_bytes: int | None  # None: not known (the default 65536 is assumed)
    engine: str  # the worker's runtime_type
    local_ns: str
    worker_ns: str  # the label the gateway recorded at registration
    writable: bool  # the shm dir takes a 0600 segment here
    requests: int
    failed_requests: int
    # The gateway's own probe of /dev/shm at start (its log: dev_writable); None when not known.
    gateway_writable: bool | None = None
    # The shm dir's size and free bytes here (statvfs) when the gateway runs here; None when not known.
    shm_size_bytes: int | None = None
    shm_free_bytes: int | None = None


class TensorPath(Closed):
    """Which path a gateway's tensors took, as e2e judges it."""

    SHM = "shm"
    INLINE = "inline"
    NONE = "none"  # no multimodal tensor was sent
    UNDETERMINED = "undetermined"  # the sources disagree, or there is none: never a guess


class FailureClass(Closed):
    """The failure of smg-facts §5.3 the evidence proves (the empty string: none); falsy when none."""

    NONE = ""
    CONSUMED_HANDLE_RETRIED = "consumed_handle_retried"  # a retry reused a handle a worker had consumed
    SEGMENT_LEFT_BEHIND = "segment_left_behind"  # a segment still in the shm dir after the request
    REQUEST_FAILED = "request_failed"  # the gateway answered with an error


@dataclass(frozen=True)
class Verdict:
    path: TensorPath
    cause: str  # one sentence, the gateway's reason
    agree: bool  # every available source tells the same story
    counts: dict[str, int]  # SHM tensors per source (metrics, shm dir, receipts)
    failure_class: FailureClass = FailureClass.NONE
    # the catalogue's cause when the path is not shm, or when it is but the worker cannot open the segments
    # (None: SHM as configured)
    code: Cause | None = None


def shm_counts(m: MetricsEvidence, d: ShmDirEvidence, r: ReceiptEvidence) -> dict[str, int]:
    counts: dict[str, int] = {}
    if m.available:
        counts["metrics"] = m.tensors.get("shm", 0)
    if d.available:
        # A failed SHM write leaves a segment created and removed unread (the gateway unlinks its
        # partial file and sends the bytes inline): as many of those as the metrics count failures
        # are attempts, not tensors that went by SHM.
        failed = min(m.shm_write_failures, len(d.removed_unread)) if m.available else 0
        counts["shm dir"] = len(d.segments) - failed
    if r.available and not r.partial:
        counts["receipts"] = r.count("shm")
    return counts


def judge(ctx: Context, m: MetricsEvidence, d: ShmDirEvidence, r: ReceiptEvidence) -> Verdict:
    counts = shm_counts(m, d, r)
    failure = _failure_class(ctx, d, r)
    if not counts:
        return Verdict(
            TensorPath.UNDETERMINED,
            "no evidence: no smg_mm_* metrics, no shm dir view and no receipts",
            False,
            counts,
            failure,
            Cause.NO_EVIDENCE,
        )
    if len(set(counts.values())) > 1:
        said = ", ".join(f"{k} {v}" for k, v in counts.items())
        return Verdict(
            TensorPath.UNDETERMINED,
            f"the sources disagree on SHM tensors: {said}",
            False,
            counts,
            failure,
            Cause.SOURCES_DISAGREE,
        )
    inline_counts = _inline_counts(m, r)
    if len(set(inline_counts.values())) > 1:
        said = ", ".join(f"{k} {v}" for k, v in inline_counts.items())
        return Verdict(
            TensorPath.UNDETERMINED,
            f"the sources disagree on inline tensors: {said}",
            False,
            counts,
            failure,
            Cause.SOURCES_DISAGREE,
        )
    n_shm = next(iter(counts.values()))
    n_inline = next(iter(inline_counts.values()), 0)
    if n_shm:
        text, code = _shm_cause(ctx, m, d, r, n_shm, n_inline), None
        blocked = _cannot_open(ctx)
        if blocked is not None and (ctx.failed_requests or _refused(r)):  # sent by SHM where it cannot be read
            text += f"; the worker cannot open them: {blocked.reason}"
            code = for_verdict(blocked.sharing.value, ctx.local_ns)
        return Verdict(TensorPath.SHM, text, True, counts, failure, code)
    if n_inline:
        path, cause, code = _inline_cause(ctx, m, d, r)
        return Verdict(path, cause, True, counts, failure, code)
    # Not gated on m.available: under worker processing the gateway meters no tensor at all, so
    # its smg_mm_tensors_* families never appear, but its own processing counter says why.
    if m.processing.get("worker"):
        return Verdict(
            TensorPath.NONE,
            "no multimodal tensors: the gateway runs --mm-processing worker (media go as refs)",
            True,
            counts,
            failure,
            Cause.WORKER_PROCESSING,
        )
    if ctx.failed_requests == ctx.requests:
        return Verdict(
            TensorPath.NONE,
            "no multimodal tensors: every request failed before the gateway sent any",
            True,
            counts,
            failure,
            Cause.NO_MM_TENSORS,
        )
    return Verdict(
        TensorPath.NONE,
        "no multimodal tensors were sent (is the model a vision model?)",
        True,
        counts,
        failure,
        Cause.NO_MM_TENSORS,
    )


def _inline_counts(m: MetricsEvidence, r: ReceiptEvidence) -> dict[str, int]:
    out: dict[str, int] = {}
    if m.available:
        out["metrics"] = m.tensors.get("inline", 0)
    if r.available and not r.partial:
        out["receipts"] = r.count("inline")
    return out


def _min_bytes(ctx: Context) -> int:
    return ctx.shm_min_bytes if ctx.shm_min_bytes is not None else DEFAULT_SHM_MIN_BYTES


def _shm_cause(
    ctx: Context, m: MetricsEvidence, d: ShmDirEvidence, r: ReceiptEvidence, n_shm: int, n_inline: int
) -> str:
    per = max(ctx.requests, 1)
    shm_receipts = [x for x in r.receipts if x.payload_kind == "shm"]
    keys = sorted({x.key for x in shm_receipts})
    what = ", ".join(keys) if keys else f"{n_shm // per or n_shm} tensor(s)"
    nbytes = m.nbytes.get("shm", 0) if m.available else sum(x.nbytes for x in shm_receipts)
    if not nbytes and d.available:
        nbytes = sum(s.nbytes or 0 for s in d.segments)
    text = f"SHM: {what} {human_size(nbytes / per)} via shm"
    if ctx.requests > 1:
        text += f" in each of {ctx.requests} requests"
    consumed = [s.in_flight_ms for s in d.segments if s.end == End.CONSUMED] if d.available else []
    # A refused receipt was never read (its age is when the worker looked, not when it read).
    ages = [x.age_ms for x in shm_receipts if x.age_ms > 0 and not x.error_code]
    refused = _refused(r)
    if consumed:
        text += f", consumed in {human_ms(median(consumed))}"
    elif ages:
        text += f", read {human_ms(median(ages))} after the write"
    elif refused:
        codes = ", ".join(sorted({x.error_code for x in refused}))
        text += f", never read: the worker refused {len(refused)} of {len(shm_receipts)} ({codes})"
        if codes == "missing":
            text += ": no such segment where it looks"
    if n_inline:
        each, least = " per request" if ctx.requests > 1 else "", human_size(_min_bytes(ctx))
        text += f"; {n_inline // per or n_inline} tensor(s) inline{each} (below shm_min_bytes {least})"
    return text


def _inline_cause(
    ctx: Context, m: MetricsEvidence, d: ShmDirEvidence, r: ReceiptEvidence
) -> tuple[TensorPath, str, Cause]:
    sizes = [x.nbytes for x in r.receipts] if r.available else []
    if not sizes and m.available and m.tensors.get("inline"):
        sizes = [m.nbytes.get("inline", 0)]  # an upper bound of the largest tensor
    largest = max(sizes, default=0)
    if m.available and m.shm_write_failures:
        return (
            TensorPath.INLINE,
            f"inline: SHM writes are failing (write failures +{m.shm_write_failures})",
            write_failure(largest, ctx.shm_size_bytes, ctx.shm_free_bytes, ctx.writable),
        )
    if d.available and d.probe_file_left:
        return (
            TensorPath.INLINE,
            (
                f"inline: the gateway's probe file is left over ({d.probe_file_left}): its writability "
                "probe fails, so SHM stays off"
            ),
            Cause.PROBE_FILE_LEFT,
        )
    minb = _min_bytes(ctx)
    mode = parse_mode(ctx.mode)

    writable = ctx.writable and ctx.gateway_writable is not False

    def rule(md: Mode) -> Decision:
        return decide(
            md,
            nbytes=largest,
            engine=ctx.engine,
            local_ns=ctx.local_ns,
            worker_ns=ctx.worker_ns,
            writable=writable,
            shm_min_bytes=minb,
        )

    if mode is not None:
        dec = rule(mode)
        if dec.path == "shm":
            return (
                TensorPath.UNDETERMINED,
                (f"the gateway sent inline although its rule says shm ({dec.reason}); see its log"),
                Cause.INLINE_AGAINST_RULE,
            )
        if mode in (Mode.INLINE, Mode.RDMA):
            return TensorPath.INLINE, f"inline: mode is {mode.value}", Cause.MODE_INLINE
        if ctx.gateway_writable is False and dec.cause is Cause.SHM_PERMISSION:
            pid = d.name_pid if d.available and d.name_pid is not None else "<pid>"
            return (
                TensorPath.INLINE,
                (
                    f"inline: {dec.reason} (dev_writable=false in its log): SHM is off for its life; a "
                    f"leftover {gateway_probe_name(pid)} (it removes the file as its probe fails) "
                    "or a /dev/shm it cannot write"
                ),
                Cause.GATEWAY_PROBE_FAILED,
            )
        return (TensorPath.INLINE, *_why(dec, largest, minb))
    # A remote gateway: its mode cannot be read. What auto would do tells the cause apart.
    dec = rule(Mode.AUTO)
    if dec.path == "inline":
        text, code = _why(dec, largest, minb)
        return TensorPath.INLINE, text + " (or mode is inline)", code
    return (
        TensorPath.INLINE,
        "inline: mode is inline (the worker's id matches this host's, so auto or shm would use SHM)",
        Cause.MODE_INLINE,
    )


def _why(dec: Decision, largest: int, minb: int) -> tuple[str, Cause]:
    """An inline decision's sentence, and its cause as ``decide`` decided it."""
    code = dec.cause or Cause.ENGINE_INLINE_ONLY  # an inline decision always names one
    if code is Cause.BELOW_SHM_MIN_BYTES:
        return f"inline: every tensor is below shm_min_bytes {human_size(minb)} (largest {human_size(largest)})", code
    if code in (Cause.SHM_PERMISSION, Cause.ENGINE_INLINE_ONLY, Cause.NOT_GRPC, Cause.MODE_INLINE):
        return f"inline: {dec.reason}", code
    return f"inline: the worker advertises another namespace id ({dec.reason})", code  # auto's namespace check


def _refused(r: ReceiptEvidence) -> list[ReceiptSeen]:
    """The SHM tensors the worker's receipts say it could not read (missing, denied, ...)."""
    return [x for x in r.receipts if x.payload_kind == "shm" and x.error_code] if r.available else []


def _cannot_open(ctx: Context) -> NamespaceComparison | None:
    """The namespace ids say the worker cannot open the gateway's segments (another host, another tmpfs):
    the comparison that says why, or None when they say it can (or cannot tell)."""
    cmp = compare_namespace_ids(ctx.local_ns, ctx.worker_ns)
    return cmp if cmp.sharing in (Sharing.OTHER_HOST, Sharing.PRIVATE_TMPFS) else None


def _failure_class(ctx: Context, d: ShmDirEvidence, r: ReceiptEvidence) -> FailureClass:
    """The failure classes of smg-facts §5.3 that the evidence can prove."""
    consumed = {s.name for s in d.segments if s.end == End.CONSUMED} if d.available else set()
    missing = [x for x in r.receipts if x.payload_kind == "shm" and x.error_code == "missing"]
    # A worker that cannot see the gateway's tmpfs never consumed a handle: its "missing" is its view.
    unseen = not d.available and _cannot_open(ctx) is None
    if ctx.failed_requests and missing and (unseen or any(x.shm_name in consumed for x in missing)):
        return FailureClass.CONSUMED_HANDLE_RETRIED
    if d.available and d.left_behind:
        return FailureClass.SEGMENT_LEFT_BEHIND
    if ctx.failed_requests:
        return FailureClass.REQUEST_FAILED
    return FailureClass.NONE


FAILURE_TEXT = {
    FailureClass.CONSUMED_HANDLE_RETRIED: (
        "the gateway retried a request with an SHM handle a worker had already read (and unlinked): the retry "
        "fails although inline would have worked (SMG: retries reuse consumed handles)"
    ),
    FailureClass.SEGMENT_LEFT_BEHIND: "a segment the gateway wrote is still in the shm dir after the request (a leak)",
    FailureClass.REQUEST_FAILED: "the gateway answered with an error",
}


def expectation(expect: str | None, mode: str, default: str, v: Verdict) -> tuple[str, bool]:
    """(the path expected, whether the run met it).

    ``expect`` (the caller's --expect) wins; ``any`` accepts every path. Without it a known
    ``auto``/``shm`` setting expects SHM: SHM-eligible tensors gone inline fail, with their
    cause (tensors below shm_min_bytes and runs without tensors are inline or empty by design).
    ``default``: what the caller expects otherwise ("" nothing)."""
    if expect == "any":
        return "", True
    if expect:
        return expect, v.path == expect
    if parse_mode(mode) in (Mode.AUTO, Mode.SHM):
        return TensorPath.SHM, v.path != TensorPath.INLINE or v.code is Cause.BELOW_SHM_MIN_BYTES
    return default, not default or v.path == default
