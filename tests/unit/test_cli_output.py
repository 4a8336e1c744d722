"""Shared output helpers (cli/fmt.py): prose wraps to the terminal, strangers' text is escaped."""

from __future__ import annotations

import sys

import pytest

from smgshm.cli import fmt
from smgshm.cli.app import App

LONG = "share one tmpfs: --ipc=host, --ipc=container:<gateway>, or an emptyDir {medium: Memory} " * 3


def test_hints_wrap_at_80_columns_with_a_hanging_indent(
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


# A path longer than a line of 80, and flags whose wrap a naive wrapper would cut at a hyphen.
DEEP = "/proc/4242/root/var/lib/kubelet/pods/0f3c2a9e-1b7d-4c1e-9a55-7f0e3b2d9c11/volumes/kubernetes.io~empty-dir/dshm"
WARNED = f"cannot read {DEEP}: permission denied; rerun as root or pass --node-root /host --include-stale " * 2


def _wrapped_whole(err: str, head: str, indent: int) -> list[str]:
    lines = err.splitlines()
    assert len(lines) > 2, err
    assert lines[0].startswith(head), err
    assert all(len(ln) <= 80 for ln in lines if not ln.strip().startswith(DEEP)), err  # only the path is wider
    assert all(ln.startswith(" " * indent) and not ln.endswith(" ") for ln in lines[1:]), err
    assert f"{' ' * indent}{DEEP}:" in lines, "a path longer than the line has a line of its own, whole"
    words = err.split()
    for word in ("--node-root", "--include-stale", DEEP + ":"):
        assert words.count(word) == 2, (word, err)  # every flag and path whole, none cut or lost
    return lines


def test_a_long_warning_wraps_at_word_boundaries_and_never_cuts_a_path_or_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    app = App()
    app.warn(WARNED)
    _wrapped_whole(capsys.readouterr().err, "warning: ", 9)
    assert app.warnings == [WARNED]  # JSON keeps the message whole


def test_a_long_error_and_its_hint_wrap_as_prose(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from smgshm.cli import CliError
    from smgshm.core.errors import HostError

    monkeypatch.setenv("COLUMNS", "80")
    err = HostError(WARNED.strip(), hint=f"free space in {DEEP} --node-root /host --include-stale")
    for app in (App(), None):  # the invocation's console, or none yet (an error before the root callback)
        CliError(err, app).show()
        out = capsys.readouterr().err
        hint_at = next(i for i, ln in enumerate(out.splitlines()) if ln.startswith("hint: "))
        lines = out.splitlines()
        _wrapped_whole("\n".join(lines[:hint_at]), "Error: ", 7)
        hint = lines[hint_at:]
        assert all(len(ln) <= 80 for ln in hint if ln.strip() != DEEP), out
        assert f"{' ' * 6}{DEEP}" in hint, out


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


def test_a_long_usage_error_wraps_as_prose_after_clicks_usage_lines() -> None:
    from tests.conftest import run_cli

    for args in (
        ("e2e", "--gateway", "http://127.0.0.1:9", "--keep-logs", "--mode", "shm"),  # the command's own
        ("--no-such-root-option-" + "x" * 70,),  # click's, while parsing the root
    ):
        err = run_cli(*args, exit=2, env={"COLUMNS": "80"}).stderr
        lines = err.splitlines()
        assert lines[0].startswith("Usage: "), err
        at = next(i for i, ln in enumerate(lines) if ln.startswith("Error: "))
        assert all(len(ln) <= 80 for ln in lines if " " in ln.strip()), err  # only one over-long word may be wider
        assert all(ln.startswith(" " * 7) for ln in lines[at + 1 :]), err
        assert len(lines) > at + 1, f"the error wrapped: {err}"
