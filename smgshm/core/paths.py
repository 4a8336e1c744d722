"""The one place that names the shm directory and the boot-id path (SMG's names: core/names.py)."""

from __future__ import annotations

import os

# S108 flags any /dev/shm literal as an insecure temp path; here it is the very
# directory SMG's gateway and workers use, not a scratch location.
DEFAULT_SHM_DIR = "/dev/shm"  # noqa: S108
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def smgshm_cmd(shm_dir: str, *args: str) -> list[str]:
    """A smgshm command line to suggest (argv, for shlex.join / quote_cmd): it names ``shm_dir``
    unless that is the default, so pasting it acts on the dir examined, never on /dev/shm."""
    if os.path.realpath(shm_dir) != os.path.realpath(DEFAULT_SHM_DIR):
        args = (*args, "--shm-dir", shm_dir)
    return ["smgshm", *args]
