"""node-problem-detector's custom plugin contract, in one place: the status codes and the one line.

NPD runs a plugin, reads its exit status (0 OK, 1 NonOK: a problem, 2 Unknown) and takes its stdout,
cut to ``max_output_length`` (80 by default), as the condition's or event's message. So a plugin
mode prints exactly one line of at most 80 characters, plain ASCII (no colour, a stranger's name
escaped), and every failure of its own, a usage error or a bug included, is Unknown: never OK.
"""

from __future__ import annotations

import enum
import sys

from smgshm.cli.fmt import escape

MAX_CHARS = 80


class NpdStatus(enum.IntEnum):
    OK = 0
    PROBLEM = 1  # NPD's NonOK
    UNKNOWN = 2


def npd_line(message: str) -> str:
    """``message`` as NPD's one line: escaped, ASCII only, at most MAX_CHARS (cut with "...")."""
    text = escape(message).encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."


def npd_emit(status: NpdStatus, message: str) -> int:
    """Write the one line to stdout (unless this invocation wrote it already) and give the exit status to
    end with."""
    import click

    from smgshm.cli.app import App

    ctx = click.get_current_context(silent=True)
    app = ctx.find_object(App) if ctx is not None else None
    if app is not None:
        if app.said:
            return int(status)
        app.said = True
    sys.stdout.write(npd_line(message) + "\n")
    sys.stdout.flush()
    return int(status)
