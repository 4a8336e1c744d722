"""What fills the shm dir, by family, and whether what is left holds what the deployment needs.

Read-only: entries are only lstat'ed, never opened, followed or removed. Bytes are what
each file holds in memory (st_blocks), each inode counted once however many names it has.
The tmpfs's own used bytes minus the files listed is what no name accounts for: files
unlinked but still open or mapped (a segment a reader maps), or inside directories.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from dataclasses import asdict, dataclass, field

from smgshm.core.engines import ENGINES
from smgshm.core.errors import HostError
from smgshm.core.host.mounts import unique_mount_id
from smgshm.core.host.place import place_of
from smgshm.core.host.usercache import cache_dir, read_private, write_private
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


def shm_space(shm_dir: str) -> tuple[int | None, int | None]:
    """(size, free bytes) of the shm dir here; (None, None) when it cannot be read."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None, None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


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
#
# Kept per user (usercache: the user's own private file) and per mount: a need belongs to the tmpfs
# it was measured on. st_dev alone does not name one (tmpfs devices are anonymous, and a new mount
# takes a number an unmounted one left), nor does the id the mount table shows (also taken again);
# the unique mount id (Linux 6.8+) is never given twice in a boot. So an entry is keyed by the boot
# id, st_dev, the mount table's id and the unique id where the kernel gives it.

SEEN_FILE = "largest-tensors.json"
SEEN_FORMAT = "smgshm largest tensors 2"  # the first format, keyed by st_dev alone, is ignored (and replaced)
MAX_SEEN = 32  # entries kept: this boot's, the latest first
MAX_SEEN_BYTES = 64 * 1024  # a bigger file is not read
_MAX_SOURCE = 64


@dataclass(frozen=True)
class MountKey:
    """Which mount a shm dir lies in, as far as this boot can tell it from another."""

    boot_id: str
    dev: int  # st_dev
    mount_id: int  # the id in /proc/self/mountinfo
    unique_id: int | None  # statx STATX_MNT_ID_UNIQUE; None where the kernel does not give it


@dataclass(frozen=True)
class _Seen:
    key: MountKey
    source: str
    nbytes: int
    unix_s: float


def seen_path() -> str:
    return os.path.join(cache_dir(), SEEN_FILE)


def _boot_id() -> str:
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            return f.read(64).strip()
    except (OSError, ValueError):
        return ""


def mount_key(shm_dir: str, boot_id: str | None = None) -> MountKey | None:
    """The mount ``shm_dir`` lies in; None when it cannot be told (then nothing is kept or quoted)."""
    boot = _boot_id() if boot_id is None else boot_id
    try:
        # The tmpfs itself, never a path resolved as text: /proc/PID/root/dev/shm is PID's, not ours.
        place = place_of(shm_dir)
        unique = unique_mount_id(shm_dir)  # statx through the path as given: the mount it lies in
    except OSError:
        return None
    if not boot or place.mount is None:
        return None
    return MountKey(boot, place.dev, place.mount.mount_id, unique)


def _count(v: object) -> bool:
    return type(v) is int and 0 <= v < 1 << 63  # a JSON true is no count


def _entry(v: object) -> _Seen | None:
    """One entry of the file, or None when it is not one (the file is the user's, but read as untrusted)."""
    if not isinstance(v, dict):
        return None
    boot, source, when, uid = v.get("boot_id"), v.get("source"), v.get("unix_s"), v.get("unique_id")
    if not (
        isinstance(boot, str)
        and 0 < len(boot) <= 64
        and isinstance(source, str)
        and 0 < len(source) <= _MAX_SOURCE
        and source.isprintable()
        and all(_count(v.get(k)) for k in ("dev", "mount_id", "nbytes"))
        and (uid is None or _count(uid))
        and isinstance(when, (int, float))
        and not isinstance(when, bool)  # a JSON true is no time
        and math.isfinite(when)
    ):
        return None
    return _Seen(MountKey(boot, v["dev"], v["mount_id"], uid), source, v["nbytes"], float(when))


def _load_seen(path: str) -> list[_Seen]:
    data = read_private(os.path.basename(path), MAX_SEEN_BYTES, os.path.dirname(path))
    if data is None:
        return []
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # garbage, NaN, or nested past the decoder's own limit
        return []
    entries = doc.get("entries") if isinstance(doc, dict) and doc.get("format") == SEEN_FORMAT else None
    if not isinstance(entries, list):
        return []
    return [e for v in entries[: MAX_SEEN * 4] if (e := _entry(v)) is not None]


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def record_tensor_seen(source: str, nbytes: int, shm_dir: str, path: str | None = None) -> None:
    """Remember the largest tensor ``source`` (e.g. "smgshm e2e") moved through ``shm_dir``; never an error."""
    path = path or seen_path()
    key = mount_key(shm_dir)
    if key is None or not _count(nbytes) or not 0 < len(source) <= _MAX_SOURCE:
        return
    seen = [e for e in _load_seen(path) if e.key.boot_id == key.boot_id]  # another boot's mounts are gone
    if any(e.key == key and e.source == source and e.nbytes >= nbytes for e in seen):
        return
    seen = [e for e in seen if not (e.key == key and e.source == source)]
    seen.append(_Seen(key, source, nbytes, time.time()))
    seen = sorted(seen, key=lambda e: e.unix_s, reverse=True)[:MAX_SEEN]
    entries = [{**asdict(e.key), "source": e.source, "nbytes": e.nbytes, "unix_s": e.unix_s} for e in seen]
    doc = {"format": SEEN_FORMAT, "entries": entries}
    write_private(os.path.basename(path), json.dumps(doc).encode(), os.path.dirname(path))


def recorded_needs(shm_dir: str, path: str | None = None, boot_id: str | None = None) -> list[Need]:
    """The largest tensors bench and e2e moved through the mount ``shm_dir`` lies in, this boot, as
    capacity needs.

    ``boot_id``: this boot's, when the caller has read it already."""
    key = mount_key(shm_dir, boot_id)
    out = []
    for e in sorted(_load_seen(path or seen_path()), key=lambda e: e.source):
        if key is not None and e.key == key:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(e.unix_s))
            out.append(Need(f"the largest tensor {e.source} moved here, {when}", e.nbytes))
    return out
