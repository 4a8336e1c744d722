"""What every doctor check reports: its name, its status, its fix, and the outcome it asks for."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from smgshm.core.causes import CATALOGUE, Cause, Where
from smgshm.core.outcomes import Outcome, Status, worst


@dataclass(frozen=True)
class Check:
    name: str
    status: Status  # info is advice, never counted as a warning; unknown cannot be judged
    summary: str
    fix: str = ""
    code: Outcome = Outcome.OK  # what this check asks the run to end as (JSON: its exit code)
    # The command of the fix as argv (shown shell-quoted, so pasting it does only what it says; None: no
    # command is safe to run blind), and the exact bytes (hex) of the entry names the check is about: names
    # may be invalid UTF-8.
    fix_cmd: list[str] | None = None
    names_hex: list[str] = field(default_factory=list)
    cause: Cause | None = None  # the catalogue's cause of a failure or warning (JSON: its code, or null)


def deciding(checks: Iterable[Check]) -> list[Check]:
    """The checks that decide the run's exit code: each failure, and each that judged nothing (unknown, with
    the code it asks for): a check of nothing never passes."""
    return [c for c in checks if c.status == Status.FAIL or (c.status == Status.UNKNOWN and c.code != Outcome.OK)]


def run_outcome(checks: Iterable[Check]) -> Outcome:
    """What a run of ``checks`` ends as: the worst code among those that decide it (outcomes.SEVERITY)."""
    return worst(c.code for c in deciding(checks))


def cause_check(
    name: str, status: Status, summary: str, cause: Cause, code: Outcome = Outcome.OK, where: Where | None = None
) -> Check:
    """A check that fails or warns for ``cause``: the catalogue's fix, and its next step's command for what
    ``where`` names (the catalogue builds it: no check writes its own text or command for a cause; none that
    would only run doctor again)."""
    entry = CATALOGUE[cause]
    step = entry.next_step(replace(where or Where(), running="doctor"))
    return Check(name, status, summary, entry.fix, code, fix_cmd=step or None, cause=cause)


# How a group of checks hands its results on as each finishes (doctor shows them live).
AddChecks = Callable[[list[Check]], None]
