"""The one catalogue of why SHM does not happen: a stable code, a sentence, and a fix.

probe, e2e, doctor and watch name a cause with a ``Cause``; its ``value`` is the code
carried in JSON (never renamed: alerting keys on it). ``found`` builds the instance a
report carries: the catalogue's meaning and fix, the case's own sentence, and the
argv of the cause's next step (each entry's ``step``, built from what the caller knows:
a ``Where`` naming the shm dir, gateway or worker; shell-quoted only when shown). Every
command suggested for a cause is built here, none by its callers. The README's table of causes is checked
against this module by tests/test_causes.py.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from smgshm.core.engines import ENGINES

TRANSPORT_FLAG = "--multimodal-tensor-transport"


class Cause(enum.Enum):
    OTHER_HOST = "namespace_other_host"
    PRIVATE_TMPFS = "namespace_private_tmpfs"
    ID_SPELLING = "namespace_id_spelling"
    NO_NAMESPACE_ID = "no_namespace_id"
    LOCAL_ID_UNREADABLE = "namespace_unreadable"
    MODE_INLINE = "mode_inline"
    BELOW_SHM_MIN_BYTES = "below_shm_min_bytes"
    ENGINE_INLINE_ONLY = "engine_inline_only"
    SHM_WRITES_FAILING = "shm_writes_failing"
    SHM_FULL = "shm_full"
    SHM_TOO_SMALL = "shm_too_small"
    SHM_PERMISSION = "shm_permission"
    GATEWAY_PROBE_FAILED = "gateway_probe_failed"
    PROBE_FILE_LEFT = "probe_file_left"
    UID_MISMATCH = "uid_mismatch"
    VERIFY_FAILED = "verify_failed"
    NOT_GRPC = "not_grpc"
    WORKER_PROCESSING = "worker_processing"
    NO_MM_TENSORS = "no_mm_tensors"
    ZMQ_LANE = "zmq_lane"
    WORKER_UNREACHABLE = "worker_unreachable"
    GATEWAY_NOT_READY = "gateway_not_ready"
    INLINE_AGAINST_RULE = "inline_against_rule"
    SOME_WORKERS_INLINE = "some_workers_inline"
    SOURCES_DISAGREE = "sources_disagree"
    NO_EVIDENCE = "no_evidence"
    # What doctor finds before any request: a gateway's own workers and configuration, its segments.
    WORKER_SLOW = "worker_slow"
    STALE_NAMESPACE_LABEL = "stale_namespace_label"
    WORKERS_UNLISTED = "workers_unlisted"
    NO_WORKERS = "no_workers"
    MIXED_NAMESPACE_IDS = "mixed_namespace_ids"
    WORKER_OVERRIDE_IGNORED = "worker_override_ignored"
    PD_DECODE_NAMESPACE = "pd_decode_namespace"
    SEGMENTS_STRANDED = "segments_stranded"
    SEGMENTS_LEAKED = "segments_leaked"
    PREFLIGHT_TIMEOUT = "preflight_timeout"


@dataclass(frozen=True)
class Where:
    """What the caller knows of the object a cause concerns, for the command of its next step to name it:
    the shm dir examined (as the command must be given it: never this host's /dev/shm for another's), the
    gateway's URL, the worker's address; ``assume_dead``: the caller judged with gc's
    --assume-dead, so the gc it suggests must be told so too. "" (False): not known, not named.
    ``running``: the command the caller is (doctor, probe): a step that would only run it again to look
    (doctor for doctor) is none."""

    shm_dir: str = ""
    gateway_url: str = ""
    address: str = ""
    assume_dead: bool = False
    running: str = ""  # the smgshm command the caller runs: a step that only looks never suggests it again


Step = Callable[[Where], "list[str] | None"]


def _on_dir(*args: str, look: bool = False) -> Step:
    """``smgshm ARGS --shm-dir DIR``: a command acting on the shm dir examined (none when it is not known).
    ``look``: it only diagnoses, so it is none for a caller running that command already."""

    def step(w: Where) -> list[str] | None:
        if not w.shm_dir or (look and w.running == args[0]):
            return None
        return ["smgshm", *args, "--shm-dir", w.shm_dir]

    return step


def _on_worker(*args: str, look: bool = False) -> Step:
    """``smgshm ARGS ADDRESS``: a command acting on the worker named (none when no worker is). ``look``: as
    for ``_on_dir``."""

    def step(w: Where) -> list[str] | None:
        if not w.address or (look and w.running == args[0]):
            return None
        return ["smgshm", *args, w.address]

    return step


def _gateway_workers(w: Where) -> list[str] | None:
    """probe of each worker of the gateway named: which of them the cause holds for (a look: none in probe)."""
    return ["smgshm", "probe", "--from-gateway", w.gateway_url] if w.gateway_url and w.running != "probe" else None


def _reap_leaked(w: Where) -> list[str] | None:
    """gc deleting the leaked segments of the dir examined, told --assume-dead when they were judged so."""
    if not w.shm_dir:
        return None
    return ["smgshm", "gc", "--delete", "--shm-dir", w.shm_dir, *(["--assume-dead"] if w.assume_dead else [])]


def _none(_w: Where) -> list[str] | None:
    """No command applies: the fix's words say what to do."""
    return None


