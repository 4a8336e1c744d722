"""One fix per cause: what doctor reports for a worker's probe is what probe reports for it, fix and command."""

from __future__ import annotations

from dataclasses import replace

import pytest

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.client.probe import LocalChecks, WorkerReport, cause_of
from smgshm.core.doctor.workers import probe_check

ADDR = "127.0.0.1:50051"
SHM_DIR = "/tmp/smgshm-unit-shm"  # never read: the fix's command names it


@pytest.mark.parametrize(
    ("verdict", "local_id", "cause"),
    [
        ("other_host", "ns-a", Cause.OTHER_HOST),
        ("private_tmpfs", "ns-a", Cause.PRIVATE_TMPFS),
        ("uid_mismatch", "ns-a", Cause.UID_MISMATCH),
        ("verify_failed", "ns-a", Cause.VERIFY_FAILED),
        ("undetermined", "ns-a", Cause.NO_NAMESPACE_ID),
        ("undetermined", "", Cause.LOCAL_ID_UNREADABLE),
        ("unreachable", "ns-a", Cause.WORKER_UNREACHABLE),
        ("spelling", "ns-a", Cause.ID_SPELLING),
    ],
)
def test_doctor_reports_the_fix_probe_reports(verdict: str, local_id: str, cause: Cause) -> None:
    local = LocalChecks(local_id, True, "", [], 1 << 30)
    w = WorkerReport(ADDR, verdict, "the reason")
    probed = cause_of(w, local, SHM_DIR)
    assert probed is not None
    assert probed.code == cause.value
    check = probe_check(replace(w, cause_info=probed), f"probe {ADDR}")
    assert check.cause is cause
    assert check.fix == probed.fix == CATALOGUE[cause].fix
    assert check.fix_cmd == (probed.fix_cmd or [])


def test_a_fix_command_is_filled_in_from_the_catalogue_once() -> None:
    assert CATALOGUE[Cause.VERIFY_FAILED].command(ADDR, SHM_DIR) == ["smgshm", "probe", "--verify", ADDR]
    assert CATALOGUE[Cause.ID_SPELLING].command(ADDR, SHM_DIR) == ["smgshm", "ns", "--shm-dir", SHM_DIR]
    assert CATALOGUE[Cause.OTHER_HOST].command(ADDR, SHM_DIR) is None
