"""What fills the shm dir, by family, and whether what is left holds what the deployment needs.

Read-only: entries are only lstat'ed, never opened, followed or removed. Bytes are what
each file holds in memory (st_blocks), each inode counted once however many names it has.
The tmpfs's own used bytes minus the files listed is what no name accounts for: files
unlinked but still open or mapped (a segment a reader maps), or inside directories.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field

from smgshm.core.errors import HostError

DOCKER_DEFAULT_SHM = 64 * 1024 * 1024
MAX_ENTRIES = 2_000_000  # bounded work in a hostile dir; the listing says when it stopped

# (family, what it is, pattern on the name). First match wins; "other" takes the rest.
FAMILIES: list[tuple[str, str, re.Pattern[str]]] = [
    ("smg", "SMG segments (smg-*)", re.compile(r"smg-")),
    ("psm", "Python multiprocessing.shared_memory (psm_*; vLLM's and TokenSpeed's too)", re.compile(r"psm_")),
    ("sglang", "SGLang (sgl_shm_*)", re.compile(r"sgl_shm_")),
    ("vllm", "vLLM (names with 'vllm')", re.compile(r".*vllm", re.IGNORECASE)),
    ("nccl", "NCCL (nccl-*)", re.compile(r"nccl-")),
    ("torch", "torch shared tensors (torch_*)", re.compile(r"torch_")),
    ("semaphore", "POSIX named semaphores (sem.*)", re.compile(r"sem\.")),
]
OTHER = ("other", "anything else")


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
    docker_default: bool = False  # the tmpfs is Docker's 64 MiB default


def assess_capacity(usage: ShmUsage, needs: list[Need]) -> CapacityVerdict:
    """Does the free space hold the largest known need? (Unknown when no need is known.)"""
    largest = max(needs, key=lambda n: n.nbytes, default=None)
    fits = None if largest is None else usage.free_bytes >= largest.nbytes
    return CapacityVerdict(
        usage.free_bytes, usage.total_bytes, list(needs), largest, fits, usage.total_bytes == DOCKER_DEFAULT_SHM
    )
