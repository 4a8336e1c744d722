"""A soak: concurrent senders against one real receiver for a bounded time.

Four sender processes (SHM, SHM with three tensors, inline, auto), two requests in
flight each, against one `smgshm serve`, for ``--soak-seconds`` (40 s by default, so
that CI stays inside its budget; `pytest tests/test_soak.py --soak-seconds 600` by
hand). Afterwards the shm dir holds exactly what it held before, no request failed
or mismatched, and the receiver's memory stayed flat; its peak RSS is reported.
"""

from __future__ import annotations

import json
import statistics
import time

import psutil
import pytest

from tests.conftest import Children, own_smg_entries, smgshm_argv, start_serve

MIB = 1024 * 1024
SENDERS = [
    ("--transport", "shm", "--size", "1MiB"),
    ("--transport", "shm", "--size", "256KiB", "--tensors", "3", "--dtype", "bfloat16"),
    ("--transport", "inline", "--size", "512KiB", "--layout", "tokenspeed"),
    ("--transport", "auto", "--size", "4MiB", "--dtype", "uint8"),
]
# Allowed growth of the receiver's RSS from just after warm-up to the end of the soak:
# allocator noise and gRPC's buffers, far below what one leaked 1 MiB tensor per request adds.
FLAT_MIB = 48


def _smg_count() -> int:
    # Only what this test's processes made: other runs on the machine come and go meanwhile.
    return len(own_smg_entries())


@pytest.mark.slow
def test_soak_concurrent_senders_leave_nothing_and_memory_stays_flat(
    children: Children, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    seconds: float = request.config.getoption("--soak-seconds")
    before = _smg_count()
    serve, doc = start_serve(children)
    address = doc["result"]["address"]
    proc = psutil.Process(serve.pid)
    senders = [
        children.spawn(smgshm_argv("--json", "send", address, "--duration", f"{seconds}s", "-c", "2", *args))
        for args in SENDERS
    ]
    rss: list[int] = []
    deadline = time.monotonic() + seconds + 90  # the senders stop on their own at `seconds`
    while any(s.poll() is None for s in senders) and time.monotonic() < deadline:
        rss.append(proc.memory_info().rss)
        time.sleep(0.25)
    docs = []
    for s in senders:
        out, err = s.communicate(timeout=30)
        assert s.returncode == 0, f"sender exited {s.returncode}: {err[-500:]}"
        docs.append(json.loads(out))

    requests = 0
    for d in docs:
        r = d["result"]
        assert d["ok"] is True, r["problems"][:3]
        assert r["problems"] == []
        for p in r["paths"]:
            assert (p["failures"], p["mismatches"], p["leftovers"]) == (0, 0, 0)
            requests += p["requests"]
    paths = {p["path"] for d in docs for p in d["result"]["paths"]}
    assert paths == {"shm", "inline"}  # auto here (same namespace) went over SHM, inline stayed inline
    assert serve.poll() is None, "the receiver died during the soak"
    assert _smg_count() == before, "segments left in /dev/shm after the soak"

    # The first fifth is warm-up (imports, pools, allocator arenas); compare the next fifth to the last.
    fifth = max(1, len(rss) // 5)
    early, late = statistics.median(rss[fifth : 2 * fifth]), statistics.median(rss[-fifth:])
    peak = max(rss)
    with capsys.disabled():  # the soak's report belongs in the CI log
        print(
            f"\nsoak: {seconds:.0f}s, {len(SENDERS)} senders x 2, {requests} requests; receiver RSS "
            f"after warm-up {early / MIB:.0f} MiB, at the end {late / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB"
        )
    assert requests > 10 * len(SENDERS)
    assert late - early < FLAT_MIB * MIB, f"receiver RSS grew {(late - early) / MIB:.0f} MiB during the soak"
