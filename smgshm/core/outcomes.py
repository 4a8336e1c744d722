"""The outcomes the core can reach, and which of them is worst: the core's side of the exit codes.

The core says what happened (an operation failed, a check failed, the peer is unreachable, ...);
``smgshm.cli.exitcodes`` alone turns an outcome into a number. Every ``SmgshmError`` subclass
names its outcome in its class (``errors.py``), so no module maps errors by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from smgshm.core.closed import Closed


class Outcome(enum.Enum):
    OK = "ok"  # success, or the check passed
    FAILED = "failed"  # the operation failed: bad handle or segment, request refused
    CHECK_FAILED = "check_failed"  # a verdict, not a fault: SHM unusable, byte mismatch or leftover, leaks
    UNREACHABLE = "unreachable"  # endpoint unreachable, deadline exceeded, wrong service
    HOST = "host"  # the local environment: no or full shm dir, permission denied
    UNDETERMINED = "undetermined"  # a verdict: no namespace id advertised, or this host's is unreadable


# Worst first: a run that saw several ends as the first of these (doctor's documented order).
SEVERITY: tuple[Outcome, ...] = (
    Outcome.UNREACHABLE,
    Outcome.HOST,
    Outcome.CHECK_FAILED,
    Outcome.UNDETERMINED,
    Outcome.FAILED,
    Outcome.OK,
)


def worst(outcomes: Iterable[Outcome]) -> Outcome:
    """The most severe of ``outcomes``; OK when there is none."""
    return min(outcomes, key=SEVERITY.index, default=Outcome.OK)


class Status(Closed):
    """A check's status (doctor's, and a finding's that becomes one): what one check says, beside the
    outcome it asks the run to end as."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    INFO = "info"  # advice, never counted as a warning
    # Could not be judged: never a failure, never a warning. With code UNDETERMINED it is a check that judged
    # nothing (no workers, every segment unknown, nothing showing the setting): the run is inconclusive, exit 6.
    UNKNOWN = "unknown"
