"""This host (or another process) as seen from its shm dir: identity, space, mount."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass

from smgshm.core.errors import HostError
from smgshm.core.host.mounts import mount_holding, read_mounts
from smgshm.core.host.namespace import namespace_id
from smgshm.core.host.place import place_of
from smgshm.core.names import probe_file_name
from smgshm.core.paths import BOOT_ID_PATH, DEFAULT_SHM_DIR


@dataclass(frozen=True)
class HostIdentity:
    """What ``smgshm ns`` reports and the receiver's Identity RPC carries."""

    namespace_id: str
    boot_id: str
    shm_dev: int
    shm_dir: str
    uid: int
    gid: int
    pid: int
    pid_namespace: str
    hostname: str
    shm_total_bytes: int
    shm_free_bytes: int
    fstype: str
    mount_options: str


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def _mount_of(shm_dir: str, pid: int | None) -> tuple[str, str]:
    """(fstype, options) of the mount ``shm_dir`` lies in: ``pid``'s view of it, or (None) the path as
    given, seen where it is mounted (a /proc/PID/root/... path in PID's table, not in /proc's)."""
    try:
        table = None if pid is None else read_mounts(f"/proc/{pid}/mountinfo")
        m = place_of(shm_dir).mount if table is None else mount_holding(table, shm_dir)
    except OSError:
        m = None
    if m is None:
        return "", ""
    return m.fstype, ",".join(dict.fromkeys(m.options.split(",") + m.super_options.split(",")))


def read_host_identity(shm_dir: str = DEFAULT_SHM_DIR, pid: int | None = None) -> HostIdentity:
    """Identity of this process, or of ``pid`` as its mount namespace sees ``shm_dir``."""
    proc = f"/proc/{pid}" if pid is not None else "/proc/self"
    if pid is not None and not os.path.isdir(proc):
        raise HostError("no such process", pid=pid)
    root = f"{proc}/root" if pid is not None else "/"
    seen = os.path.join(root, shm_dir.lstrip("/")) if pid is not None else shm_dir
    try:
        st = os.stat(seen)
        vfs = os.statvfs(seen)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM):
            raise HostError("permission denied reading the shm dir", path=seen, uid=os.getuid()) from err
        raise HostError("shm dir does not exist", path=seen, hint="mount a tmpfs at /dev/shm") from err
    ns_link = ""
    with contextlib.suppress(OSError):
        ns_link = os.readlink(f"{proc}/ns/pid")
    uid, gid = os.getuid(), os.getgid()
    hostname = socket.gethostname()
    if pid is not None:
        pst = os.stat(proc)
        uid, gid = pst.st_uid, pst.st_gid
        hostname = _read(f"{proc}/root/etc/hostname") or hostname
    fstype, opts = _mount_of(shm_dir, pid)
    boot_id = _read(BOOT_ID_PATH)
    return HostIdentity(
        namespace_id=namespace_id(boot_id, st.st_dev),  # `seen` was stat'ed following links, as SMG does
        boot_id=boot_id,
        shm_dev=st.st_dev,
        shm_dir=shm_dir,
        uid=uid,
        gid=gid,
        pid=pid if pid is not None else os.getpid(),
        pid_namespace=ns_link,
        hostname=hostname,
        shm_total_bytes=vfs.f_blocks * vfs.f_frsize,
        shm_free_bytes=vfs.f_bavail * vfs.f_frsize,
        fstype=fstype,
        mount_options=opts,
    )


def probe_writable(shm_dir: str = DEFAULT_SHM_DIR) -> str | None:
    """The gateway's writability probe, under smgshm's own name; ``None`` when it passes.

    Like ``mm_shm_dev_writable``: create_new, 0600, write one byte, remove.
    """
    path = os.path.join(shm_dir, probe_file_name())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        return f"{err.strerror} ({path})"
    try:
        os.write(fd, b"x")
    except OSError as err:
        return f"{err.strerror} ({path})"
    finally:
        os.close(fd)
        os.unlink(path)
    return None
