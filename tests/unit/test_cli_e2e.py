"""`smgshm e2e`, in-process: its options, its refusals and the parts of its verdict that need no gateway."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli


def test_a_gateway_pid_of_no_process_is_a_usage_error() -> None:
    """No such process is a mistyped argument (exit 2), not an unreachable gateway (4); more in
    test_cli_doctor.py::test_a_gateway_pid_that_is_no_gateway_is_a_usage_error."""
    res = run_cli("--json", "e2e", "--gateway-pid", str(2**22 + 7), exit=2)  # above pid_max's default
    assert res.json["error"]["kind"] == "usage"
    assert run_cli("e2e", "--running", "--gateway", "http://127.0.0.1:1", exit=2).stderr


def test_smg_missing_exits_5_naming_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    res = run_cli("e2e", exit=5)
    assert "pip install 'smgshm[gateway]'" in res.stderr


def test_gateway_log_options_are_for_the_embedded_default_only() -> None:
    res = run_cli("e2e", "--gateway", "http://127.0.0.1:9", "--keep-logs", exit=2)
    assert "--keep-logs" in res.stderr


def test_sizes_with_running_is_refused_by_name_before_any_gateway_is_looked_for() -> None:
    """--running --sizes is a usage error naming --running (it once fell to the --gateway refusal, after a
    /proc scan for the running gateway, leaving its own refusal unreachable)."""
    for args in (("--running",), ("--gateway-pid", "1")):
        res = run_cli("e2e", *args, "--sizes", "224", exit=2)
        assert "it takes no --running" in res.stderr, res.stderr
