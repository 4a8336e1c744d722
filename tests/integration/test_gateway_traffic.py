"""doctor infers a gateway's transport from its metrics after real multimodal traffic.

The real gateway (`smg launch`) preprocesses a real PNG with the weight-less model directory and
sends `smgshm serve` real pixel_values (smg-facts §5.2); its metrics since start are the evidence.
A gateway whose output goes to /dev/null leaves no log to read: then the metrics alone speak.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from smgshm.core.gateway.metrics import mm_traffic, scrape
from smgshm.core.gateway.mode import judge
from smgshm.core.gateway.process import GatewayConfig, start_gateway
from smgshm.core.gateway.running import inspect_gateway
from smgshm.core.receiver.modeldir import ensure_model_dir
from tests.conftest import Children, start_serve
from tests.support.interop_gateway import PINNED_ID
from tests.support.interop_generate import chat, png, serve_behind_gateway
from tests.support.running_gateways import doctor_doc, mine


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Gateways entered here are stopped at teardown."""
    with ExitStack() as s:
        yield s


pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.gateway,
]


@pytest.mark.slow
def test_shm_traffic_is_seen_in_the_metrics_and_the_log(children: Children, stack: ExitStack, tmp_path: Path) -> None:
    _, gw, model = serve_behind_gateway(children, stack, tmp_path, "shm")
    for _ in range(2):
        status, text = chat(gw, model, png(448), stream=False)
        assert status == 200, text[-2000:]
    doc = doctor_doc("--gateway-pid", str(gw.pid))  # the real shm dir: the gateway writes there
    entry, checks = mine(doc, gw.pid)
    assert entry["traffic"]["tensors"] == {"shm": 2, "inline": 4}
    t = checks[f"gateway {gw.pid} transport"]
    assert t["status"] == "ok", t
    assert "SHM in use since start: 2 of 6 tensors via shm" in t["summary"]
    assert "(mode=shm, log)" in t["summary"]
    sources = [e["source"] for e in entry["finding"]["evidence"]]
    assert sources == [f"log {gw.log_path}:{entry['log']['line_no']}", f"metrics {gw.metrics_url}"]
    # What the deployment moves is a capacity need for the shm dir it writes to.
    needs = doc["result"]["host"]["capacity"]["needs"]
    assert any(n["source"].startswith(f"gateway pid {gw.pid}'s mean tensor") for n in needs), needs


@pytest.mark.slow
def test_inline_traffic_of_a_gateway_without_a_log_is_inferred_from_metrics(
    children: Children, stack: ExitStack, tmp_path: Path
) -> None:
    """auto + a worker advertising another host's id: SMG stays inline, and only the metrics show it."""
    md = ensure_model_dir(str(tmp_path / "model"))
    _, ready = start_serve(children, "--model-dir", md.path, "--advertise-namespace-id", PINNED_ID)
    cfg = GatewayConfig(
        worker_urls=(ready["result"]["address"],), model_path=md.path, transport="auto", log_path="/dev/null"
    )
    gw = stack.enter_context(start_gateway(cfg, ready_timeout_s=60))
    for _ in range(2):
        status, text = chat(gw, md.served_model_name, png(448), stream=False)
        assert status == 200, text[-2000:]
    g = inspect_gateway(gw.pid)
    assert g.logs == [], "its output goes to /dev/null: no log to read"
    assert g.metrics_url == gw.metrics_url
    traffic = mm_traffic(scrape(g.metrics_url))
    assert traffic.tensors == {"inline": 6}
    f = judge(f"gateway pid {gw.pid}", None, traffic, g.metrics_url)
    assert f.verdict == "off_or_failing"
    # 2 x (pixel_values 4,816,896 B + image_grid_thw 24 B + patches_per_image 8 B) over 6 tensors.
    assert f.summary == (
        f"gateway pid {gw.pid}: multimodal tensors went inline since start (6 tensors, mean 1.5 MiB): "
        "SHM is off (the default is inline) or failing"
    )
    assert f.fix.startswith("restart the gateway with --multimodal-tensor-transport auto")
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-pid", str(gw.pid))
    entry, checks = mine(doc, gw.pid)
    assert entry["log"] is None
    t = checks[f"gateway {gw.pid} transport"]
    assert t["status"] == "warn"
    assert t["summary"] == f.summary


@pytest.mark.slow
def test_inline_traffic_with_its_log_names_the_setting(children: Children, stack: ExitStack, tmp_path: Path) -> None:
    _, gw, model = serve_behind_gateway(children, stack, tmp_path, "inline")
    status, text = chat(gw, model, png(448), stream=True)
    assert status == 200, text[-2000:]
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-pid", str(gw.pid))
    _, checks = mine(doc, gw.pid)
    t = checks[f"gateway {gw.pid} transport"]
    assert t["status"] == "warn"
    assert (
        t["summary"] == f"gateway pid {gw.pid}: configured inline (log): SHM is off; 3 tensors went inline since start"
    )
    assert "--multimodal-tensor-transport auto" in t["fix"]
