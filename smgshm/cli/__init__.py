"""The root command group and the one place where errors become exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from smgshm import __version__
from smgshm.cli import jsonout, signals
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode, for_outcome
from smgshm.core.errors import SmgshmError


class CliError(click.ClickException):
    """A core error on its way out, with the exit code of its kind."""

    def __init__(self, err: SmgshmError, app: App | None) -> None:
        super().__init__(str(err))
        self.err = err
        self.app = app
        self.exit_code = for_outcome(err.outcome)

    # click declares exit_code a class variable; this one's is the error's own, hence a property.
    @property
    def exit_code(self) -> int:
        return self._exit_code

    @exit_code.setter
    def exit_code(self, code: int) -> None:
        self._exit_code = code

    def show(self, file: Any = None) -> None:
        from smgshm.cli.fmt import escape, safe

        # Messages carry peers' and the filesystem's strings: escaped. One line each, never
        # wrapped: scripts grep "Error: " lines.
        console = self.app.err_console if self.app else None
        if console is None:
            hint = f"\nhint: {escape(self.err.hint)}" if self.err.hint else ""
            click.echo(f"Error: {escape(str(self.err))}{hint}", err=True)
            return
        console.print(Text("Error: ", style="bold red") + safe(str(self.err)), soft_wrap=True)
        if self.err.hint:
            console.print(Text("hint: ", style="cyan") + safe(self.err.hint), soft_wrap=True)


@contextmanager
def _closed_stdout_exits() -> Iterator[None]:
    """stdout's reader gone (``smgshm gc --all | head -1``): exit 141 without a word, after the run's
    own clean-up (its finally blocks ran as the error rose). Any other broken pipe goes on as a fault."""
    try:
        yield
    except BrokenPipeError:
        if not signals.stdout_closed():
            raise
        raise click.exceptions.Exit(ExitCode.CLOSED_PIPE) from None


# Each command's module, imported when that command is first looked up: `smgshm gc` then does
# not import bench's, e2e's or probe's dependencies (start-up is part of every gc run's time).
_COMMANDS = {
    "doctor": "smgshm.cli.doctor",
    "probe": "smgshm.cli.probe",
    "send": "smgshm.cli.send",
    "gc": "smgshm.cli.gc",
    "watch": "smgshm.cli.watch",
    "bench": "smgshm.cli.bench",
    "serve": "smgshm.cli.serve",
    "e2e": "smgshm.cli.e2e",
    "ns": "smgshm.cli.ns",
    "completion": "smgshm.cli.completion",
    "preflight": "smgshm.cli.preflight",
}


class RootGroup(click.Group):
    """Translates exceptions once: SmgshmError -> its code, Ctrl-C -> 130, a bug -> 70.

    Subcommands load on first use; ``commands`` (help, docs, tests) loads them all.
    """

    @property
    def commands(self) -> MutableMapping[str, click.Command]:  # as click.Group declares it
        for name in _COMMANDS:
            self._load(name)
        return self._commands

    @commands.setter
    def commands(self, value: MutableMapping[str, click.Command]) -> None:
        self._commands = dict(value)

    def _load(self, name: str) -> click.Command | None:
        cmd = self._commands.get(name)
        if cmd is None and name in _COMMANDS:
            import importlib

            cmd = getattr(importlib.import_module(_COMMANDS[name]), name)
            accept_root_flags(cmd)
            self._commands[name] = cmd
        return cmd

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_COMMANDS, *self._commands})

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name is None:
            raise TypeError("Command has no name.")
        self._commands[name] = cmd

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with _closed_stdout_exits():  # the root's --help and --version, said while parsing
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _closed_stdout_exits():
                return super().invoke(ctx)
        except SmgshmError as err:
            app = ctx.obj if isinstance(ctx.obj, App) else None
            if app is not None and app.npd:
                _npd_unknown(f"error: {err.kind}: {err}")
            if app is not None and app.json:
                jsonout.write_error(app, err.kind, str(err), err.hint)
            raise CliError(err, app) from err
        except click.UsageError as err:
            app = ctx.obj if isinstance(ctx.obj, App) else None
            if app is not None and app.npd:  # NPD's Unknown is 2, as a usage error's: the one line is added
                from smgshm.cli.npd import NpdStatus, npd_emit

                npd_emit(NpdStatus.UNKNOWN, f"usage error: {err.format_message()}")
            if app is not None and app.json:
                jsonout.write_error(app, "usage", err.format_message(), None)
            raise
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt as stop:
            said = getattr(stop, "said", None)  # core.errors.Interrupted: what the run stopped, in one line
            if said:
                click.echo(f"interrupted: {said}", err=True)
            # SIGTERM/SIGHUP unwound as Ctrl-C (signals.unwind_on_signals): their own codes, 143 and 129
            raise click.exceptions.Exit(getattr(stop, "exit_code", ExitCode.INTERRUPTED)) from None
        except Exception as err:
            app = ctx.obj if isinstance(ctx.obj, App) else None
            if (app is not None and app.traceback) or os.environ.get("SMGSHM_DEBUG") == "1":
                raise
            if app is not None and app.npd:
                _npd_unknown(f"internal error: {type(err).__name__}: {err}")
            if app is not None and app.json:
                jsonout.write_error(app, "internal", f"{type(err).__name__}: {err}", "rerun with --traceback")
            click.echo(f"Error: internal error: {type(err).__name__}: {err}", err=True)
            click.echo("hint: this is a bug in smgshm; rerun with --traceback and report it", err=True)
            raise click.exceptions.Exit(ExitCode.INTERNAL) from err


def _npd_unknown(message: str) -> None:
    """In node-problem-detector mode a failure of smgshm's own is NPD's Unknown (2), said in one line."""
    from smgshm.cli.npd import NpdStatus, npd_emit

    raise click.exceptions.Exit(npd_emit(NpdStatus.UNKNOWN, message))


# The generated pages ship inside the package (editable and wheel installs alike), as man1/ under this.
MAN_PATH = Path(__file__).resolve().parent.parent / "man"


def _print_man_path(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(str(MAN_PATH))
        ctx.exit()


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--json", "json_", is_flag=True, help="Write one JSON document to stdout (schema_version 1).")
@click.option("--no-color", is_flag=True, help="No colour (also when NO_COLOR is set or output is not a TTY).")
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No progress or hints; gc, watch and doctor print nothing unless something failed.",
)
@click.option("--traceback", is_flag=True, help="Show the Python traceback of an internal error.")
@click.version_option(__version__, "-V", "--version", prog_name="smgshm")
@click.option(
    "--man-path",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_man_path,
    help='Print the directory of the man pages and exit: man -M "$(smgshm --man-path)" smgshm-gc.',
)
@click.pass_context
def cli(ctx: click.Context, json_: bool, no_color: bool, quiet: bool, traceback: bool) -> None:
    """Diagnose and administer SMG's same-host /dev/shm tensor transport.

    SMG's gateway sends large multimodal tensors to vLLM and TokenSpeed workers
    either inline in gRPC or through /dev/shm segments. smgshm tells you whether
    SHM works between a gateway and its workers, why not, and what leaked.

    \b
    The root options may also follow the subcommand: `smgshm gc --check --json`.

    \b
    Examples:
      smgshm doctor                     # every check, with the fix for each failure
      smgshm e2e                        # SMG's real gateway, shm/auto/inline: which path?
      smgshm serve                      # the reference receiver, on 127.0.0.1:50051
      smgshm ns                         # this host's shm_namespace_id
      smgshm ns compare ID_A ID_B       # do two ids share /dev/shm?
      smgshm probe 127.0.0.1:50051      # does this worker share /dev/shm with me?
      smgshm send 127.0.0.1:50051       # verified tensors through /dev/shm
      smgshm bench                      # inline vs SHM by size: the shm_min_bytes to set
      smgshm gc                         # what leaked?
      smgshm watch                      # SHM traffic live: in flight, consumed, orphans
      smgshm preflight -- smg launch    # reclaim a restarted pid 1's leftovers, then start SMG
      smgshm completion bash            # the shell completion script
    """
    # gRPC's C core logs its own copy of errors we already report in one line (e.g. a busy
    # port); grpc is imported lazily, so this takes effect. An operator's setting wins.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    ctx.obj = App(json=json_, quiet=quiet, no_color=no_color, traceback=traceback, command=ctx.invoked_subcommand or "")


# Root flags a user may also put after the subcommand, as with git, kubectl and docker.
# (attribute on App, spellings); --traceback too, so it can be added when a run fails.
_LATE_FLAGS = (
    ("json", ("--json",)),
    ("no_color", ("--no-color",)),
    ("quiet", ("-q", "--quiet")),
    ("traceback", ("--traceback",)),
)


def _late_flag(name: str) -> Any:
    def callback(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        app = ctx.find_object(App)
        if value and app is not None:
            app.set_flag(name)

    return callback


class _LateFlag(click.Option):
    """A root flag's copy on a subcommand: offered by shell completion (with the root's help),
    left out of the subcommand's --help and man page, where the root's own is documented."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        return None


