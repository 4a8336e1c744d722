"""`smgshm e2e` against the real gateway: the path judged from metrics, the shm dir and receipts."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from smgshm.core.gateway.process import RunningGateway
from tests.conftest import SHM, Children, closed_port, run_cli, smgshm_argv, start_serve, wait_for
from tests.support.e2e import FOREIGN_ID, gateway, mm_shm_worker
from tests.support.json_schema import check_e2e_schema


def e2e_json(gw: RunningGateway, *args: str, exit: int = 0) -> dict:  # type: ignore[type-arg]
    argv = ["--json", "e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "2", *args]
    doc = run_cli(*argv, exit=exit).json
    check_e2e_schema(doc)
    return doc["result"]


@pytest.mark.gateway
@pytest.mark.parametrize("mode", ["shm", "inline"])
def test_non_smgshm_worker_verdict_from_metrics_and_shm_dir(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str, mode: str
) -> None:
    """A worker that only reads through SMG's mm_shm: no receipts, yet the verdict is right."""
    gw = gateway(gateways, tmp_path, model_dir, mm_shm_worker(children, model_dir), mode=mode)
    [run] = e2e_json(gw, "--expect", mode)["runs"]
    assert run["path"] == mode
    assert run["agree"] is True
    assert run["receipts"]["available"] is False
    assert run["shm_dir"]["available"] is True
    assert run["shm_dir"]["gateway_pid"] == gw.pid
    assert [r["ok"] for r in run["requests"]] == [True, True]
    assert {r["stream"] for r in run["requests"]} == {False, True}  # both ways by default
    m = run["metrics"]
    if mode == "shm":
        # pixel_values via SHM per request; image_grid_thw and patches_per_image inline (below 64 KiB).
        assert m["tensors"] == {"shm": 2, "inline": 4}
        assert run["shm_tensors_by_source"] == {"metrics": 2, "shm dir": 2}
        assert [s["end"] for s in run["shm_dir"]["segments"]] == ["consumed", "consumed"]
        assert all(s["nbytes"] in (4816896, None) for s in run["shm_dir"]["segments"])  # None: unlinked before stat
        assert run["cause"].startswith("SHM: ")
        assert "below shm_min_bytes 64.0 KiB" in run["cause"]
    else:
        assert m["tensors"] == {"inline": 6}
        assert run["shm_dir"]["segments"] == []
        assert "mode is inline" in run["cause"]
        assert run["cause_info"]["code"] == "mode_inline"


