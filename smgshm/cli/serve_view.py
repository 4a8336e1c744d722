"""Human output of ``smgshm serve``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

if TYPE_CHECKING:
    from smgshm.cli.app import App

def serve_ready(app: App, info: dict[str, Any]) -> None:
    line = (
        f"smgshm serve: ready on {info['address']} as a {info['engine']} worker "
        f"(namespace {info['namespace_id'] or 'unreadable'}, reader {info['reader']}, "
        f"unlink after read {'on' if info['unlink_after_read'] else 'off'})"
    )
    app.console.print(Text(line))
