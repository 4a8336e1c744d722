"""The root command group and the one place where errors become exit codes."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from smgshm import __version__
from smgshm.cli import jsonout, signals
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode, for_outcome
from smgshm.core.errors import SmgshmError

if TYPE_CHECKING:
    from rich.console import Console


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
        from smgshm.cli.fmt import prose, safe

        # Messages carry peers' and the filesystem's strings: escaped. Wrapped at the terminal's width
        # (80 when piped) as all prose is, between words: a path or a flag is never cut, and one longer
        # than the line has a line of its own. "Error: " still starts the first line.
        console = _err_console(self.app)
        prose(console, Text("Error: ", style="bold red") + safe(str(self.err)), 7)
        if self.err.hint:
            prose(console, Text("hint: ", style="cyan") + safe(self.err.hint), 6)


class _WrappedUsageError(click.UsageError):
    """A usage error said as click says it (usage, the --help hint), its ``Error:`` line wrapped as prose."""

    def __init__(self, err: click.UsageError, app: App | None) -> None:
        super().__init__(err.format_message(), err.ctx)
        self.app = app

    def show(self, file: Any = None) -> None:
        import io

        from smgshm.cli.fmt import prose

        said = io.StringIO()
        super().show(said)
        head, _, error = said.getvalue().rstrip("\n").rpartition("\n")
        console = _err_console(self.app)
        if head:
            console.print(Text(head), soft_wrap=True)
        prose(console, Text(error), 7)  # click's own words, markup-free: "Error: ..." (7 wide)


def _err_console(app: App | None) -> Console:
    """Where errors are said: the invocation's stderr console, or (before it exists) a plain one."""
    if app is not None:
        return app.err_console
    from rich.console import Console  # (an error's: a run that ends well never loads it)

    return Console(file=sys.stderr, no_color=True, highlight=False, soft_wrap=True)


def _say_err(app: App | None, head: str, text: str, style: str = "") -> None:
    """One message on stderr (``Error:``, ``hint:``, ``interrupted:``), escaped and wrapped as prose."""
    from smgshm.cli.fmt import prose, safe

    prose(_err_console(app), Text(head, style=style) + safe(text), len(head))


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


@contextmanager
def _whole_words() -> Iterator[None]:
    """click's help wraps with textwrap's defaults, which break a word at its hyphens and cut one longer
    than the line: "non-" then "regular", a flag split in two. Within this, click's wrapper does neither
    (click builds it inside ``wrap_text`` from ``click._textwrap``, so that name is what is swapped)."""
    from click import _textwrap

    base = _textwrap.TextWrapper

    class Whole(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **{**kw, "break_on_hyphens": False, "break_long_words": False})

    _textwrap.TextWrapper = Whole  # type: ignore[misc]
    try:
        yield
    finally:
        _textwrap.TextWrapper = base  # type: ignore[misc]


class _HelpFormatter(click.HelpFormatter):
    """--help as click lays it out, with every word, flag and name whole (``_whole_words``)."""

    def write_text(self, text: str) -> None:
        with _whole_words():
            super().write_text(text)

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        with _whole_words():
            super().write_dl(rows, col_max, col_spacing)

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        with _whole_words():
            super().write_usage(prog, args, prefix)


class _Context(click.Context):
    formatter_class = _HelpFormatter


class RootGroup(click.Group):
    """Translates exceptions once: SmgshmError -> its code, Ctrl-C -> 130, a bug -> 70.

    Subcommands load on first use; ``commands`` (help, docs, tests) loads them all.
    """

    context_class = _Context

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
            try:
                return super().make_context(info_name, list(args), parent, **extra)
            except click.UsageError as err:  # the root's own options: no App yet, the mode is read from argv
                _usage_out(None, args, err)
                raise _WrappedUsageError(err, None) from err

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_ARGS] = list(args)  # for a usage error a subcommand meets before its App knows its mode
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _closed_stdout_exits():
                return super().invoke(ctx)
        except SmgshmError as err:
            app = _app(ctx)
            _failed(app, err.kind, str(err), err.hint, npd=f"error: {err.kind}: {err}")
            raise CliError(err, app) from err
        except click.UsageError as err:
            _usage_out(_app(ctx), ctx.meta.get(_ARGS, []), err)
            raise _WrappedUsageError(err, ctx.obj if isinstance(ctx.obj, App) else None) from err
        except click.ClickException as err:  # (not CliError: raised above only) click's own, e.g. a file it opens
            _failed(_app(ctx), "error", err.format_message(), None, npd=f"error: {err.format_message()}")
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt as stop:
            said = getattr(stop, "said", None)  # core.errors.Interrupted: what the run stopped, in one line
            if said:
                _say_err(ctx.obj if isinstance(ctx.obj, App) else None, "interrupted: ", said)
            # The one output of the mode too: --json's error document, NPD's one line (Unknown, 2)
            _failed(_app(ctx), "interrupted", said or "interrupted", None, npd=f"interrupted: {said or 'a signal'}")
            raise click.exceptions.Exit(signals.interrupt_code(stop)) from None
        except Exception as err:
            app = _app(ctx)
            gone = _missing_extra(ctx, err)
            if gone is not None:  # an extra's module not installed: the install's choice, a usage error (2)
                _usage_out(app, ctx.meta.get(_ARGS, []), gone)
                raise _WrappedUsageError(gone, ctx.obj if isinstance(ctx.obj, App) else None) from err
            if app.traceback or os.environ.get("SMGSHM_DEBUG") == "1":
                raise
            what = f"{type(err).__name__}: {err}"
            _failed(app, "internal", what, "rerun with --traceback", npd=f"internal error: {what}")
            _say_err(app, "Error: ", f"internal error: {what}", "bold red")
            _say_err(app, "hint: ", "this is a bug in smgshm; rerun with --traceback and report it", "cyan")
            raise click.exceptions.Exit(ExitCode.INTERNAL) from err