def accept_root_flags(cmd: click.Command) -> None:
    """Give ``cmd`` (and its subcommands) copies of the root flags.

    Click parses options per command, so ``smgshm gc --check --json`` was a usage error.
    Copies are added only where the command has no option of that spelling itself.
    """
    taken = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    helps = {opt: p.help for p in cli.params if isinstance(p, click.Option) for opt in p.opts}
    for name, spellings in _LATE_FLAGS:
        free = [s for s in spellings if s not in taken]
        if free:
            flag = _LateFlag(free, is_flag=True, expose_value=False, is_eager=True, help=helps.get(spellings[-1]))
            flag.callback = _late_flag(name)
            cmd.params.append(flag)
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            accept_root_flags(sub)


def main() -> None:
    """Console-script entry point."""
    signals.PROCESS_ENTRY = True  # this process is smgshm itself (not a CliRunner in a test)
    signals.standard_streams()
    try:
        with _closed_stdout_exits():
            try:
                cli.main(prog_name="smgshm")
            finally:  # here, not at interpreter exit, where a closed stdout is exit 120 and a traceback
                sys.stdout.flush()
    except KeyboardInterrupt:
        sys.exit(ExitCode.INTERRUPTED)
    except click.exceptions.Exit as end:  # only _closed_stdout_exits raises it out here
        sys.exit(end.exit_code)


__all__ = ["App", "CliError", "cli", "main"]
