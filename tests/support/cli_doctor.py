"""Shared by the tests of cli_doctor (moved out of tests/test_cli_doctor.py)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import mounted_tmpfs, run_cli

SHM = "/dev/shm"


ENVELOPE = {"smgshm_version", "schema_version", "command", "ok", "result", "warnings"}


RESULT_KEYS = {"checks", "embedded_receiver", "workers", "host"}


CHECK_KEYS = {"name", "status", "summary", "fix", "code", "fix_cmd", "names_hex", "cause"}


STATUSES = {"ok", "warn", "fail", "skip", "info", "unknown"}


SEVERITY = [4, 5, 3, 6, 1, 0]  # the documented order: the worst code of the failing checks wins


IS_ROOT = os.geteuid() == 0


# The leak check trusts a dead-looking pid only from the host's initial pid namespace (and
# doctor has no --assume-dead), so leak verdicts are only asserted there.
needs_init_pidns = pytest.mark.skipif(
    os.readlink("/proc/self/ns/pid") != "pid:[4026531836]",
    reason="leak verdicts need the host's initial pid namespace",
)


def worst(codes: list[int]) -> int:
    return min(codes or [0], key=SEVERITY.index)


def doctor(*args: str, exit: int) -> dict[str, Any]:
    """``smgshm --json doctor ARGS``: assert the exit code, the document's shape, and its self-consistency."""
    doc: dict[str, Any] = run_cli("--json", "doctor", "--no-gateways", *args, exit=exit).json
    assert set(doc) == ENVELOPE, doc
    assert doc["command"] == "doctor"
    assert doc["schema_version"] == 1
    assert set(doc["result"]) == RESULT_KEYS
    checks = doc["result"]["checks"]
    assert checks, "doctor ran no checks"
    for c in checks:
        assert set(c) == CHECK_KEYS, c
        assert c["status"] in STATUSES, c
        assert isinstance(c["code"], int)
        assert c["summary"], c
        if c["status"] == "unknown":  # judged nothing: exit 6, or nothing asked (doctor --node's liveness)
            assert c["code"] in (0, 6), c
        elif c["status"] != "fail":
            assert c["code"] == 0, c
    assert exit == worst([c["code"] for c in checks if c["status"] in ("fail", "unknown")]), checks
    assert doc["ok"] is (exit == 0)
    return doc


def checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> check, asserting the names are unique (where one worker is checked)."""
    names = [c["name"] for c in doc["result"]["checks"]]
    assert len(names) == len(set(names)), names
    return {c["name"]: c for c in doc["result"]["checks"]}


T = TypeVar("T")


def trusted(shm_dir: str, run: Callable[[], T], timeout: float = 60.0) -> T:
    """``run()``, again (bounded) until pid liveness in ``shm_dir`` was trusted both before and
    after it: on a shared machine another job's pid namespace can reach the dir for a while, and
    doctor then rightly calls a leak unknown. Skips if that never ends."""
    from smgshm.core.host.pidtrust import judge_trust

    def ok() -> bool:
        t = judge_trust(shm_dir)
        return t.trusted and not t.doubt_uids

    deadline = time.monotonic() + timeout
    while True:
        before = ok()
        try:
            out = run()
        except AssertionError:
            if before and ok():
                raise  # trusted throughout: a real failure
        else:
            if before and ok():
                return out
        if time.monotonic() >= deadline:
            pytest.skip(f"pid liveness in {shm_dir} stayed untrusted (another pid namespace reaches it)")
        time.sleep(1)


def unique() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex}"


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[str]:
    """A private tmpfs shm dir: a 32 MiB mount as root, else a dir on /dev/shm not named smg-*."""
    if IS_ROOT:
        with mounted_tmpfs(tmp_path / f"shm-{unique()}", "32m") as d:
            yield d
        return
    d = os.path.join(SHM, f"smgshm-test-{unique()}")
    os.mkdir(d, 0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
