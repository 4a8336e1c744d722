"""Shared by the tests of receiver_attack (moved out of tests/test_receiver_attack.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2

HUGE = 2**32 - 1


def _file(d: Path, name: str, data: bytes) -> Path:
    p = d / name
    p.write_bytes(data)
    p.chmod(0o600)
    return p


def _td(name: str, nbytes: int, shape: list[int] | None = None, dtype: str = "uint8") -> Any:
    return vllm_engine_pb2.TensorData(
        shape=shape if shape is not None else [nbytes],
        dtype=dtype,
        shm=common_pb2.ShmHandle(name=name, offset=0, nbytes=nbytes, owner_id="smg:1"),
    )


def _mm(pixels: Any, extras: dict[str, Any] | None = None) -> Any:
    mm = vllm_engine_pb2.MultimodalInputs(pixel_values=pixels)
    for k, v in (extras or {}).items():
        mm.model_specific_tensors[k].CopyFrom(v)
    return mm


def _health(ch: grpc.Channel, service: str = "", timeout: float = 30) -> int:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    req = health_pb2.HealthCheckRequest(service=service)
    return int(health_pb2_grpc.HealthStub(ch).Check(req, timeout=timeout).status)
