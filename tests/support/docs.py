"""Shared by the tests of docs (moved out of tests/test_docs.py)."""

from __future__ import annotations

from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]


MAN1 = ROOT / "smgshm" / "man" / "man1"


PAGES = sorted(MAN1.glob("*.1"))


def _page_command(page: Path) -> click.Command:
    from smgshm.cli import cli

    cmd: click.Command = cli
    for word in page.stem.split("-")[1:]:
        assert isinstance(cmd, click.Group)
        sub = cmd.commands.get(word)
        assert sub is not None, page.name
        cmd = sub
    return cmd
