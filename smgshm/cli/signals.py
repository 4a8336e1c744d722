"""Stopping a long run cleanly on SIGINT, SIGTERM and SIGHUP: the run ends, its report is printed.

Python's default Ctrl-C raises KeyboardInterrupt wherever the main thread is, while the
worker threads go on sending; SIGTERM (``timeout``, systemd, kubectl) and SIGHUP kill the
process outright, leaving its in-flight segments behind. Here each just sets an event the
core polls; the command then reports what it did and exits 128 + the signal's number.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from smgshm.cli.exitcodes import ExitCode

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_CODES = {signal.SIGINT: ExitCode.INTERRUPTED, signal.SIGTERM: ExitCode.TERMINATED, signal.SIGHUP: ExitCode.HANGUP}


@dataclass
class Stop:
    """The event a core run polls, and the first signal that set it."""

    event: threading.Event = field(default_factory=threading.Event)
    signum: int | None = None

    @property
    def exit_code(self) -> ExitCode | None:
        return None if self.signum is None else _CODES.get(signal.Signals(self.signum), ExitCode.INTERRUPTED)

    @property
    def name(self) -> str:
        return "" if self.signum is None else signal.Signals(self.signum).name


@contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """Within the block, SIGINT/SIGTERM/SIGHUP set ``Stop.event`` instead of killing the process.

    Outside the main thread (where handlers cannot be installed) the event is simply never set
    by a signal. The previous handlers are restored on exit.
    """
    stop = Stop()

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.signum is None:
            stop.signum = signum
        stop.event.set()

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            old[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)
