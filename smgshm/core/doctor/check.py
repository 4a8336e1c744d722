"""What every doctor check reports: its name, its status, its fix, and the outcome it asks for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from smgshm.core.causes import CATALOGUE, Cause, Where
from smgshm.core.closed import Closed
from smgshm.core.outcomes import Outcome


class Status(Closed):
    """A check's status."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    INFO = "info"  # advice, never counted as a warning
    UNKNOWN = "unknown"  # cannot be judged (doctor --node): never a failure, never a warning


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # a Status: info is advice, never counted as a warning; unknown cannot be judged
    summary: str
    fix: str = ""
    code: Outcome = Outcome.OK  # what this check asks the run to end as (JSON: its exit code)
    # The command of the fix as argv (shown shell-quoted, so pasting it does only what it says),
    # and the exact bytes (hex) of the entry names the check is about: names may be invalid UTF-8.
    fix_cmd: list[str] = field(default_factory=list)
    names_hex: list[str] = field(default_factory=list)
    cause: Cause | None = None  # the catalogue's cause of a failure or warning (JSON: its code, or null)


def cause_check(
    name: str, status: str, summary: str, cause: Cause, code: Outcome = Outcome.OK, where: Where | None = None
) -> Check:
    """A check that fails or warns for ``cause``: the catalogue's fix, and its next step's command for what
    ``where`` names (the catalogue builds it: no check writes its own text or command for a cause; none that
    would only run doctor again)."""
    entry = CATALOGUE[cause]
    step = entry.next_step(replace(where or Where(), running="doctor"))
    return Check(name, status, summary, entry.fix, code, fix_cmd=step or [], cause=cause)


# How a group of checks hands its results on as each finishes (doctor shows them live).
AddChecks = Callable[[list[Check]], None]
