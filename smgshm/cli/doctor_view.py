"""Human output of ``smgshm doctor``: one line per check as it finishes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli.fmt import command, fix_line, prose, safe

if TYPE_CHECKING:
    from smgshm.cli.app import App

_MARK = {
    "ok": ("ok  ", "green"),
    "warn": ("warn", "yellow"),
    "fail": ("FAIL", "bold red"),
    "skip": ("skip", "dim"),
    "info": ("info", "cyan"),
    "unknown": ("????", "yellow"),  # cannot be judged (doctor --node): never a failure, never a warning
}


@contextmanager
def progress(app: App) -> Iterator[Callable[[Any], None]]:
    """While doctor runs: the check just finished, on a terminal's stderr only (transient: the verdict and
    the checks follow on stdout)."""
    if app.json or app.quiet or not app.err_console.is_terminal:
        yield lambda c: None
        return
    with app.err_console.status("doctor: starting") as status:
        yield lambda c: status.update(safe(f"doctor: {c.name} done"))


def mark(status: str) -> Text:
    """A status as doctor marks it: ``[FAIL]``, ``[warn]``, ``[ok  ]``..."""
    text, style = _MARK.get(status, (status, ""))
    return Text(f"[{text}]", style=style)


def doctor_check(app: App, check: Any, show_cause: bool = False) -> None:
    """One line per check, then its fix on the next line (and an advice's command). The catalogue's cause
    code ends the line of a failure, warning or check that judged nothing (as JSON's "cause": alert on it);
    ``show_cause``: after the check's name instead, whatever its status."""
    code = check.cause.value if getattr(check, "cause", None) is not None else ""
    cause = f" ({code})" if show_cause and code else ""
    # Summaries carry strangers' strings (log paths, names): escaped, never raw control characters.
    head = mark(check.status) + Text(" ") + safe(f"{check.name}{cause}: ", "bold") + safe(check.summary)
    if code and not show_cause and check.status in ("fail", "warn", "unknown"):
        head += Text(f" ({code})")
    prose(app.console, head, 7)
    if check.status not in ("fail", "warn", "info", "unknown"):  # unknown: its fix gets what it lacked
        return
    if check.fix and check.status != "info":
        fix_line(app, check.fix)
    if getattr(check, "fix_cmd", None):
        # Meant to be pasted: quoted, and continued with a backslash where it is wider than the terminal.
        command(app.console, check.fix_cmd, 12)


def _named(checks: list[Any]) -> str:
    return ", ".join(c.name for c in checks[:3]) + (", ..." if len(checks) > 3 else "")


def headline(app: App, report: Any) -> None:
    """The first line, in the exit code's terms: failed (naming the first failures), inconclusive (naming what
    judged nothing: never a pass), passed with warnings, or passed."""
    from smgshm.core.doctor.check import deciding

    warned = [c for c in report.checks if c.status == "warn"]
    unjudged = [c for c in deciding(report.checks) if c.status == "unknown"]
    if report.failed:
        line, style = f"{len(report.failed)} check(s) failed: {_named(report.failed)}", "bold red"
        if unjudged:
            line += f"; {len(unjudged)} inconclusive: {_named(unjudged)}"
    elif unjudged:
        line, style = f"inconclusive: {len(unjudged)} check(s) judged nothing: {_named(unjudged)}", "bold yellow"
    elif warned:
        line, style = f"passed with {len(warned)} warning(s)", "bold yellow"
    else:
        line, style = "all checks passed", "bold green"
    prose(app.console, safe(f"doctor: {line}", style), 2)


def report(app: App, report: Any) -> None:
    """The verdict first, as every command says it, then every check in the order run (--quiet: the verdict)."""
    headline(app, report)
    for c in [] if app.quiet else report.checks:
        doctor_check(app, c)