@dataclass(frozen=True)
class Entry:
    meaning: str  # what the code means, for the README table and a fix-less display
    fix: str  # the concrete fix, in words
    step: Step = _none  # the argv of the command that applies, from what the caller knows (Where)

    def next_step(self, where: Where) -> list[str] | None:
        """The command of this cause's next step for the object ``where`` names (None: none applies); argv,
        shell-quoted when shown."""
        return self.step(where)


_SHARE = (
    "share one tmpfs: docker --ipc=host or --ipc=container:<gateway>, a shared volume at /dev/shm, or a "
    "Kubernetes emptyDir {medium: Memory} mounted at /dev/shm in both containers"
)

CATALOGUE: dict[Cause, Entry] = {
    Cause.OTHER_HOST: Entry(
        "the worker runs on another host or VM (boot ids differ): it cannot open this host's segments",
        f"SHM needs gateway and worker on one host; keep {TRANSPORT_FLAG} inline (or auto) for remote workers",
        _gateway_workers,
    ),
    Cause.PRIVATE_TMPFS: Entry("same host, but the worker's /dev/shm is a different tmpfs", _SHARE, _gateway_workers),
    Cause.ID_SPELLING: Entry(
        "the ids name the same tmpfs but are spelled differently; the gateway compares strings",
        "advertise the id exactly as SMG's servicer computes it, which ns prints",
        _on_dir("ns", look=True),
    ),
    Cause.NO_NAMESPACE_ID: Entry(
        "the worker advertises no (or a malformed) shm_namespace_id, so auto stays inline",
        "the worker must advertise shm_namespace_id (vLLM field 10, TokenSpeed scheduler_info); SGLang, TRT-LLM "
        "and MLX never do and always get inline",
        _gateway_workers,
    ),
    Cause.LOCAL_ID_UNREADABLE: Entry(
        "this host's namespace id is unreadable (boot id or the shm dir cannot be read)",
        "make /proc/sys/kernel/random/boot_id and the shm dir readable; ns shows what is read",
        _on_dir("ns", look=True),
    ),
    Cause.MODE_INLINE: Entry(
        "the gateway's transport mode is inline (or rdma): it never uses SHM",
        f"restart the gateway with {TRANSPORT_FLAG} auto (or SMG_MM_TENSOR_TRANSPORT=auto; the flag wins)",
    ),
    Cause.BELOW_SHM_MIN_BYTES: Entry(
        "every tensor is below the gateway's shm_min_bytes: inline by design",
        "nothing to fix for small tensors; lower --multimodal-shm-min-bytes to move them to SHM",
    ),
    Cause.ENGINE_INLINE_ONLY: Entry(
        "the worker's engine takes tensors inline only: no namespace id changes that",
        "SGLang, TRT-LLM and MLX take tensors inline only: serve the model with vLLM or TokenSpeed over gRPC to use "
        "SHM, or set the gateway's transport inline",
    ),
    Cause.SHM_WRITES_FAILING: Entry(
        "the gateway's SHM writes fail, so those tensors go inline",
        "read the gateway's log for the write error; check the shm dir's space and permissions with doctor",
        _on_dir("doctor", look=True),
    ),
    Cause.SHM_FULL: Entry(
        "the shm dir is full: the gateway's SHM writes fail",
        "free the shm dir (enlarge it, or remove leaked segments with gc)",
        _on_dir("gc", "--delete"),
    ),
    Cause.SHM_TOO_SMALL: Entry(
        "the shm dir is smaller than one tensor: the gateway's SHM writes fail however empty it is",
        "enlarge the shm dir (docker --shm-size, a larger emptyDir sizeLimit); nothing leaked, gc frees nothing; "
        "doctor says by how much",
        _on_dir("doctor", look=True),
    ),
    Cause.SHM_PERMISSION: Entry(
        "this host cannot create a 0600 segment in the shm dir (permission, or a read-only mount)",
        "give the gateway's uid write access to the shm dir (mounted read-write, mode 1777, as /dev/shm and a memory "
        "emptyDir are); doctor checks it",
        _on_dir("doctor", look=True),
    ),
    Cause.GATEWAY_PROBE_FAILED: Entry(
        "the gateway's writability probe of /dev/shm failed at start (dev_writable=false): SHM is off for its life",
        "restart the gateway after removing a leftover probe file or making /dev/shm writable; gc lists what is there",
        _on_dir("gc", look=True),
    ),
    Cause.PROBE_FILE_LEFT: Entry(
        "a leftover smg-tokenspeed-probe-<pid> file makes the gateway with that pid find /dev/shm unwritable",
        "restart the gateway after removing the leftover probe file with gc",
        _on_dir("gc", "--delete"),
    ),
    Cause.UID_MISMATCH: Entry(
        "the worker runs as another uid and cannot open the 0600 segments",
        "run the gateway and the worker as the same uid (segments are created 0600)",
    ),
    Cause.VERIFY_FAILED: Entry(
        "the receiver could not read the canary segment byte-exactly",
        "read the receiver's error, fix it and verify again",
        _on_worker("probe", "--verify"),
    ),
    Cause.NOT_GRPC: Entry(
        "a non-gRPC worker: SMG sends it tensors inline only",
        "register the worker over gRPC (grpc://host:port) to let it take SHM",
    ),
    Cause.WORKER_PROCESSING: Entry(
        "the gateway runs --mm-processing worker: media go to the worker as refs, no tensors",
        "use --mm-processing router (or auto) if the gateway should send tensors",
    ),
    Cause.NO_MM_TENSORS: Entry(
        "no multimodal tensors were sent (the model is not a vision model, or every request failed)",
        "send an image to a vision model; read the requests' errors",
    ),
    Cause.ZMQ_LANE: Entry(
        "the gateway reaches the worker over its direct-ZMQ lane (ipc://), which takes inline tensor payloads only",
        "register the worker over gRPC (grpc://host:port) to let it take SHM",
    ),
    Cause.WORKER_UNREACHABLE: Entry(
        "the worker does not answer",
        "check the address and that the worker's gRPC server is up (--connect-timeout to wait longer)",
        _on_worker("probe", look=True),
    ),
    Cause.GATEWAY_NOT_READY: Entry(
        "the gateway answers 502/503/504 (an error, exit 4): no worker of it is registered and healthy yet",
        "wait until GET /workers lists its workers healthy (--worker-urls or POST /workers), or read the workers' logs",
    ),
    Cause.INLINE_AGAINST_RULE: Entry(
        "the gateway sent inline although its rule says shm",
        "read the gateway's log for the reason",
    ),
    Cause.SOME_WORKERS_INLINE: Entry(
        "SHM-eligible tensors went inline while others went by SHM: some of the gateway's workers do not take "
        "SHM (another namespace, an inline-only engine or lane); its counters cannot tell which",
        "doctor names each worker's cause, as does probing the gateway's workers",
        _gateway_workers,
    ),
    Cause.SOURCES_DISAGREE: Entry(
        "the sources of evidence (metrics, shm dir, receipts) tell different stories (a worker shared with "
        "another gateway keeps receipts of its tensors too)",
        "rerun while the worker serves only this gateway; if they still disagree, pass the gateway's own --metrics URL",
    ),
    Cause.NO_EVIDENCE: Entry(
        "no evidence: no smg_mm_* metrics, no shm dir view and no receipts",
        "run smgshm where the gateway runs, as root or as its uid (its segments are then seen), with its --metrics URL",
    ),
    Cause.WORKER_SLOW: Entry(
        "a worker the gateway lists did not answer doctor's probe within its budget",
        "probe it alone, with a longer --timeout if it answers slowly",
        _on_worker("probe", look=True),
    ),
    Cause.STALE_NAMESPACE_LABEL: Entry(
        "the gateway recorded another shm_namespace_id at registration than the worker advertises now "
        "(labels are read once): under auto it stays inline",
        "re-register the worker (DELETE then POST /workers) or restart the gateway",
    ),
    Cause.WORKERS_UNLISTED: Entry(
        "the gateway's GET /workers did not answer (or refused), so its workers could not be probed",
        "check that the gateway's HTTP port answers GET /workers; pass --api-key KEY if the gateway requires one",
    ),
    Cause.NO_WORKERS: Entry(
        "the gateway has no worker registered",
        "register its workers (--worker-urls, or POST /workers)",
    ),
    Cause.MIXED_NAMESPACE_IDS: Entry(
        "one model is served by workers with different or empty namespace ids under auto/shm: a retry can "
        "send a handle to a worker that cannot open it",
        "serve one model from workers that share the gateway's /dev/shm, or put the others under another "
        "model name or gateway",
    ),
    Cause.WORKER_OVERRIDE_IGNORED: Entry(
        "a per-worker transport setting (field or label) that SMG ignores although its docs promise it",
        "set the gateway's own --multimodal-tensor-transport / --multimodal-shm-min-bytes instead",
    ),
    Cause.PD_DECODE_NAMESPACE: Entry(
        "a PD decode worker in another namespace than the gateway: under auto every request goes inline",
        "run the decode workers where they share the gateway's /dev/shm, or run the gateway with "
        f"{TRANSPORT_FLAG} shm (no namespace check; the prefill worker reads the pixels)",
    ),
    Cause.SEGMENTS_STRANDED: Entry(
        "a live gateway's segments that no worker will read: SMG never removes its own while it lives",
        "restart the gateway (it sweeps its own at its first SHM write), or smgshm gc --delete "
        "--include-stale after the stale age",
    ),
    Cause.SEGMENTS_LEAKED: Entry(
        "segments whose producer is dead and that no process holds: nothing will read or remove them",
        "remove them with gc",
        _reap_leaked,
    ),
    Cause.PREFLIGHT_TIMEOUT: Entry(
        "preflight did not finish its checks within --timeout: nothing is known, so SHM may be off (the gateway "
        "starts and serves inline; with --require-shm it must not start)",
        "rerun with a longer --timeout; look for a process stuck in D state (its /proc reads block) or a crowded "
        "shm dir (smgshm gc)",
    ),
}


