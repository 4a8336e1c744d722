"""Tensors as SMG carries them: raw little-endian bytes plus a dtype name and a shape.

torch is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

import ctypes
import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from smgshm.core.errors import WireError

if TYPE_CHECKING:
    import torch

# SMG's dtype names (tensor_wire.PROTO_DTYPE_MAP) and their item sizes.
ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "uint8": 1,
    "int64": 8,
    "uint32": 4,
}
DTYPES = tuple(ITEMSIZE)
DIGEST_ALGO = "xxh3_128"


def expected_nbytes(shape: Sequence[int], dtype: str) -> int:
    """prod(shape) x itemsize, refusing dtypes SMG does not know."""
    if dtype not in ITEMSIZE:
        raise WireError("unsupported dtype", dtype=dtype, supported=",".join(DTYPES))
    if any(d < 0 for d in shape):
        raise WireError("negative dimension in shape", shape=list(shape))
    return math.prod(shape) * ITEMSIZE[dtype]


def check_payload(shape: Sequence[int], dtype: str, nbytes: int) -> None:
    """The check SMG's ``tensor_from_parts`` makes: payload length must match."""
    want = expected_nbytes(shape, dtype)
    if want != nbytes:
        raise WireError("payload length does not match shape and dtype", expected=want, got=nbytes, dtype=dtype)


def digest(data: memoryview | bytes | bytearray) -> bytes:
    """The digest receipts carry: xxh3-128 of the payload.

    Verification runs on every payload, so its cost is the bench's floor: sha256 runs at
    ~1.7 GB/s here and blake2b at ~0.7, xxh3 at ~25 (4 % of a 64 MiB SHM round trip
    instead of 40 %). The sender chooses the bytes, so a non-cryptographic 128-bit hash
    is enough to catch a transport that changed them.
    """
    import xxhash

    return xxhash.xxh3_128_digest(data)


def digest_mismatch(algo: str, got: bytes, want: bytes) -> str | None:
    """Why a receipt's digest does not vouch for ``want``, or None when it does."""
    if algo != DIGEST_ALGO:
        return f"the receiver digests with {algo or 'nothing'!r}, this smgshm with {DIGEST_ALGO!r}: upgrade one side"
    if got != want:
        return "the receiver's digest differs from the sender's"
    return None


def torch_dtype(dtype: str) -> torch.dtype:
    import torch

    expected_nbytes((), dtype)
    found: torch.dtype = getattr(torch, dtype)  # a dtype's name: expected_nbytes has checked it
    return found


def make_tensor(shape: Sequence[int], dtype: str, seed: int) -> torch.Tensor:
    """A reproducible test tensor of any SMG dtype (random bits for integers too)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    td = torch_dtype(dtype)
    if td.is_floating_point:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32).to(td)
    info = torch.iinfo(td)
    lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(lo, hi, tuple(shape), generator=gen, dtype=torch.int64).to(td)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor (little-endian on every SMG host)."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise WireError("tensor must be contiguous and on the CPU", device=str(t.device))
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(b"")
    # A ctypes array over the tensor's memory: no copy, and it works for bfloat16,
    # which numpy cannot represent. The caller keeps ``t`` alive while it uses the view.
    return memoryview((ctypes.c_uint8 * nbytes).from_address(t.data_ptr())).cast("B")


_quiet_readonly = False


def _quiet_readonly_warning() -> None:
    # torch.frombuffer warns (once) that a read-only buffer gives a tensor it must not write
    # to; the receiver only reads, and copying to get a writable buffer is what it avoids.
    global _quiet_readonly
    if not _quiet_readonly:
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        _quiet_readonly = True


def tensor_from_payload(data: memoryview | bytes | bytearray, shape: Sequence[int], dtype: str) -> torch.Tensor:
    """Build a tensor over ``data`` without copying (``torch.frombuffer``; read-only buffers too)."""
    import torch

    if memoryview(data).readonly:
        _quiet_readonly_warning()

    check_payload(shape, dtype, memoryview(data).nbytes)
    if memoryview(data).nbytes == 0:
        return torch.empty(tuple(shape), dtype=torch_dtype(dtype))
    return torch.frombuffer(data, dtype=torch_dtype(dtype)).reshape(tuple(shape))
