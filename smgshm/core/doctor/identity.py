"""doctor's first checks: this host's namespace id and its shm dir (kind, size, free, writable)."""

from __future__ import annotations

from smgshm.core.doctor.check import Check
from smgshm.core.errors import SmgshmError
from smgshm.core.outcomes import Outcome
from smgshm.core.paths import smgshm_cmd

DOCKER_DEFAULT_SHM = 64 * 1024 * 1024


def check_identity(shm_dir: str) -> list[Check]:
    from smgshm.core.host.identity import probe_writable, read_host_identity

    try:
        ident = read_host_identity(shm_dir)
    except SmgshmError as err:
        return [Check("shm dir", "fail", str(err), err.hint or "mount a tmpfs at /dev/shm", Outcome.HOST)]
    from smgshm.core.host.namespace import parse_namespace_id

    out = []
    if ident.namespace_id and parse_namespace_id(ident.namespace_id) is None:
        out.append(Check("namespace id", "fail", f"{ident.namespace_id!r} is malformed: the gateway stays inline",
                         "check /proc/sys/kernel/random/boot_id (a UUID) and the shm dir",
                         Outcome.UNDETERMINED))  # fmt: skip
    elif ident.namespace_id:
        out.append(Check("namespace id", "ok", f"{ident.namespace_id} (boot_id:st_dev of {shm_dir})"))
    else:
        out.append(
            Check(
                "namespace id",
                "fail",
                "unreadable: under auto the gateway stays inline",
                "make /proc/sys/kernel/random/boot_id and the shm dir readable",
                Outcome.UNDETERMINED,
            )
        )
    size = f"{ident.shm_total_bytes / 2**20:.0f} MiB, {ident.shm_free_bytes / 2**20:.0f} MiB free"
    if ident.fstype and ident.fstype != "tmpfs":
        out.append(
            Check(
                "shm dir",
                "warn",
                f"{shm_dir} is {ident.fstype}, not tmpfs ({size})",
                "mount a tmpfs at /dev/shm: SHM through a disk filesystem is slow",
            )
        )
    elif ident.shm_total_bytes == DOCKER_DEFAULT_SHM:
        out.append(
            Check(
                "shm dir",
                "warn",
                f"{shm_dir} is 64 MiB: Docker's default --shm-size ({size})",
                "give the gateway's container --shm-size=8g (or --ipc=host); one 64 MiB tensor fills it",
            )
        )
    elif ident.shm_free_bytes < ident.shm_total_bytes // 10:
        out.append(Check("shm dir", "warn", f"{shm_dir} is nearly full ({size})", "reap leaks, or enlarge it:",
                         fix_cmd=smgshm_cmd(shm_dir, "gc", "--delete")))  # fmt: skip
    else:
        out.append(Check("shm dir", "ok", f"{shm_dir}: {ident.fstype or '?'}, {size}"))
    err = probe_writable(shm_dir)
    if err:
        full = "No space" in err
        fix = (
            "enlarge the tmpfs (docker --shm-size, emptyDir sizeLimit) or free space:"
            if full
            else "run as a uid that may write the shm dir; SMG's gateway would stay inline"
        )
        out.append(Check("writable", "fail", f"cannot create a 0600 segment: {err}", fix, Outcome.HOST,
                         fix_cmd=smgshm_cmd(shm_dir, "gc", "--delete") if full else []))  # fmt: skip
    else:
        out.append(Check("writable", "ok", "a 0600 segment can be created and removed, as the gateway's probe does"))
    return out
