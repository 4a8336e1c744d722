"""Human output of ``smgshm doctor``: one line per check as it finishes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli.fmt import fix_line, prose, quote_cmd, safe

if TYPE_CHECKING:
    from smgshm.cli.app import App

_MARK = {"ok": ("ok  ", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red"), "skip": ("skip", "dim")}


def doctor_check(app: App, check: Any) -> None:
    """One line per check as it finishes, then its fix on the next line."""
    mark, style = _MARK.get(check.status, (check.status, ""))
    # Summaries carry strangers' strings (log paths, names): escaped, never raw control characters.
    prose(app.console, Text(f"[{mark}] ", style=style) + safe(f"{check.name}: ", "bold") + safe(check.summary), 7)
    if check.status not in ("fail", "warn"):
        return
    if check.fix:
        fix_line(app, check.fix)
    if getattr(check, "fix_cmd", None):
        # One line, never wrapped: it is meant to be pasted. quote_cmd makes that safe.
        app.console.print(Text("            ") + Text(quote_cmd(check.fix_cmd)), soft_wrap=True)


def headline(app: App, report: Any) -> None:
    """The last line, in the exit code's terms: failed, passed with warnings, or passed."""
    warned = [c for c in report.checks if c.status == "warn"]
    if report.failed:
        line, style = f"{len(report.failed)} check(s) failed", "bold red"
    elif warned:
        line, style = f"passed with {len(warned)} warning(s)", "bold yellow"
    else:
        line, style = "all checks passed", "bold green"
    app.console.print(Text(f"doctor: {line}", style=style))
