"""Shared by the tests of running_gateways (moved out of tests/test_running_gateways.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.timeout(180)


def doctor_doc(*args: str) -> dict[str, Any]:
    """``smgshm --json doctor`` on a scratch shm dir; any verdict (other gateways here may fail it). A test
    names its gateway (--gateway-pid): doctor's bounded reading of every gateway's log here would
    otherwise be spent on other tests' gateways first."""
    from smgshm.cli import cli

    res = CliRunner().invoke(cli, ["--json", "doctor", *args], catch_exceptions=False)
    assert res.exit_code in (0, 3, 4, 5, 6), res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["command"] == "doctor"
    return doc


def mine(doc: dict[str, Any], pid: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(host.gateways entry, {check name: check}) for gateway ``pid``."""
    found = [g for g in doc["result"]["host"]["gateways"] if g["gateway"] and g["gateway"]["pid"] == pid]
    assert len(found) == 1, [g["gateway"] and g["gateway"]["pid"] for g in doc["result"]["host"]["gateways"]]
    checks = {c["name"]: c for c in doc["result"]["checks"] if c["name"].startswith(f"gateway {pid}")}
    return found[0], checks
