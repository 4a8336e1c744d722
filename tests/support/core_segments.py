"""Shared by the tests of core_segments (moved out of tests/test_core_segments.py)."""

from __future__ import annotations

import os
import uuid

import pytest

SHM = "/dev/shm"


def _name() -> str:
    return f"smg-smgshm-test-{os.getpid()}-{uuid.uuid4().hex}"


def _make_file(scratch: list[str], data: bytes) -> str:
    """A 0600 regular file in /dev/shm holding ``data``; returns its name."""
    name = _name()
    path = os.path.join(SHM, name)
    scratch.append(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return name


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod and unshare need root")
