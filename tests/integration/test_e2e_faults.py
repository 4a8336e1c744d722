"""The gateway's failure classes of smg-facts §5.3, reproduced with serve --fault against the real gateway."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from smgshm.cli import cli
from smgshm.core.gateway.chat import make_png, send_chat
from smgshm.core.gateway.process import RunningGateway
from smgshm.core.receiver.modeldir import SERVED_MODEL_NAME
from tests.conftest import SHM, Children, run_cli, start_serve
from tests.support.cli_gc import JUDGE  # another job's containers must not make the verdict unknown
from tests.support.e2e import gateway, needs_smg

pytestmark = [needs_smg, pytest.mark.timeout(180)]


def gc_rows(pid: int, *args: str) -> list[dict]:  # type: ignore[type-arg]
    doc = run_cli("--json", "gc", *JUDGE, *args).json
    return [s for s in doc["result"]["segments"] if s["producer_pid"] == pid and s["kind"] == "gateway"]


@pytest.mark.slow
def test_leak_under_disable_retries_seen_by_gc_then_reaped(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """die-after-headers + --disable-retries: the segment leaks; gc calls it in flight/stale while the
    gateway lives, leaked once it is gone, and --delete reaps it."""
    _, ready = start_serve(children, "--model-dir", model_dir, "--fault", "die-after-headers")
    gw = gateway(gateways, tmp_path, model_dir, ready["result"]["address"], mode="shm", disable_retries=True)
    out = send_chat(gw.http_url, SERVED_MODEL_NAME, make_png(448), stream=False, timeout_s=60)
    assert not out.ok
    assert out.status == 502  # worker_stream_failed (smg-facts §5.3)
    [seg] = gc_rows(gw.pid)
    assert seg["producer_alive"] is True
    assert seg["state"] == "in_flight"  # young, its producer alive: gc never calls it leaked
    [seg] = gc_rows(gw.pid, "--stale-after", "0s")
    assert seg["state"] == "stale"
    assert os.path.exists(os.path.join(SHM, seg["name"]))
    gw.kill()  # SIGKILL: a crashed gateway removes nothing
    [seg] = gc_rows(gw.pid)
    assert seg["state"] == "leaked"
    # Reaped by gc's own code (scan, judge, reap), restricted to this test's segment: the shm dir is
    # shared, and `gc --delete` would also reap other runs' provably dead segments.
    from smgshm.core.segments.judge import ScanOptions, State
    from smgshm.core.segments.reaping import reap, reapable
    from smgshm.core.segments.scan import scan_segments

    leaked = reapable({State.LEAKED})
    scan = scan_segments(ScanOptions(SHM, assume_dead=True))  # as JUDGE: by this namespace's pids
    mine = [s for s in scan.segments if s.name == seg["name"] and leaked(s)]
    [deleted] = reap(mine, SHM)
    assert deleted.deleted is True, deleted.reason
    assert not os.path.exists(os.path.join(SHM, seg["name"]))


@pytest.mark.slow
def test_retry_of_a_consumed_handle_is_reported_as_that_failure_class(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """Two workers, one reads (and unlinks) then dies: the gateway's retry hands the other the
    consumed handle; e2e names that class from the receipts and the shm dir."""
    _, dying = start_serve(children, "--model-dir", model_dir, "--fault", "die-after-read")
    _, good = start_serve(children, "--model-dir", model_dir)
    gw = gateway(
        gateways,
        tmp_path,
        model_dir,
        dying["result"]["address"],
        good["result"]["address"],
        mode="shm",
        extra_args=("--policy", "round_robin"),
    )
    # Not streamed: a streamed reply has sent its headers, so the gateway cannot retry it (the
    # stream just breaks); a unary one it retries, on the other worker, with the same handle.
    argv = [
        "--json",
        "e2e",
        "--gateway",
        gw.http_url,
        "--metrics",
        gw.metrics_url,
        "-n",
        "2",
        "--warmup",
        "0",
        "--no-stream",
    ]
    res = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert res.exit_code == 4, res.stderr  # the dying worker is dead after: an endpoint unreachable
    [run] = json.loads(res.stdout)["result"]["runs"]
    assert run["cause_info"]["code"] == "worker_unreachable"
    assert run["failure_class"] == "consumed_handle_retried"
    assert "retries reuse consumed handles" in run["failure"]
    missing = [r for r in run["receipts"]["receipts"] if r["payload_kind"] == "shm" and r["error_code"] == "missing"]
    assert missing
    consumed = {s["name"] for s in run["shm_dir"]["segments"] if s["end"] == "consumed"}
    assert missing[0]["shm_name"] in consumed
    assert run["receipts"]["partial"] is True  # the dying worker's receipts died with it
    assert run["agree"] is True  # metrics and the shm dir still agree on the writes
    assert [r["ok"] for r in run["requests"]].count(False) == 1
