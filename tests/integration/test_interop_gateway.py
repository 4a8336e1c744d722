"""The real SMG gateway (`smg launch`, 1.13.0) registers `smgshm serve` as a healthy vLLM worker.

No model is needed: the gateway calls HealthCheck, GetModelInfo and GetServerInfo through
the vLLM stubs and records the worker's ``shm_namespace_id`` as a label (smg-facts §5.1).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.gateway.process import GatewayConfig, RunningGateway, start_gateway
from smgshm.core.host.namespace import read_namespace_id
from tests.conftest import Children, run_cli, start_serve, wait_for
from tests.support.interop_gateway import PINNED_ID, SMG  # noqa: F401

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.gateway,
]


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[list[RunningGateway]]:
    """Gateways a test starts; every one stopped (group SIGTERM, SIGKILL, reaped) at teardown."""
    started: list[RunningGateway] = []
    yield started
    for gw in started:
        gw.stop()


def launch_gateway(gateways: list[RunningGateway], tmp_path: Path, *worker_addresses: str) -> RunningGateway:
    cfg = GatewayConfig(worker_urls=worker_addresses, transport="auto", log_path=str(tmp_path / "gateway.log"))
    gw = start_gateway(cfg, ready_timeout_s=60)
    gateways.append(gw)
    return gw


def healthy_worker(gw: RunningGateway, url: str) -> dict[str, Any]:
    found = [w for w in gw.workers() if w.get("url") == url and w.get("is_healthy") is True]
    assert found, f"{url} not healthy in GET /workers"
    return found[0]


def registered(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, *serve_args: str
) -> tuple[dict[str, Any], dict[str, Any], RunningGateway]:
    """Start serve and a gateway pointing at it; return (serve ready doc, worker info, gateway)."""
    _, ready = start_serve(children, *serve_args)
    address = ready["result"]["address"]
    gw = launch_gateway(gateways, tmp_path, address)  # returns once GET /workers shows it healthy
    return ready, healthy_worker(gw, f"grpc://{address}"), gw


@pytest.mark.slow
def test_gateway_registers_serve_as_healthy_vllm_worker(
    children: Children, gateways: list[RunningGateway], tmp_path: Path
) -> None:
    ready, worker, gw = registered(children, gateways, tmp_path)
    assert worker["status"] == "ready"
    assert worker["runtime_type"] == "vllm"
    assert worker["connection_mode"] == "grpc"
    ns = ready["result"]["namespace_id"]
    assert ns, "serve advertised no namespace id"
    assert ns == read_namespace_id()
    assert worker["labels"]["shm_namespace_id"] == ns
    # The gateway read GetModelInfo too: the worker serves smgshm's model name.
    assert worker["model_id"] == "smgshm-reference-receiver"
    # Logged at start (verified by hand: "Multimodal tensor transport configured mode=auto ...").
    setting = wait_for(gw.transport_setting, 20, "the gateway to log its transport mode")
    assert (setting.mode, setting.shm_min_bytes, setting.dev_writable) == ("auto", 65536, True)
    assert re.search(r"Multimodal tensor transport configured mode=auto", gw.logs())


@pytest.mark.slow
def test_gateway_records_pinned_namespace_label(
    children: Children, gateways: list[RunningGateway], tmp_path: Path
) -> None:
    ready, worker, _ = registered(children, gateways, tmp_path, "--advertise-namespace-id", PINNED_ID)
    assert ready["result"]["namespace_id"] == PINNED_ID
    assert read_namespace_id() != PINNED_ID
    # A stale or pinned id is what the gateway keeps: smgshm probe can then show the mismatch.
    assert worker["labels"]["shm_namespace_id"] == PINNED_ID
    assert worker["status"] == "ready"
    assert worker["runtime_type"] == "vllm"


@pytest.mark.slow
def test_probe_from_real_gateway_with_several_workers(
    children: Children, gateways: list[RunningGateway], tmp_path: Path
) -> None:
    """`probe --from-gateway` against `smg launch` with a vLLM and a TokenSpeed worker registered."""
    _, vllm = start_serve(children)
    _, ts = start_serve(children, "--engine", "tokenspeed")
    addrs = [vllm["result"]["address"], ts["result"]["address"]]
    gw = launch_gateway(gateways, tmp_path, *addrs)  # returns once every worker is healthy
    doc = run_cli("--json", "probe", "--from-gateway", gw.http_url).json
    rows = {w["address"]: w for w in doc["result"]["workers"]}
    assert set(rows) == {f"grpc://{a}" for a in addrs}
    assert rows[f"grpc://{addrs[0]}"]["engine"] == "vllm"
    assert rows[f"grpc://{addrs[1]}"]["engine"] == "tokenspeed"
    for w in rows.values():
        assert w["verdict"] == "shared"
        # The label the gateway recorded at registration is the id the worker advertises now.
        assert w["gateway_label"] == w["namespace_id"] == read_namespace_id()
        assert w["decisions"]["auto"]["path"] == "shm"
    assert doc["warnings"] == []
