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

from tests.support.examples import _root_examples

ROOT = Path(__file__).resolve().parents[2]


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
