"""Shared by the tests of causes (moved out of tests/test_causes.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.gateway.process import RunningGateway
from tests.conftest import Children, run_cli, wait_for

needs_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)


def _spawn_json(children: Children, argv: list[str]) -> dict[str, Any]:
    """The first JSON line of a child (a serve's ready document, or a command's whole output)."""
    p = children.spawn(argv)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, p.stderr.read() if p.stderr else "exited"
    doc: dict[str, Any] = json.loads(line)
    return doc


def _e2e_run(gw: RunningGateway, *args: str, exit: int) -> dict[str, Any]:
    argv = ["--json", "e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", "--warmup", "0", *args]
    [run] = run_cli(*argv, exit=exit).json["result"]["runs"]
    return run  # type: ignore[no-any-return]


def _launched(gateways: list[RunningGateway], tmp_path: Path, **kw: Any) -> RunningGateway:
    """A real gateway that will never be "ready" (no worker healthy): started, its transport line
    awaited, stopped at teardown like every other."""
    from smgshm.core.gateway.process import GatewayConfig, launch_gateway

    gw = launch_gateway(GatewayConfig(log_path=str(tmp_path / f"gateway-{len(gateways)}.log"), **kw))
    gateways.append(gw)
    wait_for(gw.transport_setting, what="the gateway's transport line")
    wait_for(lambda: _listed(gw) is not None, what="its HTTP port")  # it listens a moment after that line
    return gw


def _listed(gw: RunningGateway) -> list[dict[str, Any]] | None:
    """Its GET /workers; None while it does not answer (401 with --api-key is an answer)."""
    from smgshm.core.errors import ServerError, SmgshmError

    try:
        return gw.workers()
    except ServerError:
        return []
    except SmgshmError:
        return None


def _doctor(*args: str, exit: int) -> tuple[dict[str, dict[str, Any]], str]:
    """doctor's checks by name (--json) and its human output, from two runs."""
    doc = run_cli("--json", "doctor", *args, exit=exit).json
    text = run_cli("doctor", *args, exit=exit).stdout
    return {c["name"]: c for c in doc["result"]["checks"]}, text
