"""doctor's first checks: this host's namespace id and its shm dir (kind, size, free, writable)."""

from __future__ import annotations

from smgshm.core.causes import Cause, Where
from smgshm.core.doctor.check import Check, cause_check
from smgshm.core.host.facts import HostFacts
from smgshm.core.host.identity import HostIdentity
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.paths import smgshm_cmd
from smgshm.core.units import human_size

DOCKER_DEFAULT_SHM = 64 * 1024 * 1024


def check_identity(facts: HostFacts) -> list[Check]:
    """The namespace id, the shm dir (kind, size, free space) and the writability probe, as read once."""
    shm_dir, ident, err = facts.shm_dir, facts.identity, facts.identity_error
    if ident is None:
        hint = err.hint if err is not None else None
        return [Check("shm dir", Status.FAIL, str(err), hint or "mount a tmpfs at /dev/shm", Outcome.HOST)]

    out = [check_namespace_id(ident, shm_dir)]
    size = f"{human_size(ident.shm_total_bytes)}, {human_size(ident.shm_free_bytes)} free"
    if ident.fstype and ident.fstype != "tmpfs":
        out.append(
            Check(
                "shm dir",
                Status.WARN,
                f"{shm_dir} is {ident.fstype}, not tmpfs ({size})",
                "mount a tmpfs at /dev/shm: SHM through a disk filesystem is slow",
            )
        )
    elif ident.shm_total_bytes == DOCKER_DEFAULT_SHM:
        out.append(
            Check(
                "shm dir",
                Status.WARN,
                f"{shm_dir} is 64 MiB: Docker's default --shm-size ({size})",
                "give the gateway's container --shm-size=8g (or --ipc=host); one 64 MiB tensor fills it",
            )
        )
    elif ident.shm_free_bytes < ident.shm_total_bytes // 10:
        out.append(
            Check(
                "shm dir",
                Status.WARN,
                f"{shm_dir} is nearly full ({size})",
                "reap leaks, or enlarge it:",
                fix_cmd=smgshm_cmd(shm_dir, "gc", "--delete"),
            )
        )
    else:
        out.append(Check("shm dir", Status.OK, f"{shm_dir}: {ident.fstype or '?'}, {size}"))
    probe_err = facts.writable_error
    if probe_err:
        cause = Cause.SHM_FULL if "No space" in probe_err else Cause.SHM_PERMISSION
        summary = f"cannot create a 0600 segment: {probe_err}"
        out.append(cause_check("writable", Status.FAIL, summary, cause, Outcome.HOST, Where(shm_dir)))
    else:
        out.append(
            Check("writable", Status.OK, "a 0600 segment can be created and removed, as the gateway's probe does")
        )
    return out


def check_namespace_id(ident: HostIdentity, shm_dir: str) -> Check:
    """The shm_namespace_id a gateway writing to ``shm_dir`` advertises: well formed, or why not."""
    from smgshm.core.host.namespace import parse_namespace_id

    at = Where(shm_dir)  # ns reads the id of this dir: what is read, and what is not
    if ident.namespace_id and parse_namespace_id(ident.namespace_id) is None:
        malformed = f"{ident.namespace_id!r} is malformed: the gateway stays inline"
        return cause_check("namespace id", Status.FAIL, malformed, Cause.LOCAL_ID_UNREADABLE, Outcome.UNDETERMINED, at)
    if ident.namespace_id:
        return Check("namespace id", Status.OK, f"{ident.namespace_id} (boot_id:st_dev of {shm_dir})")
    # As probe and e2e name it: one fact, one cause.
    unreadable = "unreadable: under auto the gateway stays inline"
    return cause_check("namespace id", Status.FAIL, unreadable, Cause.LOCAL_ID_UNREADABLE, Outcome.UNDETERMINED, at)
