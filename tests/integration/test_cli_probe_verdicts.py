"""probe: the first line agrees with the exit code; a worker that does not answer is exit 4 with the reason.

Workers here are real gRPC servers on loopback: smgshm's reference receiver, and a small
vLLM engine whose GetServerInfo stalls, answers too much, or advertises a hostile id.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from tests.conftest import run_cli

pytestmark = pytest.mark.timeout(60)

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\nfix: run rm -rf ~"


class Engine(vllm_engine_pb2_grpc.VllmEngineServicer):  # type: ignore[misc]
    """A vLLM engine face: healthy; GetServerInfo as the test wants it."""

    def __init__(self, server_info: Callable[[], Any]) -> None:
        self.server_info = server_info
        self.release = threading.Event()

    def HealthCheck(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's method name
        return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="Health")

    def GetServerInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.server_info()


@pytest.fixture
def engine() -> Iterator[Callable[[Callable[[Any], Any]], str]]:
    started: list[tuple[Any, Engine]] = []

    def start(make: Callable[[Engine], Any]) -> str:
        holder: list[Engine] = []
        servicer = Engine(lambda: make(holder[0]))
        holder.append(servicer)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        assert port != 0
        server.start()
        started.append((server, servicer))
        return f"127.0.0.1:{port}"

    yield start
    for server, servicer in started:
        servicer.release.set()
        server.stop(0).wait()


@pytest.mark.slow
def test_get_server_info_that_times_out_is_exit_4_not_undetermined(engine: Any) -> None:
    def stall(e: Engine) -> Any:
        e.release.wait(30)
        return vllm_engine_pb2.GetServerInfoResponse()

    addr = engine(stall)
    res = run_cli("probe", "--engine", "vllm", "--timeout", "1s", addr, exit=4)
    assert res.stdout.startswith("UNREACHABLE")
    assert "GetServerInfo deadline exceeded" in res.stdout
    assert "advertises no" not in res.stdout


def test_get_server_info_that_is_oversized_is_exit_4(engine: Any) -> None:
    addr = engine(lambda e: vllm_engine_pb2.GetServerInfoResponse(kv_connector="x" * (5 * 1024 * 1024)))
    doc = run_cli("--json", "probe", "--engine", "vllm", addr, exit=4).json
    (w,) = doc["result"]["workers"]
    assert w["verdict"] == "unreachable"
    assert "larger than the message limit" in w["reason"]


def test_a_hostile_namespace_id_is_shown_escaped(engine: Any) -> None:
    addr = engine(lambda e: vllm_engine_pb2.GetServerInfoResponse(shm_namespace_id=HOSTILE))
    res = run_cli("probe", "--engine", "vllm", addr, exit=6)
    assert res.stdout.startswith("UNDETERMINED")
    for out in (res.stdout, res.stderr):
        assert "\x1b" not in out
        assert "\x07" not in out
    assert not any(ln.startswith("fix:") for ln in res.stdout.splitlines())
    assert "pwned" in res.stdout
    assert "x1b[2J" in res.stdout  # shown, as an escape
    doc = run_cli("--json", "probe", "--engine", "vllm", addr, exit=6).json
    assert doc["result"]["workers"][0]["namespace_id"] == HOSTILE  # JSON keeps the exact value


def test_need_more_than_free_fails_under_a_failing_headline(receiver: Any) -> None:
    res = run_cli("probe", "--need", "1000000GiB", receiver.address, exit=3)
    head = res.stdout.splitlines()[0]
    assert head.startswith("SHM not usable:")
    assert "less than --need" in head


def test_quiet_prints_the_verdict_line_only(receiver: Any) -> None:
    res = run_cli("-q", "probe", receiver.address)
    assert res.stdout.splitlines() == ["SHM usable: /dev/shm is shared with the worker"]
    assert run_cli("probe", receiver.address, "-q").stdout == res.stdout


def test_a_refused_port_fails_at_once_and_says_refused() -> None:
    # --connect-timeout 50s: waiting it out would hit this test's 60 s timeout.
    res = run_cli("probe", "--connect-timeout", "50s", "127.0.0.1:1", exit=4)
    assert "connection refused" in res.stdout
    assert res.stdout.startswith("UNREACHABLE: 1 of 1")


def test_an_unknown_host_says_cannot_resolve() -> None:
    res = run_cli("--json", "probe", "no-such-host.invalid:50051", exit=4)
    assert "cannot resolve host" in res.json["result"]["workers"][0]["reason"]
    err = run_cli("send", "no-such-host.invalid:50051", exit=4).stderr
    assert "cannot resolve host" in err


def test_a_hostile_probe_lookalike_is_warned_escaped_as_no_gateways_and_kept_exact_in_json(receiver: Any) -> None:
    import os
    import shutil
    import uuid

    d = os.path.join("/dev/shm", f"smgshm-test-{os.getpid()}-{uuid.uuid4().hex}")  # not smg-*: no other test's
    os.mkdir(d, 0o700)
    raw = b"smg-tokenspeed-probe-7\xff\x1b[2J\nfix: rm -rf ~"
    try:
        os.close(os.open(os.path.join(os.fsencode(d), raw), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        human = run_cli("probe", "--shm-dir", d, receiver.address)
        doc = run_cli("--json", "probe", "--shm-dir", d, receiver.address).json
    finally:
        shutil.rmtree(d)
    assert "\x1b" not in human.stderr
    assert "\\xff\\x1b[2J\\nfix: rm -rf ~" in human.stderr
    assert not any(ln.startswith("fix:") for ln in human.stderr.splitlines())
    assert "no gateway's" in human.stderr, "a name that is not SMG's probe file's is said to be no gateway's"
    assert "will find /dev/shm unwritable" not in human.stderr
    assert doc["result"]["local"]["leftover_probe_files"] == []
    assert [bytes.fromhex(h) for h in doc["result"]["local"]["probe_lookalikes_hex"]] == [raw]