@dataclass(frozen=True)
class Found:
    """One cause as a report carries it: ``code`` for machines, ``message`` and ``fix`` for people."""

    code: str
    message: str
    fix: str
    fix_cmd: list[str] | None = None  # a command that applies, as argv; shell-quote when shown


def found(cause: Cause, message: str = "", where: Where | None = None, fix: str = "") -> Found:
    """The instance of ``cause``: the case's sentence (default: the catalogue's meaning), its fix and the
    command of its next step for what ``where`` names (the catalogue's, never the caller's own)."""
    entry = CATALOGUE[cause]
    return Found(cause.value, message or entry.meaning, fix or entry.fix, entry.next_step(where or Where()))


def no_space(needed: int, size_bytes: int | None) -> Cause:
    """Why a write of ``needed`` bytes found no space: too small when the tmpfs's total is below it, whatever is
    free (no gc frees that), else full (the empty dir would hold it: freeing space helps)."""
    if size_bytes is not None and needed and size_bytes < needed:
        return Cause.SHM_TOO_SMALL
    return Cause.SHM_FULL


def write_failure(largest: int, size_bytes: int | None, free_bytes: int | None, writable: bool | None) -> Cause:
    """Why the gateway's SHM writes fail, as far as this host's shm dir tells (None: not known).

    ``largest``: a tensor size the writes needed (0: unknown). Full and too small are told
    apart by the dir's size: a full one frees up, a too small one never does."""
    short = (size_bytes is not None and size_bytes < largest) or (free_bytes is not None and free_bytes < largest)
    if largest and short:
        return no_space(largest, size_bytes)
    if writable is False:
        return Cause.SHM_PERMISSION
    return Cause.SHM_WRITES_FAILING


