"""What fills the shm dir, by family, and whether what is left holds what the deployment needs.

Read-only: entries are only lstat'ed, never opened, followed or removed. Bytes are what
each file holds in memory (st_blocks), each inode counted once however many names it has.
The tmpfs's own used bytes minus the files listed is what no name accounts for: files
unlinked but still open or mapped (a segment a reader maps), or inside directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass, field

from smgshm.core.engines import ENGINES
from smgshm.core.errors import HostError
from smgshm.core.names import SMG_FAMILY_PREFIX
from smgshm.core.paths import BOOT_ID_PATH

DOCKER_DEFAULT_SHM = 64 * 1024 * 1024
MAX_ENTRIES = 2_000_000  # bounded work in a hostile dir; the listing says when it stopped

Family = tuple[str, str, re.Pattern[str]]


def _engine_families() -> list[Family]:
    """The names engines make themselves, from their rows. A prefix is a stronger claim than a word
    inside the name, so the prefix families go first (an sgl_shm_ name that mentions vllm stays SGLang's)."""
    by_prefix = [
        (e.name, f"{e.title} ({e.own_shm_prefix}*)", re.compile(re.escape(e.own_shm_prefix)))
        for e in ENGINES
        if e.own_shm_prefix
    ]
    by_word = [
        (e.name, f"{e.title} (names with '{e.own_shm_word}')", re.compile(f".*{re.escape(e.own_shm_word)}", re.I))
        for e in ENGINES
        if e.own_shm_word
    ]
    return by_prefix + by_word


# (family, what it is, pattern on the name). First match wins; "other" takes the rest.
FAMILIES: list[Family] = [
    ("smg", f"SMG segments ({SMG_FAMILY_PREFIX}*)", re.compile(re.escape(SMG_FAMILY_PREFIX))),
    ("psm", "Python multiprocessing.shared_memory (psm_*; vLLM's and TokenSpeed's too)", re.compile(r"psm_")),
    *_engine_families(),
    ("nccl", "NCCL (nccl-*)", re.compile(r"nccl-")),
    ("torch", "torch shared tensors (torch_*)", re.compile(r"torch_")),
    ("semaphore", "POSIX named semaphores (sem.*)", re.compile(r"sem\.")),
]
OTHER = ("other", "anything else")
INFLIGHT_SOURCE = "--inflight-bytes"


@dataclass(frozen=True)
class FamilyUsage:
    family: str
    description: str
    count: int
    nbytes: int  # held in memory (st_blocks * 512), each inode once
    apparent_bytes: int  # st_size


@dataclass(frozen=True)
class ShmUsage:
    shm_dir: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    families: list[FamilyUsage]
    unattributed_bytes: int  # used by the tmpfs but by no name listed here
    entries: int
    truncated: bool = False


def family_of(name: str) -> str:
    """The family a shm dir entry belongs to, by its name."""
    for fam, _, pattern in FAMILIES:
        if pattern.match(name):
            return fam
    return OTHER[0]


def shm_usage(shm_dir: str, max_entries: int = MAX_ENTRIES) -> ShmUsage:
    """Counts and bytes per family of what is in ``shm_dir``; HostError when it cannot be read."""
    try:
        vfs = os.statvfs(shm_dir)
        it = os.scandir(shm_dir)
    except OSError as err:
        raise HostError(f"cannot read the shm dir: {err.strerror}", path=shm_dir) from err
    counts: dict[str, list[int]] = {}
    seen: set[int] = set()
    entries, truncated = 0, False
    with it:
        for entry in it:
            if entries >= max_entries:
                truncated = True
                break
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            entries += 1
            c = counts.setdefault(family_of(entry.name), [0, 0, 0])
            c[0] += 1
            if st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                c[1] += st.st_blocks * 512
                c[2] += st.st_size
    described = {f: d for f, d, _ in FAMILIES} | {OTHER[0]: OTHER[1]}
    fams = [FamilyUsage(f, described[f], *counts[f]) for f in described if f in counts]
    total, free = vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize
    used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    listed = sum(f.nbytes for f in fams)
    return ShmUsage(shm_dir, total, free, used, fams, max(0, used - listed), entries, truncated)


@dataclass(frozen=True)
class Need:
    """One thing the shm dir must hold at once, with where the figure comes from."""

    source: str
    nbytes: int


@dataclass(frozen=True)
class CapacityVerdict:
    free_bytes: int
    total_bytes: int
    needs: list[Need] = field(default_factory=list)
    largest: Need | None = None
    fits: bool | None = None  # None: no need is known
    explicit_unmet: bool = False  # the operator's own budget (--inflight-bytes) does not fit: not inferred
    docker_default: bool = False  # the tmpfs is Docker's 64 MiB default


def assess_capacity(usage: ShmUsage, needs: list[Need]) -> CapacityVerdict:
    """Does the free space hold the largest known need? (Unknown when no need is known.)"""
    largest = max(needs, key=lambda n: n.nbytes, default=None)
    fits = None if largest is None else usage.free_bytes >= largest.nbytes
    return CapacityVerdict(
        usage.free_bytes,
        usage.total_bytes,
        list(needs),
        largest,
        fits,
        explicit_unmet=any(n.source == INFLIGHT_SOURCE and n.nbytes > usage.free_bytes for n in needs),
        docker_default=usage.total_bytes == DOCKER_DEFAULT_SHM,
    )


# -- the largest tensors bench and e2e moved here (this boot), for doctor's capacity check ------


def seen_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "smgshm", "largest-tensors.json")


def _boot_id() -> str:
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _load_seen(path: str, boot_id: str | None = None) -> dict[str, dict[str, float]]:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return {}
    boot = _boot_id() if boot_id is None else boot_id
    if not isinstance(doc, dict) or doc.get("boot_id") != boot or not isinstance(doc.get("seen"), dict):
        return {}
    return {str(k): v for k, v in doc["seen"].items() if isinstance(v, dict) and isinstance(v.get("nbytes"), int)}


def _key(source: str, shm_dir: str) -> str | None:
    try:
        return f"{source}@{os.stat(shm_dir).st_dev}"  # a need belongs to the tmpfs it was measured on
    except OSError:
        return None


def record_tensor_seen(source: str, nbytes: int, shm_dir: str, path: str | None = None) -> None:
    """Remember the largest tensor ``source`` (e.g. "smgshm e2e") moved through ``shm_dir``; never an error."""
    path = path or seen_path()
    key = _key(source, shm_dir)
    seen = _load_seen(path)
    if key is None or nbytes <= int(seen.get(key, {}).get("nbytes", 0)):
        return
    seen[key] = {"nbytes": nbytes, "unix_s": time.time()}
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"boot_id": _boot_id(), "seen": seen}, f)
        os.replace(tmp, path)


def recorded_needs(shm_dir: str, path: str | None = None, boot_id: str | None = None) -> list[Need]:
    """The largest tensors bench and e2e moved through ``shm_dir`` since boot, as capacity needs.

    ``boot_id``: this boot's, when the caller has read it already."""
    out = []
    for key, v in sorted(_load_seen(path or seen_path(), boot_id).items()):
        source = key.rpartition("@")[0]
        if _key(source, shm_dir) != key:
            continue
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(v.get("unix_s", 0))))
        out.append(Need(f"the largest tensor {source} moved here, {when}", int(v["nbytes"])))
    return out
