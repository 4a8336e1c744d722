"""Shared output helpers (cli/fmt.py): prose wraps to the terminal, strangers' text is escaped."""

from __future__ import annotations

import sys

import pytest

from smgshm.cli import fmt
from smgshm.cli.app import App

LONG = "share one tmpfs: --ipc=host, --ipc=container:<gateway>, or an emptyDir {medium: Memory} " * 3


def test_hints_wrap_at_80_columns_with_a_hanging_indent_warnings_stay_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    app = App()
    fmt.hint(app, LONG)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) > 3
    assert max(len(ln) for ln in lines) <= 80
    assert lines[0].startswith("hint: ")
    assert lines[1].startswith(" " * 6)
    assert " ".join(err.split()).count("emptyDir {medium: Memory}") == 3  # nothing lost in the wrap
    app.warn(LONG)  # warnings (and errors) are one grep-able line each
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_word_longer_than_the_line_is_never_cut(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    name = "smg-tokenspeed-" + "9" * 120
    fmt.hint(App(), f"remove {name} by hand")
    assert name in capsys.readouterr().err.split()


def test_warnings_show_control_characters_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    app = App()
    app.warn("leftover smg-x\x1b[2J\nfix: rm -rf ~\udcff")
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "\\x1b[2J\\nfix: rm -rf ~\\xff" in err
    assert err.count("\n") == 1
    assert app.warnings == ["leftover smg-x\x1b[2J\nfix: rm -rf ~\udcff"]  # JSON keeps the raw text


def test_lossless_round_trips_undecodable_bytes() -> None:
    import os

    raw = b"smg-\xff\x1b\n"
    assert bytes.fromhex(fmt.lossless(os.fsdecode(raw))) == raw


def test_prose_keeps_the_spaces_between_words(capsys: pytest.CaptureFixture[str]) -> None:
    fmt.prose(App().console, "[ok  ] shm dir:  two")
    assert capsys.readouterr().out == "[ok  ] shm dir:  two\n"


def test_a_table_too_wide_becomes_records_never_cut_cells(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    from smgshm.cli.fmt import fit_table

    def table() -> Table:
        t = Table(box=None, pad_edge=False)
        for col in ("size", "inline", "shm", "rate"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_row("256.0 MiB", "687.65 ms", "55.34 ms", "1.2 GiB/s")
        t.add_row("4.0 KiB", "0.80 ms", "1.06 ms", "3.7 MiB/s")
        return t

    fit_table(Console(width=80, file=sys.stdout), table())
    wide = capsys.readouterr().out.splitlines()
    assert wide[1].split() == ["256.0", "MiB", "687.65", "ms", "55.34", "ms", "1.2", "GiB/s"], "a table where it fits"
    assert all(ln == ln.rstrip() for ln in wide), "no padded cell at a line's end"
    fit_table(Console(width=40, file=sys.stdout), table())
    narrow = capsys.readouterr().out.splitlines()
    assert narrow[:3] == ["256.0 MiB", "  inline 687.65 ms; shm 55.34 ms", "  rate 1.2 GiB/s"], narrow
    assert all(len(ln) <= 40 and ln == ln.rstrip() for ln in narrow), narrow
    assert "…" not in "".join(narrow)
    assert " ".join(" ".join(narrow).split()).count("1.2 GiB/s") == 1, "every cell, whole"
