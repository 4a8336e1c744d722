"""`smgshm send` against a real `smgshm serve` child: every dtype and layout, both paths, cleanup, failures."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.transport.tensors import DTYPES, ITEMSIZE, make_tensor, tensor_bytes
from tests.conftest import SHM, Children, closed_port, run_cli, smgshm_argv, start_serve, wait_for
from tests.support.cli_send import own_segments, receiver_has_received

pytestmark = pytest.mark.timeout(120)

LAYOUTS = ("vllm", "tokenspeed")
TRANSPORTS = ("inline", "shm")
SMALL = ("--shape", "64x64", "--shm-min-bytes", "1")  # 64x64 is below 64KiB: force SHM anyway
SMALL_ELEMS = 64 * 64
# A healthy sender gives up within a second or two of its receiver dying (gRPC fails
# fast once the channel is in TRANSIENT_FAILURE); this bound is generous.
SENDER_EXIT_DEADLINE = 20.0

ENVELOPE_KEYS = {"smgshm_version", "schema_version", "command", "ok", "result", "warnings"}
ERROR_ENVELOPE_KEYS = {"smgshm_version", "schema_version", "command", "ok", "error", "warnings"}
ERROR_KEYS = {"kind", "message", "hint"}
RESULT_KEYS = {
    "address",
    "layout",
    "mode",
    "dtype",
    "shape",
    "tensor_nbytes",
    "receiver_namespace_id",
    "receiver_unlinks",
    "receiver_uid",
    "paths",
    "problems",
    "unreachable",
    "verified",
    "stopped",
    "cancelled",
}
PATH_KEYS = {
    "path",
    "requests",
    "tensors",
    "nbytes",
    "failures",
    "mismatches",
    "leftovers",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "gb_per_s",
}
PROBLEM_KEYS = {"request", "key", "kind", "message"}


# --- helpers ----------------------------------------------------------------------------------


def remove_segments(pid: int) -> list[str]:
    """Unlink what a (killed) sender left, so the leak guard reports the test, not teardown."""
    left = own_segments(pid)
    for name in left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM, name))
    return left


def send_json(address: str, *args: str, exit: int = 0) -> dict[str, Any]:
    """``smgshm --json send ADDRESS ARGS`` in-process; the whole JSON document."""
    doc: dict[str, Any] = run_cli("--json", "send", address, *args, exit=exit).json
    return doc


def only_path(result: dict[str, Any]) -> dict[str, Any]:
    assert len(result["paths"]) == 1, result["paths"]
    path: dict[str, Any] = result["paths"][0]
    return path


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a child started by ``Children.spawn`` (its own session) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
        proc.communicate(timeout=10)


def stop_serve(proc: subprocess.Popen[str]) -> None:
    """SIGTERM a serve child and wait for it to exit (it stops cleanly on SIGTERM)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        kill_group(proc)


@pytest.fixture(scope="module")
def keeping_address() -> Iterator[str]:
    """A real `smgshm serve --keep-segments` for the module."""
    reg = Children()
    try:
        _, doc = start_serve(reg, "--keep-segments")
        assert doc["result"]["unlink_after_read"] is False
        yield doc["result"]["address"]
    finally:
        reg.reap()


# --- byte-exact round trips -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_byte_exact(address: str, dtype: str, layout: str, transport: str) -> None:
    count = 2
    doc = send_json(
        address,
        "--transport",
        transport,
        "--layout",
        layout,
        "--dtype",
        dtype,
        "--tensors",
        "3",
        "-n",
        str(count),
        *SMALL,
    )
    assert doc["ok"] is True
    r = doc["result"]
    assert (r["layout"], r["mode"], r["dtype"], r["shape"]) == (layout, transport, dtype, [64, 64])
    assert r["verified"] is True
    assert r["unreachable"] is False
    assert r["problems"] == []
    assert r["tensor_nbytes"] == SMALL_ELEMS * ITEMSIZE[dtype]
    p = only_path(r)
    assert p["path"] == transport
    assert (p["mismatches"], p["leftovers"], p["failures"]) == (0, 0, 0)
    assert p["requests"] == count
    assert p["tensors"] == 3 * count
    assert p["nbytes"] == 3 * count * SMALL_ELEMS * ITEMSIZE[dtype]
    assert own_segments() == []


