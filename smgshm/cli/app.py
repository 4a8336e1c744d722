"""Per-invocation state: output mode and the two consoles."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from rich.text import Text

from smgshm.cli.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console


@cache
def _console_class() -> type[Console]:
    """rich's Console, loaded when a console is first used: a --json run that says nothing on either stream never
    loads it (rich.console is some 10 ms of start-up beyond the rich.text every run loads)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich's own answer is exit 1 (our "operation failed") with stdout sent to /dev/null even when
            # stderr was the closed stream: the root group decides instead, once for every command.
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console


@dataclass
class App:
    json: bool = False
    quiet: bool = False
    no_color: bool = False
    traceback: bool = False
    npd: bool = False  # node-problem-detector plugin mode (cli/npd.py): every ending is one line, exit 0/1/2
    command: str = ""
    warnings: list[str] = field(default_factory=list)
    said: bool = False  # the one JSON document or NPD line is written (one output channel: never a second)
    # A document streamed and not yet whole (gc's listing): given why the run failed, it closes it (ok false).
    close_doc: Callable[[str], None] | None = field(default=None, repr=False)
    # stdout's and stderr's, made when first used (``console``, ``err_console``) on the streams of that moment
    _made: tuple[Console, Console] | None = field(default=None, init=False, repr=False)

    @property
    def console(self) -> Console:
        return self._consoles()[0]

    @property
    def err_console(self) -> Console:
        return self._consoles()[1]

    def _consoles(self) -> tuple[Console, Console]:
        if self._made is None:
            plain, cls = self.no_color or bool(os.environ.get("NO_COLOR")), _console_class()
            # Each stream decides its own colour from its own isatty (rich does that per file).
            self._made = (
                cls(file=sys.stdout, no_color=plain, highlight=False, soft_wrap=True),
                cls(file=sys.stderr, no_color=plain, highlight=False, soft_wrap=True),
            )
        return self._made

    def set_flag(self, name: str) -> None:
        """A root flag given after the subcommand (``smgshm gc --check --json``): same effect as before it."""
        setattr(self, name, True)
        if name == "no_color":
            self._made = None  # made again, without colour

    def warn(self, message: str) -> None:
        """A warning: kept for the JSON document and always said on stderr (unless --quiet)."""
        from smgshm.cli.fmt import prose, safe

        self.warnings.append(message)
        if not self.quiet:  # escaped (a stranger's name can hold a newline); wrapped as all prose, words whole
            prose(self.err_console, Text("warning: ", style="yellow") + safe(message), 9)

    def warn_state_dir(self, refused: str) -> None:
        """The sightings' state dir refused (``Sightings.refused``: "<dir>: <why>"), said (gc, gc --node, watch)."""
        self.warn(
            f"sightings not stored: state dir {refused}; smgshm changes no dir it did not make "
            "(point SMGSHM_STATE_DIR at a dir of this user's that no one else may write)"
        )

    def warn_lock(self) -> None:
        """Said once a run: another process held the sightings store's lock past the run's one bounded wait,
        so this run stored nothing then, and later stores did not wait (usercache.LockWaits)."""
        from smgshm.core.host.usercache import lock_waits

        waits = lock_waits()
        if waits.exhausted:
            n = waits.skipped
            later = f"; {n} later store(s) of this run found it held and did not wait" if n else ""
            self.warn(
                f"sightings not stored: another process held the store's lock in {waits.where} past this run's "
                f"one wait{later}"
            )

    def info(self, message: str) -> None:
        """Progress or status on stderr; silent under --quiet and --json."""
        if not self.json and not self.quiet:
            from smgshm.cli.fmt import prose  # wrapped at the terminal's width, as every human line is

            prose(self.err_console, Text(message, style="dim"), 2)

    def confirm(self, question: str) -> bool:
        """Ask on stderr and read one line from stdin: yes for y or yes, anything else is no. No, an
        empty answer and end of input (Ctrl-D, a closed stdin) decline, which is no error; Ctrl-C
        stays an interruption (exit 130). click.confirm made a "no" "Aborted!" and exit 1."""
        self.err_console.print(Text(f"{question} [y/N]: "), end="")
        answer = sys.stdin.readline()
        if not answer:
            self.err_console.print()  # the prompt's line ends: what follows starts on its own
        return answer.strip().lower() in ("y", "yes")

    def silent(self, code: ExitCode) -> bool:
        """--quiet and nothing failed: gc, watch and doctor print nothing at all (a cron line stays quiet)."""
        return self.quiet and not self.json and code == ExitCode.OK

    def emit(self, result: Any, human: Any, code: ExitCode = ExitCode.OK) -> ExitCode:
        """Write the result: one JSON document, or the human renderer's output."""
        if not self.json:
            human(self, result)
        return self.emit_rendered(result, code)

    def emit_rendered(self, result: Any, code: ExitCode = ExitCode.OK) -> ExitCode:
        """Finish a command whose human output was already said as it went: under --json write the one
        document; for people nothing is left to render."""
        from smgshm.cli import jsonout

        if self.json:
            jsonout.write_result(self, result, ok=code == ExitCode.OK)
        return code
