"""A held lock does not multiply (issue #31, item 5): another process holding the sightings store's lock costs
a run one bounded wait, not one per store. gc --node over several pods' tmpfs waited a second per tmpfs (30 pods,
30 s; 256, past NPD's 50 s timeout). The waits are counted, never timed."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from smgshm.core.host import usercache
from tests.conftest import Children, make_file, mounted_tmpfs, run_cli
from tests.support.node import dshm, needs_root_and_unshare

pytestmark = needs_root_and_unshare

PODS = 6
# A second process holds smgshm's lock of the state dir (an exclusive flock on the dir) until its stdin closes.
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _node(root: Path) -> Iterator[list[str]]:
    """PODS pods' memory emptyDirs, each a real tmpfs holding a segment whose name carries a pid (a sighting
    to store), with their pod log dirs; every mount and dir gone at the end."""
    with contextlib.ExitStack() as stack:
        uids = [f"cccccccc-0000-4000-8000-{i:012d}" for i in range(PODS)]
        for i, uid in enumerate(uids):
            d = stack.enter_context(mounted_tmpfs(dshm(root, uid), "1m"))
            make_file(d, f"smg-tokenspeed-1-{time.time_ns()}-0")
            (root / "var/log/pods" / f"ns_pod-{i}_{uid}").mkdir(parents=True)
        yield uids


def test_a_held_store_lock_costs_gc_node_one_wait_not_one_per_tmpfs(
    tmp_path: Path, children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("SMGSHM_STATE_DIR", str(state))
    tries: list[tuple[float, bool]] = []  # each lock taken: (how long it might wait, had it)
    real_flock = usercache._flock

    def counted(fd: int, wait_s: float) -> bool:
        got = real_flock(fd, wait_s)
        tries.append((wait_s, got))
        return got

    monkeypatch.setattr(usercache, "_flock", counted)
    holder = children.spawn([sys.executable, "-c", HOLDER, str(state)], stdin=subprocess.PIPE)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    with _node(tmp_path / "node") as uids:
        doc = run_cli("--json", "gc", "--node", "--node-root", str(tmp_path / "node")).json
        assert len(tries) == PODS, tries  # each tmpfs's store tried the lock...
        assert not any(got for _, got in tries)
        assert len([w for w, _ in tries if w > 0]) == 1, tries  # ...and the run waited once
        blocks = [t for t in doc["result"]["tmpfs"] if t["pod_uid"] in uids]
        assert len(blocks) == PODS
        assert not any(t["sightings_stored"] for t in blocks)
        said = [w for w in doc["warnings"] if "held the store's lock" in w]
        assert len(said) == 1, doc["warnings"]
        assert str(state) in said[0]
        assert f"{PODS - 1} later store(s)" in said[0]

        assert holder.stdin is not None
        holder.stdin.close()  # the lock let go: the next run waits again, and stores
        holder.wait(timeout=30)
        tries.clear()
        doc = run_cli("--json", "gc", "--node", "--node-root", str(tmp_path / "node")).json
        assert all(t["sightings_stored"] for t in doc["result"]["tmpfs"] if t["pod_uid"] in uids)
        assert all(got for _, got in tries)
        assert len(tries) == PODS
        assert not [w for w in doc["warnings"] if "held the store's lock" in w]
