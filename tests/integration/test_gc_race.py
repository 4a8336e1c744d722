"""gc racing a producer that creates and unlinks segments as fast as it can.

The producer is alive throughout, so none of its segments may ever be deleted: it
counts every one it finds gone before it unlinked it. Dead producers' segments are
planted between gc passes so that gc is seen deleting while it races.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import Children, make_file, run_cli
from tests.support.cli_gc import JUDGE, dead_pid

pytestmark = pytest.mark.timeout(120)

# Keeps a rolling window of 16 live segments (smgshm's naming, its own pid), creating and
# unlinking as fast as it can until its stdin closes; prints "<created> <stolen>".
PRODUCER = """
import collections, os, select, sys, time
d = sys.argv[1]
live, created, stolen, seq = collections.deque(), 0, 0, 0
print("ready", flush=True)
while seq % 64 or not select.select([sys.stdin], [], [], 0)[0]:  # readable: closed by the test
    name = f"smg-smgshm-{os.getpid()}-{time.time_ns()}-{seq}"
    seq += 1
    fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"\\x01" * 4096)
    os.close(fd)
    created += 1
    live.append(name)
    if len(live) > 16:
        try:
            os.unlink(os.path.join(d, live.popleft()))
        except FileNotFoundError:
            stolen += 1
for name in live:
    try:
        os.unlink(os.path.join(d, name))
    except FileNotFoundError:
        stolen += 1
print(created, stolen, flush=True)
"""


@pytest.mark.slow
def test_gc_racing_a_live_producer_never_deletes_its_segments(children: Children, tmpfs_dir: str) -> None:
    producer = children.spawn([sys.executable, "-c", PRODUCER, tmpfs_dir], stdin=subprocess.PIPE)
    assert producer.stdin is not None
    assert producer.stdout is not None
    assert producer.stdout.readline().strip() == "ready"
    gone = dead_pid(children)
    planted: list[str] = []
    passes = 0
    # The producer races gc for 4 s and at least 5 passes: a loaded machine makes passes slow,
    # and a fixed-length race could then end with too few of them.
    stop_after = time.monotonic() + 4
    while producer.poll() is None:
        if passes >= 5 and time.monotonic() >= stop_after and not producer.stdin.closed:
            producer.stdin.close()
        name = f"smg-smgshm-{gone}-{time.time_ns()}-{passes}"
        make_file(tmpfs_dir, name, age_s=3600)
        planted.append(name)
        doc = run_cli("--json", "gc", "--shm-dir", tmpfs_dir, *JUDGE, "--delete", "--min-age", "0", "--yes").json
        for d in doc["result"]["deleted"]:
            assert d["name"].startswith(f"smg-smgshm-{gone}-"), f"gc deleted a live producer's segment: {d}"
        passes += 1
    out = producer.stdout.read()  # it has exited: not communicate(), which trips on the closed stdin
    producer.wait(timeout=30)
    created, stolen = map(int, out.split())
    assert producer.returncode == 0
    assert passes >= 5, "gc should have raced the producer several times"
    assert created > 1000, "the producer should have churned through segments"
    assert stolen == 0, f"gc deleted {stolen} segment(s) of a live producer"
    # Everything planted for the dead pid was reaped while racing, and nothing else is left.
    assert [n for n in planted if os.path.lexists(os.path.join(tmpfs_dir, n))] == []
    assert os.listdir(tmpfs_dir) == []
