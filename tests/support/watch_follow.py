"""Shared by the tests of watch_follow (moved out of tests/test_watch_follow.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from smgshm.core.watch.follow import ShmEvent, ShmWatcher
from tests.conftest import wait_for


@pytest.fixture
def prefix() -> str:
    """Only this test's segments: the shared /dev/shm carries other helpers' traffic."""
    return f"smg-smgshm-{os.getpid()}-"


@pytest.fixture
def tmpfs(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A private tmpfs mounted for this test alone, always unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a private tmpfs needs root")
    mnt = os.path.join(str(tmp_path), "shm")
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=1777", "smgshm-test", mnt], check=True)
    try:
        yield mnt
    finally:
        while os.path.ismount(mnt):  # also whatever a test mounted over it
            subprocess.run(["umount", "-l", mnt], check=False)


def collect(w: ShmWatcher, until: object, timeout: float = 30.0) -> list[ShmEvent]:
    """Read events until ``until(events)`` holds (bounded)."""
    got: list[ShmEvent] = []

    def more() -> bool:
        got.extend(w.events(0.05))
        return bool(until(got))  # type: ignore[operator]

    wait_for(more, timeout, "inotify events")
    return got


def removed(name: str) -> object:
    return lambda evs: any(e.kind == "removed" and e.name == name for e in evs)
