"""The real `smgshm serve` subprocess: ready document, signals, binding, engines and receipts."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.segments.io import ShmRef, owner_id, write_segment
from smgshm.core.transport.tensors import DIGEST_ALGO, digest
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal
from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc
from tests.conftest import SHM, Children, smgshm_argv, start_serve

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
BIG = 256 * MiB
READY_KEYS = {"smgshm_version", "schema_version", "command", "ok", "result", "warnings"}
RESULT_KEYS = {
    "address",
    "engine",
    "engine_service",
    "namespace_id",
    "reader",
    "unlink_after_read",
    "shm_dir",
    "pid",
    "model_dir",
    "served_model_name",
    "log_receipts",
    "fault",
}


@contextlib.contextmanager
def channel(address: str) -> Iterator[grpc.Channel]:
    opts = [("grpc.max_send_message_length", BIG), ("grpc.max_receive_message_length", BIG)]
    with grpc.insecure_channel(address, options=opts) as ch:
        yield ch


def receive(address: str, msg: Any, timeout: float = 30.0, request_id: str = "t") -> Any:
    """One Diagnostics.Receive of a vLLM MultimodalInputs message."""
    req = diag_pb2.ReceiveRequest(
        request_id=request_id, layout=diag_pb2.LAYOUT_VLLM, multimodal_inputs=msg.SerializeToString()
    )
    with channel(address) as ch:
        return diag_pb2_grpc.DiagnosticsStub(ch).Receive(req, timeout=timeout)


def inline_msg(data: bytes) -> Any:
    return build_multimodal(Layout.VLLM, Request(OutTensor((len(data),), "uint8", inline=data)))


def shm_msg(ref: ShmRef) -> Any:
    return build_multimodal(Layout.VLLM, Request(OutTensor((ref.nbytes,), "uint8", shm=ref)))


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 30.0) -> tuple[int, str, str]:
    """Signal serve and collect (exit code, stdout, stderr)."""
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


# --- the ready document and line ------------------------------------------------------------


@pytest.mark.slow
def test_json_ready_document_keys(children: Children) -> None:
    proc, doc = start_serve(children)
    assert set(doc) == READY_KEYS
    assert set(doc["result"]) == RESULT_KEYS
    assert doc["command"] == "serve"
    assert doc["ok"] is True
    assert doc["schema_version"] == 1
    assert doc["warnings"] == []
    r = doc["result"]
    assert r["address"].startswith("127.0.0.1:")
    assert int(r["address"].rsplit(":", 1)[1]) > 0
    assert r["engine"] == "vllm"
    assert r["engine_service"] == "vllm.grpc.engine.VllmEngine"
    assert r["namespace_id"] == read_namespace_id()
    assert r["reader"] == "view"
    assert r["unlink_after_read"] is True
    assert r["shm_dir"] == SHM
    assert r["pid"] == proc.pid


@pytest.mark.slow
def test_human_ready_line(children: Children) -> None:
    # A wide pipe: the banner on one line (it wraps at 80 columns: tests/test_cli_columns.py).
    proc = children.spawn(smgshm_argv("serve", "--listen", "127.0.0.1:0"), env={**os.environ, "COLUMNS": "400"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "ready on 127.0.0.1:" in line, line
    assert "vllm worker" in line
    assert read_namespace_id() in line
    code, _, err = stop(proc)
    assert code == 0, err
    assert "stopping" in err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly(children: Children, sig: signal.Signals) -> None:
    proc, doc = start_serve(children)
    address = doc["result"]["address"]
    with channel(address) as ch:  # it answers before the signal ...
        grpc.channel_ready_future(ch).result(timeout=30)
    code, out, err = stop(proc, sig)
    assert code == 0, err
    assert "Traceback" not in err
    assert out == ""  # nothing after the one ready document
    with socket.socket() as s:  # ... and has let go of its port after it
        host, port = address.rsplit(":", 1)
        assert s.connect_ex((host, int(port))) != 0


# --- binding ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_non_loopback_listen_warns(children: Children) -> None:
    proc, doc = start_serve(children, "--listen", "0.0.0.0:0")
    assert doc["result"]["address"].startswith("0.0.0.0:")
    assert len(doc["warnings"]) == 1
    assert "NOT loopback" in doc["warnings"][0]
    code, _, err = stop(proc)
    assert code == 0, err
    assert "NOT loopback" in err


def busy_port_serve(children: Children, env: dict[str, str] | None = None) -> tuple[int, str, int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = children.spawn(smgshm_argv("serve", "--listen", f"127.0.0.1:{port}"), env=env)
        _, err = proc.communicate(timeout=60)
    return proc.returncode, err, port


@pytest.mark.slow
def test_port_in_use_exits_4(children: Children) -> None:
    code, err, port = busy_port_serve(children)
    assert code == 4, err
    errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, err
    # The message may wrap to the terminal width: continuation lines are indented.
    message = " ".join(ln.strip() for ln in err.splitlines())
    assert f"127.0.0.1:{port}" in message
    assert "cannot bind" in message
    assert "address in use" in message
    assert "Traceback" not in err


@pytest.mark.slow
def test_port_in_use_stderr_is_only_the_error_line(children: Children) -> None:
    code, err, _ = busy_port_serve(children, env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"})
    assert code == 4
    # Only the error (wrapped lines are indented continuations), no gRPC log noise.
    lines = err.splitlines()
    assert lines[0].startswith("Error:"), err
    assert all(ln.startswith(" ") for ln in lines[1:]), err


@pytest.mark.slow
def test_unix_socket_listen(children: Children) -> None:
    from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

    path = f"/tmp/smgshm-test-{os.getpid()}-{uuid.uuid4().hex[:12]}.sock"
    try:
        proc, doc = start_serve(children, "--listen", f"unix:{path}")
        assert doc["result"]["address"] == f"unix:{path}"
        assert doc["warnings"] == []  # a unix socket counts as local
        assert os.path.exists(path)
        with channel(f"unix:{path}") as ch:
            info = vllm_engine_pb2_grpc.VllmEngineStub(ch).GetServerInfo(
                vllm_engine_pb2.GetServerInfoRequest(), timeout=10
            )
        assert info.shm_namespace_id == read_namespace_id()
        assert info.server_type == "smgshm"
        code, _, err = stop(proc)
        assert code == 0, err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@pytest.mark.slow
def test_tokenspeed_engine_advertises_namespace_in_scheduler_info(children: Children) -> None:
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2, tokenspeed_scheduler_pb2_grpc

    _, doc = start_serve(children, "--engine", "tokenspeed")
    assert doc["result"]["engine"] == "tokenspeed"
    assert doc["result"]["engine_service"] == "tokenspeed.grpc.scheduler.TokenSpeedScheduler"
    with channel(doc["result"]["address"]) as ch:
        stub = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(ch)
        info = stub.GetServerInfo(tokenspeed_scheduler_pb2.GetServerInfoRequest(), timeout=10)
    assert info.scheduler_info["shm_namespace_id"] == read_namespace_id()
    assert info.scheduler_info["shm_namespace_id"] == doc["result"]["namespace_id"]


# --- receiving tensors ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("keep", [True, False], ids=["keep-segments", "unlink-after-read"])
def test_shm_receive_unlinks_unless_keep_segments(children: Children, keep: bool) -> None:
    _, doc = start_serve(children, *(["--keep-segments"] if keep else []))
    assert doc["result"]["unlink_after_read"] is (not keep)
    data = os.urandom(256 * 1024)
    ref = write_segment(data)
    try:
        assert os.path.exists(ref.path)
        resp = receive(doc["result"]["address"], shm_msg(ref), request_id="shm-1")
        assert resp.request_id == "shm-1"
        assert len(resp.receipts) == 1
        rc = resp.receipts[0]
        assert not rc.HasField("error"), rc.error
        assert rc.key == "pixel_values"
        assert rc.payload_kind == "shm"
        assert rc.shm_name == ref.name
        assert rc.nbytes == len(data)
        assert rc.digest_algo == DIGEST_ALGO
        assert rc.digest == digest(data)
        assert rc.unlinked is (not keep)
        assert os.path.exists(ref.path) is keep
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ref.path)


@pytest.mark.slow
def test_100mib_inline_round_trips(children: Children) -> None:
    _, doc = start_serve(children)
    data = os.urandom(100 * MiB)
    resp = receive(doc["result"]["address"], inline_msg(data), timeout=60)
    (rc,) = resp.receipts
    assert not rc.HasField("error"), rc.error
    assert rc.payload_kind == "inline"
    assert list(rc.shape) == [len(data)]
    assert rc.nbytes == len(data)
    assert rc.digest == digest(data)


@pytest.mark.slow
def test_request_over_max_message_bytes_is_resource_exhausted(children: Children) -> None:
    _, doc = start_serve(children, "--max-message-bytes", "1MiB")
    address = doc["result"]["address"]
    with pytest.raises(grpc.RpcError) as info:
        receive(address, inline_msg(os.urandom(2 * MiB)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Under the limit it still works.
    small = os.urandom(64 * 1024)
    (rc,) = receive(address, inline_msg(small)).receipts
    assert rc.digest == digest(small)


@pytest.mark.slow
def test_fifo_handle_is_refused_without_hanging(children: Children) -> None:
    _, doc = start_serve(children)
    address = doc["result"]["address"]
    name = f"smg-smgshm-test-fifo-{os.getpid()}-{uuid.uuid4().hex}"
    path = os.path.join(SHM, name)
    os.mkfifo(path, 0o600)
    try:
        ref = ShmRef(name=name, offset=0, nbytes=16, owner_id=owner_id(), shm_dir=SHM)
        resp = receive(address, shm_msg(ref), timeout=30)  # a hang would be DEADLINE_EXCEEDED
        (rc,) = resp.receipts
        assert rc.HasField("error")
        assert rc.error.code == "not_regular", rc.error
        assert rc.unlinked is False
        assert os.path.exists(path)  # a refused segment is left to its producer
        # The server is still serving.
        data = os.urandom(4096)
        (ok,) = receive(address, inline_msg(data), timeout=30).receipts
        assert not ok.HasField("error")
        assert ok.digest == digest(data)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def test_fault_options_are_checked_before_serving() -> None:
    from tests.conftest import run_cli

    assert "--fault" in run_cli("serve", "--fault", "explode", exit=2).stderr
    assert "at most 60s" in run_cli("serve", "--fault-delay", "61s", exit=2).stderr
