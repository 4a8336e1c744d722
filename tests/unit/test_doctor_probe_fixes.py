"""One fix per cause: what doctor reports for a worker's probe is what probe reports for it, fix and command."""

from __future__ import annotations

from dataclasses import replace

import pytest

from smgshm.core.causes import CATALOGUE, Cause, Where
from smgshm.core.client.probe import LocalChecks, WorkerReport, cause_of
from smgshm.core.doctor.gatewayworkers import JudgedGateway, _worker_check, lint
from smgshm.core.doctor.workers import probe_check
from smgshm.core.gateway.admin import GatewayWorker

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
    assert check.fix_cmd == probed.fix_cmd


def test_a_fix_command_is_filled_in_from_the_catalogue_once() -> None:
    at = Where(SHM_DIR, address=ADDR)
    assert CATALOGUE[Cause.VERIFY_FAILED].next_step(at) == ["smgshm", "probe", "--verify", ADDR]
    assert CATALOGUE[Cause.ID_SPELLING].next_step(at) == ["smgshm", "ns", "--shm-dir", SHM_DIR]
    assert CATALOGUE[Cause.OTHER_HOST].next_step(at) is None  # no gateway named: nothing to probe its workers of


HERE = "5ef74ec3-0000-4000-8000-000000000000:27"
FOREIGN = "00000000-0000-4000-8000-000000000000:1"


def _w(url: str, ns: str, *, kind: str = "regular", override: str = "") -> GatewayWorker:
    return GatewayWorker("id", url, "grpc", "vllm", ns, True, "ready", "m", kind, override)


def test_a_gateways_configuration_checks_give_the_catalogues_fixes() -> None:
    g = JudgedGateway("gateway 7", "http://127.0.0.1:1", "auto", HERE)
    workers = [
        _w("grpc://a:1", HERE, kind="prefill", override="multimodal_tensor_transport=shm"),
        _w("grpc://b:1", FOREIGN, kind="decode"),
    ]
    checks = [c for c in lint(g, workers) if c.cause is not None]
    assert {c.cause for c in checks} == {
        Cause.WORKER_OVERRIDE_IGNORED,
        Cause.MIXED_NAMESPACE_IDS,
        Cause.PD_DECODE_NAMESPACE,
    }
    for c in checks:
        assert c.cause is not None
        assert c.fix == CATALOGUE[c.cause].fix, c
    stale = _worker_check(
        g, _w("grpc://a:1", ""), WorkerReport("grpc://a:1", "shared", "", "vllm", namespace_id=HERE), False, 0.0
    )
    assert stale.cause is Cause.STALE_NAMESPACE_LABEL
    assert stale.fix == CATALOGUE[Cause.STALE_NAMESPACE_LABEL].fix
