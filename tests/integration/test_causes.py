"""The cause catalogue: every cause has a code, a sentence and a fix; codes are unique; the README's table matches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.gateway.process import RunningGateway
from tests.conftest import Children, closed_port, run_cli, start_serve, wait_for
from tests.support.causes import _doctor, _e2e_run, _launched, _listed, _spawn_json, needs_unshare
from tests.support.e2e import gateway, mm_shm_worker, needs_smg


def test_probe_json_carries_the_cause_of_an_unreachable_worker() -> None:
    addr = f"127.0.0.1:{closed_port()}"
    doc = run_cli("--json", "probe", "--connect-timeout", "1s", addr, exit=4).json
    [w] = doc["result"]["workers"]
    assert w["cause_info"]["code"] == "worker_unreachable"
    assert w["cause_info"]["message"].startswith(f"{addr}: ")
    assert w["cause_info"]["fix"] == CATALOGUE[Cause.WORKER_UNREACHABLE].fix


# --------------------------------------------------------------------------- causes produced here for real


@pytest.mark.slow
@needs_unshare
def test_verify_failed_a_receiver_on_its_own_tmpfs_claiming_this_hosts_id(children: Children) -> None:
    """The ids match (the receiver claims this host's), so only the canary tells: it is not there."""
    from smgshm.core.host.namespace import read_namespace_id

    script = (
        'mount -t tmpfs -o size=4m tmpfs /dev/shm && exec "$0" -m smgshm --json serve --listen 127.0.0.1:0 '
        '--advertise-namespace-id "$1"'
    )
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, read_namespace_id()]
    addr = _spawn_json(children, argv)["result"]["address"]
    [w] = run_cli("--json", "probe", "--verify", addr, exit=3).json["result"]["workers"]
    assert w["verdict"] == "verify_failed"
    assert w["cause_info"]["code"] == "verify_failed"
    assert w["cause_info"]["fix_cmd"] == ["smgshm", "probe", "--verify", addr]


@pytest.mark.slow
@needs_unshare
def test_namespace_unreadable_when_this_hosts_boot_id_is_empty(children: Children, tmp_path: Path) -> None:
    """probe where /proc/sys/kernel/random/boot_id reads empty: this host's id cannot be formed."""
    _, ready = start_serve(children)
    addr = ready["result"]["address"]
    fake = tmp_path / "boot_id"
    fake.write_text("", encoding="ascii")
    script = f'mount --bind {fake} /proc/sys/kernel/random/boot_id && exec "$0" -m smgshm --json probe "$1"'
    doc = _spawn_json(
        children, ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, addr]
    )
    [w] = doc["result"]["workers"]
    assert w["verdict"] == "undetermined"
    assert w["cause_info"]["code"] == "namespace_unreadable"
    assert w["cause_info"]["fix_cmd"][:2] == ["smgshm", "ns"]
    # doctor, for the same fact, names the same cause: this host's id, and the worker judged against it.
    script = (
        f'mount --bind {fake} /proc/sys/kernel/random/boot_id && exec "$0" -m smgshm --json doctor --no-gateways '
        '--no-e2e --worker "$1"'
    )
    doc = _spawn_json(
        children, ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, addr]
    )
    c = {check["name"]: check for check in doc["result"]["checks"]}
    assert (c["namespace id"]["cause"], c[f"probe {addr}"]["cause"]) == ("namespace_unreadable",) * 2
    assert c["namespace id"]["fix"] == c[f"probe {addr}"]["fix"] == CATALOGUE[Cause.LOCAL_ID_UNREADABLE].fix


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv(1)")
def test_shm_permission_for_doctor_as_a_user_who_cannot_write_the_shm_dir() -> None:
    """A shm dir only root may write (0755): doctor as nobody cannot create the 0600 segment SMG's gateway
    would, and names the permission (not a full dir)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="smgshm-causes-", dir="/tmp")
    try:
        os.chmod(d, 0o755)  # noqa: S103 - readable by nobody, writable by root only: the point of the test
        argv = [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "smgshm",
            "--json",
            "doctor",
            "--no-gateways",
            "--no-e2e",
            "--shm-dir",
            d,
        ]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert res.returncode == 5, res.stdout + res.stderr
        w = {c["name"]: c for c in json.loads(res.stdout)["result"]["checks"]}["writable"]
        assert (w["status"], w["cause"]) == ("fail", "shm_permission")
        assert "uid" in w["fix"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_smg
@pytest.mark.timeout(180)
def test_below_shm_min_bytes_at_a_real_gateway_with_a_high_minimum(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A gateway whose shm_min_bytes (64 MiB) exceeds every tensor: inline by design, no failure under shm."""
    gw = gateway(gateways, tmp_path, model_dir, mm_shm_worker(children, model_dir), mode="shm", shm_min_bytes=64 << 20)
    run = _e2e_run(gw, exit=0)
    assert run["path"] == "inline"
    assert run["cause_info"]["code"] == "below_shm_min_bytes"


