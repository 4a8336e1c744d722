"""Shared by the tests of examples (moved out of tests/test_examples.py)."""

from __future__ import annotations

import shlex

import click

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
