"""The one table of exit codes. Each is documented in the README and man pages and tested."""

from __future__ import annotations

import enum

from smgshm.core.outcomes import Outcome


class ExitCode(enum.IntEnum):
    OK = 0  # success, or the check passed, or the user declined a prompt (nothing done: not a failure)
    FAILED = 1  # the operation failed: bad handle, bad segment, request refused
    USAGE = 2  # bad arguments or conflicting flags (click)
    CHECK_FAILED = 3  # a verdict: SHM unusable, byte mismatch or leftover, leaks found
    UNREACHABLE = 4  # endpoint unreachable, deadline exceeded, wrong service
    HOST = 5  # local environment: no or full shm dir, permission denied
    UNDETERMINED = 6  # the peer advertises no namespace id, ours is unreadable, or the check judged nothing
    INTERNAL = 70  # a bug in smgshm (sysexits EX_SOFTWARE)
    CANNOT_EXEC = 126  # preflight's wrapper: the command was found but the kernel would not run it (the shell's 126)
    NOT_FOUND = (
        127  # preflight's wrapper: exec said ENOENT (the command or its interpreter is not there; the shell's 127)
    )
    HANGUP = 129  # SIGHUP: a long run (send, e2e, doctor) stopped cleanly and said what it did
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    CLOSED_PIPE = 141  # stdout's reader left (`| head`): 128 + SIGPIPE, as a shell reports `cat | head`
    TERMINATED = 143  # SIGTERM: as SIGHUP (``timeout``, systemd, kubectl delete)


DESCRIPTIONS: dict[ExitCode, str] = {
    ExitCode.OK: "success; the check passed; or a prompt answered no (nothing was changed)",
    ExitCode.FAILED: "the operation failed (bad handle, truncated or foreign segment, request refused)",
    ExitCode.USAGE: "usage error, including conflicting flags",
    ExitCode.CHECK_FAILED: "check failed: SHM unusable, byte mismatch or leftover segment, leaks found",
    ExitCode.UNREACHABLE: "endpoint unreachable, deadline exceeded, or wrong service",
    ExitCode.HOST: "local environment: no, too small or full shm dir, permission denied",
    ExitCode.UNDETERMINED: "undetermined: no namespace id advertised, this host's unreadable, or nothing to judge",
    ExitCode.INTERNAL: "internal error (a bug); rerun with --traceback",
    ExitCode.CANNOT_EXEC: "preflight's wrapper: its document was written, then the command could not be exec'd "
    "(ETXTBSY, E2BIG, EACCES, ENOEXEC: said in one line on stderr), as a shell's 126",
    ExitCode.NOT_FOUND: "preflight's wrapper: its document was written, then exec said the command or its "
    "interpreter is not there (ENOENT, said in one line on stderr), as a shell's 127",
    ExitCode.HANGUP: "stopped by SIGHUP, as by Ctrl-C (send, e2e, doctor)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C): send stops within a second and prints a partial report; e2e and "
    "doctor stop what they started and say so in one line (their gateways' logs removed or named)",
    ExitCode.CLOSED_PIPE: "stdout closed by its reader (| head): the rest of the output dropped quietly",
    ExitCode.TERMINATED: "stopped by SIGTERM, as by Ctrl-C (send, e2e, doctor)",
}


# The one place an outcome of the core becomes a number.
_FOR_OUTCOME: dict[Outcome, ExitCode] = {
    Outcome.OK: ExitCode.OK,
    Outcome.FAILED: ExitCode.FAILED,
    Outcome.CHECK_FAILED: ExitCode.CHECK_FAILED,
    Outcome.UNREACHABLE: ExitCode.UNREACHABLE,
    Outcome.HOST: ExitCode.HOST,
    Outcome.UNDETERMINED: ExitCode.UNDETERMINED,
}


def for_outcome(outcome: Outcome) -> ExitCode:
    """The exit code of a core outcome."""
    return _FOR_OUTCOME[outcome]
