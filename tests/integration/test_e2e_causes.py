"""The causes e2e names when SHM is configured yet tensors go inline, produced for real (the README's
findings: writes failing, a leftover probe file kept or removed by the gateway).

Each test runs the real gateway, a ``serve`` worker and ``smgshm e2e`` in a private mount namespace
whose /dev/shm is a fresh tmpfs (held by ``unshare -m``, joined with ``nsenter -m``), the gateway in
its own pid namespace as well (``unshare -p -f --mount-proc``): it is pid 1 there, as in a container,
so the name of its probe file is known before it starts, and e2e (outside that pid namespace) must
find its names by the pid they carry, not by the pid it sees. Nothing outlives a test: the holder,
the worker and the gateway are children killed and reaped at teardown (the gateway also dies with
its ``unshare``), and the tmpfs, with every segment in it, goes with the last process of its
namespace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.gateway.metrics import mm_traffic, scrape
from smgshm.core.gateway.process import GatewayConfig, RunningGateway, start_gateway
from smgshm.core.host.proc import innermost_pid, ns_pids
from tests.conftest import Children, run_cli, smgshm_argv, wait_for
from tests.support.e2e import gateway, needs_smg
from tests.support.e2e_causes import TOOLS, PrivateShm, e2e_in, router_pid, serve_in
from tests.support.json_schema import check_e2e_schema

# makes pid namespaces: never beside a test whose verdicts need liveness trusted (tests/conftest.py)
pytestmark = [
    needs_smg,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="mount and pid namespaces need root"),
    pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS), reason=f"needs {', '.join(TOOLS)}"),
    pytest.mark.pidns,
]
PROBE_1 = "smg-tokenspeed-probe-1"  # the probe file of a gateway that is pid 1 in its namespace
NOBODY = "65534"


def gateway_in(
    ns: PrivateShm, gateways: list[RunningGateway], tmp_path: Path, model: str, worker: str, as_uid: str | None = None
) -> RunningGateway:
    """The real gateway under mode shm, pid 1 of a new pid namespace inside ``ns`` (as ``as_uid``)."""
    prefix = ns.enter("unshare", "-p", "-f", "--mount-proc", "--kill-child")
    if as_uid is not None:
        # The uid change clears the parent-death signal unshare --kill-child set: set it again.
        prefix += ["setpriv", "--reuid", as_uid, "--regid", as_uid, "--clear-groups", "--pdeathsig", "SIGKILL"]
    cfg = GatewayConfig(
        worker_urls=(worker,),
        model_path=model,
        transport="shm",
        shm_dir=ns.shm,
        log_path=str(tmp_path / "gateway.log"),
        argv_prefix=tuple(prefix),
    )
    gw = start_gateway(cfg, ready_timeout_s=90)
    gateways.append(gw)
    return gw


def write_failures(gw: RunningGateway) -> int:
    return mm_traffic(scrape(gw.metrics_url, 10.0)).shm_write_failures


@pytest.mark.slow
@pytest.mark.parametrize("private_shm", ["1m"], indirect=True)
def test_full_tmpfs_makes_real_writes_fail_and_e2e_says_so(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A 1 MiB /dev/shm takes the gateway's 1-byte probe file but no 4.8 MB pixel_values: each write
    fails (ENOSPC), smg_mm_shm_write_failures_total counts it, the bytes go inline, and e2e says why."""
    ns = private_shm
    gw = gateway_in(ns, gateways, tmp_path, model_dir, serve_in(ns, children, model_dir))
    setting = wait_for(gw.transport_setting, what="the gateway's transport line")
    assert (setting.mode, setting.dev_writable) == ("shm", True)  # its probe passed: SHM is on
    assert write_failures(gw) == 0
    doc = json.loads(e2e_in(ns, gw, "--json", "-n", "2", "--expect", "shm", exit=3).stdout)
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["path"] == "inline"
    assert run["cause"] == "inline: SHM writes are failing (write failures +2)"
    assert run["cause_info"]["code"] == "shm_too_small"  # 1 MiB holds no 4.8 MB tensor however empty
    assert run["agree"] is True
    assert (run["mode"], run["dev_writable"]) == ("shm", True)  # from the log it writes
    assert run["metrics"]["shm_write_failures"] == 2
    assert run["metrics"]["tensors"] == {"inline": 6}
    assert run["shm_tensors_by_source"] == {"metrics": 0, "shm dir": 0, "receipts": 0}
    pixels = [r for r in run["receipts"]["receipts"] if r["key"] == "pixel_values"]
    assert [(r["payload_kind"], r["nbytes"]) for r in pixels] == [("inline", 4816896)] * 2
    # The shm dir saw each failed write: a partial file of the gateway, removed by it unread. They
    # carry pid 1 (its pid in its namespace), not the pid e2e sees it by.
    d = run["shm_dir"]
    assert d["gateway_pid"] == router_pid(gw) != 1
    assert d["name_pid"] == 1
    assert [(s["name"].startswith("smg-tokenspeed-1-"), s["end"], s["reads"]) for s in d["segments"]] == [
        (True, "cleaned", 0)
    ] * 2
    assert write_failures(gw) == 3  # the gateway's own counter: the warm-up request and the two measured
    text = e2e_in(ns, gw, "-n", "1", "--expect", "shm", exit=3).stdout
    assert "inline: SHM writes are failing (write failures +1)" in text
    assert "expected shm" in text
    assert write_failures(gw) == 5
    assert [n for n in ns.ls() if n.startswith("smg-")] == []  # every partial file was removed


