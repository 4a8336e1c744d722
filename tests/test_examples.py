"""Every documented example parses: each `smgshm ...` line of every --help text, man page and the README.

Examples are parsed by the real click definitions (make_context down the command
chain, so option types convert and root options after the subcommand are accepted)
without running anything: no servers, no waits. A usage error (exit 2) fails.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
_CUT = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}


def _words(line: str) -> list[str] | None:
    """The argv after ``smgshm`` of one shell line, up to a pipe or redirection; None if not ours."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        words = list(lex)
    except ValueError:
        return None
    for i, w in enumerate(words):
        if w in _CUT:
            words = words[:i]
            break
    if not words or words[0] != "smgshm":
        return None
    # A shell expansion ("$(docker inspect ...)", "$SMG_API_KEY") stands for a value we
    # cannot know here; "1" is valid for every type it stands in for (a pid, a key, an id).
    return ["1" if "$" in w else w for w in words[1:]]


def _help_examples() -> list[str]:
    from smgshm.cli import cli

    out = []

    def walk(cmd: click.Command) -> None:
        _, sep, block = (cmd.help or "").partition("Examples:")
        if sep:
            out.extend(ln.strip() for ln in block.splitlines() if ln.strip().startswith("smgshm"))
        if isinstance(cmd, click.Group):
            for sub in cmd.commands.values():
                walk(sub)

    walk(cli)
    return out


def _man_examples() -> list[str]:
    out = []
    unescape = {"\\-": "-", "\\(aq": "'", "\\(ga": "`", "\\(ti": "~", "\\(ha": "^", "\\e": "\\", "\\&": ""}
    for page in sorted((ROOT / "smgshm" / "man" / "man1").glob("*.1")):
        _, sep, rest = page.read_text().partition(".SH EXAMPLES\n")
        if sep:
            text = rest.split("\n.SH ", 1)[0]
            for esc, plain in unescape.items():
                text = text.replace(esc, plain)
            text = text.replace(" \\\n    ", " ")  # a long example goes on over continuation lines
            out += [ln for ln in text.splitlines() if ln.startswith("smgshm")]
    return out


def _readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        out += [ln.strip() for ln in block.splitlines() if ln.strip().startswith("smgshm ")]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    out += [m.replace("\\|", "|") for m in re.findall(r"`(smgshm [^`]+)`", prose)]
    return out


EXAMPLES = sorted({*_help_examples(), *_man_examples(), *_readme_examples()})


def parse(argv: list[str]) -> click.Context:
    """Parse ``smgshm argv`` down to the leaf command as click.main would, without invoking it."""
    from smgshm.cli import cli

    cmd: click.Command = cli
    ctx = cli.make_context("smgshm", list(argv))
    while isinstance(cmd, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            break
        name, sub, args = cmd.resolve_command(ctx, rest)
        assert sub is not None
        assert name is not None
        ctx = sub.make_context(name, args, parent=ctx)
        cmd = sub
    return ctx


def test_there_are_examples_from_each_source() -> None:
    assert len(_help_examples()) >= 20
    assert _man_examples()
    assert _readme_examples()


@pytest.mark.parametrize("line", EXAMPLES)
def test_example_parses(line: str) -> None:
    argv = _words(line)
    if argv is None:
        pytest.skip("not an smgshm command line")
    try:
        parse(argv)
    except click.exceptions.Exit:  # --help, --version
        pass
    except click.UsageError as err:
        pytest.fail(f"{line!r}: exit 2: {err.format_message()}")


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "--check", "--json"],
        ["probe", "127.0.0.1:1", "--no-color"],
        ["doctor", "--from-gateway", "http://127.0.0.1:1", "--json"],
        ["ns", "compare", "A", "B", "-q"],
        ["bench", "--min-shm-speedup", "4", "--json", "--traceback"],
    ],
)
def test_root_options_after_the_subcommand(argv: list[str]) -> None:
    parse(argv)


def test_root_options_after_the_subcommand_take_effect() -> None:
    from tests.conftest import run_cli

    doc = run_cli("ns", "compare", "A", "B", "--json", exit=6).json
    assert doc["command"] == "ns compare"
    assert doc["result"]["sharing"] == "undetermined"
    assert run_cli("ns", "compare", "A", "B", "-q", exit=6).stderr == ""


def _root_examples() -> list[list[str]]:
    from smgshm.cli import cli

    block = (cli.help or "").partition("Examples:")[2]
    lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("smgshm")]
    out = [_words(ln) for ln in lines]
    assert all(w is not None for w in out), lines
    return [w for w in out if w is not None]


def _leaves() -> set[str]:
    """Every command a person can run: each subcommand, and a group that runs alone (``ns``)."""
    from smgshm.cli import cli

    out: set[str] = set()

    def walk(cmd: click.Command, path: str) -> None:
        if not isinstance(cmd, click.Group) or cmd.invoke_without_command:
            out.add(path)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())

    for name, cmd in cli.commands.items():  # type: ignore[attr-defined]
        walk(cmd, name)
    return out


def test_root_help_shows_every_command_once() -> None:
    """The root --help's examples: each parses, and together they name every command exactly once."""
    shown = [parse(argv).command_path.removeprefix("smgshm ") for argv in _root_examples()]
    assert sorted(shown) == sorted(_leaves()), shown


# The root examples cheap and safe to run here (read-only, no server, no wait): run for real.
CHEAP = {"ns": 0, "gc": 0, "completion bash": 0, "ns compare ID_A ID_B": 6}


@pytest.mark.parametrize("argv", _root_examples(), ids=" ".join)
def test_cheap_root_examples_run(argv: list[str]) -> None:
    line = " ".join(argv)
    if line not in CHEAP:
        pytest.skip("needs a worker, a gateway or a long run: parsed above")
    from tests.conftest import run_cli

    res = run_cli(*argv, exit=CHEAP[line])
    assert res.stdout.strip()
