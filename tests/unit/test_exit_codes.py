"""One scenario per documented exit code, through the real root group."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from smgshm.cli import RootGroup, cli
from smgshm.cli.app import App
from smgshm.cli.exitcodes import DESCRIPTIONS, ExitCode, for_outcome
from smgshm.core.errors import HostError, SegmentError, TransportError
from smgshm.core.outcomes import SEVERITY, Outcome
from tests.conftest import run_cli

LOCAL_BOOT = "d05353d0-0000-4000-8000-000000000000"


def _group_raising(exc: BaseException) -> click.Group:
    """A root group like smgshm's whose only command raises ``exc``, to drive the mapping."""

    @click.group(cls=RootGroup)
    @click.option("--json", "json_", is_flag=True)
    @click.pass_context
    def root(ctx: click.Context, json_: bool) -> None:
        ctx.obj = App(json=json_, command="boom")

    @root.command()
    def boom() -> None:
        raise exc

    return root


def test_every_code_is_described() -> None:
    assert set(DESCRIPTIONS) == set(ExitCode)


def test_every_outcome_has_a_code_and_a_rank() -> None:
    """The core's outcomes map onto the documented codes; doctor's order is 4, 5, 3, 6, 1, then 0."""
    assert sorted(SEVERITY, key=str) == sorted(Outcome, key=str)
    assert [for_outcome(o) for o in SEVERITY] == [4, 5, 3, 6, 1, 0]


def test_0_success() -> None:
    run_cli("ns", exit=0)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (SegmentError("segment is shorter than its handle", code="short", path="/dev/shm/x"), 1),
        (TransportError("endpoint unreachable", endpoint="127.0.0.1:1"), 4),
        (HostError("shm dir is full", path="/dev/shm", hint="free space"), 5),
        (RuntimeError("a bug"), 70),
        (KeyboardInterrupt(), 130),
    ],
)
def test_error_mapping(exc: BaseException, code: int) -> None:
    res = CliRunner().invoke(_group_raising(exc), ["boom"])
    assert res.exit_code == code, res.output
    if code in (1, 4, 5):
        first = res.stderr.splitlines()[0]
        assert first.startswith("Error: ")
        assert str(exc) in first
    if code == 5:
        assert "hint: free space" in res.stderr
    if code == 70:
        assert "--traceback" in res.stderr


def test_70_reraises_with_traceback_env() -> None:
    res = CliRunner().invoke(_group_raising(RuntimeError("a bug")), ["boom"], env={"SMGSHM_DEBUG": "1"})
    assert isinstance(res.exception, RuntimeError)


def test_error_json_document() -> None:
    res = CliRunner().invoke(_group_raising(HostError("shm dir is full", hint="h")), ["--json", "boom"])
    import json

    doc = json.loads(res.stdout)
    assert doc["ok"] is False
    assert doc["error"] == {"kind": "host", "message": "shm dir is full", "hint": "h"}


def test_2_usage() -> None:
    res = run_cli("ns", "--pid", "notanumber", exit=2)
    assert "Invalid value" in res.stderr


def test_3_check_failed() -> None:
    run_cli("ns", "compare", f"{LOCAL_BOOT}:27", f"{LOCAL_BOOT}:28", exit=3)


def test_5_host_error_real() -> None:
    res = run_cli("ns", "--shm-dir", "/nonexistent-smgshm-dir", exit=5)
    assert "shm dir does not exist" in res.stderr


def test_6_undetermined() -> None:
    run_cli("ns", "compare", "", f"{LOCAL_BOOT}:27", exit=6)


def test_unknown_command_is_usage() -> None:
    res = CliRunner().invoke(cli, ["nosuchcommand"])
    assert res.exit_code == 2
