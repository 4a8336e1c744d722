"""core/gateway/process: the real gateway started, judged ready, and always stopped with nothing left."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from smgshm.core.errors import HostError, TransportError
from smgshm.core.gateway.process import (
    PIP_HINT,
    GatewayConfig,
    find_smg,
    free_port,
    remove_gateway_segments,
    start_gateway,
)
from tests.conftest import SHM, Children, closed_port, start_serve, wait_for

needs_smg = pytest.mark.gateway  # skipped where smg is missing (tests/conftest.py)


def gone(pid: int) -> bool:
    """No process group ``pid`` is left (the gateway and anything it spawned)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_find_smg_missing_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HostError) as exc:
        find_smg()
    assert exc.value.hint == PIP_HINT == "pip install 'smgshm[gateway]'"


def test_remove_gateway_segments_only_touches_that_pid_and_regular_files(scratch: list[str]) -> None:
    pid = 2**22 + 12345  # above any default pid_max: not a live process's
    mine = [f"smg-tokenspeed-{pid}-{time.time_ns()}-0", f"smg-tokenspeed-probe-{pid}"]
    others = [f"smg-tokenspeed-{pid + 1}-{time.time_ns()}-0", f"smg-smgshm-{pid}-{time.time_ns()}-0"]
    for name in mine + others:
        path = os.path.join(SHM, name)
        scratch.append(path)
        Path(path).write_bytes(b"x")
    link = f"smg-tokenspeed-{pid}-{time.time_ns()}-1"
    scratch.append(os.path.join(SHM, link))
    os.symlink("/etc/hostname", os.path.join(SHM, link))
    assert sorted(remove_gateway_segments(pid)) == sorted(mine)
    for name in others:
        assert os.path.exists(os.path.join(SHM, name))
    assert os.path.islink(os.path.join(SHM, link))


@needs_smg
@pytest.mark.timeout(120)
def test_gateway_started_ready_and_stopped_with_its_segments(children: Children, tmp_path: Path) -> None:
    _, ready = start_serve(children)
    address = ready["result"]["address"]
    log = tmp_path / "gw.log"
    with start_gateway(GatewayConfig(worker_urls=(address,), transport="shm", log_path=str(log))) as gw:
        assert gw.alive()
        [w] = gw.workers()
        assert w["url"] == f"grpc://{address}"
        assert w["is_healthy"] is True
        setting = wait_for(gw.transport_setting, 20, "the transport line")
        assert setting.mode == "shm"
        # What a crashed request would leave: a payload named with the gateway's pid.
        left = os.path.join(SHM, f"smg-tokenspeed-{gw.pid}-{time.time_ns()}-7")
        Path(left).write_bytes(b"\0" * 64)
        pid = gw.pid
    assert gone(pid)
    assert not os.path.exists(left)
    assert gw.removed_segments == [os.path.basename(left)]
    assert "smgshm: " in log.read_text()
    assert "--multimodal-tensor-transport shm" in log.read_text()


@needs_smg
@pytest.mark.timeout(60)
def test_not_ready_in_time_is_a_transport_error_and_leaves_no_process(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{closed_port()}"  # nobody listens: the worker never turns healthy
    with pytest.raises(TransportError) as exc:
        start_gateway(GatewayConfig(worker_urls=(dead,), log_path=str(tmp_path / "gw.log")), ready_timeout_s=3)
    assert exc.value.fields["log"] == str(tmp_path / "gw.log")
    started = [ln for ln in (tmp_path / "gw.log").read_text().splitlines() if ln.startswith("# smgshm:")]
    assert started, "the log names the command it ran"


@needs_smg
def test_gateway_that_exits_at_start_is_a_host_error(tmp_path: Path) -> None:
    cfg = GatewayConfig(extra_args=("--no-such-flag-smgshm",), log_path=str(tmp_path / "gw.log"))
    with pytest.raises(HostError) as exc:
        start_gateway(cfg, ready_timeout_s=30)
    assert exc.value.fields["exit_code"] != 0
    assert str(tmp_path / "gw.log") in (exc.value.hint or "")


_HOLDER = """
import sys, time
from smgshm.core.gateway.process import GatewayConfig, start_gateway
with start_gateway(GatewayConfig(worker_urls=(sys.argv[1],), log_path=sys.argv[2])) as gw:
    print(gw.pid, flush=True)
    time.sleep(120)
"""


@needs_smg
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_parent_interrupted_or_killed_leaves_no_gateway(children: Children, tmp_path: Path, sig: int) -> None:
    """Ctrl-C stops it through the context manager; a SIGKILLed parent through PR_SET_PDEATHSIG."""
    _, ready = start_serve(children)
    holder = children.spawn([sys.executable, "-c", _HOLDER, ready["result"]["address"], str(tmp_path / "gw.log")])
    assert holder.stdout is not None
    line = holder.stdout.readline()
    assert line.strip(), holder.stderr.read() if holder.stderr else ""
    gw_pid = int(line)
    assert not gone(gw_pid)
    holder.send_signal(sig)
    holder.wait(30)
    wait_for(lambda: gone(gw_pid), 30, "the gateway to be gone")
    if sig == signal.SIGINT:
        assert holder.returncode != 0
        assert holder.stderr is not None
        assert "KeyboardInterrupt" in holder.stderr.read()
    for name in os.listdir(SHM):
        assert not name.startswith(f"smg-tokenspeed-{gw_pid}-")


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
