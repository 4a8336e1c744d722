"""Man pages match regeneration, pass mandoc's lint and read whole at 80 columns, and are
found after an install; every command has help with examples and a page."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from tests.conftest import run_cli
from tests.support.docs import MAN1, PAGES, ROOT, _page_command
from tests.support.scripts import load_script


def _generator():  # type: ignore[no-untyped-def]
    return load_script("man_generate", ROOT / "man" / "generate.py")


def test_man_pages_are_fresh(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path)
    assert {p.name for p in written} == {p.name for p in PAGES}
    for p in written:
        assert p.read_text() == (MAN1 / p.name).read_text(), f"{p.name} is stale: run python man/generate.py"
        assert ".SH EXIT STATUS" in p.read_text()


def _commands() -> list[tuple[str, click.Command]]:
    from smgshm.cli import cli

    out: list[tuple[str, click.Command]] = [("", cli)]
    for name, cmd in cli.commands.items():  # type: ignore[attr-defined]
        out.append((name, cmd))
        if isinstance(cmd, click.Group):
            out += [(f"{name} {s}", c) for s, c in cmd.commands.items()]
    return out


@pytest.mark.parametrize(("path", "cmd"), _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_help_has_summary_and_examples(path: str, cmd: click.Command) -> None:
    out = run_cli(*path.split(), "--help").stdout
    assert "Examples:" in out
    assert (cmd.help or "").splitlines()[0].endswith("."), "the first help line is a one-line summary"
    assert (MAN1 / f"{('smgshm ' + path).strip().replace(' ', '-')}.1").exists()


@pytest.mark.parametrize(("path", "cmd"), _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_help_fits_80_columns_with_every_word_whole(path: str, cmd: click.Command) -> None:
    """At 80 columns every line of --help fits, examples (kept verbatim by click's \\b) included, and no
    word, flag or name of the help text or of an option's help is cut (click's wrap broke "non-regular"
    at its hyphen)."""
    from click.testing import CliRunner

    from smgshm.cli import cli

    res = CliRunner().invoke(cli, [*path.split(), "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "Examples:" in out
    for line in out.splitlines():
        assert len(line) <= 80, f"{len(line)} columns: {line}"
    shown = set(out.split())
    ctx = click.Context(cmd, info_name=path or "smgshm")
    source = (cmd.help or "").replace("\b", "").split()
    for param in cmd.params:
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is not None:
            source += record[0].split() + record[1].split()
    cut = [word for word in source if word not in shown]
    assert not cut, f"words cut or lost at 80 columns: {cut}"


def test_man_names_are_whole_summaries() -> None:
    for page in PAGES:
        name = page.read_text().split(".SH NAME\n", 1)[1].splitlines()[0]
        assert not name.endswith("..."), f"{page.name}: NAME cut short: {name}"


def test_readme_commands_table_lists_every_command() -> None:
    """One unbroken table: a blank line inside it would cut the rows after it off the table."""
    from smgshm.cli import cli

    text = (ROOT / "README.md").read_text()
    table = text.split("| command | what it answers |", 1)[1].split("\n\n", 1)[0]
    for name in cli.commands:  # type: ignore[attr-defined]
        assert f"| `smgshm {name}" in table, f"README's commands table has no row for {name}"


def test_readme_exit_codes_say_how_watch_ends_on_ctrl_c_and_sigterm() -> None:
    """watch exits 0 (3 with --check and an orphan) after SIGINT or SIGTERM, not 130 or 143
    (tests/integration/test_cli_watch.py::test_ctrl_c_and_sigterm_print_the_summary): the table says so."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Exit codes", 1)[1].split("\n\n", 2)[1]
    rows = {ln.split("|")[1].strip(): ln for ln in table.splitlines() if ln.startswith("| 1")}
    for code in ("130", "143"):
        assert "not `watch`" in rows[code].lower(), rows[code]
        assert " 0 " in rows[code].split("`watch`", 1)[1], rows[code]


def test_readme_guarantees_name_tests_that_exist() -> None:
    """Each row of "What smgshm guarantees" names test files and functions that are really there."""
    import re

    text = (ROOT / "README.md").read_text()
    table = text.split("## What smgshm guarantees", 1)[1].split("\n## ", 1)[0]
    named = 0
    for row in (ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln):
        current = None
        for ref in re.findall(r"`([\w/]*test_\w+\.py)?(::\w+)?`", row.rsplit("|", 2)[-2]):
            path, func = ref
            if path:
                current = ROOT / path
                assert current.exists(), f"README names {path}, which does not exist"
            if func:
                assert current is not None, row
                assert f"def {func[2:]}(" in current.read_text(), f"README names {current.name}{func}: no such test"
                named += 1
    assert named >= 20


# --- the pages as man(1) and mandoc show them -------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_has_see_also_naming_the_others(page: Path) -> None:
    section = page.read_text().split(".SH SEE ALSO\n", 1)[1].split("\n.SH ", 1)[0]
    named = set(re.findall(r"^\.BR (\S+) \(1\),?$", section, re.M))
    others = {p.stem.replace("-", "\\-") for p in PAGES} - {page.stem.replace("-", "\\-")}
    assert named == others
    assert page.stem == "smgshm" or "smgshm" in named


def _help_commands(cmd: click.Command) -> list[str]:
    """The example commands of a help text (comments and `#   ` snippets left out), continuations joined."""
    _, sep, block = (cmd.help or "").partition("Examples:")
    rows = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")] if sep else []
    out: list[str] = []
    for row in rows:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + row
        else:
            out.append(row)
    return [" ".join(c.partition("  #")[0].split()) for c in out]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_man_examples_are_the_help_examples_whole(page: Path) -> None:
    """Each example command of --help is in the page as code, once its continuation lines are joined."""
    section = page.read_text().partition(".SH EXAMPLES\n")[2].split("\n.SH ", 1)[0]
    unescape = {"\\-": "-", "\\(aq": "'", "\\(ga": "`", "\\(ti": "~", "\\(ha": "^", "\\e": "\\", "\\&": ""}
    for esc, plain in unescape.items():
        section = section.replace(esc, plain)
    blocks = re.findall(r"^\.nf\n(.*?)\n\.fi$", section, re.M | re.S)
    commands = [" ".join(b.replace(" \\\n    ", " ").split()) for b in blocks]
    wanted = _help_commands(_page_command(page))
    assert [c for c in commands if c in wanted] == wanted  # snippets (a crontab line) aside
