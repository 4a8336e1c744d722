"""``doctor``: every check in one run, each with the fix for its failure.

With no worker given it starts the reference receiver in this process on loopback
(the embedded default), so a fresh machine gets a full answer with no setup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from smgshm.core.doctor.check import Check
from smgshm.core.doctor.e2e import check_e2e
from smgshm.core.doctor.hostchecks import HostFindings, run_host_checks
from smgshm.core.doctor.identity import check_identity
from smgshm.core.doctor.leaks import STRANDED_AFTER_S, check_leaks
from smgshm.core.doctor.reapers import check_reapers
from smgshm.core.doctor.workers import check_send, check_workers
from smgshm.core.gateway.admin import GatewayWorker
from smgshm.core.host.facts import read_host_facts
from smgshm.core.outcomes import Status
from smgshm.core.paths import DEFAULT_SHM_DIR, same_dir


@dataclass(frozen=True)
class DoctorReport:
    checks: list[Check]
    embedded_receiver: str = ""  # its address when doctor started one
    workers: list[str] = field(default_factory=list)
    host: HostFindings | None = None  # gateways here, shm usage, capacity, page size

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]


def run_doctor(
    workers: list[str],
    *,
    shm_dir: str = DEFAULT_SHM_DIR,
    timeout: float = 5.0,
    on_check: Callable[[Check], None] | None = None,
    gateway_logs: list[str] | None = None,
    inflight_bytes: int | None = None,
    gateway: str | None = None,
    api_key: str | None = None,
    e2e: bool = True,
    metrics_url: str | None = None,
    gateway_pids: tuple[int, ...] | None = None,
    stranded_after_s: float = STRANDED_AFTER_S,
    gateway_workers: list[GatewayWorker] | None = None,
) -> DoctorReport:
    """Run every check in order; with no workers, against an embedded reference receiver.

    With ``e2e``: real image requests through ``gateway`` (``smgshm e2e --gateway``), or,
    with no workers and no gateway, through the embedded real gateway when smg is installed.
    ``gateway_workers``: ``gateway``'s ``GET /workers`` as already asked (for its configuration lint).
    """
    checks: list[Check] = []

    def add(new: list[Check]) -> None:
        for c in new:
            checks.append(c)
            if on_check:
                on_check(c)

    # Read once: every check below sees the same identity, namespace id and writability probe.
    facts = read_host_facts(shm_dir)
    add(check_identity(facts))
    if any(c.name == "shm dir" and c.status == "fail" for c in checks):
        # Nothing below can mean anything without a shm dir; say so instead of failing obscurely.
        for name in ("probe", "send", "leaks"):
            add([Check(name, Status.SKIP, f"skipped: {shm_dir} is not usable")])
        add(check_reapers())
        return DoctorReport(checks, "", list(workers))
    embedded = None
    if not workers:
        from smgshm.core.receiver.reader import ReceiverConfig
        from smgshm.core.receiver.services import start_receiver

        embedded = start_receiver(ReceiverConfig(shm_dir=shm_dir), "127.0.0.1:0")
        workers = [embedded.address]
    try:
        found, probed = check_workers(workers, facts, timeout, embedded.address if embedded else "")
        add(found)
        # The probe asked each worker for smgshm's Identity too: a send is only tried on a smgshm receiver.
        for w, report in zip(workers, probed.workers, strict=True):
            if embedded is not None or report.smgshm_receiver:
                add(check_send(w, facts, timeout, f" {w}" if len(workers) > 1 else ""))
    finally:
        if embedded is not None:
            embedded.stop(0)
    if e2e and (gateway or embedded is not None):
        if same_dir(shm_dir, DEFAULT_SHM_DIR) or gateway:
            add(check_e2e(gateway, api_key, facts, timeout, metrics_url))
        else:  # SMG's gateway always writes /dev/shm: an embedded one would say nothing about this dir
            add([Check("e2e", Status.SKIP, f"skipped: SMG's gateway writes {DEFAULT_SHM_DIR}, not {shm_dir}")])
    add(check_leaks(shm_dir, stranded_after_s))
    host = run_host_checks(
        add, facts, timeout, gateway_logs, inflight_bytes, gateway_pids, api_key, gateway, gateway_workers
    )
    add(check_reapers())
    return DoctorReport(checks, embedded.address if embedded else "", workers, host)
