"""No short flag means two things: across every command, each one spells one long option."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import click
import pytest
from click.shell_completion import BashComplete

from smgshm.cli import cli
from tests.conftest import run_cli
from tests.support.examples import parse


def _spellings() -> Iterator[tuple[str, list[str]]]:
    """(command path, spellings of one option) for every option of every command: the root's, the
    hidden copies of root flags, and the help option (its names come from the context settings)."""

    def walk(cmd: click.Command, ctx: click.Context) -> Iterator[tuple[str, list[str]]]:
        yield ctx.command_path, list(ctx.help_option_names)
        for p in cmd.params:
            if isinstance(p, click.Option):
                yield ctx.command_path, [*p.opts, *p.secondary_opts]
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings))

    yield from walk(cli, click.Context(cli, info_name="smgshm", **cli.context_settings))


def test_each_short_flag_spells_one_long_option_everywhere() -> None:
    meanings: dict[str, dict[tuple[str, ...], list[str]]] = defaultdict(lambda: defaultdict(list))
    for path, spellings in _spellings():
        longs = tuple(sorted(s for s in spellings if s.startswith("--")))
        for short in (s for s in spellings if not s.startswith("--")):
            assert longs, f"{path}: {short} has no long form"
            meanings[short][longs].append(path)
    clashes = {short: dict(by) for short, by in meanings.items() if len(by) > 1}
    assert not clashes, f"short flags with two meanings: {clashes}"
    assert {"-h", "-q", "-n", "-V", "-w"} <= set(meanings), sorted(meanings)  # the walk sees them all


@pytest.mark.parametrize(
    ("argv", "param", "value"),
    [(["send", "--count", "3", "127.0.0.1:1"], "count", 3), (["bench", "--iterations", "4"], "iterations", 4)],
)
def test_renamed_options_still_parse_and_are_shown_nowhere(argv: list[str], param: str, value: int) -> None:
    """-n's long name is --requests everywhere now; scripts that spelt send's --count or bench's
    --iterations go on working, and nothing (help, man page, completion) teaches the old names."""
    assert parse(argv).params[param] == value
    assert parse([argv[0], "-n", str(value), *argv[3:]]).params[param] == value
    old = argv[1]
    ctx = click.Context(cli, info_name="smgshm", **cli.context_settings)
    cmd = cli.get_command(ctx, argv[0])
    assert cmd is not None
    sub = click.Context(cmd, info_name=argv[0], parent=ctx)
    specs = [rec[0] for p in cmd.get_params(sub) if (rec := p.get_help_record(sub))]
    assert any("--requests" in spec for spec in specs)
    assert not any(old in spec for spec in specs)
    offered = BashComplete(cli, {}, "smgshm", "_SMGSHM_COMPLETE").get_completions([argv[0]], "--")
    assert "--requests" in {c.value for c in offered}
    assert old not in {c.value for c in offered}


def test_bench_has_no_w_any_more() -> None:
    """-w is doctor's --worker; bench's warm-up is --warmup only (as e2e's)."""
    assert "No such option '-w'" in run_cli("bench", "-w", "0", exit=2).stderr
