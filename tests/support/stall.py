"""A filesystem that stops answering, for real: a FUSE mount whose server never reads /dev/fuse. Every
call that reaches it (a stat, an open through it) waits in the kernel (D state, ``fuse_get_req``) until
the device is closed, which aborts the connection and fails them all (ENOTCONN). A process may still keep
a handle to it: an ``O_PATH`` open of its root asks the server nothing."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

needs_fuse = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse")

# Keeps an O_PATH fd to its argv[1] (the stalled mount), says "ready", waits for stdin to close.
KEEPER = "import os, sys; keep = os.open(sys.argv[1], os.O_PATH); print('ready', flush=True); sys.stdin.read()"


@contextlib.contextmanager
def stalled_fuse(path: Path) -> Iterator[str]:
    """A FUSE mount at ``path`` nobody serves; at the end the device closed (every waiter released) and
    the mount gone."""
    path.mkdir(parents=True, exist_ok=True)
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0".encode()
    try:
        if libc.mount(b"smgshm-stall", os.fsencode(path), b"fuse", 0, opts) != 0:
            err = ctypes.get_errno()
            pytest.skip(f"cannot mount FUSE here: {os.strerror(err)}")
        try:
            yield str(path)
        finally:
            os.close(dev)  # first: whatever waits on it fails now, the umount included
            dev = -1
            subprocess.run(["umount", "-l", str(path)], timeout=30, check=False)
    finally:
        if dev >= 0:
            os.close(dev)


def keeper_argv(mnt: str) -> list[str]:
    return [sys.executable, "-c", KEEPER, mnt]
