"""doctor finds real SMG gateways (`smg launch`) on this host and establishes their transport from evidence.

Every gateway here is real, started through smgshm/core/gateway/process.py on free loopback ports and
always stopped. The machine is shared: other runs' gateways may be found too, so each test judges
only the gateway (by pid) it started.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.gateway.log import read_transport_config
from smgshm.core.gateway.process import GatewayConfig, RunningGateway, start_gateway
from smgshm.core.gateway.running import find_gateways
from tests.conftest import Children, run_cli, wait_for
from tests.support.running_gateways import doctor_doc, mine

needs_smg = pytest.mark.gateway  # skipped where smg is missing (tests/conftest.py)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to look at a process as another uid)")


def launch(gateways: list[RunningGateway], log: Path, **kw: Any) -> RunningGateway:
    gw = start_gateway(GatewayConfig(log_path=str(log), **kw), ready_timeout_s=60)
    gateways.append(gw)
    return gw


@needs_smg
def test_doctor_finds_a_gateway_with_its_ports_and_reads_the_flag_from_its_log(
    gateways: list[RunningGateway], tmp_path: Path
) -> None:
    gw = launch(gateways, tmp_path / "gw.log", transport="shm")
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-pid", str(gw.pid))
    entry, checks = mine(doc, gw.pid)
    assert set(entry) == {"gateway", "log_path", "log", "traffic", "finding"}
    g = entry["gateway"]
    assert set(g) == {
        "pid",
        "ns_pid",
        "uid",
        "pid_namespace",
        "same_pid_namespace",
        "net_namespace",
        "same_net_namespace",
        "uptime_s",
        "ports",
        "http_url",
        "metrics_url",
        "logs",
        "inspect",
        "note",
    }
    assert set(entry["finding"]) == {
        "verdict",
        "status",
        "summary",
        "fix",
        "code",
        "evidence",
        "mode",
        "mean_tensor_bytes",
        "cause",
    }
    assert g["uid"] == os.getuid()
    assert g["inspect"] == "ok"
    assert g["same_pid_namespace"] is True
    assert g["uptime_s"] is not None
    assert g["uptime_s"] >= 0
    # Which port is which was asked of the ports themselves.
    roles = {p["port"]: p["role"] for p in g["ports"]}
    http_port = int(gw.http_url.rsplit(":", 1)[1])
    prom_port = int(gw.metrics_url.rsplit(":", 1)[1].split("/")[0])
    assert roles[http_port] == "http"
    assert roles[prom_port] == "metrics"
    assert g["http_url"] == gw.http_url
    assert g["metrics_url"] == gw.metrics_url
    # Its log was found from its open files (stdout/stderr), and its start-up line read.
    assert [log["path"] for log in g["logs"]] == [str(tmp_path / "gw.log")]
    assert entry["log"]["mode"] == "shm"
    assert entry["log"]["shm_min_bytes"] == 65536
    assert entry["log"]["dev_writable"] is True
    assert checks[f"gateway {gw.pid}"]["status"] == "ok"
    assert gw.http_url in checks[f"gateway {gw.pid}"]["summary"]
    t = checks[f"gateway {gw.pid} transport"]
    assert t["status"] == "ok", t
    assert "configured shm (log)" in t["summary"]
    # The metrics were read too: no traffic yet, and nothing failing.
    assert entry["traffic"] is not None
    assert entry["traffic"]["shm_write_failures"] == 0


@needs_smg
def test_gateway_pid_and_no_gateways_choose_what_doctor_judges(gateways: list[RunningGateway], tmp_path: Path) -> None:
    """On a shared host an operator judges their own gateway only, or none."""
    a = launch(gateways, tmp_path / "a.log", transport="shm")
    b = launch(gateways, tmp_path / "b.log", transport="inline")
    doc = doctor_doc("--shm-dir", str(tmp_path), "--no-e2e", "--gateway-pid", str(a.pid))
    assert [g["gateway"]["pid"] for g in doc["result"]["host"]["gateways"]] == [a.pid]
    assert not any(c["name"].startswith(f"gateway {b.pid}") for c in doc["result"]["checks"])
    doc = doctor_doc("--shm-dir", str(tmp_path), "--no-e2e", "--no-gateways")
    assert doc["result"]["host"]["gateways"] == []
    assert {c["name"]: c["status"] for c in doc["result"]["checks"]}["gateways"] == "skip"
    b.stop()  # a pid that is no longer a gateway: a mistyped argument (exit 2 naming it), not "unreachable"
    doc = run_cli("--json", "doctor", "--shm-dir", str(tmp_path), "--no-e2e", "--gateway-pid", str(b.pid), exit=2).json
    assert doc["error"]["kind"] == "usage"
    assert f"no process has pid {b.pid}" in doc["error"]["message"]


@needs_smg
@pytest.mark.parametrize(
    ("flag", "env", "mode"),
    [
        (None, {"SMG_MM_TENSOR_TRANSPORT": "auto"}, "auto"),
        ("inline", {"SMG_MM_TENSOR_TRANSPORT": "shm"}, "inline"),  # the flag wins over the environment
        (None, {}, "inline"),  # SMG's default
    ],
)
def test_mode_set_by_environment_is_read_from_the_log(
    gateways: list[RunningGateway], tmp_path: Path, flag: str | None, env: dict[str, str], mode: str
) -> None:
    gw = launch(gateways, tmp_path / "gw.log", transport=flag, env=env)
    # The environment cannot be read back from /proc: the process title overwrote it.
    with open(f"/proc/{gw.pid}/environ", "rb") as f:
        assert b"SMG_MM_TENSOR_TRANSPORT" not in f.read()
    found = {g.pid: g for g in find_gateways()}
    assert gw.pid in found
    config = read_transport_config(str(tmp_path / "gw.log"))
    assert config is not None
    assert config.mode == mode
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-pid", str(gw.pid))
    _, checks = mine(doc, gw.pid)
    t = checks[f"gateway {gw.pid} transport"]
    if mode == "inline":
        assert t["status"] == "warn"
        assert "configured inline (log): SHM is off" in t["summary"]
        assert "--multimodal-tensor-transport auto" in t["fix"]
        assert t["cause"] == "mode_inline"
    else:
        assert t["status"] == "ok"
        assert t["cause"] is None
        assert f"configured {mode} (log)" in t["summary"]


@needs_smg
def test_an_unknown_mode_is_logged_as_inline_with_the_gateways_warning(
    gateways: list[RunningGateway], tmp_path: Path
) -> None:
    gw = launch(gateways, tmp_path / "gw.log", env={"SMG_MM_TENSOR_TRANSPORT": "shmm"})
    # The gateway's background logger may write the warning a moment after it is ready (a loaded host).
    config = wait_for(
        lambda: (c := read_transport_config(gw.log_path)) is not None and c.warnings and c,
        30,
        "the gateway's start-up line and its warning in its log",
    )
    assert config.mode == "inline"
    assert any("unknown transport value" in w for w in config.warnings), config.warnings


@needs_smg
def test_a_named_log_no_running_gateway_holds_is_reported_as_such(
    gateways: list[RunningGateway], tmp_path: Path
) -> None:
    gw = launch(gateways, tmp_path / "gw.log", transport="auto")
    gw.stop()
    copy = tmp_path / "old gateway.log"  # a space: the name is shown as given
    shutil.copy(tmp_path / "gw.log", copy)
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-log", str(copy))
    c = {x["name"]: x for x in doc["result"]["checks"]}[f"gateway log {copy}"]
    assert c["status"] == "ok"
    assert "configured auto (log)" in c["summary"]
    assert "no running gateway here has this log open" in c["summary"]


@pytest.mark.slow
def test_a_missing_log_fails_its_check_with_exit_5(tmp_path: Path) -> None:
    missing = tmp_path / "no such.log"
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-log", str(missing))
    assert set(doc["result"]["host"]) == {"gateways", "shm_usage", "capacity", "page_policy", "last_what_if"}
    c = {x["name"]: x for x in doc["result"]["checks"]}[f"gateway log {missing}"]
    assert c["status"] == "fail"
    assert c["code"] == 5
    assert "cannot read the gateway log" in c["summary"]


@pytest.mark.slow
def test_a_fifo_given_as_the_log_fails_the_check_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "gw.log"
    os.mkfifo(fifo)
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-log", str(fifo))
    c = {x["name"]: x for x in doc["result"]["checks"]}[f"gateway log {fifo}"]
    assert c["status"] == "fail"
    assert c["code"] == 5
    assert "not a regular file" in c["summary"]


@needs_smg
@needs_root
def test_a_gateway_of_another_uid_is_reported_as_not_inspectable(
    gateways: list[RunningGateway], tmp_path: Path, children: Children
) -> None:
    gw = launch(gateways, tmp_path / "gw.log", transport="shm")
    code = (
        # encodings.idna: getaddrinfo loads it lazily, at the first dial of another gateway found here.
        "import json, os, concurrent.futures, encodings.idna\n"
        "from dataclasses import asdict\n"
        "import prometheus_client.parser, smgshm.core.gateway.http, smgshm.core.gateway.metrics\n"
        "from smgshm.core.gateway.running import find_gateways\n"
        # Imports first (the interpreter's own files may be root's alone), then become nobody.
        "os.setgid(65534); os.setuid(65534)\n"
        "print(json.dumps([asdict(g) for g in find_gateways()]))\n"
    )
    p = children.spawn([sys.executable, "-c", code], cwd=str(Path(__file__).resolve().parents[2]))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    seen = {g["pid"]: g for g in json.loads(out)}
    g = seen[gw.pid]
    assert g["inspect"] == "permission_denied"
    assert g["uid"] == 0, "the owner is still told (from /proc/PID/status)"
    assert g["ports"] == [], "nothing is guessed"
    assert g["logs"] == []
    assert "not readable by uid 65534" in g["note"]


@pytest.mark.pidns
@needs_smg
@needs_root
def test_a_gateway_in_other_pid_and_network_namespaces_is_seen_but_its_ports_not_dialled(
    children: Children, tmp_path: Path
) -> None:
    smg = str(Path(sys.executable).parent / "smg")
    log = tmp_path / "ns gw.log"
    inner = (
        f"ip link set lo up 2>/dev/null; exec {shlex.quote(smg)} launch --host 127.0.0.1 --port 30000 "
        "--prometheus-host 127.0.0.1 --prometheus-port 29000 --disable-tokenizer-autoload "
        f"--multimodal-tensor-transport shm > {shlex.quote(str(log))} 2>&1"
    )
    p = children.spawn(["unshare", "--pid", "--fork", "--net", "--mount-proc", "sh", "-c", inner])

    def found() -> Any:
        for g in find_gateways():
            try:  # another test's gateway may be gone by now: only this test's counts
                with open(f"/proc/{g.pid}/status", encoding="ascii") as f:
                    ppid = next(int(ln.split()[1]) for ln in f if ln.startswith("PPid:"))
            except FileNotFoundError:
                continue
            if ppid == p.pid and len(g.ports) == 2 and g.logs:
                return g
        return None

    g = wait_for(found, 60, "the namespaced gateway to listen")
    assert g.same_pid_namespace is False
    assert g.ns_pid == 1, "its pid in its own namespace: the pid its segments are named with"
    assert g.same_net_namespace is False
    assert {(pt.port, pt.role) for pt in g.ports} == {(30000, "unknown"), (29000, "unknown")}, "listed, never dialled"
    assert (g.http_url, g.metrics_url) == ("", "")
    assert g.inspect == "partial"
    assert "another network namespace" in g.note
    assert "pid 1" in g.note
    # Its log is read through /proc/PID/fd, whatever mount namespace it lives in.
    doc = doctor_doc("--shm-dir", str(tmp_path), "--gateway-pid", str(g.pid))
    _, checks = mine(doc, g.pid)
    assert "configured shm (log)" in checks[f"gateway {g.pid} transport"]["summary"]


def test_find_gateways_ignores_other_processes(children: Children) -> None:
    # A process whose argv merely mentions the title is not a gateway.
    p = children.spawn([sys.executable, "-c", "import time; time.sleep(30)", "smg::router"])
    assert p.pid not in {g.pid for g in find_gateways(probe=False)}
