"""Every documented example parses: each `smgshm ...` line of every --help text, man page and the README.

Examples are parsed by the real click definitions (make_context down the command
chain, so option types convert and root options after the subcommand are accepted)
without running anything: no servers, no waits. A usage error (exit 2) fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from tests.support.examples import _leaves, _root_examples, _words, parse

ROOT = Path(__file__).resolve().parents[2]


def _help_examples() -> list[str]:
    from smgshm.cli import cli

    out = []

    def walk(cmd: click.Command) -> None:
        _, sep, block = (cmd.help or "").partition("Examples:")
        if sep:  # a long example goes on over continuation lines: one command line
            block = re.sub(r"\\\n\s*", " ", block)
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


def test_root_help_shows_every_command_once() -> None:
    """The root --help's examples: each parses, and together they name every command exactly once."""
    shown = [parse(argv).command_path.removeprefix("smgshm ") for argv in _root_examples()]
    assert sorted(shown) == sorted(_leaves()), shown