@pytest.mark.slow
@pytest.mark.parametrize("private_shm", ["16m"], indirect=True)
def test_leftover_probe_file_turns_shm_off_and_e2e_names_it(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A probe file left by an earlier pid-1 gateway (here as root) makes the next pid-1 gateway's
    probe fail (EEXIST): SHM stays off with no write failure counted. Run as another uid, the gateway
    cannot remove the file either (SMG removes it whether its probe passed or not), so it stays, and
    e2e, which sees the gateway by another pid, finds it by the pid in the gateway's namespace."""
    ns = private_shm
    fd = os.open(os.path.join(ns.shm, PROBE_1), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    model = os.path.join(ns.shm, "model")  # readable by the gateway's uid (the tests' temp dir is not)
    shutil.copytree(model_dir, model)
    os.chmod(model, 0o755)  # noqa: S103 - the gateway runs as nobody and must read it
    for name in os.listdir(model):
        os.chmod(os.path.join(model, name), 0o644)
    gw = gateway_in(ns, gateways, tmp_path, "/dev/shm/model", serve_in(ns, children, "/dev/shm/model"), as_uid=NOBODY)
    setting = wait_for(gw.transport_setting, what="the gateway's transport line")
    assert (setting.mode, setting.dev_writable) == ("shm", False)  # its own account: the probe failed
    assert gw.log_lines(f"path=/dev/shm/{PROBE_1}")  # its warning names the probe file
    doc = json.loads(e2e_in(ns, gw, "--json", "-n", "2", "--expect", "shm", exit=3).stdout)
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["path"] == "inline"
    assert run["cause"].startswith(f"inline: the gateway's probe file is left over ({PROBE_1})")
    assert run["cause_info"]["code"] == "probe_file_left"
    assert run["agree"] is True
    assert (run["mode"], run["dev_writable"]) == ("shm", False)
    assert run["metrics"]["shm_write_failures"] == 0  # silent: no write is even tried
    assert run["metrics"]["tensors"] == {"inline": 6}
    d = run["shm_dir"]
    assert d["gateway_pid"] == router_pid(gw) != 1
    assert (d["name_pid"], d["probe_file_left"], d["segments"]) == (1, PROBE_1, [])
    text = e2e_in(ns, gw, "-n", "1", "--expect", "shm", exit=3).stdout
    assert "the gateway's probe file is left over" in text
    assert PROBE_1 in ns.ls()


@pytest.mark.slow
@pytest.mark.parametrize("private_shm", ["16m"], indirect=True)
def test_leftover_probe_file_the_gateway_removes_is_named_from_its_log(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """The usual case: the leftover is the gateway's uid's, so its failed probe removes it. The file is
    gone, SHM stays off, no write fails: only its start-up line (dev_writable=false) tells, and e2e
    reads that from the log the gateway writes (its open files) when it runs here."""
    ns = private_shm
    os.close(os.open(os.path.join(ns.shm, PROBE_1), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    gw = gateway_in(ns, gateways, tmp_path, model_dir, serve_in(ns, children, model_dir))
    setting = wait_for(gw.transport_setting, what="the gateway's transport line")
    assert (setting.mode, setting.dev_writable) == ("shm", False)
    assert PROBE_1 not in ns.ls()  # removed by the probe it failed
    doc = json.loads(e2e_in(ns, gw, "--json", "-n", "2", "--expect", "shm", exit=3).stdout)
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["path"] == "inline"
    assert run["cause"].startswith(
        "inline: the gateway's writability probe of /dev/shm fails (dev_writable=false in its log)"
    )
    assert f"a leftover {PROBE_1} (it removes the file as its probe fails)" in run["cause"]
    assert run["cause_info"]["code"] == "gateway_probe_failed"
    assert (run["mode"], run["dev_writable"]) == ("shm", False)
    assert run["setting_source"].startswith(f"log {gw.log_path}:")
    assert run["metrics"]["shm_write_failures"] == 0
    assert (run["shm_dir"]["name_pid"], run["shm_dir"]["probe_file_left"], run["shm_dir"]["segments"]) == (1, "", [])
    text = e2e_in(ns, gw, "-n", "1", "--expect", "shm", exit=3).stdout
    assert "dev_writable=false in its log" in text
    # (no raw byte count; the words as said, whatever the width wrapped)
    assert "setting mode shm, shm_min_bytes 64.0 KiB, dev_writable false (log " in " ".join(text.split())


@pytest.mark.slow
@pytest.mark.parametrize("private_shm", ["16m"], indirect=True)
def test_a_full_tmpfs_is_shm_full_and_gc_is_the_fix(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """16 MiB, 12 MiB of it taken by a file: the 4.8 MB writes fail (ENOSPC) although the empty dir would
    hold them, so the cause is a full dir (free it), not a too small one (enlarge it)."""
    ns = private_shm
    with open(os.path.join(ns.shm, "filler"), "wb") as f:
        f.write(bytes(12 << 20))
    gw = gateway_in(ns, gateways, tmp_path, model_dir, serve_in(ns, children, model_dir))
    assert wait_for(gw.transport_setting, what="the gateway's transport line").dev_writable is True
    doc = json.loads(e2e_in(ns, gw, "--json", "-n", "1", "--warmup", "0", "--expect", "shm", exit=3).stdout)
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["path"] == "inline"
    assert run["metrics"]["shm_write_failures"] == 1
    info = run["cause_info"]
    assert (info["code"], info["fix"]) == ("shm_full", CATALOGUE[Cause.SHM_FULL].fix)
    assert info["fix_cmd"] == ["smgshm", "gc", "--delete", "--shm-dir", "/dev/shm"]  # the gc that frees it
    text = e2e_in(ns, gw, "-n", "1", "--warmup", "0", "--expect", "shm", exit=3).stdout
    assert "not shm (shm_full)" in text
    assert f"fix: {CATALOGUE[Cause.SHM_FULL].fix}: smgshm gc --delete --shm-dir /dev/shm" in text
    # doctor where the gateway writes: its write failures are a full dir too (by the largest tensor e2e saw).
    pid = router_pid(gw)
    argv = ns.enter(*smgshm_argv("--json", "doctor", "--no-e2e", "--gateway-pid", str(pid)))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    checks = {c["name"]: c for c in json.loads(res.stdout)["result"]["checks"]}
    t = checks[f"gateway {pid} transport"]
    assert (t["status"], t["cause"], t["fix"]) == ("fail", "shm_full", CATALOGUE[Cause.SHM_FULL].fix), t
    assert checks["capacity"]["cause"] == "shm_full"
    assert res.returncode == 3, res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("private_shm", ["16m"], indirect=True)
def test_writes_refused_by_permission_are_shm_permission_where_e2e_cannot_write_either(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """The gateway (uid nobody) passed its probe at start; then its /dev/shm turned root's 0755, so every
    write fails (EACCES) with plenty of space. e2e as root can write there itself: it cannot tell why, and
    says writes fail (read the gateway's log); e2e as the gateway's uid cannot either: a permission."""
    ns = private_shm
    model = os.path.join(ns.shm, "model")  # readable by the gateway's uid (the tests' temp dir is not)
    shutil.copytree(model_dir, model)
    os.chmod(model, 0o755)  # noqa: S103 - the gateway runs as nobody and must read it
    for name in os.listdir(model):
        os.chmod(os.path.join(model, name), 0o644)
    gw = gateway_in(ns, gateways, tmp_path, "/dev/shm/model", serve_in(ns, children, "/dev/shm/model"), as_uid=NOBODY)
    assert wait_for(gw.transport_setting, what="the gateway's transport line").dev_writable is True
    os.chmod(ns.shm, 0o755)  # noqa: S103 - root's, no longer writable by others: nobody creates nothing
    args = ("--json", "-n", "1", "--warmup", "0", "--expect", "shm")
    [run] = json.loads(e2e_in(ns, gw, *args, exit=3).stdout)["result"]["runs"]
    assert (run["path"], run["metrics"]["shm_write_failures"]) == ("inline", 1)
    info = run["cause_info"]
    assert (info["code"], info["fix"]) == ("shm_writes_failing", CATALOGUE[Cause.SHM_WRITES_FAILING].fix)
    assert info["fix_cmd"] == ["smgshm", "doctor", "--shm-dir", "/dev/shm"]
    doc = json.loads(e2e_in(ns, gw, *args, exit=3, as_uid=NOBODY).stdout)
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert (run["path"], run["metrics"]["shm_write_failures"]) == ("inline", 1)
    info = run["cause_info"]
    assert (info["code"], info["fix"]) == ("shm_permission", CATALOGUE[Cause.SHM_PERMISSION].fix)
    text = e2e_in(ns, gw, "-n", "1", "--warmup", "0", "--expect", "shm", exit=3, as_uid=NOBODY).stdout
    assert "not shm (shm_permission)" in text
    assert f"fix: {CATALOGUE[Cause.SHM_PERMISSION].fix}" in text
    text = e2e_in(ns, gw, "-n", "1", "--warmup", "0", "--expect", "shm", exit=3).stdout
    assert "not shm (shm_writes_failing)" in text
    assert f"fix: {CATALOGUE[Cause.SHM_WRITES_FAILING].fix}" in text


@pytest.mark.slow
@pytest.mark.parametrize("private_shm", ["16m"], indirect=True)
def test_e2e_from_the_host_does_not_judge_a_containers_tmpfs_by_its_own(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """A gateway in its own mount namespace (a container's /dev/shm) tested by e2e from the host: the host's
    shm dir sees none of its segments. That is no evidence against SHM (no "sources disagree"): the shm dir
    view is unavailable, naming the dir to watch, and with that dir it sees them."""
    ns = private_shm
    gw = gateway_in(ns, gateways, tmp_path, model_dir, serve_in(ns, children, model_dir))
    theirs = f"/proc/{router_pid(gw)}/root/dev/shm"
    args = (
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
        "--expect",
        "shm",
    )
    [run] = run_cli(*args).json["result"]["runs"]
    assert (run["path"], run["agree"], run["cause_info"]) == ("shm", True, None)
    assert run["shm_tensors_by_source"] == {"metrics": 1, "receipts": 1}
    assert run["shm_dir"]["available"] is False
    assert run["shm_dir"]["note"].endswith(f"watch it with --shm-dir {theirs}")
    [run] = run_cli(*args, "--shm-dir", theirs).json["result"]["runs"]
    assert (run["path"], run["agree"]) == ("shm", True)
    assert run["shm_tensors_by_source"] == {"metrics": 1, "shm dir": 1, "receipts": 1}


@pytest.mark.slow
@pytest.mark.parametrize("private_shm", ["64m"], indirect=True)
def test_shm_to_a_worker_on_another_tmpfs_names_the_namespace_and_says_never_read(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """The gateway here, configured shm; its worker (a serve) in a mount namespace whose /dev/shm is
    another tmpfs. Every request fails (the worker finds no such segment). e2e names the cause the ids
    show (namespace_private_tmpfs) with its fix, and says the segments were never read."""
    worker = serve_in(private_shm, children, model_dir)
    gw = gateway(gateways, tmp_path, model_dir, worker, mode="shm")
    args = ("e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", "--warmup", "0")
    doc = run_cli("--json", *args, exit=3).json
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert (run["path"], run["failure_class"]) == ("shm", "request_failed")
    assert run["worker_namespace_id"] != doc["result"]["local_namespace_id"]
    assert [r["error_code"] for r in run["receipts"]["receipts"] if r["payload_kind"] == "shm"] == ["missing"]
    info = run["cause_info"]
    assert info is not None, run["cause"]
    assert (info["code"], info["fix"]) == ("namespace_private_tmpfs", CATALOGUE[Cause.PRIVATE_TMPFS].fix)
    assert info["fix_cmd"] == ["smgshm", "probe", "--from-gateway", gw.http_url]
    assert "never read" in run["cause"]
    assert "after the write" not in run["cause"]
    text = run_cli(*args, exit=3).stdout
    assert text.startswith("e2e: FAILED: gateway request_failed (namespace_private_tmpfs)"), text
    assert f"fix: {CATALOGUE[Cause.PRIVATE_TMPFS].fix}" in " ".join(text.split())
    # doctor: the gateway wrote SHM, but no request of it succeeded: its transport check fails, never
    # "SHM in use"; the worker's own check names the cause.
    doc = run_cli("--json", "doctor", "--gateway-pid", str(gw.pid), "--no-e2e", exit=3).json
    checks = {c["name"]: c for c in doc["result"]["checks"]}
    t = checks[f"gateway {gw.pid} transport"]
    assert (t["status"], t["code"]) == ("fail", 3), t
    assert "SHM in use" not in t["summary"]
    assert re.search(r"every one of its \d+ chat request\(s\) failed", t["summary"]), t["summary"]
    assert checks[f"gateway {gw.pid} worker grpc://{worker}"]["cause"] == "namespace_private_tmpfs"


def test_innermost_pid_is_the_pid_in_its_own_namespace(children: Children) -> None:
    p = children.spawn(["unshare", "-p", "-f", "--mount-proc", "--kill-child", "sleep", "60"])
    import psutil

    [inner] = wait_for(lambda: psutil.Process(p.pid).children(), what="the child of unshare")
    pids = wait_for(lambda: ns_pids(inner.pid), what="its NSpid line")
    assert pids == [inner.pid, 1]
    assert innermost_pid(inner.pid) == 1
    assert innermost_pid(os.getpid()) == os.getpid()