def test_concurrency_4_with_16_requests(address: str) -> None:
    doc = send_json(address, "--concurrency", "4", "-n", "16", "--tensors", "2", *SMALL)
    p = only_path(doc["result"])
    assert p["path"] == "shm"
    assert p["requests"] == 16
    assert p["tensors"] == 32
    assert (p["mismatches"], p["leftovers"], p["failures"]) == (0, 0, 0)
    assert p["p99_ms"] >= p["p90_ms"] >= p["p50_ms"] > 0
    assert own_segments() == []


def test_human_ok_line(address: str) -> None:
    out = run_cli("send", address, "-n", "3", *SMALL)
    assert "OK: 3 request(s) verified, no segment left behind" in out.stdout
    assert out.stderr == ""


# --- the transport decision -------------------------------------------------------------------


@pytest.mark.slow
def test_auto_with_the_local_receiver_uses_shm(address: str) -> None:
    r = send_json(address, "--transport", "auto", *SMALL)["result"]
    assert r["mode"] == "auto"
    assert only_path(r)["path"] == "shm"
    assert only_path(r)["leftovers"] == 0


@pytest.mark.slow
def test_auto_with_another_boot_id_goes_inline(children: Children) -> None:
    foreign = f"{uuid.uuid4()}:{os.stat(SHM).st_dev}"
    _, doc = start_serve(children, "--advertise-namespace-id", foreign)
    r = send_json(doc["result"]["address"], "--transport", "auto", "--tensors", "2", *SMALL)["result"]
    assert r["receiver_namespace_id"] == foreign
    p = only_path(r)
    assert p["path"] == "inline"
    assert (p["requests"], p["tensors"], p["mismatches"]) == (1, 2, 0)


def test_tensor_below_shm_min_bytes_goes_inline_under_shm(address: str) -> None:
    # 4x4 float32 = 64 B, below 1 KiB.
    r = send_json(address, "--transport", "shm", "--shape", "4x4", "--shm-min-bytes", "1KiB")["result"]
    assert r["tensor_nbytes"] == 64
    p = only_path(r)
    assert p["path"] == "inline"
    assert (p["requests"], p["mismatches"], p["leftovers"]) == (1, 0, 0)


def test_tensor_at_shm_min_bytes_uses_shm(address: str) -> None:
    # The rule is nbytes >= shm_min_bytes: exactly at the threshold is SHM.
    r = send_json(address, "--transport", "shm", "--shape", "4x4", "--shm-min-bytes", "64")["result"]
    assert only_path(r)["path"] == "shm"


# --- a receiver that keeps segments -----------------------------------------------------------


@pytest.mark.slow
def test_keep_segments_receiver_is_leftover_and_sender_removes_them(keeping_address: str) -> None:
    doc = send_json(keeping_address, "-n", "2", "--tensors", "3", *SMALL, exit=3)
    assert doc["ok"] is False
    r = doc["result"]
    assert r["receiver_unlinks"] is False
    assert r["unreachable"] is False
    p = only_path(r)
    assert p["path"] == "shm"
    assert (p["leftovers"], p["mismatches"], p["failures"]) == (6, 0, 0)
    assert len(r["problems"]) == 6
    assert {prob["kind"] for prob in r["problems"]} == {"leftover"}
    assert all(prob["key"].startswith(f"smg-smgshm-{os.getpid()}-") for prob in r["problems"])
    assert own_segments() == []  # the sender removed what the receiver kept


def test_keep_segments_hint(keeping_address: str) -> None:
    out = run_cli("send", keeping_address, *SMALL, exit=3)
    assert "FAILED: 1 problem(s) in 1 request(s)" in out.stdout
    assert "leftover" in out.stdout
    assert "keeps segments" in out.stderr
    assert own_segments() == []


