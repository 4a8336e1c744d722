"""The shm dir's page-size policy, and what huge pages would change, as measured.

Every SMG segment is a new tmpfs file, so its write is bound by first-touch page faults:
one per 4 KiB page unless the tmpfs allocates transparent huge pages (2 MiB). A tmpfs
mount chooses with its ``huge=`` option (never by default; ``/proc/self/mountinfo``
shows it when set), and ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` can
override every mount (``deny`` forces it off, ``force`` on). smgshm only reports the
policy and suggests the remount: it never changes the host's mounts itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from smgshm.core.host import usercache
from smgshm.core.host.identity import HostIdentity, read_host_identity
from smgshm.core.paths import BOOT_ID_PATH, DEFAULT_SHM_DIR

SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
RECOMMENDED = "within_size"
# Issue 17's figures, measured on another machine (a private tmpfs, 64 MiB segments, one run):
# labelled as such wherever shown, and replaced by this host's own what-if once it has run.
ELSEWHERE = {
    "smg_writer_gb_per_s": (1.33, 8.78),
    "pwrite_writer_gb_per_s": (2.17, 8.54),
}
CAVEATS = (
    "huge=within_size allocates 2 MiB pages only inside each file's size, so small files stay on "
    "4 KiB pages (huge=always rounds every file up to 2 MiB of memory); huge pages need free contiguous "
    "memory, else the kernel falls back to 4 KiB pages; in a container only a privileged one (or the host, "
    "for --ipc=host or a bind mount) can remount; Docker's --shm-size mount and a Kubernetes emptyDir "
    "(medium: Memory) take no huge= option, so there set shmem_enabled=force on the node (it applies to "
    "every tmpfs and shared memory) or mount a huge tmpfs on the host and bind it; emptyDir medium: "
    "HugePages is hugetlbfs (pre-reserved pages, no write(2)), not the same thing"
)


@dataclass(frozen=True)
class PagePolicy:
    shm_dir: str
    mount_huge: str  # the mount's huge= option: never (also when absent) | always | within_size | advise
    shmem_enabled: str  # the selected value of shmem_enabled, "" when the kernel has none
    huge_pages: bool | None  # would SMG's segments get huge pages here (None: cannot tell)
    reason: str


def _selected(text: str) -> str:
    # "always within_size advise [never] deny force" -> "never"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip()


def page_policy(
    shm_dir: str = DEFAULT_SHM_DIR, shmem_enabled_path: str = SHMEM_ENABLED, identity: HostIdentity | None = None
) -> PagePolicy:
    """The page-size policy SMG's segments in ``shm_dir`` get (its mount from ``identity`` when given)."""
    ident = identity if identity is not None else read_host_identity(shm_dir)
    opts = dict(o.partition("=")[::2] for o in ident.mount_options.split(",") if o)
    huge = opts.get("huge", "never") or "never"
    try:
        with open(shmem_enabled_path, encoding="ascii") as f:
            knob = _selected(f.read())
    except OSError:
        knob = ""
    if ident.fstype != "tmpfs":
        return PagePolicy(shm_dir, huge, knob, None, f"{shm_dir} is {ident.fstype or 'not a mount'}, not tmpfs")
    if not knob:
        return PagePolicy(shm_dir, huge, knob, False, "this kernel has no transparent huge pages for tmpfs")
    if knob == "deny":
        return PagePolicy(shm_dir, huge, knob, False, "shmem_enabled=deny forbids huge pages on every tmpfs")
    if knob == "force":
        return PagePolicy(shm_dir, huge, knob, True, "shmem_enabled=force puts huge pages on every tmpfs")
    if huge in ("always", "within_size"):
        return PagePolicy(shm_dir, huge, knob, True, f"mounted huge={huge}")
    if huge == "advise":
        # Only on madvise(MADV_HUGEPAGE), which SMG's writer does not call.
        return PagePolicy(shm_dir, huge, knob, False, "mounted huge=advise, and SMG's writer never madvises")
    return PagePolicy(shm_dir, huge, knob, False, "mounted without huge= (never)")


def remount_argv(shm_dir: str = DEFAULT_SHM_DIR) -> list[str]:
    """The command that gives the tmpfs of ``shm_dir`` huge pages, as argv (for the operator to run,
    shell-quoted), in the mount namespace that holds it; empty when that cannot be told."""
    from smgshm.core.host.place import place_of
    from smgshm.core.host.place import remount_argv as remount

    try:
        return remount(place_of(shm_dir), f"huge={RECOMMENDED}")
    except OSError:
        return []


_CACHE_NAME = "what-if-huge-pages.json"


def cache_path() -> str:
    """Where the last what-if of this user is kept, for doctor to quote (host/usercache.py's rules)."""
    return os.path.join(usercache.cache_dir(), _CACHE_NAME)


def save_last_what_if(doc: dict[str, Any]) -> None:
    """Keep a what-if's figures, private to this user (a failure to cache is not an error)."""
    with contextlib.suppress(ValueError, TypeError):
        usercache.write_private(_CACHE_NAME, json.dumps(doc, allow_nan=False).encode())


def load_last_what_if(max_bytes: int = 1 << 20, boot_id: str | None = None) -> dict[str, Any] | None:
    """This boot's last what-if on this host, or None (absent, another boot, unreadable, or a file
    this user cannot trust: another's, writable by others, a link, garbage or nested past reason).

    ``boot_id``: this boot's, when the caller has read it already."""
    data = usercache.read_private(_CACHE_NAME, max_bytes)
    if data is None:
        return None
    try:
        doc = json.loads(data)
        if boot_id is None:
            with open(BOOT_ID_PATH, encoding="ascii") as f:
                boot_id = f.read().strip()
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return None
    if not isinstance(doc, dict) or doc.get("boot_id") != boot_id:
        return None
    return doc


def age_text(measured_unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(measured_unix_s))
