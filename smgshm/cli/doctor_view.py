"""Human output of ``smgshm doctor``: one line per check as it finishes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli.fmt import safe

if TYPE_CHECKING:
    from smgshm.cli.app import App

_MARK = {"ok": ("ok  ", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red"), "skip": ("skip", "dim")}


def doctor_check(app: App, check: Any) -> None:
    """One line per check as it finishes, then its fix on the next line."""
    mark, style = _MARK.get(check.status, (check.status, ""))
    # Summaries carry strangers' strings (log paths, names): escaped, never raw control characters.
    app.console.print(Text(f"[{mark}] ", style=style) + safe(f"{check.name}: ", "bold") + safe(check.summary))
    if check.fix and check.status in ("fail", "warn"):
        app.console.print(Text("       fix: ", style="cyan") + safe(check.fix))
