"""Human output of ``smgshm serve``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from rich.text import Text

from smgshm.cli.fmt import escape, prose
from smgshm.cli.jsonout import dumps
from smgshm.core.errors import HostError

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.core.receiver.receipts import GenerateReceipt


def serve_ready(app: App, info: dict[str, Any]) -> None:
    line = (
        f"smgshm serve: ready on {info['address']} as a {info['engine']} worker "
        f"(namespace {info['namespace_id'] or 'unreadable'}, reader {info['reader']}, "
        f"unlink after read {'on' if info['unlink_after_read'] else 'off'})"
    )
    prose(app.console, Text(line), 2)
    if info.get("model_dir"):
        prose(app.console, Text(f"  model {info['served_model_name']} from {escape(info['model_dir'])}"), 4)


def receipt_logger(target: str, on_stdout_gone: Callable[[], None]) -> Callable[[GenerateReceipt], None]:
    """A thread-safe writer of one JSON line per receipt to ``target`` (a path, or - for stdout).

    Written from the RPC threads: when stdout's reader has gone (``--log-receipts - | head``) the
    lines are dropped from then on and ``on_stdout_gone`` is called once, for serve to stop and exit
    141 as every command does; the request being served is not failed for it."""
    from smgshm.cli.signals import stdout_closed

    try:
        out: TextIO = sys.stdout if target == "-" else open(target, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as serve
    except OSError as err:
        raise HostError(f"cannot open the receipts log: {err.strerror}", path=target) from err
    lock = threading.Lock()
    gone = threading.Event()

    def write(r: GenerateReceipt) -> None:
        line = dumps(r.to_json())
        with lock:
            if gone.is_set():
                return
            try:
                out.write(line + "\n")
                out.flush()
            except BrokenPipeError:
                if out is not sys.stdout or not stdout_closed():
                    raise
                gone.set()
                on_stdout_gone()

    return write
