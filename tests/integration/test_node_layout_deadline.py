"""The node view's layout reads are bounded, each and in all (issue #31, item 7): a dir under the node root
that does not answer (a real FUSE mount nobody serves, tests/support/stall.py, where a pod's dir or a
runtime's is) is not waited for past its bound, and the run's layout reads have one deadline
(core/node/layout.py's LAYOUT_S, host/bounded.py's ``within``): what was not read by then is never dropped,
but reported ``unknown`` (the node view's ``layout_read``), and each tmpfs the mount table shows below it is
a block of its own, not scanned (``Unscanned``), nothing of it deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_file, mounted_tmpfs, smgshm_argv
from tests.support.node import POD_A, POD_B, laid_out, needs_root_and_unshare
from tests.support.schema_check import validate_document
from tests.support.stall import needs_fuse, stalled_fuse

pytestmark = [pytest.mark.timeout(180), needs_fuse, needs_root_and_unshare, pytest.mark.trust]

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
STALLED_POD = "cccccccc-0000-4000-8000-00000000000c"
OTHER_STALLED_POD = "dddddddd-0000-4000-8000-00000000000d"
SANDBOX = "5a" * 32
# smgshm with its per-read bound and its layout deadline set (argv[1], argv[2]); the rest of argv is smgshm's.
BOUNDS_SET = (
    "import sys; import smgshm.core.host.bounded as b, smgshm.core.node.layout as l; "
    "b.READ_S, l.LAYOUT_S = float(sys.argv[1]), float(sys.argv[2]); "
    "sys.argv = ['smgshm', *sys.argv[3:]]; from smgshm.cli import main; main()"
)


def _gc_node(argv: list[str], within_s: float) -> tuple[subprocess.CompletedProcess[str], float, dict[str, Any]]:
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=within_s, env=ENV, cwd="/", check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gc --node did not end within {within_s} s: a layout read blocked without bound")
    doc: dict[str, Any] = json.loads(r.stdout)  # one document
    validate_document(doc)
    return r, time.monotonic() - t0, doc


def _layout_unseen(doc: dict[str, Any]) -> dict[str, Any]:
    (u,) = [u for u in doc["result"]["unseen"] if u["reason"] == "layout_read"]
    return u


def test_a_pod_dir_that_does_not_answer_is_unknown_and_the_others_are_judged(tmp_path: Path) -> None:
    """A pod's dir is a FUSE mount that stopped answering: gc --node ends (the default bounds), names that
    dir as not read (the view unknown, never a pass), and judges the other pods (pod A's dead producer's
    segment leaked, pod B's live one's alive). It hung for good before."""
    root = tmp_path / "node"
    with (
        laid_out(root, [(POD_A, "16m", "dead"), (POD_B, "16m", "live")]) as pods,
        stalled_fuse(root / "var/lib/kubelet/pods" / STALLED_POD),
    ):
        pod = pods[POD_A[2]]
        assert pod.stdin is not None
        pod.stdin.close()
        pod.wait(timeout=60)
        argv = smgshm_argv("--json", "gc", "--node", "--node-root", str(root), "--check")
        r, _took, doc = _gc_node(argv, 120)
    assert r.returncode == 3, r.stderr  # pod A's leak fails the check; what was not seen is said besides
    assert "node view unknown" in r.stderr
    u = _layout_unseen(doc)
    assert f"var/lib/kubelet/pods/{STALLED_POD}" in u["message"], u
    assert "did not answer within" in u["message"], u
    states = {t["pod_uid"]: {s["state"] for s in t["segments"]} for t in doc["result"]["tmpfs"] if t["pod_uid"]}
    assert states[POD_A[2]] == {"leaked"}, states
    assert states[POD_B[2]] == {"in_flight"}, states  # its producer lives: kept


def test_the_layout_reads_have_one_deadline_and_what_comes_after_is_unknown_not_dropped(tmp_path: Path) -> None:
    """Two pod dirs that do not answer, each cut at the per-read bound (1 s here), spend the run's layout
    deadline (1.5 s here): many bounded reads no longer add up. What was to be read after it (containerd's
    sandboxes dir, whose sandbox has a tmpfs with a dead producer's segment) is reported, not dropped: the
    view says it (layout_read), and the sandbox's tmpfs, found in the mount table, is a block of its own,
    unknown, its error naming the bound, its segment not deleted by --delete."""
    root = tmp_path / "node"
    shm = root / "run/containerd/io.containerd.grpc.v1.cri/sandboxes" / SANDBOX / "shm"
    with (
        laid_out(root, [(POD_B, "16m", "live")]),
        mounted_tmpfs(shm, "4m"),
        stalled_fuse(root / "var/lib/kubelet/pods" / STALLED_POD),
        stalled_fuse(root / "var/lib/kubelet/pods" / OTHER_STALLED_POD),
    ):
        seg = make_file(str(shm), "smg-tokenspeed-4194303-1-0")  # no process has that pid: leaked, were it read
        prom = tmp_path / "gc.prom"
        smgshm = ["--json", "gc", "--node", "--node-root", str(root), "--delete", "--min-age", "0", "--yes"]
        smgshm += ["--prometheus", str(prom)]
        argv = [sys.executable, "-c", BOUNDS_SET, "1.0", "1.5", *smgshm]
        r, took, doc = _gc_node(argv, 120)
        assert os.path.exists(seg), "a segment under a dir that was not read was deleted"
    assert r.returncode == 0, r.stderr
    assert took < 90, took  # a bound against a hang (the layout's part: 1.5 s at most), never a timing
    u = _layout_unseen(doc)
    assert f"var/lib/kubelet/pods/{STALLED_POD}" in u["message"], u
    (box,) = [t for t in doc["result"]["tmpfs"] if t["path"] == str(shm)]
    assert box["kind"] == "sandbox_shm"
    assert box["liveness_trusted"] is False
    assert box["segments"] == []
    assert box["deleted"] == []
    assert box["scan_error"].startswith("not scanned: "), box["scan_error"]
    assert box["scan_failure"] == "stalled"
    assert "io.containerd.grpc.v1.cri/sandboxes was not read in time" in box["scan_error"], box["scan_error"]
    assert "the run's time for reads was spent" in box["scan_error"], box["scan_error"]
    # The exporter's series for it (the same in gc --node --prometheus): not scanned, because a read stalled.
    failures = [ln for ln in prom.read_text().splitlines() if ln.startswith("smgshm_node_volume_scan_failure{")]
    assert [ln for ln in failures if 'kind="sandbox_shm"' in ln] == [
        ln for ln in failures if 'reason="stalled"' in ln and ln.endswith(" 1.0")
    ], failures
    assert any('reason="stalled"' in ln for ln in failures), failures
