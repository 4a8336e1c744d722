"""Man pages match regeneration; every command has help with examples and a page."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent


def _generator():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("man_generate", ROOT / "man" / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_man_pages_are_fresh(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path)
    assert {p.name for p in written} == {p.name for p in (ROOT / "man").glob("*.1")}
    for p in written:
        assert p.read_text() == (ROOT / "man" / p.name).read_text(), (
            f"man/{p.name} is stale: run python man/generate.py"
        )
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
    assert (ROOT / "man" / f"{('smgshm ' + path).strip().replace(' ', '-')}.1").exists()


def test_man_names_are_whole_summaries() -> None:
    for page in (ROOT / "man").glob("*.1"):
        name = page.read_text().split(".SH NAME\n", 1)[1].splitlines()[0]
        assert not name.endswith("..."), f"{page.name}: NAME cut short: {name}"


def test_readme_commands_table_lists_every_command() -> None:
    """One unbroken table: a blank line inside it would cut the rows after it off the table."""
    from smgshm.cli import cli

    text = (ROOT / "README.md").read_text()
    table = text.split("| command | what it answers |", 1)[1].split("\n\n", 1)[0]
    for name in cli.commands:  # type: ignore[attr-defined]
        assert f"| `smgshm {name}" in table, f"README's commands table has no row for {name}"


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
                current = ROOT / "tests" / Path(path).name
                assert current.exists(), f"README names {path}, which does not exist"
            if func:
                assert current is not None, row
                assert f"def {func[2:]}(" in current.read_text(), f"README names {current.name}{func}: no such test"
                named += 1
    assert named >= 20