def for_verdict(verdict: str, local_id: str, engine: str = "") -> Cause | None:
    """The cause of a worker's verdict judged against ``local_id`` (this host's namespace id, or the
    gateway's): one fact, one cause, whichever command says it (probe, e2e, doctor). Undetermined is
    the worker's engine when it takes tensors inline only (SGLang, TRT-LLM, MLX: no id would change
    that), else this host's id unreadable when there is none, else the worker's missing id."""
    cause = for_sharing(verdict)
    if cause is Cause.NO_NAMESPACE_ID and engine in {e.name for e in ENGINES if not e.shm}:
        return Cause.ENGINE_INLINE_ONLY
    if cause is Cause.NO_NAMESPACE_ID and not local_id:
        return Cause.LOCAL_ID_UNREADABLE
    return cause


def for_sharing(sharing: str) -> Cause | None:
    """The cause of a namespace verdict (``host.namespace.Sharing`` values and probe's verdicts)."""
    return {
        "other_host": Cause.OTHER_HOST,
        "private_tmpfs": Cause.PRIVATE_TMPFS,
        "spelling": Cause.ID_SPELLING,
        "undetermined": Cause.NO_NAMESPACE_ID,
        "unreachable": Cause.WORKER_UNREACHABLE,
        "uid_mismatch": Cause.UID_MISMATCH,
        "verify_failed": Cause.VERIFY_FAILED,
        "not_grpc": Cause.NOT_GRPC,
    }.get(sharing)
