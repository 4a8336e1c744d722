"""The one place that names the shm directory and the boot-id path (SMG's names: core/names.py)."""

from __future__ import annotations

import os

# S108 flags any /dev/shm literal as an insecure temp path; here it is the very
# directory SMG's gateway and workers use, not a scratch location.
DEFAULT_SHM_DIR = "/dev/shm"  # noqa: S108
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def same_dir(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are the very same directory (device and inode); False when either cannot
    be read. Not their paths resolved as text: ``os.path.realpath`` reads /proc/PID/root as "/", so
    another mount namespace's /dev/shm (/proc/PID/root/dev/shm) would read as this one's."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def node_path(path: str, node_root: str) -> str | None:
    """``path`` (under ``node_root``, as this process reaches it) as the node itself names it: without the
    root's prefix, so a fix pasted on the node acts on that very path. Lexical, never resolved (a
    ``/proc/PID/root`` root resolves to "/"); None when ``path`` is not below ``node_root``."""
    root = os.path.normpath(node_root)
    if root == "/":
        return os.path.normpath(path)
    inside = os.path.relpath(os.path.normpath(path), root)
    if inside == ".":
        return "/"
    return None if inside == ".." or inside.startswith("../") else "/" + inside


def smgshm_cmd(shm_dir: str, *args: str) -> list[str]:
    """A smgshm command line to suggest (argv, for shlex.join / quote_cmd): it names ``shm_dir``
    unless that is the default directory itself, so pasting it acts on the dir examined, never on
    this host's /dev/shm (``same_dir``: a tmpfs seen through /proc/PID/root is named)."""
    if not same_dir(shm_dir, DEFAULT_SHM_DIR):
        args = (*args, "--shm-dir", shm_dir)
    return ["smgshm", *args]
