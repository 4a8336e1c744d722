"""Shared by the tests of cli_send (moved out of tests/test_cli_send.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest

from tests.conftest import SHM, Children, start_serve


def own_segments(pid: int | None = None, shm_dir: str = SHM) -> list[str]:
    """smgshm segments a process (default: this one, the in-process sender) has in ``shm_dir``."""
    prefix = f"smg-smgshm-{os.getpid() if pid is None else pid}-"
    return sorted(n for n in os.listdir(shm_dir) if n.startswith(prefix))


def receiver_has_received(address: str) -> bool:
    """The receiver's vLLM GetServerInfo says a Receive has started (last_receive_timestamp)."""
    from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        try:
            info = vllm_engine_pb2_grpc.VllmEngineStub(ch).GetServerInfo(
                vllm_engine_pb2.GetServerInfoRequest(), timeout=5
            )
        except grpc.RpcError:
            return False
    return bool(info.last_receive_timestamp)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    """One real `smgshm serve` (unlinks after read) for the whole module, reaped at the end."""
    reg = Children()
    try:
        _, doc = start_serve(reg)
        yield doc["result"]["address"]
    finally:
        reg.reap()