def test_keep_segments_inline_is_fine(keeping_address: str) -> None:
    # Inline tensors create no segment, so a keeping receiver leaves nothing to report.
    doc = send_json(keeping_address, "--transport", "inline", *SMALL)
    assert only_path(doc["result"])["leftovers"] == 0


# --- a receiver killed mid-run ----------------------------------------------------------------


def _send_while_receiver_dies(children: Children, count: int) -> tuple[subprocess.Popen[str], int]:
    """Start serve and a sender child, SIGKILL serve once it receives; return (sender, its pid)."""
    proc, doc = start_serve(children)
    address = doc["result"]["address"]
    sender = children.spawn(smgshm_argv("--json", "send", address, "-n", str(count), "--size", "1MiB", "-c", "2"))
    wait_for(lambda: sender.poll() is not None or receiver_has_received(address), 60, "the receiver to be busy")
    assert sender.poll() is None, "the sender ended before the receiver could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    return sender, sender.pid


@pytest.mark.slow
def test_receiver_killed_mid_run_exits_4_and_leaves_nothing(children: Children) -> None:
    import json

    sender, pid = _send_while_receiver_dies(children, 600)
    try:
        out, err = sender.communicate(timeout=SENDER_EXIT_DEADLINE)
    except subprocess.TimeoutExpired:
        kill_group(sender)
        remove_segments(pid)
        pytest.fail(f"sender still running {SENDER_EXIT_DEADLINE}s after its receiver died")
    left = remove_segments(pid)
    assert sender.returncode == 4, err
    assert left == [], "segments the sender created survived it"
    r = json.loads(out)["result"]
    assert r["unreachable"] is True
    p = only_path(r)
    assert 0 < p["requests"] <= 600  # the sender stops sending once the receiver is gone
    assert p["failures"] > 0
    if p["requests"] < 600:
        assert any(prob["kind"] == "not_sent" for prob in r["problems"])
    assert p["mismatches"] == 0
    assert any(prob["kind"] == "rpc_failed" and prob["message"].startswith("UNAVAILABLE") for prob in r["problems"])


@pytest.mark.slow
def test_receiver_killed_sender_stops_promptly(children: Children) -> None:
    sender, pid = _send_while_receiver_dies(children, 100_000)
    try:
        _, err = sender.communicate(timeout=SENDER_EXIT_DEADLINE)
    except subprocess.TimeoutExpired:
        kill_group(sender)
        remove_segments(pid)
        pytest.fail(f"sender still running {SENDER_EXIT_DEADLINE}s after its receiver died")
    left = remove_segments(pid)
    assert sender.returncode == 4, err
    assert left == []


# --- endpoints that are not a smgshm receiver -------------------------------------------------


def test_unreachable_address_exits_4() -> None:
    target = f"127.0.0.1:{closed_port()}"
    out = run_cli("send", target, "--connect-timeout", "300ms", exit=4)
    assert out.stderr.startswith("Error:"), out.stderr
    assert "connection refused" in out.stderr
    assert target in out.stderr
    assert own_segments() == []


def test_unreachable_json_error_document() -> None:
    out = run_cli("--json", "send", f"127.0.0.1:{closed_port()}", "--connect-timeout", "300ms", exit=4)
    doc = out.json
    assert set(doc) == ERROR_ENVELOPE_KEYS
    assert set(doc["error"]) == ERROR_KEYS
    assert doc["ok"] is False
    assert doc["command"] == "send"
    assert doc["error"]["kind"] == "transport"
    assert "connection refused" in doc["error"]["message"]
    assert "Error:" in out.stderr


def _health_only(server: grpc.Server) -> None:
    from grpc_health.v1 import health, health_pb2_grpc

    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)


def _vllm_only(server: grpc.Server) -> None:
    from smg_grpc_proto.generated import vllm_engine_pb2_grpc

    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(vllm_engine_pb2_grpc.VllmEngineServicer(), server)


