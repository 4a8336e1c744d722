"""Shared output helpers (cli/fmt.py): prose wraps to the terminal, strangers' text is escaped."""

from __future__ import annotations

import sys

import pytest


@pytest.mark.slow
def test_probe_and_its_hints_fit_80_columns(receiver: object) -> None:
    from tests.conftest import run_cli

    dead = "127.0.0.1:1"
    res = run_cli(
        "probe",
        "--need",
        "1000000GiB",
        receiver.address,
        dead,
        exit=4,  # type: ignore[attr-defined]
        env={"COLUMNS": "80"},
    )
    lines = res.stdout.splitlines() + res.stderr.splitlines()  # warnings and errors wrap too
    assert len(lines) > 6
    assert max(len(ln) for ln in lines) <= 80, "\n".join(ln for ln in lines if len(ln) > 80)


def test_a_command_wider_than_the_terminal_continues_with_a_backslash_and_pastes_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import subprocess

    from rich.console import Console

    from smgshm.cli.fmt import command

    argv = [
        "smgshm",
        "gc",
        "--shm-dir",
        "/tmp/a dir with spaces; $(rm -rf x)/" + "d" * 20,
        "--delete",
        "--include-stale",
        "--stale-after",
        "600s",
        "--min-age",
        "600s",
        "it's",
    ]
    command(Console(width=80, file=sys.stdout), argv, 12)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) > 1
    assert all(len(ln) <= 80 and ln == ln.rstrip() for ln in lines), out
    assert all(ln.endswith(" \\") for ln in lines[:-1])
    # What a shell reads from the pasted lines is the very argv.
    said = subprocess.run(
        ["bash", "-c", 'printf "%s\\n" ' + out.replace("smgshm", "", 1)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert said == argv[1:]


def test_probes_table_says_unknown_figures_never_a_dash() -> None:
    from tests.conftest import run_cli

    res = run_cli("probe", "127.0.0.1:1", "127.0.0.1:2", exit=4, env={"COLUMNS": "80"})
    rows = [ln.split() for ln in res.stdout.splitlines() if ln.startswith("127.0.0.1:") and ln.endswith("unknown")]
    assert rows == [[f"127.0.0.1:{n}", "unknown", "unknown", "unreachable", "unknown"] for n in (1, 2)], res.stdout
