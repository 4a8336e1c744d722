"""doctor's gc scan: leaked segments, hazards named like segments, and whether liveness is trusted."""

from __future__ import annotations

from smgshm.core.doctor.check import Check
from smgshm.core.errors import SmgshmError
from smgshm.core.outcomes import Outcome
from smgshm.core.paths import smgshm_cmd


def check_leaks(shm_dir: str) -> list[Check]:
    from smgshm.core.segments.judge import ScanOptions
    from smgshm.core.segments.scan import scan_segments

    try:
        r = scan_segments(ScanOptions(shm_dir))
    except SmgshmError as err:
        return [Check("leaks", "fail", str(err), err.hint or "", Outcome.HOST)]
    c = r.counts
    out = []
    if c["leaked"]:
        out.append(
            Check(
                "leaks",
                "fail",
                f"{c['leaked']} leaked segment(s), {r.reclaimable_bytes} bytes reclaimable",
                "reap them:",
                Outcome.CHECK_FAILED,
                fix_cmd=smgshm_cmd(shm_dir, "gc", "--delete"),
            )
        )
    else:
        out.append(Check("leaks", "ok", f"{len(r.segments)} SMG segment(s), none leaked"))
    if c["hazard"]:
        out.append(
            Check(
                "hazards",
                "fail",
                f"{c['hazard']} non-regular entr(ies) or mount points named like segments (SMG's reader refuses them; "
                "a FIFO hangs it)",
                "inspect and remove them by hand; they are listed by:",
                Outcome.CHECK_FAILED,
                fix_cmd=smgshm_cmd(shm_dir, "gc", "--all"),
            )
        )
    if not r.liveness_trusted:
        out.append(Check("liveness", "warn", r.liveness_note))
    return out