@pytest.mark.parametrize("register", [_health_only, _vllm_only], ids=["health-only", "vllm-only"])
def test_non_smgshm_grpc_server_exits_4(register: Any) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        out = run_cli("send", f"127.0.0.1:{port}", *SMALL, exit=4)
    finally:
        server.stop(0).wait(5)
    assert "Error:" in out.stderr
    assert "not a smgshm receiver" in out.stderr
    assert "smgshm serve" in out.stderr  # the hint says what to run
    assert own_segments() == []


# --- a full shm dir ---------------------------------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path: Any) -> Iterator[str]:
    """A 1 MiB tmpfs on a tmp_path subdirectory (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(d)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        yield str(d)
    finally:
        if subprocess.run(["umount", str(d)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.slow
def test_full_shm_dir_exits_5_and_leaves_it_empty(children: Children, tiny_tmpfs: str) -> None:
    """An empty 1 MiB shm dir cannot take a 4 MiB tensor: too small (enlarge it), never "full" with a gc
    that frees nothing; with a filler in it, a tensor the empty dir would hold finds it full."""
    proc, doc = start_serve(children, "--shm-dir", tiny_tmpfs)
    try:
        assert doc["result"]["shm_dir"] == tiny_tmpfs
        out = run_cli("send", doc["result"]["address"], "--shm-dir", tiny_tmpfs, "--size", "4MiB", exit=5)
        assert "Error:" in out.stderr
        assert "shm dir is too small" in out.stderr
        assert "needed_bytes=4194304" in out.stderr
        assert "gc --delete" not in out.stderr
        assert os.listdir(tiny_tmpfs) == []
        err = run_cli("--json", "send", doc["result"]["address"], "--shm-dir", tiny_tmpfs, "--size", "4MiB", exit=5)
        assert err.json["error"]["kind"] == "no_space"
        assert err.json["error"]["hint"] == CATALOGUE[Cause.SHM_TOO_SMALL].fix

        with open(os.path.join(tiny_tmpfs, "filler"), "wb") as f:
            f.write(bytes(768 * 1024))
        out = run_cli("send", doc["result"]["address"], "--shm-dir", tiny_tmpfs, "--size", "512KiB", exit=5)
        assert "shm dir is full" in out.stderr
        assert "gc --delete" in out.stderr
        assert os.listdir(tiny_tmpfs) == ["filler"]
        os.unlink(os.path.join(tiny_tmpfs, "filler"))
    finally:
        stop_serve(proc)  # before the fixture unmounts


# --- a receiver running as another uid --------------------------------------------------------


@pytest.mark.slow
def test_receiver_as_another_uid_is_a_permission_error(children: Children) -> None:
    if os.geteuid() != 0:
        pytest.skip("running a receiver as uid 65534 needs root")
    argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    argv += smgshm_argv("--json", "serve", "--listen", "127.0.0.1:0")
    try:
        proc = children.spawn(argv, cwd="/")
    except FileNotFoundError:
        pytest.skip("setpriv is not installed")
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        pytest.skip(f"uid 65534 cannot run this venv's smgshm serve: {proc.communicate(timeout=10)[1][-500:]}")
    import json

    address = json.loads(line)["result"]["address"]

    r = send_json(address, "-n", "2", *SMALL, exit=3)["result"]
    assert r["receiver_uid"] == 65534
    assert r["unreachable"] is False
    p = only_path(r)
    assert p["path"] == "shm"
    assert p["failures"] == 2
    assert p["leftovers"] == 2  # refused, not unlinked: the sender removed them
    errors = [prob for prob in r["problems"] if prob["kind"] == "receiver_error"]
    assert len(errors) == 2
    assert all("permission" in prob["message"] for prob in errors)
    assert own_segments() == []

    out = run_cli("send", address, *SMALL, exit=3)
    assert "uid 65534" in out.stderr
    assert "keeps segments" not in out.stderr  # it does unlink; it just cannot open
    assert own_segments() == []


# --- interop with SMG's servicer reader -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_segments_read_byte_exactly_by_smg_mm_shm(dtype: str, layout: str) -> None:
    from smg_grpc_servicer import mm_shm

    from smgshm.core.segments.io import write_segment
    from smgshm.core.transport.wire import Layout, OutTensor, engine_pb2, to_tensor_data

    shape = (3, 17, 5)
    t = make_tensor(shape, dtype, seed=11)
    data = tensor_bytes(t)
    ref = write_segment(data)
    try:
        assert ref.nbytes == t.numel() * ITEMSIZE[dtype]
        td = to_tensor_data(Layout(layout), OutTensor(shape, dtype, shm=ref))
        wire = engine_pb2(Layout(layout)).TensorData.FromString(td.SerializeToString())  # as the servicer gets it
        assert mm_shm.tensor_payload_bytes(wire) == bytes(data)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ref.path)


# --- the JSON schema --------------------------------------------------------------------------


def test_json_schema_key_sets(address: str, keeping_address: str) -> None:
    ok = send_json(address, "--transport", "inline", *SMALL)
    assert set(ok) == ENVELOPE_KEYS
    assert (ok["command"], ok["schema_version"], ok["ok"], ok["warnings"]) == ("send", 1, True, [])
    assert set(ok["result"]) == RESULT_KEYS
    assert set(only_path(ok["result"])) == PATH_KEYS

    bad = send_json(keeping_address, *SMALL, exit=3)
    assert set(bad) == ENVELOPE_KEYS
    assert bad["ok"] is False
    assert set(bad["result"]) == RESULT_KEYS
    assert set(only_path(bad["result"])) == PATH_KEYS
    assert bad["result"]["problems"], "a keeping receiver must produce a problem"
    for prob in bad["result"]["problems"]:
        assert set(prob) == PROBLEM_KEYS
        assert isinstance(prob["request"], int)
    r = bad["result"]
    assert isinstance(r["shape"], list)
    assert isinstance(r["receiver_uid"], int)
    assert isinstance(r["receiver_namespace_id"], str)
    for key in ("p50_ms", "p90_ms", "p99_ms", "gb_per_s"):
        assert isinstance(only_path(r)[key], float)


# --- usage errors -----------------------------------------------------------------------------


def test_shape_and_size_together_exit_2() -> None:
    # An unreachable address: exit 2 (not 4) proves the flags are refused before connecting.
    out = run_cli("send", f"127.0.0.1:{closed_port()}", "--shape", "4x4", "--size", "64", exit=2)
    assert "exclusive" in out.stderr


@pytest.mark.parametrize(("dtype", "size"), [("float32", "6"), ("int64", "12"), ("bfloat16", "3"), ("uint32", "1026")])
def test_size_not_a_multiple_of_itemsize_exits_2(dtype: str, size: str) -> None:
    out = run_cli("send", f"127.0.0.1:{closed_port()}", "--dtype", dtype, "--size", size, exit=2)
    assert f"not a multiple of {dtype}'s item size" in out.stderr


def test_size_a_multiple_of_itemsize_is_accepted(address: str) -> None:
    # The other side of the rule: 1 KiB of int64 is a valid 1-D tensor of 128 items.
    r = send_json(address, "--dtype", "int64", "--size", "1KiB", "--shm-min-bytes", "1")["result"]
    assert (r["shape"], r["tensor_nbytes"]) == ([128], 1024)
    assert only_path(r)["mismatches"] == 0


@pytest.mark.parametrize("layout", ["vllm", "tokenspeed"])
def test_many_tensors_match_by_key_not_order(address: str, layout: str) -> None:
    """12 tensors: the receiver's map order (extra_10 before extra_2) must not read as mismatches."""
    doc = run_cli(
        "--json", "send", address, "--layout", layout, "--tensors", "12", "--shape", "16", "--shm-min-bytes", "1"
    ).json
    p = only_path(doc["result"])
    assert p["tensors"] == 12
    assert p["mismatches"] == 0
    assert doc["result"]["problems"] == []
