"""doctor judges a real gateway's own workers (GET /workers, each probed), lints its configuration,
and fails on segments a live gateway stranded; its verdict line comes first.

Every gateway is a real `smg launch` on free loopback ports, judged alone (--gateway-pid) and always
stopped; every worker is a child reaped at teardown.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.gateway.process import RunningGateway
from tests.conftest import Children, run_cli
from tests.support.cli_doctor import needs_init_pidns, trusted
from tests.support.e2e import FOREIGN_ID, gateway, mm_shm_worker, needs_smg

pytestmark = [needs_smg, pytest.mark.timeout(180)]


def doctor(*args: str, exit: int) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(run_cli("--json", "doctor", "--no-e2e", *args, exit=exit).stdout)
    return doc


def checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["result"]["checks"]}


@pytest.mark.slow
def test_a_foreign_and_a_dead_worker_fail_naming_them_and_the_mixed_ids_warn(
    gateways: list[RunningGateway], tmp_path: Path, model_dir: str, children: Children, shm_dir: str
) -> None:
    here = mm_shm_worker(children, model_dir)
    foreign = mm_shm_worker(children, model_dir, FOREIGN_ID)
    doomed = mm_shm_worker(children, model_dir)
    gw = gateway(gateways, tmp_path, model_dir, f"grpc://{here}", f"grpc://{foreign}", f"grpc://{doomed}", mode="auto")
    victim = children.procs[-1]
    victim.kill()
    victim.wait(10)
    t0 = time.monotonic()
    doc = doctor("--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, exit=4)
    assert time.monotonic() - t0 < 20.0, "doctor with a gateway found stays under 20 s"
    c = checks(doc)
    ok = c[f"gateway {gw.pid} worker grpc://{here}"]
    assert ok["status"] == "ok", ok["summary"]
    bad = c[f"gateway {gw.pid} worker grpc://{foreign}"]
    assert bad["status"] == "fail", bad
    assert bad["cause"] == "namespace_other_host"  # the catalogue's code (core/causes.py)
    assert foreign in bad["summary"]
    assert bad["fix"]
    dead = c[f"gateway {gw.pid} worker grpc://{doomed}"]
    assert dead["status"] == "fail", dead
    assert dead["cause"] == "worker_unreachable"
    assert dead["code"] == 4
    assert f"worker grpc://{doomed} unreachable" in dead["summary"]
    assert dead["fix"]
    lint = [v for k, v in c.items() if k.startswith(f"gateway {gw.pid} config model ")]
    assert len(lint) == 1, list(c)
    assert lint[0]["status"] == "warn"
    assert lint[0]["cause"] == "mixed_namespace_ids"
    assert FOREIGN_ID in lint[0]["summary"]
    assert "retry" in lint[0]["summary"]


@pytest.mark.slow
@pytest.mark.trust  # judges its gateway alive by pid: never beside a test that makes pid namespaces
@needs_init_pidns
def test_a_segment_stranded_by_a_live_gateway_fails_with_its_bytes_and_the_verdict_comes_first(
    gateways: list[RunningGateway], tmp_path: Path, model_dir: str, children: Children, shm_dir: str
) -> None:
    here = mm_shm_worker(children, model_dir)
    gw = gateway(gateways, tmp_path, model_dir, f"grpc://{here}", mode="auto")
    # One of this gateway's segments (its pid in the name), written after it started, read by nobody.
    name = f"smg-tokenspeed-{gw.pid}-{time.time_ns()}-0"
    with open(os.path.join(shm_dir, name), "wb") as f:
        f.write(b"x" * 65536)
    # A scan sees it (stale is proven on the boot clock, from the first sighting: never on its mtime).
    run_cli("--json", "gc", "--shm-dir", shm_dir)
    time.sleep(1.5)
    args = ("--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, "--stranded-after", "1s")
    doc = trusted(shm_dir, lambda: doctor(*args, exit=3))
    s = checks(doc)["stranded"]
    assert s["status"] == "fail", s
    assert s["cause"] == "segments_stranded"
    assert "64.0 KiB held" in s["summary"]
    assert str(gw.pid) in s["summary"]
    assert s["fix_cmd"][:4] == ["smgshm", "gc", "--delete", "--include-stale"]
    assert checks(doc)["leaks"]["status"] == "ok", "a live gateway's segment is not leaked: stranded"
    out = run_cli("--no-color", "doctor", "--no-e2e", *args, exit=3).stdout.splitlines()
    assert out[0].startswith("doctor: 1 check(s) failed: stranded"), out[:3]
    assert any(ln.startswith("[FAIL] stranded: ") for ln in out)
    assert os.path.exists(os.path.join(shm_dir, name)), "doctor only reports; it deletes nothing"


def _w(url: str, ns: str, *, model: str = "m", kind: str = "regular", override: str = "") -> Any:
    from smgshm.core.gateway.admin import GatewayWorker

    return GatewayWorker("id", url, "grpc", "vllm", ns, True, "ready", model, kind, override)


HERE = "5ef74ec3-0000-4000-8000-000000000000:27"


def test_the_lint_names_ignored_overrides_and_a_decode_worker_in_another_namespace() -> None:
    from smgshm.core.doctor.gatewayworkers import JudgedGateway, lint

    g = JudgedGateway("gateway 7", "http://127.0.0.1:1", "auto", HERE)
    out = {
        c.cause.value if c.cause else "": c
        for c in lint(
            g,
            [
                _w("grpc://a:1", HERE, kind="prefill", override="multimodal_tensor_transport=shm"),
                _w("grpc://b:1", FOREIGN_ID, kind="decode"),
            ],
        )
    }
    assert out["worker_override_ignored"].status == "warn"
    assert "SMG ignores per-worker transport settings" in out["worker_override_ignored"].summary
    assert out["pd_decode_namespace"].status == "fail"
    assert "grpc://b:1" in out["pd_decode_namespace"].summary
    assert out["mixed_namespace_ids"].status == "warn"
    # Under inline nothing goes through SHM: mixed ids and a foreign decode worker say nothing.
    inline = lint(
        JudgedGateway("gateway 7", "http://127.0.0.1:1", "inline", HERE),
        [_w("grpc://a:1", HERE, kind="prefill"), _w("grpc://b:1", FOREIGN_ID, kind="decode")],
    )
    assert inline == []
