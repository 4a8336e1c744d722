"""Stopping a long run cleanly on SIGINT, SIGTERM and SIGHUP (the run ends, its report is printed),
and ending quietly when the reader of stdout or stderr has gone (``| head``).

Python's default Ctrl-C raises KeyboardInterrupt wherever the main thread is, while the
worker threads go on sending; SIGTERM (``timeout``, systemd, kubectl) and SIGHUP kill the
process outright, leaving its in-flight segments behind. Here each just sets an event the
core polls; the command then reports what it did and exits 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ParamSpec, TextIO, TypeVar

from smgshm.cli.exitcodes import ExitCode

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Set by the console entry point (``smgshm.cli.main``): this process is smgshm itself, so a command
# that has stopped cleanly may leave with os._exit, skipping interpreter teardown (serve: torch's and
# gRPC's take 2-3 s, past its promise to be gone within 2 s of a signal). Never set in-process (tests'
# CliRunner).
PROCESS_ENTRY = False
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

    old: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            old[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP raised as Ctrl-C is (``unwind_on_signals``): every ``except KeyboardInterrupt`` and
    ``finally`` of the run applies alike (gateways and receivers stopped, logs removed or named, a batch set
    aside put back, the one line of what was stopped), and the exit code is still the signal's."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> ExitCode:
        return _CODES.get(signal.Signals(self.signum), ExitCode.INTERRUPTED)


@contextmanager
def unwind_on_signals() -> Iterator[None]:
    """Within the block SIGTERM and SIGHUP unwind the main thread as Ctrl-C does (``Terminated``), so that
    what a run has under way is undone by its own ``finally`` and ``except BaseException`` blocks (e2e's and
    doctor's gateways and receivers stopped; gc --delete and preflight put a batch they set aside back under
    its names, segments/reaping.py) instead of the process dying with it. Once one of the three has arrived,
    the next ones are ignored: a clean-up is never itself cut short. Outside the main thread nothing is
    installed; the previous handlers are restored on exit. (A run that polls an event uses
    ``stop_on_signals``.)"""
    fired: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if fired:
            return
        fired.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

    def unraisable(info: Any) -> None:
        # Raised where it cannot propagate (an object's __del__ ran when the signal was handled): the run
        # would go on as if no signal had come. Kept instead, for the process's exit code (cli's main).
        if fired and isinstance(info.exc_value, KeyboardInterrupt):
            _SWALLOWED[:] = fired[:1]
            return
        before(info)

    old: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}
    before = sys.unraisablehook
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            old[sig] = signal.signal(sig, handler)
        sys.unraisablehook = unraisable
    try:
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)
        if old:
            sys.unraisablehook = before


_SWALLOWED: list[int] = []  # the signal a clean-up swallowed (unwind_on_signals), once


def swallowed_code() -> ExitCode | None:
    """The exit code of a signal whose exception a clean-up swallowed (a ``__del__``): the run ended as if it
    had not come, and must not exit 0 for it. None when none was."""
    return _CODES.get(signal.Signals(_SWALLOWED[0])) if _SWALLOWED else None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def unwinds(said: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """A command whose whole run unwinds on SIGTERM/SIGHUP as on Ctrl-C (``unwind_on_signals``) and always
    ends an interrupt with one line: the core's (``Interrupted.said``: what it stopped, its logs), else
    ``said``, for an interrupt where the command had started nothing (looking for a gateway, parsing)."""

    def wrap(run: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(run)
        def command(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            from smgshm.core.errors import Interrupted

            try:
                with unwind_on_signals():
                    return run(*args, **kwargs)
            except KeyboardInterrupt as err:
                if getattr(err, "said", None):
                    raise
                raise Interrupted(said) from err

        return command

    return wrap


def interrupt_code(stop: BaseException) -> ExitCode:
    """The exit code of a run ended by a signal: 130 for Ctrl-C, 143 SIGTERM, 129 SIGHUP, as the table says;
    the signal is found on the exception or on the one it was raised from (core's ``Interrupted``)."""
    seen: BaseException | None = stop
    while seen is not None:
        signum = getattr(seen, "signum", None)
        if signum is not None:
            return _CODES.get(signal.Signals(signum), ExitCode.INTERRUPTED)
        seen = seen.__cause__ or seen.__context__
    return ExitCode.INTERRUPTED


# -- a closed stdout or stderr -------------------------------------------------------------------
# `smgshm gc --all | head -1`: the reader leaves and the next write fails with EPIPE (Python ignores
# SIGPIPE, so the process is not killed). Left alone, rich exits 1 (the documented "operation
# failed") and Python prints a traceback at exit. The rule, for every command:
#   - stdout's reader gone: the run unwinds (its finally blocks clean up, as for Ctrl-C) and exits
#     141, what a shell reports for `cat | head` (128 + SIGPIPE), without a word;
#   - stderr's reader gone: progress, warnings and errors are dropped from then on, and the run
#     goes on to its own exit code (stdout and the code still carry the result).


def _broken(fd: int) -> bool:
    """Whether ``fd`` is a pipe or socket whose reader has gone (poll: POLLERR/POLLHUP, never blocks)."""
    import select

    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) and not ev & select.POLLNVAL for _, ev in poll.poll(0))


def _to_devnull(fd: int) -> None:
    """Point ``fd`` at /dev/null: whatever is still buffered for it, and any later write, goes nowhere."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def stdout_closed() -> bool:
    """After an EPIPE: was it stdout's? Then stdout (and stderr, if it is gone too) now lead to
    /dev/null. False when the broken pipe was another's (a socket, a child's pipe): a fault to report."""
    if not _broken(1):
        return False
    for fd in (1, 2):
        if fd == 1 or _broken(fd):
            _to_devnull(fd)
    return True


class QuietStderr:
    """``sys.stderr`` that, once its reader has gone, drops what is written instead of raising:
    a closed stderr never changes a run's outcome. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        _to_devnull(self._stream.fileno())
        with contextlib.suppress(OSError):  # what was buffered now goes to /dev/null
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def standard_streams() -> None:
    """Before a real run: fds 0, 1 and 2 open (a closed one reads or writes /dev/null, so no file
    smgshm opens later can become fd 2 and receive stray error output), and stderr quiet when closed."""
    while True:
        fd = os.open(os.devnull, os.O_RDWR)
        if fd > 2:
            os.close(fd)
            break
    if sys.stdin is None:
        sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin, open until exit
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - as stdin
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - as stdin
    sys.stderr = QuietStderr(sys.stderr)
