"""doctor's checks of the workers: each one's probe (verified by a canary), then a verified send."""

from __future__ import annotations

import os
import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

from smgshm.core.causes import Cause, for_sharing, found
from smgshm.core.doctor.check import Check
from smgshm.core.errors import NoSpaceError, SmgshmError
from smgshm.core.names import probe_file_pid
from smgshm.core.outcomes import Outcome, Status
from smgshm.core.paths import smgshm_cmd
from smgshm.core.units import human_ms

if TYPE_CHECKING:
    from smgshm.core.client.probe import ProbeReport, WorkerReport
    from smgshm.core.host.facts import HostFacts


def check_workers(
    addresses: list[str], facts: HostFacts, timeout: float, embedded: str = ""
) -> tuple[list[Check], ProbeReport]:
    """Each worker's probe, verified with a canary; the report says which ones are smgshm receivers.

    ``embedded``: the address of doctor's own reference receiver, labelled as such (it is no real worker)."""
    from smgshm.core.client.probe import ProbeOptions, probe

    shm_dir = facts.shm_dir
    opts = ProbeOptions(timeout=timeout, connect_timeout=timeout, shm_dir=shm_dir, verify=True)
    report = probe(addresses, opts, facts=facts)
    gc_fix = smgshm_cmd(shm_dir, "gc", "--delete")  # gc's rule: a probe file proven dead goes at any age
    out = probe_file_checks(report.local.leftover_probe_files, report.local.probe_lookalikes, shm_dir, gc_fix)
    for w in report.workers:
        c = probe_check(w, f"probe {w.address}")
        if w.address == embedded:
            c = replace(c, summary=f"embedded receiver (smgshm's, in this process; no real worker): {c.summary}")
        out.append(c)
    return out, report


def probe_file_checks(
    leftovers: list[str], lookalikes: list[str], shm_dir: str | None, gc_fix: list[str], where: str = ""
) -> list[Check]:
    """A failure per leftover gateway probe file of ``shm_dir`` (the next gateway with its pid finds the dir
    unwritable and stays inline; ``where`` says in which pid namespace), a warning per look-alike. ``gc_fix``:
    the gc command that reaps it once its pid is dead; else it is removed by hand, by its path in ``shm_dir``
    as the one who pastes it sees it (None: no such path, so no command)."""
    out = []
    for name in leftovers:
        pid = probe_file_pid(name)
        out.append(
            Check(
                "probe files",
                Status.FAIL,
                f"leftover {name}: a gateway with pid {pid}{where} will stay inline",
                f"{shlex.join(gc_fix)}, or once no gateway has pid {pid}{where}, remove it:",
                Outcome.CHECK_FAILED,
                fix_cmd=None if shm_dir is None else ["rm", "--", os.path.join(shm_dir, name)],
                names_hex=[os.fsencode(name).hex()],
                cause=Cause.PROBE_FILE_LEFT,
            )
        )
    for name in lookalikes:
        out.append(
            Check(
                "probe files",
                Status.WARN,
                f"{name} is named like a gateway's probe file but carries no pid: no gateway's, none is blocked",
                "nothing to do for SMG (gc lists it as other); remove it if it is yours",
                names_hex=[os.fsencode(name).hex()],
            )
        )
    return out


# Each probe verdict that is not "shared": the outcome it asks for (its fix is the catalogue's, by its cause).
PROBE_OUTCOMES: dict[str, Outcome] = {
    "other_host": Outcome.CHECK_FAILED,
    "private_tmpfs": Outcome.CHECK_FAILED,
    "uid_mismatch": Outcome.CHECK_FAILED,
    "verify_failed": Outcome.CHECK_FAILED,
    "undetermined": Outcome.UNDETERMINED,
    "unreachable": Outcome.UNREACHABLE,
}


def probe_check(w: WorkerReport, name: str) -> Check:
    """One worker's probe as a check: shared is ok; anything else fails with the fix probe reports for it."""
    if w.verdict == "shared":
        how = "verified with a canary segment" if w.verify and w.verify.ok else "ids match"
        return Check(name, Status.OK, f"{w.engine}: /dev/shm shared ({how})")
    code = PROBE_OUTCOMES.get(w.verdict, Outcome.CHECK_FAILED)
    # probe's own cause, as probe reports it (this host's id unreadable is not the worker's missing id).
    info = w.cause_info
    if info is None:
        cause = for_sharing(w.verdict)
        info = found(cause) if cause is not None else None
    if info is None:
        return Check(name, Status.FAIL, f"{w.verdict}: {w.reason}", "", code)
    return Check(
        name, Status.FAIL, f"{w.verdict}: {w.reason}", info.fix, code, fix_cmd=info.fix_cmd, cause=Cause(info.code)
    )


def _space_cause(err: SmgshmError) -> Cause | None:
    """The cause a segment write's ENOSPC was named by (too small or full); None for any other error."""
    return Cause(err.cause) if isinstance(err, NoSpaceError) else None


def check_send(address: str, facts: HostFacts, timeout: float, label: str = "") -> list[Check]:
    """A verified send of inline, then SHM, tensors to a smgshm receiver."""
    from smgshm.core.client.send import SendOptions, send
    from smgshm.core.gateway.setting import Mode
    from smgshm.core.transport.verify import ProblemKind

    out = []
    for mode in (Mode.INLINE, Mode.SHM):
        opts = SendOptions(mode=mode, shape=(256, 1024), tensors=2, count=4, timeout=timeout, shm_dir=facts.shm_dir)
        try:
            r = send(address, opts, facts=facts)
        except SmgshmError as err:
            out.append(
                Check(
                    f"send {mode.value}{label}",
                    Status.FAIL,
                    str(err),
                    err.hint or "",
                    # A send that could not run is the host's fault or the receiver's reachability.
                    Outcome.HOST if err.outcome is Outcome.HOST else Outcome.UNREACHABLE,
                    cause=_space_cause(err),
                )
            )
            continue
        if r.ok:
            p = r.paths[0]
            out.append(
                Check(
                    f"send {mode.value}{label}",
                    Status.OK,
                    f"{p.requests} requests, {p.tensors} tensors byte-exact via "
                    f"{p.path}, nothing left behind (p50 {human_ms(p.p50_ms)})",
                )
            )
        else:
            first = r.problems[0] if r.problems else None
            what = f"{first.kind}: {first.message}" if first else "unreachable"
            fix = (
                "the receiver must unlink after reading (SMG's gateway relies on it)"
                if first and first.kind is ProblemKind.LEFTOVER
                else ""
            )
            out.append(
                Check(
                    f"send {mode.value}{label}",
                    Status.FAIL,
                    what,
                    fix,
                    Outcome.UNREACHABLE if r.unreachable else Outcome.CHECK_FAILED,
                )
            )
    return out
