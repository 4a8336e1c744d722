"""The real SMG gateway (`smg launch`, 1.13.0) registers `smgshm serve` as a healthy vLLM worker.

No model is needed: the gateway calls HealthCheck, GetModelInfo and GetServerInfo through
the vLLM stubs and records the worker's ``shm_namespace_id`` as a label (smg-facts §5.1).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.namespace import read_namespace_id
from tests.conftest import Children, run_cli, start_serve, wait_for

SMG = Path(sys.executable).parent / "smg"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PINNED_ID = "00000000-0000-4000-8000-000000000000:1"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not SMG.exists(), reason=f"SMG gateway script not installed at {SMG}"),
]


def free_port() -> int:
    """A loopback port nobody is listening on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Gateway:
    """A running `smg launch` child whose stdout and stderr go to files."""

    def __init__(self, proc: subprocess.Popen[str], port: int, out: Path, err: Path) -> None:
        self.proc = proc
        self.port = port
        self.out = out
        self.err = err

    def logs(self) -> str:
        """Both log streams so far, ANSI colour codes stripped."""
        text = "".join(p.read_text(errors="replace") for p in (self.out, self.err) if p.exists())
        return ANSI.sub("", text)

    def workers(self) -> dict[str, Any] | None:
        """GET /workers, or None while the gateway is not answering yet."""
        if self.proc.poll() is not None:
            raise AssertionError(f"gateway exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/workers", timeout=2) as resp:
                doc: dict[str, Any] = json.loads(resp.read())
                return doc
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return None

    def healthy_worker(self, url: str) -> dict[str, Any] | None:
        doc = self.workers()
        if doc is None:
            return None
        for w in doc.get("workers", []):
            if w.get("url") == url and w.get("is_healthy") is True:
                found: dict[str, Any] = w
                return found
        return None


def launch_gateway(children: Children, tmp_path: Path, *worker_addresses: str) -> Gateway:
    port, prom = free_port(), free_port()
    out, err = tmp_path / "gateway.stdout", tmp_path / "gateway.stderr"
    argv = [
        str(SMG),
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *(f"grpc://{a}" for a in worker_addresses),
        "--multimodal-tensor-transport",
        "auto",
        "--disable-tokenizer-autoload",
        "--prometheus-port",
        str(prom),
    ]
    with out.open("w") as fo, err.open("w") as fe:
        proc = children.spawn(argv, stdout=fo, stderr=fe)
    return Gateway(proc, port, out, err)


def registered(children: Children, tmp_path: Path, *serve_args: str) -> tuple[dict[str, Any], dict[str, Any], Gateway]:
    """Start serve and a gateway pointing at it; return (serve ready doc, worker info, gateway)."""
    _, ready = start_serve(children, *serve_args)
    address = ready["result"]["address"]
    gw = launch_gateway(children, tmp_path, address)
    worker = wait_for(lambda: gw.healthy_worker(f"grpc://{address}"), 60, "the gateway to report the worker healthy")
    return ready, worker, gw


def test_gateway_registers_serve_as_healthy_vllm_worker(children: Children, tmp_path: Path) -> None:
    ready, worker, gw = registered(children, tmp_path)
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
    wait_for(lambda: "mode=auto" in gw.logs(), 20, "the gateway to log its transport mode")
    assert re.search(r"Multimodal tensor transport configured mode=auto", gw.logs())


def test_gateway_records_pinned_namespace_label(children: Children, tmp_path: Path) -> None:
    ready, worker, _ = registered(children, tmp_path, "--advertise-namespace-id", PINNED_ID)
    assert ready["result"]["namespace_id"] == PINNED_ID
    assert read_namespace_id() != PINNED_ID
    # A stale or pinned id is what the gateway keeps: smgshm probe can then show the mismatch.
    assert worker["labels"]["shm_namespace_id"] == PINNED_ID
    assert worker["status"] == "ready"
    assert worker["runtime_type"] == "vllm"


def test_probe_from_real_gateway_with_several_workers(children: Children, tmp_path: Path) -> None:
    """`probe --from-gateway` against `smg launch` with a vLLM and a TokenSpeed worker registered."""
    _, vllm = start_serve(children)
    _, ts = start_serve(children, "--engine", "tokenspeed")
    addrs = [vllm["result"]["address"], ts["result"]["address"]]
    gw = launch_gateway(children, tmp_path, *addrs)
    for a in addrs:
        wait_for(lambda a=a: gw.healthy_worker(f"grpc://{a}"), 60, f"the gateway to report {a} healthy")
    doc = run_cli("--json", "probe", "--from-gateway", f"http://127.0.0.1:{gw.port}").json
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
