"""Shared by the tests of core_receiver (moved out of tests/test_core_receiver.py)."""

from __future__ import annotations

import os

from smgshm.core.segments.io import ShmRef, write_segment
from smgshm.core.transport.tensors import make_tensor, tensor_bytes

SHM = "/dev/shm"


def _seg(scratch: list[str], data: bytes) -> ShmRef:
    ref = write_segment(data)
    scratch.append(ref.path)
    return ref


def _fake_ref(name: str, nbytes: int) -> ShmRef:
    return ShmRef(name=name, offset=0, nbytes=nbytes, owner_id=f"smg:{os.getpid()}", shm_dir=SHM)


def _tensor(shape: tuple[int, ...], dtype: str, seed: int) -> bytes:
    return bytes(tensor_bytes(make_tensor(shape, dtype, seed)))