_ARGS = "smgshm.args"


def _missing_extra(ctx: click.Context, err: Exception) -> click.UsageError | None:
    """A module of an optional extra that is not installed, met where no command's guard said so first
    (smgshm/cli/extras.py): the usage error naming the extra; None for any other failure."""
    if not isinstance(err, ModuleNotFoundError):
        return None
    from smgshm.cli.extras import MissingExtraError, extra_for

    extra = extra_for(err.name)
    return None if extra is None else MissingExtraError(f"smgshm {ctx.invoked_subcommand or ''}".rstrip(), extra)


def _app(ctx: click.Context) -> App:
    """The invocation's App; a bare one (no flag set) when the failure came before the root callback made it."""
    return ctx.obj if isinstance(ctx.obj, App) else App()


def _asked(args: list[str], flag: str) -> bool:
    """Whether ``flag`` is on the command line (before any ``--``): the mode asked for, when a usage error
    stops the parse before the flag was taken."""
    return flag in args[: args.index("--")] if "--" in args else flag in args


def _usage_out(app: App | None, args: list[str], err: click.UsageError) -> None:
    """A usage error in the one output channel of the mode asked for: under --npd one NPD line (Unknown, 2: a
    usage error's code too), which --npd with --json is as well (one of the two: the plugin's); under --json
    one error document. The mode is the App's, or read from ``args`` when the parse stopped before it was."""
    app = app or App()
    app.command = app.command or next((a for a in args if a in _COMMANDS), "")  # "": the root's own
    if app.npd or _asked(args, "--npd"):
        from smgshm.cli.npd import NpdStatus, npd_emit

        app.npd = True
        with _in(app):
            npd_emit(NpdStatus.UNKNOWN, f"usage error: {err.format_message()}")
    elif app.json or _asked(args, "--json"):
        jsonout.write_error(app, "usage", err.format_message(), None)


@contextmanager
def _in(app: App) -> Iterator[None]:
    """``app`` as the current context's object (npd_emit finds it there to say its line once)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.find_object(App) is app:
        yield
        return
    with click.Context(cli, obj=app).scope(cleanup=False):
        yield


def _failed(app: App, kind: str, message: str, hint: str | None, *, npd: str) -> None:
    """A failure in the one output channel of the invocation's mode: under --npd NPD's one line (``npd``;
    Unknown, and the run ends with 2), else under --json the error document (``kind``, ``message``, ``hint``);
    nothing when that one output was written already."""
    if app.npd:
        _npd_unknown(app, npd)
    if app.json and app.close_doc is not None:  # a document under way (gc's streamed listing): closed, not doubled
        close, app.close_doc = app.close_doc, None
        close(f"{kind}: {message}")
    elif app.json:
        jsonout.write_error(app, kind, message, hint)


def _npd_unknown(app: App, message: str) -> None:
    """In node-problem-detector mode a failure of smgshm's own is NPD's Unknown (2), said in one line."""
    from smgshm.cli.npd import NpdStatus, npd_emit

    with _in(app):
        raise click.exceptions.Exit(npd_emit(NpdStatus.UNKNOWN, message))


def man_path() -> str:
    """The generated pages ship inside the package (editable and wheel installs alike), as man1/ under this.
    (os.path, not pathlib: importing pathlib was a tenth of a gc run's start-up.)"""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "man")


def _print_man_path(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(man_path())
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
      smgshm doctor                   # every check, each failure with its fix
      smgshm e2e                      # SMG's gateway per mode: which path?
      smgshm serve                    # the reference receiver, 127.0.0.1:50051
      smgshm ns                       # this host's shm_namespace_id
      smgshm ns compare ID_A ID_B     # do two ids share /dev/shm?
      smgshm probe 127.0.0.1:50051    # does this worker share /dev/shm?
      smgshm send 127.0.0.1:50051     # verified tensors through /dev/shm
      smgshm bench                    # inline vs SHM by size: shm_min_bytes
      smgshm gc                       # what leaked?
      smgshm watch                    # SHM traffic live: in flight, orphans
      smgshm preflight -- smg launch  # reclaim leftovers, then start SMG
      smgshm completion bash          # the shell completion script
    """
    # gRPC's C core logs its own copy of errors we already report in one line (e.g. a busy
    # port); grpc is imported lazily, so this takes effect. An operator's setting wins.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from smgshm.core.host import usercache

    usercache.new_run()  # one bounded wait for a held lock per invocation (usercache.LockWaits)
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
    cmd.context_class = _Context  # its --help keeps words whole, as the root's does
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
    except KeyboardInterrupt as stop:  # outside a command's run (parsing): the signal's code all the same
        sys.exit(signals.interrupt_code(stop))
    except click.exceptions.Exit as end:  # only _closed_stdout_exits raises it out here
        sys.exit(end.exit_code)
    except SystemExit as end:
        if end.code in (0, None) and (code := signals.swallowed_code()) is not None:
            end = SystemExit(code)  # a signal whose exception a __del__ swallowed: never a clean 0
        if end.code in _INTERRUPTED:
            # Stopped by a signal, its clean-up done and said: leave now. Interpreter exit would join every
            # worker thread still blocked in a peer's call that will not answer (a probe's connect), for up
            # to its whole timeout after the operator asked it to stop.
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(int(end.code))
        raise


_INTERRUPTED = {ExitCode.INTERRUPTED, ExitCode.TERMINATED, ExitCode.HANGUP}


__all__ = ["App", "CliError", "cli", "main"]
