"""Verification is exact: a lying receiver never gets "verified" from send, probe --verify or bench.

The liar is a real gRPC server on loopback that reads every tensor honestly with smgshm's
own receiver code (so segments are consumed and unlinked as usual), then forges the
receipts it returns: duplicated under the first key, invented keys without digests,
dropped, stripped of their digest, or under another algorithm.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from smgshm.core.transport.tensors import DIGEST_ALGO
from smgshm.core.transport.verify import Sent, judge, receipt_key
from smgshm.core.transport.wire import Layout, OutTensor, Request, build_multimodal, parse_multimodal
from smgshm.rpc.v1 import diag_pb2_grpc
from tests.conftest import run_cli

pytestmark = pytest.mark.timeout(120)

Forge = Callable[[list[Any]], list[Any]]


def _dup_first(rs: list[Any]) -> list[Any]:
    return [_copy(rs[0]) for _ in rs]


def _unknown_key(rs: list[Any]) -> list[Any]:
    fake = _copy(rs[-1])
    fake.key = "model_specific_tensors[extra_99]"
    fake.digest = b""
    fake.digest_algo = ""
    return [*rs[:-1], fake]


def _drop_last(rs: list[Any]) -> list[Any]:
    return rs[:-1]


def _no_digest(rs: list[Any]) -> list[Any]:
    out = [_copy(r) for r in rs]
    out[0].digest = b""
    return out


def _other_algo(rs: list[Any]) -> list[Any]:
    out = [_copy(r) for r in rs]
    out[-1].digest_algo = "sha256"
    return out


def _extra_receipt(rs: list[Any]) -> list[Any]:
    return [*rs, _copy(rs[0])]


FORGERIES: dict[str, Forge] = {
    "duplicates_of_the_first": _dup_first,
    "an_unknown_key_without_digest": _unknown_key,
    "a_missing_receipt": _drop_last,
    "a_missing_digest": _no_digest,
    "another_algorithm": _other_algo,
    "one_receipt_too_many": _extra_receipt,
}


def _copy(r: Any) -> Any:
    from smgshm.rpc.v1 import diag_pb2

    c = diag_pb2.TensorReceipt()
    c.CopyFrom(r)
    return c


class Liar(diag_pb2_grpc.DiagnosticsServicer):  # type: ignore[misc]
    """A Diagnostics server that reads honestly and answers with forged receipts (other RPCs: UNIMPLEMENTED)."""

    def __init__(self, forge: Forge) -> None:
        self.forge = forge

    def Identity(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's method name
        from smgshm.core.host.namespace import read_namespace_id
        from smgshm.rpc.v1 import diag_pb2

        return diag_pb2.IdentityResponse(
            namespace_id=read_namespace_id(),
            uid=os.getuid(),
            unlink_after_read=True,
            max_message_bytes=64 * 1024 * 1024,
        )

    def Receive(self, request: Any, context: Any) -> Any:  # noqa: N802
        from smgshm.core.receiver.reader import ReceiverConfig, receive
        from smgshm.rpc.v1 import diag_pb2

        layout = Layout.VLLM if request.layout == diag_pb2.LAYOUT_VLLM else Layout.TOKENSPEED
        honest = diag_pb2.ReceiveResponse(request_id=request.request_id)
        for r in receive(layout, request.multimodal_inputs, ReceiverConfig()):
            honest.receipts.add(
                key=r.key,
                payload_kind=r.payload_kind,
                dtype=r.dtype,
                shape=list(r.shape),
                nbytes=r.nbytes,
                digest_algo=DIGEST_ALGO,
                digest=r.digest,
                unlinked=r.unlinked,
            )
        out = diag_pb2.ReceiveResponse(request_id=request.request_id)
        out.receipts.extend(self.forge(list(honest.receipts)))
        return out


@pytest.fixture
def liar() -> Iterator[Callable[[Forge], str]]:
    servers: list[Any] = []

    def start(forge: Forge) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        diag_pb2_grpc.add_DiagnosticsServicer_to_server(Liar(forge), server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        assert port != 0
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(0).wait()


def test_receipt_keys_are_the_keys_the_receiver_gives() -> None:
    for layout in Layout:
        extras = {f"extra_{k}": OutTensor((1,), "uint8", inline=b"x") for k in range(1, 12)}
        msg = build_multimodal(layout, Request(OutTensor((1,), "uint8", inline=b"x"), extras)).SerializeToString()
        got = {t.key for t in parse_multimodal(layout, msg)}
        assert got == {receipt_key(layout), *(receipt_key(layout, k) for k in extras)}


@pytest.mark.parametrize("transport", ["inline", "shm"])
@pytest.mark.parametrize("layout", ["vllm", "tokenspeed"])
def test_an_honest_receiver_verifies(liar: Callable[[Forge], str], transport: str, layout: str) -> None:
    addr = liar(lambda rs: rs)
    doc = run_cli(
        "--json",
        "send",
        "--transport",
        transport,
        "--layout",
        layout,
        "--shape",
        "64x64",
        "--shm-min-bytes",
        "1",
        "--tensors",
        "3",
        "-n",
        "2",
        addr,
    ).json
    assert doc["ok"] is True
    assert doc["result"]["paths"][0]["mismatches"] == 0


@pytest.mark.parametrize("transport", ["inline", "shm"])
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_send_to_a_lying_receiver_is_a_mismatch(liar: Callable[[Forge], str], forgery: str, transport: str) -> None:
    addr = liar(FORGERIES[forgery])
    res = run_cli(
        "--json",
        "send",
        "--transport",
        transport,
        "--shape",
        "64x64",
        "--shm-min-bytes",
        "1",
        "--tensors",
        "3",
        "-n",
        "2",
        addr,
        exit=3,
    )
    doc = res.json
    assert doc["ok"] is False
    path = doc["result"]["paths"][0]
    assert path["mismatches"] >= 2, path  # at least one per request, counted in `wrong`
    problems = doc["result"]["problems"]
    assert {p["kind"] for p in problems} == {"mismatch"}
    assert all(p["key"] for p in problems), "every mismatch names its key"
    human = run_cli(
        "send", "--transport", transport, "--shape", "64x64", "--shm-min-bytes", "1", "--tensors", "3", addr, exit=3
    ).stdout
    assert human.startswith("FAILED")
    assert "verified" not in human.splitlines()[0]


def test_the_unknown_key_is_named(liar: Callable[[Forge], str]) -> None:
    addr = liar(_unknown_key)
    doc = run_cli("--json", "send", "--transport", "inline", "--shape", "64x64", "--tensors", "3", addr, exit=3).json
    keys = {p["key"]: p["message"] for p in doc["result"]["problems"]}
    assert "never sent" in keys["model_specific_tensors[extra_99]"]
    assert "no receipt" in keys["model_specific_tensors[extra_2]"]


# The forgeries that mean something for a request of one tensor (the canary, a bench payload).
SINGLE = sorted(set(FORGERIES) - {"duplicates_of_the_first"})


@pytest.mark.parametrize("forgery", SINGLE)
def test_probe_verify_canary_against_a_liar_fails(liar: Callable[[Forge], str], forgery: str) -> None:
    from smgshm.core.client.probe import ProbeOptions, verify_canary
    from smgshm.core.transport.channel import open_channel

    channel = open_channel(liar(FORGERIES[forgery]), 5.0)
    try:
        result = verify_canary(channel, ProbeOptions(verify=True))
    finally:
        channel.close()
    assert result.ok is False
    assert result.code == "mismatch"


@pytest.mark.parametrize("forgery", SINGLE)
def test_bench_against_a_liar_exits_3(liar: Callable[[Forge], str], forgery: str) -> None:
    res = run_cli("--json", "bench", liar(FORGERIES[forgery]), "--sizes", "4KiB", "-n", "1", "--warmup", "0", exit=3)
    assert res.json["error"]["kind"] == "verification_failed"


def test_judge_without_digests_still_matches_keys() -> None:
    from smgshm.rpc.v1 import diag_pb2

    sent = [Sent("pixel_values", None, "shm", 4), Sent("model_specific_tensors[extra_1]", None, "shm", 4)]
    r = diag_pb2.TensorReceipt(key="pixel_values", payload_kind="shm", nbytes=4)
    assert judge(sent, [r, r]).mismatches == 2  # a duplicate, and extra_1 missing
    ok = judge(sent, [r, diag_pb2.TensorReceipt(key="model_specific_tensors[extra_1]", payload_kind="shm", nbytes=4)])
    assert ok.ok


def _hostile_error(rs: list[Any]) -> list[Any]:
    out = [_copy(r) for r in rs]
    out[0].error.code = "bad\x1b[2J"
    out[0].error.message = "refused\n\x1b]0;pwned\x07fix: rm -rf ~"
    return out


def test_a_receivers_hostile_error_text_is_shown_escaped(liar: Callable[[Forge], str]) -> None:
    res = run_cli("send", "--transport", "inline", "--shape", "64x64", liar(_hostile_error), exit=3)
    for out in (res.stdout, res.stderr):
        assert "\x1b" not in out
        assert "\x07" not in out
    assert not any(ln.startswith("fix:") for ln in res.stdout.splitlines())
    assert "refused\\n\\x1b]0;pwned\\x07fix: rm -rf ~" in res.stdout
    doc = run_cli("--json", "send", "--transport", "inline", "--shape", "64x64", liar(_hostile_error), exit=3).json
    assert doc["result"]["problems"][0]["kind"] == "receiver_error"
    assert "\x1b]0;pwned" in doc["result"]["problems"][0]["message"]  # JSON keeps the exact text
