"""SMG's transport decision as one pure function (smg-facts §2.3).

probe, send and bench all explain a choice with this, the way the gateway makes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from smgshm.core.causes import Cause, for_verdict
from smgshm.core.engines import SHM_ENGINES
from smgshm.core.gateway.setting import DEFAULT_SHM_MIN_BYTES, Mode
from smgshm.core.host.namespace import compare_namespace_ids
from smgshm.core.units import human_size

PROBE_FAILS = "the gateway's writability probe of /dev/shm fails"


@dataclass(frozen=True)
class Decision:
    """Where one tensor goes, and why: in one sentence, and as the catalogue's cause of inline."""

    path: str  # "inline" | "shm"
    reason: str
    cause: Cause | None = None  # why it goes inline, as decided (None: shm)

    @property
    def shm(self) -> bool:
        return self.path == "shm"


def decide(
    mode: Mode,
    *,
    nbytes: int,
    engine: str,
    local_ns: str,
    worker_ns: str,
    writable: bool,
    shm_min_bytes: int = DEFAULT_SHM_MIN_BYTES,
    over_grpc: bool = True,
) -> Decision:
    """The gateway's ``resolve_mm_shm_enabled`` plus its size rule, for one tensor."""
    if mode in (Mode.INLINE, Mode.RDMA):
        return Decision("inline", f"mode {mode.value} never uses SHM", Cause.MODE_INLINE)
    if not over_grpc:
        return Decision("inline", f"{engine} workers take tensors inline only", Cause.NOT_GRPC)
    if engine not in SHM_ENGINES:
        return Decision("inline", f"{engine} workers take tensors inline only", Cause.ENGINE_INLINE_ONLY)
    if mode is Mode.AUTO:
        cmp = compare_namespace_ids(local_ns, worker_ns)
        if not cmp.shared:
            cause = for_verdict(cmp.sharing.value, local_ns) or Cause.NO_NAMESPACE_ID
            return Decision("inline", f"auto: {cmp.reason}", cause)
    if not writable:
        return Decision("inline", PROBE_FAILS, Cause.SHM_PERMISSION)
    size, least = _sizes(nbytes, shm_min_bytes)
    if nbytes < shm_min_bytes:
        return Decision("inline", f"{size} is below shm_min_bytes {least}", Cause.BELOW_SHM_MIN_BYTES)
    why = "namespace ids match" if mode is Mode.AUTO else "mode shm asserts a shared /dev/shm"
    return Decision("shm", f"{mode.value}: {why} and {size} >= {least}")


def _sizes(nbytes: int, shm_min_bytes: int) -> tuple[str, str]:
    """The two sizes a rule compares, for people; exact bytes when the rounded forms would read as equal."""
    a, b = human_size(nbytes), human_size(shm_min_bytes)
    return (f"{nbytes} B", f"{shm_min_bytes} B") if a == b else (a, b)
