"""doctor's last check: host services that would delete live segments (logind RemoveIPC, tmpfiles)."""

from __future__ import annotations

import glob
import os
import re

from smgshm.core.doctor.check import Check
from smgshm.core.outcomes import Status
from smgshm.core.paths import DEFAULT_SHM_DIR


def check_reapers(uid: int | None = None) -> list[Check]:
    """systemd-logind RemoveIPC and tmpfiles rules that would delete live segments."""
    uid = os.getuid() if uid is None else uid
    out = []
    remove_ipc = None
    for path in ["/etc/systemd/logind.conf", *sorted(glob.glob("/etc/systemd/logind.conf.d/*.conf"))]:
        try:
            text = open(path, encoding="utf-8").read()  # noqa: SIM115 - tiny config files
        except OSError:
            continue
        for m in re.finditer(r"^\s*RemoveIPC\s*=\s*(\S+)", text, re.M):
            remove_ipc = m.group(1).lower() in ("yes", "true", "1", "on")
    logind = os.path.exists("/run/systemd/seats") or os.path.exists("/lib/systemd/systemd-logind")
    if logind and remove_ipc is not False and uid >= 1000:
        out.append(
            Check(
                "reaper: RemoveIPC",
                Status.WARN,
                f"systemd-logind RemoveIPC is on and uid {uid} is not a system "
                "user: its /dev/shm segments vanish when its last session ends",
                "set RemoveIPC=no in /etc/systemd/logind.conf, or run the gateway as a system user",
            )
        )
    else:
        why = "no systemd-logind" if not logind else "off" if remove_ipc is False else f"uid {uid} is a system user"
        out.append(Check("reaper: RemoveIPC", Status.OK, f"not a risk here ({why})"))
    rules: list[str] = []
    for d in ("/etc/tmpfiles.d", "/run/tmpfiles.d", "/usr/lib/tmpfiles.d"):
        for path in sorted(glob.glob(f"{d}/*.conf")):
            try:
                lines = open(path, encoding="utf-8").read().splitlines()  # noqa: SIM115
            except OSError:
                continue
            for ln in lines:
                f = ln.split()
                # type path mode user group age: an age on a rule for the shm dir deletes by time.
                if len(f) >= 6 and not f[0].startswith("#") and f[1].startswith(DEFAULT_SHM_DIR) and f[5] != "-":
                    rules.append(f"{path}: {ln.strip()}")
    aging = rules
    if aging:
        out.append(
            Check(
                "reaper: tmpfiles",
                Status.WARN,
                f"tmpfiles ages out /dev/shm: {aging[0]}",
                "exclude smg-* with an x line, e.g. 'x /dev/shm/smg-*'",
            )
        )
    else:
        out.append(Check("reaper: tmpfiles", Status.OK, "no tmpfiles rule ages out /dev/shm"))
    return out