@needs_smg
@pytest.mark.timeout(180)
def test_no_mm_tensors_when_every_request_fails_at_a_real_gateway(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A model the gateway does not serve: every request fails before any tensor is sent."""
    gw = gateway(gateways, tmp_path, model_dir, mm_shm_worker(children, model_dir), mode="shm")
    run = _e2e_run(gw, "--model", "no-such-model", exit=3)
    assert run["path"] == "none"
    assert run["cause_info"]["code"] == "no_mm_tensors"


# --------------------------------------------------------------------------- a real gateway's own state


@needs_smg
@pytest.mark.timeout(180)
def test_gateway_not_ready_and_no_workers_at_a_real_gateway_with_none(
    gateways: list[RunningGateway], tmp_path: Path, shm_dir: str
) -> None:
    """SMG with no worker answers /workers (empty) but 503 on /v1/models: e2e stays an error (exit 4)
    whose JSON kind is the cause's code; doctor names both causes, each with its fix."""
    gw = _launched(gateways, tmp_path, transport="auto")
    fix = CATALOGUE[Cause.GATEWAY_NOT_READY].fix
    res = run_cli("--json", "e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", exit=4)
    err = res.json["error"]
    assert err["kind"] == "gateway_not_ready" == Cause.GATEWAY_NOT_READY.value
    assert err["message"].startswith("gateway not ready: GET /v1/models answered HTTP 503")
    assert err["hint"] == fix
    res = run_cli("e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", exit=4)
    assert "gateway not ready: GET /v1/models answered HTTP 503" in res.stderr
    assert fix in res.stderr
    c, text = _doctor(
        "--from-gateway",
        gw.http_url,
        "--metrics",
        gw.metrics_url,
        "--gateway-pid",
        str(gw.pid),
        "--shm-dir",
        shm_dir,
        exit=4,
    )
    assert (c["e2e"]["status"], c["e2e"]["cause"], c["e2e"]["code"]) == ("fail", "gateway_not_ready", 4)
    assert c["e2e"]["fix"] == fix
    none = c[f"gateway {gw.pid} workers"]
    assert (none["status"], none["cause"], none["code"]) == ("unknown", "no_workers", 6)
    assert none["fix"] == CATALOGUE[Cause.NO_WORKERS].fix
    assert "(gateway_not_ready)" in text
    assert "(no_workers)" in text
    assert f"fix: {fix}" in text
    assert f"fix: {CATALOGUE[Cause.NO_WORKERS].fix}" in text


@needs_smg
@pytest.mark.timeout(180)
def test_zmq_lane_for_a_worker_the_real_gateway_reaches_over_ipc(
    gateways: list[RunningGateway], tmp_path: Path, model_dir: str, shm_dir: str
) -> None:
    """SMG registers an ipc:// worker on its direct-ZMQ lane (connection_mode zmq), which refuses SHM
    handles: probe --from-gateway and doctor name zmq_lane, not a namespace cause."""
    url = f"ipc://{tmp_path}/engine"
    gw = _launched(gateways, tmp_path, worker_urls=(url,), model_path=model_dir, transport="auto")
    wait_for(lambda: [w for w in _listed(gw) or [] if w.get("connection_mode") == "zmq"], what="the zmq worker")
    fix = CATALOGUE[Cause.ZMQ_LANE].fix
    doc = run_cli("--json", "probe", "--from-gateway", gw.http_url).json
    [w] = [w for w in doc["result"]["workers"] if w["address"] == url]
    assert w["verdict"] == "not_grpc"
    assert w["cause_info"]["code"] == "zmq_lane"
    assert w["cause_info"]["fix"] == fix
    res = run_cli("probe", "--from-gateway", gw.http_url)
    assert "(zmq_lane)" in res.stdout
    assert f"{url}: {fix}" in res.stderr  # probe's fixes are hints, on stderr
    c, text = _doctor("--no-e2e", "--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, exit=0)
    check = c[f"gateway {gw.pid} worker {url}"]
    assert (check["status"], check["cause"], check["fix"]) == ("warn", "zmq_lane", fix)  # configured auto
    assert "(zmq_lane)" in text
    assert f"fix: {fix}" in text


@needs_smg
@pytest.mark.timeout(180)
def test_workers_unlisted_when_the_real_gateway_wants_an_api_key(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str, shm_dir: str
) -> None:
    """A gateway started with --api-key refuses GET /workers without it (401): doctor cannot probe its
    workers and says so, naming the flag; with the key, it lists and probes them."""
    here = mm_shm_worker(children, model_dir)
    gw = _launched(
        gateways,
        tmp_path,
        worker_urls=(here,),
        model_path=model_dir,
        transport="auto",
        extra_args=("--api-key", "sekret"),
    )
    c, text = _doctor("--no-e2e", "--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, exit=0)
    check = c[f"gateway {gw.pid} workers"]
    assert (check["status"], check["cause"]) == ("warn", "workers_unlisted")
    assert "401" in check["summary"]
    assert "--api-key" in check["fix"]
    assert "(workers_unlisted)" in text
    c, _ = _doctor("--no-e2e", "--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, "--api-key", "sekret", exit=0)
    assert f"gateway {gw.pid} workers" not in c
    assert c[f"gateway {gw.pid} worker grpc://{here}"]["status"] == "ok"


@needs_smg
@pytest.mark.timeout(180)
def test_sources_disagree_when_another_gateway_feeds_the_same_worker(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A worker shared by two real gateways, the other one busy meanwhile: the worker's receipts count the
    other gateway's SHM tensors too, the tested gateway's metrics and segments only its own. e2e does not
    guess which source is right: undetermined, with the cause and its fix."""
    import threading

    from smgshm.core.gateway.chat import first_model, make_png, send_chat

    _, ready = start_serve(children, "--model-dir", model_dir)
    addr = ready["result"]["address"]
    gw = gateway(gateways, tmp_path, model_dir, addr, mode="shm")
    other = gateway(gateways, tmp_path, model_dir, addr, mode="shm")
    model, png = first_model(other.http_url), make_png(448)
    stop = threading.Event()
    sent: list[int] = []

    def busy() -> None:
        while not stop.is_set():
            sent.append(send_chat(other.http_url, model, png, stream=False, timeout_s=30.0).status)

    feeder = threading.Thread(target=busy, daemon=True)
    feeder.start()
    try:
        wait_for(lambda: 200 in sent, what="the other gateway's traffic")
        args = ("e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "2", "--warmup", "0")
        [run] = run_cli("--json", *args, exit=6).json["result"]["runs"]
        text = run_cli(*args, exit=6).stdout
    finally:
        stop.set()
        feeder.join(60)
    assert run["path"] == "undetermined"
    assert run["agree"] is False
    by = run["shm_tensors_by_source"]
    assert by["metrics"] == by["shm dir"] == 2 < by["receipts"]
    info = run["cause_info"]
    assert (info["code"], info["fix"]) == ("sources_disagree", CATALOGUE[Cause.SOURCES_DISAGREE].fix)
    assert "undetermined (sources_disagree)" in text
    assert f"fix: {CATALOGUE[Cause.SOURCES_DISAGREE].fix}" in text


@needs_smg
@pytest.mark.timeout(240)
def test_worker_slow_when_a_gateways_workers_outlast_doctors_probe_budget(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str, shm_dir: str
) -> None:
    """40 workers (one process, 40 ports) that turn slow once registered: every RPC answers after 1.5 s,
    within each RPC's own 2 s bound, so each probe takes seconds. doctor probes 32 at once and waits at
    most 10 s for them all: the workers not answered by then are said so (worker_slow), never waited for."""
    from smgshm.core.doctor.gatewayworkers import POOL, PROBE_BUDGET_S

    slow = tmp_path / "slow"
    env = {**os.environ, "MM_SHM_WORKER_PORTS": "40", "MM_SHM_WORKER_SLOW_FILE": str(slow)}
    p = children.spawn([sys.executable, "-m", "tests.support.mm_shm_worker", model_dir], env=env)
    assert p.stdout is not None
    addrs = p.stdout.readline().split()
    assert len(addrs) == 40 > POOL
    gw = gateway(gateways, tmp_path, model_dir, *addrs, mode="auto")
    slow.touch()
    c, text = _doctor("--no-e2e", "--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, exit=0)
    status = {a: c[f"gateway {gw.pid} worker grpc://{a}"] for a in addrs}
    late = [a for a, check in status.items() if check["cause"] == "worker_slow"]
    assert len(late) >= 40 - POOL, [check["summary"] for check in status.values()]
    for a in late:
        check = status[a]
        assert check["status"] == "warn"
        assert check["summary"].startswith(f"no answer to the probe within {PROBE_BUDGET_S:.0f} s")
        assert check["fix"] == CATALOGUE[Cause.WORKER_SLOW].fix
        assert check["fix_cmd"] == ["smgshm", "probe", f"grpc://{a}"]
    assert all(check["status"] == "ok" for a, check in status.items() if a not in late)
    assert "(worker_slow)" in text


@needs_smg
@pytest.mark.timeout(180)
def test_stale_namespace_label_of_a_worker_restarted_with_another_id(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str, shm_dir: str
) -> None:
    """The gateway reads a worker's id once, at registration. The worker first advertised a foreign id,
    then came back on the same port with this host's: the gateway still decides by the old label."""
    from tests.support.e2e import FOREIGN_ID

    first, ready = start_serve(children, "--advertise-namespace-id", FOREIGN_ID)
    addr = ready["result"]["address"]
    gw = gateway(gateways, tmp_path, model_dir, addr, mode="auto")
    [w] = gw.workers()
    assert w["labels"]["shm_namespace_id"] == FOREIGN_ID
    first.kill()
    first.wait(10)
    start_serve(children, "--listen", addr)  # the same port, this host's id
    c, text = _doctor("--no-e2e", "--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, exit=3)
    check = c[f"gateway {gw.pid} worker grpc://{addr}"]
    assert (check["status"], check["cause"], check["code"]) == ("fail", "stale_namespace_label", 3)
    assert FOREIGN_ID in check["summary"]
    assert check["fix"] == CATALOGUE[Cause.STALE_NAMESPACE_LABEL].fix
    assert "(stale_namespace_label)" in text
    assert f"fix: {CATALOGUE[Cause.STALE_NAMESPACE_LABEL].fix}" in text


@pytest.mark.slow
def test_no_namespace_id_from_a_vllm_worker_that_advertises_none(children: Children) -> None:
    """A vLLM worker (it could take SHM) with an empty shm_namespace_id: auto stays inline for want of the id.
    An SGLang worker is undetermined too, but for its engine (test_cli_probe: engine_inline_only)."""
    _, ready = start_serve(children, "--advertise-namespace-id", "")
    addr = ready["result"]["address"]
    [w] = run_cli("--json", "probe", addr, exit=6).json["result"]["workers"]
    assert (w["verdict"], w["engine"], w["namespace_id"]) == ("undetermined", "vllm", "")
    info = w["cause_info"]
    assert (info["code"], info["fix"]) == ("no_namespace_id", CATALOGUE[Cause.NO_NAMESPACE_ID].fix)
    res = run_cli("probe", addr, exit=6)
    assert "(no_namespace_id)" in res.stdout


@needs_smg
@pytest.mark.timeout(180)
def test_engine_inline_only_for_an_sglang_worker_of_the_real_gateway(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str, shm_dir: str
) -> None:
    """The gateway registers a worker that answers as SGLang (runtime_type sglang): its TensorData has no
    shm arm, so it gets every tensor inline whatever the ids say. probe --from-gateway and doctor name the
    engine, not a missing id."""
    _, ready = start_serve(children, "--engine", "sglang")
    addr = ready["result"]["address"]
    gw = gateway(gateways, tmp_path, model_dir, addr, mode="auto")
    assert [w["runtime_type"] for w in gw.workers()] == ["sglang"]
    fix = CATALOGUE[Cause.ENGINE_INLINE_ONLY].fix
    [w] = run_cli("--json", "probe", "--from-gateway", gw.http_url, exit=6).json["result"]["workers"]
    assert (w["verdict"], w["engine"]) == ("undetermined", "sglang")
    assert (w["cause_info"]["code"], w["cause_info"]["fix"]) == ("engine_inline_only", fix)
    res = run_cli("probe", "--from-gateway", gw.http_url, exit=6)
    assert "(engine_inline_only)" in res.stdout
    assert fix in res.stderr
    c, text = _doctor("--no-e2e", "--gateway-pid", str(gw.pid), "--shm-dir", shm_dir, exit=6)
    check = c[f"gateway {gw.pid} worker grpc://{addr}"]
    assert (check["status"], check["cause"], check["fix"]) == ("fail", "engine_inline_only", fix)
    assert "(engine_inline_only)" in text
    assert f"fix: {fix}" in text


@needs_smg
@pytest.mark.timeout(180)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv(1)")
def test_no_evidence_for_an_unprivileged_e2e_whose_requests_all_fail(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """e2e as an unprivileged user (the root gateway's pid is not visible: no shm dir view), a worker that
    keeps no receipts, and requests for a model the gateway does not serve (so it never metered a tensor
    and exports no smg_mm_* counter): nothing tells which path tensors would take, and e2e says so."""
    gw = gateway(gateways, tmp_path, model_dir, mm_shm_worker(children, model_dir), mode="shm")
    argv = [
        "setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        sys.executable,
        "-m",
        "smgshm",
        "--json",
        "e2e",
        "--gateway",
        gw.http_url,
        "--metrics",
        gw.metrics_url,
        "-n",
        "1",
        "--warmup",
        "0",
        "--model",
        "no-such-model",
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert res.returncode == 6, res.stdout + res.stderr
    [run] = json.loads(res.stdout)["result"]["runs"]
    assert run["path"] == "undetermined"
    assert [m["available"] for m in (run["metrics"], run["shm_dir"], run["receipts"])] == [False] * 3
    assert run["shm_dir"]["note"] == "the gateway's pid is not visible from here"
    info = run["cause_info"]
    assert (info["code"], info["fix"]) == ("no_evidence", CATALOGUE[Cause.NO_EVIDENCE].fix)
    human = subprocess.run(
        argv[:9] + argv[10:], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"}
    )
    assert human.returncode == 6, human.stderr
    assert "undetermined (no_evidence)" in human.stdout
    assert f"fix: {CATALOGUE[Cause.NO_EVIDENCE].fix}" in human.stdout


@needs_smg
@pytest.mark.timeout(180)
def test_some_workers_inline_when_one_of_two_workers_is_in_another_namespace(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A gateway under auto, round robin over a worker here and one advertising another host's id: half the
    pixel tensors go by SHM, half inline. watch --metrics sees both in the gateway's counters and names it
    for what the counters can tell (some workers do not take SHM), not as the gateway breaking its rule."""
    import threading

    from smgshm.core.gateway.chat import first_model, make_png, send_chat
    from tests.support.e2e import FOREIGN_ID

    here, foreign = mm_shm_worker(children, model_dir), mm_shm_worker(children, model_dir, FOREIGN_ID)
    gw = gateway(gateways, tmp_path, model_dir, here, foreign, mode="auto", extra_args=("--policy", "round_robin"))
    model, png = first_model(gw.http_url), make_png(448)
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            send_chat(gw.http_url, model, png, stream=False, timeout_s=30.0)

    feeder = threading.Thread(target=busy, daemon=True)
    feeder.start()
    try:
        args = ("watch", "--shm-dir", str(tmp_path), "--metrics", gw.metrics_url, "--interval", "2", "--count", "2")
        doc = run_cli("--json", *args).json
        text = run_cli(*args).stdout
    finally:
        stop.set()
        feeder.join(60)
    assert f"fix: {CATALOGUE[Cause.SOME_WORKERS_INLINE].fix}" in text
    g = doc["result"]["gateway"]
    assert g["tensors"]["shm"] > 0
    assert g["eligible_inline"] is True
    info = g["cause_info"]
    assert (info["code"], info["fix"]) == ("some_workers_inline", CATALOGUE[Cause.SOME_WORKERS_INLINE].fix)


@needs_smg
@pytest.mark.timeout(180)
def test_worker_processing_at_a_real_gateway_sending_media_refs_to_serve(
    children: Children, gateways: list[RunningGateway], tmp_path: Path
) -> None:
    """--mm-processing worker with the one family the gateway lets a worker expand (MiniMax-M3, weight-less),
    and serve advertising a worker-side processor: the requests succeed and no tensor is sent."""
    md = str(tmp_path / "m3")
    _, ready = start_serve(children, "--model-dir", md, "--worker-processing")
    gw = gateway(
        gateways, tmp_path, md, ready["result"]["address"], mode="shm", extra_args=("--mm-processing", "worker")
    )
    run = _e2e_run(gw, exit=0)  # its own setting: no tensors is what worker processing means
    assert run["path"] == "none"
    assert run["cause_info"]["code"] == "worker_processing"
    assert run["requests"]
    assert all(r["ok"] for r in run["requests"])  # served, not failed
    # An operator who expects SHM is told why there is none, and what to change.
    run = _e2e_run(gw, "--expect", "shm", exit=3)
    assert run["cause_info"]["code"] == "worker_processing"
    argv = ("e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", "--warmup", "0")
    text = " ".join(run_cli(*argv, "--expect", "shm", exit=3).stdout.split())
    assert "--mm-processing worker" in text
    assert CATALOGUE[Cause.WORKER_PROCESSING].fix in text