@pytest.mark.gateway
def test_expect_shm_with_foreign_id_exits_3_naming_the_cause(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    addr = mm_shm_worker(children, model_dir, FOREIGN_ID)
    gw = gateway(gateways, tmp_path, model_dir, addr, mode="auto")
    [run] = e2e_json(gw, "--expect", "shm", exit=3)["runs"]
    assert run["path"] == "inline"
    assert run["as_expected"] is False
    assert "another namespace id" in run["cause"]
    assert run["cause_info"]["code"] == "namespace_other_host"
    assert run["worker_namespace_id"] == FOREIGN_ID
    res = run_cli("e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", "--expect", "shm", exit=3)
    assert "another namespace id" in res.stdout


@pytest.mark.gateway
def test_serve_worker_receipts_agree(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """Behind a smgshm serve the receipts are a third account, and all three agree."""
    _, ready = start_serve(children, "--model-dir", model_dir)
    gw = gateway(gateways, tmp_path, model_dir, ready["result"]["address"], mode="auto")
    [run] = e2e_json(gw, "--expect", "shm")["runs"]
    assert run["receipts"]["available"] is True
    assert run["shm_tensors_by_source"] == {"metrics": 2, "shm dir": 2, "receipts": 2}
    shm = [r for r in run["receipts"]["receipts"] if r["payload_kind"] == "shm"]
    assert {r["key"] for r in shm} == {"pixel_values"}
    assert all(r["unlinked"] for r in shm)
    assert {r["shm_name"] for r in shm} == {s["name"] for s in run["shm_dir"]["segments"]}
    assert "pixel_values" in run["cause"]


@pytest.mark.gateway
def test_another_gateways_metrics_are_never_judged(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """Another gateway's metrics beside this gateway's segments: refused (exit 4) before any request,
    the hint naming its own (it was judged: undetermined at best, a wrong verdict at worst)."""
    addr = mm_shm_worker(children, model_dir)
    a = gateway(gateways, tmp_path, model_dir, addr, mode="shm")
    b = gateway(gateways, tmp_path, model_dir, addr, mode="shm")
    e2e_json(b, "-n", "1")  # b has now metered tensors: its counters are exported
    res = run_cli("e2e", "--gateway", a.http_url, "--metrics", b.metrics_url, "-n", "1", exit=4)
    assert f"served by pid {b.pid}, not by the gateway (pid {a.pid})" in res.stderr
    assert f"--metrics {a.metrics_url}" in res.stderr


@pytest.mark.gateway
def test_running_tests_the_gateway_found_here(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """--running finds the gateway by its process title, with its HTTP and metrics ports; none is typed."""
    _, ready = start_serve(children, "--model-dir", model_dir)
    gw = gateway(gateways, tmp_path, model_dir, ready["result"]["address"], mode="shm")
    doc = run_cli("--json", "e2e", "--gateway-pid", str(gw.pid), "-n", "1", "--expect", "shm").json
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["path"] == "shm"
    assert run["gateway_url"] == gw.http_url
    assert run["metrics_url"] == gw.metrics_url  # found by asking its ports, not typed
    assert run["shm_dir"]["gateway_pid"] == gw.pid
    # A second gateway here: --running alone must not guess between them (exit 2, both named).
    other = gateway(gateways, tmp_path, model_dir, ready["result"]["address"], mode="inline")
    res = run_cli("e2e", "--running", exit=2)
    assert str(gw.pid) in res.stderr
    assert str(other.pid) in res.stderr
    assert "--gateway-pid" in res.stderr
    # The embedded default says that gateways run here, and how to test one.
    res = run_cli("e2e", "--mode", "inline", "-n", "1", "--warmup", "0")
    assert "smgshm e2e --running" in res.stderr


def test_unreachable_gateway_exits_4() -> None:
    res = run_cli("e2e", "--gateway", f"http://127.0.0.1:{closed_port()}", exit=4)
    assert "refused" in res.stderr or "unreachable" in res.stderr


@pytest.mark.gateway
def test_embedded_default_shm_auto_inline_and_nothing_left(model_dir: str) -> None:
    doc = run_cli("--json", "e2e", "-n", "2", "--model-dir", model_dir).json
    check_e2e_schema(doc)
    r = doc["result"]
    assert doc["ok"] is True
    assert r["embedded"] is True
    assert [(x["label"], x["path"]) for x in r["runs"]] == [("shm", "shm"), ("auto", "shm"), ("inline", "inline")]
    for x in r["runs"]:
        assert x["agree"] is True
        assert x["receipts"]["available"] is True
        assert x["p50_ms"] > 0
        assert x["failure_class"] == ""
    assert r["removed_at_stop"] == []
    assert r["processes_left"] == []
    assert [x["gateway_log"] for x in r["runs"]] == ["", "", ""], "a passing run names no log"
    assert gateway_logs_of(r) == [], "a passing run leaves no gateway log in the temp dir"


def gateway_logs_of(result: dict) -> list[str]:  # type: ignore[type-arg]
    """The temp dir's smgshm-gateway-* logs written by this run's gateways (judged by their --port)."""
    ports = {urlsplit(x["gateway_url"]).port for x in result["runs"]}
    tmp, found = tempfile.gettempdir(), []
    for name in os.listdir(tmp):
        if name.startswith("smgshm-gateway-"):
            with contextlib.suppress(OSError), open(os.path.join(tmp, name), encoding="utf-8", errors="replace") as f:
                if any(f" --port {p} " in f.readline() for p in ports):
                    found.append(name)
    return found


@pytest.mark.gateway
def test_embedded_gateway_log_dir_keeps_the_logs_and_names_them(model_dir: str, tmp_path: Path) -> None:
    argv = [
        "--json",
        "e2e",
        "-n",
        "1",
        "--model-dir",
        model_dir,
        "--mode",
        "inline",
        "--gateway-log-dir",
        str(tmp_path),
    ]
    [run] = run_cli(*argv).json["result"]["runs"]
    assert os.path.dirname(run["gateway_log"]) == str(tmp_path)
    with open(run["gateway_log"], encoding="utf-8") as f:
        assert f.readline().startswith("# smgshm: ")


@pytest.mark.gateway
def test_embedded_foreign_id_auto_falls_back(model_dir: str) -> None:
    argv = [
        "--json",
        "e2e",
        "-n",
        "1",
        "--model-dir",
        model_dir,
        "--mode",
        "auto",
        "--advertise-namespace-id",
        FOREIGN_ID,
    ]
    # Configured auto gone inline is a failure by default (issue #22; it used to be "expected inline", exit 0).
    [run] = run_cli(*argv, exit=3).json["result"]["runs"]
    assert run["path"] == "inline"
    assert run["expected"] == "shm"
    assert run["as_expected"] is False
    assert "another namespace id" in run["cause"]
    assert run["cause_info"]["code"] == "namespace_other_host"  # FOREIGN_ID names another boot id


@pytest.mark.gateway
def test_configured_auto_gone_inline_fails_with_its_cause_and_fix(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """No --expect: the gateway's log says auto, its worker advertises a foreign id: exit 3, code, fix line."""
    addr = mm_shm_worker(children, model_dir, FOREIGN_ID)
    gw = gateway(gateways, tmp_path, model_dir, addr, mode="auto")
    [run] = e2e_json(gw, exit=3)["runs"]
    assert run["mode"] == "auto"
    assert run["path"] == "inline"
    assert run["as_expected"] is False
    cause = run["cause_info"]
    assert cause["code"] == "namespace_other_host"
    assert cause["fix"]
    assert cause["fix_cmd"] == ["smgshm", "probe", "--from-gateway", gw.http_url]
    res = run_cli("e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1", exit=3)
    assert res.stdout.startswith("e2e: FAILED: gateway not shm (namespace_other_host)")
    assert "fix: SHM needs gateway and worker on one host" in res.stdout
    assert f"smgshm probe --from-gateway {gw.http_url}" in res.stdout
    # --expect any accepts whatever path the tensors took.
    [run] = e2e_json(gw, "-n", "1", "--expect", "any")["runs"]
    assert run["path"] == "inline"
    assert run["as_expected"] is True


@pytest.mark.gateway
def test_dead_worker_is_the_headline_and_no_latency(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    addr = mm_shm_worker(children, model_dir)
    worker = children.procs[-1]
    gw = gateway(gateways, tmp_path, model_dir, addr, mode="shm")
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(10)
    argv = [
        "e2e",
        "--gateway",
        gw.http_url,
        "--metrics",
        gw.metrics_url,
        "-n",
        "1",
        "--warmup",
        "0",
        "--timeout",
        "10s",
    ]
    # An endpoint unreachable (4), not "SHM not used" (3): its cause's code in the headline, as in JSON.
    res = run_cli(*argv, exit=4)
    host_port = addr.removeprefix("grpc://")
    assert res.stdout.startswith("e2e: FAILED: gateway: worker "), res.stdout
    head = " ".join(res.stdout.split("\n[", 1)[0].split())
    assert f"{host_port} unreachable" in head
    assert head.endswith("(worker_unreachable)"), head
    assert "p50" not in res.stdout
    assert "0/1 requests ok" in res.stdout
    doc = run_cli("--json", *argv, exit=4).json
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["cause_info"]["code"] == "worker_unreachable"
    assert doc["ok"] is False
    # doctor's e2e check says the same: the endpoint's fault (4), with the cause.
    argv = ["--json", "doctor", "--gateway-pid", str(gw.pid), "--from-gateway", gw.http_url]
    doc = run_cli(*argv, "--metrics", gw.metrics_url, "--timeout", "5s", exit=4).json
    e2e = {c["name"]: c for c in doc["result"]["checks"]}[f"e2e {gw.http_url}"]
    assert (e2e["status"], e2e["code"], e2e["cause"]) == ("fail", 4, "worker_unreachable"), e2e


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_stops_every_gateway_and_leaves_no_segment(
    children: Children, model_dir: str, sig: int, code: int
) -> None:
    p = children.spawn(smgshm_argv("e2e", "-n", "200", "--model-dir", model_dir))
    me = psutil.Process(p.pid)

    def gateways_up() -> list[int]:
        kids = []
        for c in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # a child may end while we look (a gateway that lost a port)
                if "smg" in " ".join(c.cmdline()[:3]):
                    kids.append(c.pid)
        return kids if len(kids) >= 3 else []

    assert p.stderr is not None
    for line in p.stderr:  # progress on stderr: interrupt it mid-traffic, not at start-up
        if re.match(r"requests: \d+/600 answered", line):  # piped: the first answer, then each quarter
            break
    else:
        raise AssertionError(f"e2e ended before its traffic: exit {p.wait(60)}")
    # Counted now, with traffic flowing: a gateway that lost a port race at start-up has been
    # replaced by then, so these are the ones that must be stopped.
    pids = wait_for(gateways_up, 60, "e2e's three gateways")
    p.send_signal(sig)
    assert p.wait(60) == code
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    left = [n for n in os.listdir(SHM) if any(n.startswith(f"smg-tokenspeed-{x}-") for x in pids)]
    assert left == []


@pytest.mark.gateway
def test_doctor_from_gateway_includes_the_e2e_check(
    children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """doctor --from-gateway: the gateway's real image traffic judged beside the worker checks."""
    addr = mm_shm_worker(children, model_dir, FOREIGN_ID)
    gw = gateway(gateways, tmp_path, model_dir, addr, mode="auto")
    argv = [
        "--json",
        "doctor",
        "--gateway-pid",
        str(gw.pid),
        "--from-gateway",
        gw.http_url,
        "--metrics",
        gw.metrics_url,
        "--timeout",
        "5s",
    ]
    doc = run_cli(*argv, exit=3).json
    checks = {c["name"]: c for c in doc["result"]["checks"]}
    e2e = checks[f"e2e {gw.http_url}"]
    # Configured auto gone inline fails (issue #22 item 2; it used to be a warning).
    assert e2e["status"] == "fail"
    assert e2e["summary"].startswith("expected shm: ")
    assert "another namespace id" in e2e["summary"]
    assert "metrics, shm dir" in e2e["summary"]
    assert checks[f"probe grpc://{addr}"]["status"] == "fail"  # the foreign id, named by probe too
