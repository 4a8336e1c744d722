"""Shared by the e2e tests: a model directory, a non-smgshm worker, gateways that are always stopped."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from smgshm.core.gateway.process import GatewayConfig, RunningGateway, start_gateway
from tests.conftest import Children

needs_smg = pytest.mark.gateway  # skipped where smg is missing (tests/conftest.py)
FOREIGN_ID = "00000000-0000-4000-8000-000000000000:1"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from smgshm.core.receiver.modeldir import ensure_model_dir

    return ensure_model_dir(str(tmp_path_factory.mktemp("model") / "qwen2vl")).path


@pytest.fixture
def gateways() -> Iterator[list[RunningGateway]]:
    """Gateways a test starts; every one stopped (group SIGTERM, SIGKILL, reaped) at teardown."""
    started: list[RunningGateway] = []
    yield started
    for gw in started:
        gw.stop()


def mm_shm_worker(children: Children, model_dir: str, namespace_id: str | None = None) -> str:
    """A vLLM worker that reads with SMG's own mm_shm and has no receipts; returns its address."""
    argv = [sys.executable, "-m", "tests.support.mm_shm_worker", model_dir, *([namespace_id] if namespace_id else [])]
    p = children.spawn(argv)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line, p.stderr.read() if p.stderr else "worker exited"
    return line


def gateway(
    gateways: list[RunningGateway], tmp_path: Path, model_dir: str, *workers: str, mode: str = "shm", **kw: object
) -> RunningGateway:
    cfg = GatewayConfig(
        worker_urls=workers,
        model_path=model_dir,
        transport=mode,
        log_path=str(tmp_path / f"gateway-{mode}-{len(gateways)}.log"),
        **kw,
    )  # type: ignore[arg-type]
    gw = start_gateway(cfg, ready_timeout_s=60)
    gateways.append(gw)
    return gw
