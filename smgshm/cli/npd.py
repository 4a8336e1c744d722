"""node-problem-detector's one line said by a command (``--npd``): the contract's rules (status codes, the
line, gc's verdicts) live in core/node/npd.py, which the exporter's verdict file uses too; here only the
printing of it, once per invocation.
"""

from __future__ import annotations

import sys

from smgshm.core.node.npd import MAX_CHARS, NpdStatus, NpdVerdict, npd_line


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


def npd_say(verdict: NpdVerdict) -> int:
    """A verdict of core/node/npd.py said as the one line."""
    return npd_emit(verdict.status, verdict.line)


__all__ = ["MAX_CHARS", "NpdStatus", "npd_emit", "npd_line", "npd_say"]
