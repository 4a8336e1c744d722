"""The node exporter (``watch --node --serve-metrics``) and its textfile twin (``gc --node --prometheus``) on a
node laid out under a private root (tests/node_support.py): two pods' emptyDirs as real tmpfs mounts, their
log dirs, each pod's processes in their own pid and mount namespaces. Scraped on loopback, each exposition
judged by promtool and the conventions checker (test_metrics_conventions.py) and read series by series."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.node import metrics
from tests.conftest import Children, run_cli, smgshm_argv, wait_for
from tests.support.metrics_conventions import _agrees, _node_catalogue, _values, exposition_problems
from tests.support.node import HIDDEN, POD_A, POD_B, dshm, laid_out, needs_root_and_unshare

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = [needs_root_and_unshare, pytest.mark.trust]

DSHM = "dshm"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two pods under a private node root (A's producer dead, B's alive with hidden bytes); all gone at the end."""
    root = tmp_path / "node"
    with laid_out(root, [(POD_A, "16m", "dead"), (POD_B, "16m", "live")]) as pods:
        yield {"root": str(root), "a": pods[POD_A[2]], "b": pods[POD_B[2]]}


# The DaemonSet's privileges (deploy/k8s/exporter-daemonset.yaml): root, every capability dropped but SYS_PTRACE.
AS_THE_DAEMONSET = ["setpriv", "--bounding-set", "-all,+sys_ptrace", "--inh-caps", "-all", "--"]
needs_setpriv = pytest.mark.skipif(
    shutil.which("setpriv") is None, reason="no setpriv (util-linux) to drop capabilities"
)


class Exporter:
    """``watch --node --serve-metrics`` as a child (under ``wrap``, a command it is run by): its URL from stderr,
    its stdout and stderr lines drained by threads."""

    def __init__(self, children: Children, root: str, *args: str, wrap: tuple[str, ...] = ()) -> None:
        argv = smgshm_argv("watch", "--node", "--node-root", root, "--serve-metrics", "127.0.0.1:0", *args)
        self.p = children.spawn([*wrap, *argv])
        assert self.p.stderr is not None
        line = self.p.stderr.readline()
        assert "metrics at " in line, (line, self.p.stderr.read() if self.p.poll() is not None else "")
        self.url = line.split("metrics at ", 1)[1].strip()
        self.lines: list[str] = []
        self.errs: list[str] = []
        threading.Thread(target=self._drain, args=(self.p.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.p.stderr, self.errs), daemon=True).start()

    @staticmethod
    def _drain(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as r:  # noqa: S310 - our own loopback exporter
            text: str = r.read().decode("utf-8")
        problems = exposition_problems(text)
        assert problems == [], problems  # every scrape, idle or busy, passes
        return text


def _pod(uid_of: tuple[str, str, str]) -> frozenset[tuple[str, str]]:
    ns, name, uid = uid_of
    return frozenset({("namespace", ns), ("pod", name), ("uid", uid), ("volume", DSHM), ("kind", "empty_dir")})


def _one(text: str, name: str, pod: tuple[str, str, str], state: str | None = None) -> float | None:
    labels = _pod(pod) | ({("state", state)} if state else set())
    return _values(text, name).get(labels)


def _pods_in(text: str) -> set[str]:
    return {dict(k)["pod"] for k in _values(text, "smgshm_node_size_bytes")}


@pytest.mark.slow
def test_each_pods_tmpfs_is_a_series_set_with_its_pods_labels(node: dict[str, Any], children: Children) -> None:
    e = Exporter(children, node["root"], "--rescan-every", "60s", "--interval", "0.2")
    text = e.scrape()
    cat = _node_catalogue()
    assert _agrees(text, cat) == set(cat), "every family, the exporter's counters too"
    assert _pods_in(text) == {"engine-0", "gateway-0"}
    # Pod A: its producer died in A's pid namespace: leaked, reclaimable; a semaphore beside it.
    assert _one(text, "smgshm_node_segments", POD_A, "leaked") == 1
    assert _one(text, "smgshm_node_segment_bytes", POD_A, "leaked") == 8192
    assert _one(text, "smgshm_node_reclaimable_bytes", POD_A) == 8192
    assert _one(text, "smgshm_node_segments", POD_A, "in_flight") == 0
    assert _one(text, "smgshm_node_other_entries", POD_A) == 1
    assert _one(text, "smgshm_node_other_bytes", POD_A) == 4096
    assert _one(text, "smgshm_node_size_bytes", POD_A) == 16 << 20
    assert _one(text, "smgshm_node_liveness_trusted", POD_A) == 1
    assert _one(text, "smgshm_node_hidden_bytes", POD_A) == 0
    # Pod B: pid 1 there wrote it and lives: in flight; and 1 MiB unlinked but mapped.
    assert _one(text, "smgshm_node_segments", POD_B, "in_flight") == 1
    assert _one(text, "smgshm_node_segments", POD_B, "leaked") == 0
    assert _one(text, "smgshm_node_hidden_bytes", POD_B) == HIDDEN
    assert _one(text, "smgshm_node_hidden_files", POD_B) == 1
    used = _one(text, "smgshm_node_used_bytes", POD_B)
    assert used is not None
    assert used >= HIDDEN + 8192, "hidden bytes are used bytes no listing shows"
    # The node's totals and the scan's health.
    assert _values(text, "smgshm_node_all_segments")[frozenset({("state", "leaked")})] == 1
    assert _values(text, "smgshm_node_all_hidden_bytes")[frozenset()] == HIDDEN
    assert _values(text, "smgshm_node_volumes")[frozenset({("kind", "empty_dir")})] == 2
    assert _values(text, "smgshm_node_scans_total")[frozenset()] == 1
    assert _values(text, "smgshm_node_last_scan_errors")[frozenset()] == 0
    assert time.time() - _values(text, "smgshm_node_last_scan_timestamp_seconds")[frozenset()] < 120


@pytest.mark.slow
def test_traffic_updates_a_tmpfs_between_full_scans_and_never_calls_unproven_leaked(
    node: dict[str, Any], children: Children
) -> None:
    e = Exporter(children, node["root"], "--rescan-every", "600s", "--interval", "0.1")
    b = dshm(Path(node["root"]), POD_B[2])
    names = [f"smg-tokenspeed-1-{time.time_ns()}-{i}" for i in range(200)]  # pid 1 of B's namespace: alive
    for n in names:
        (b / n).write_bytes(b"\x01" * 4096)

    def in_flight(want: int) -> str | None:
        text = e.scrape()
        return text if _one(text, "smgshm_node_segments", POD_B, "in_flight") == want else None

    text = wait_for(lambda: in_flight(201), 60, "the 200 new segments in flight")
    assert _values(text, "smgshm_node_scans_total")[frozenset()] == 1, "by an update, no full scan"
    assert _values(text, "smgshm_node_updates_total")[frozenset()] >= 1
    assert _values(text, "smgshm_node_events_total")[frozenset()] >= 200
    # A pid no process of B's namespace has: the full scan would prove it leaked; an update, judging by
    # the last full scan's pid map, must not: unknown until the next full scan.
    dead = b / f"smg-tokenspeed-4000000-{time.time_ns()}-0"
    dead.write_bytes(b"\x02" * 4096)
    text = wait_for(
        lambda: (lambda t: t if _one(t, "smgshm_node_segments", POD_B, "unknown") == 1 else None)(e.scrape()),
        60,
        "the new dead producer's segment, unknown",
    )
    assert _one(text, "smgshm_node_segments", POD_B, "leaked") == 0
    assert _one(text, "smgshm_node_segments", POD_A, "leaked") == 1, "a full scan's proof stays"
    for n in names:
        os.unlink(b / n)
    dead.unlink()
    wait_for(lambda: in_flight(1), 60, "the unlinked segments gone from the series")


@pytest.mark.slow
def test_a_removed_pod_leaves_the_exposition(node: dict[str, Any], children: Children) -> None:
    root = Path(node["root"])
    e = Exporter(children, str(root), "--rescan-every", "1s", "--interval", "0.2")
    assert _pods_in(e.scrape()) == {"engine-0", "gateway-0"}
    node["a"].stdin.close()  # pod A deleted: its container exits, the kubelet unmounts and removes its dirs
    wait_for(lambda: node["a"].poll() is not None, 30, "pod A's pid 1 to exit")
    subprocess.run(["umount", str(dshm(root, POD_A[2]))], check=True, timeout=30)
    subprocess.run(
        ["rm", "-rf", str(root / "var/lib/kubelet/pods" / POD_A[2]), str(root / "var/log/pods" / "_".join(POD_A))],
        check=True,
        timeout=30,
    )
    text = wait_for(
        lambda: (lambda t: t if _pods_in(t) == {"gateway-0"} else None)(e.scrape()), 60, "pod A's series gone"
    )
    wait_for(lambda: _values(e.scrape(), "smgshm_node_scans_total")[frozenset()] >= 3, 60, "two more full scans")
    text = e.scrape()
    assert _pods_in(text) == {"gateway-0"}, "a rescan does not bring it back"
    assert _values(text, "smgshm_node_volumes")[frozenset({("kind", "empty_dir")})] == 1
    assert _values(text, "smgshm_node_all_segments")[frozenset({("state", "leaked")})] == 0
    assert _values(text, "smgshm_node_last_scan_errors")[frozenset()] == 0


@pytest.mark.slow
def test_max_volumes_bounds_what_is_followed_and_says_what_is_not(node: dict[str, Any], children: Children) -> None:
    e = Exporter(children, node["root"], "--max-volumes", "1", "--rescan-every", "60s")
    text = e.scrape()
    assert len(_pods_in(text)) == 1
    assert _values(text, "smgshm_node_unfollowed_volumes")[frozenset()] == 1
    wait_for(lambda: "1 tmpfs not followed (--max-volumes)" in " ".join(" ".join(e.lines).split()), 30, "its line")


@pytest.mark.slow
@needs_setpriv
def test_a_tmpfs_that_cannot_be_read_is_a_series_of_its_own_said_once_and_the_others_judged(
    node: dict[str, Any], children: Children, tmp_path: Path
) -> None:
    """Run as the DaemonSet runs it (no capability but SYS_PTRACE), the exporter cannot list pod B's tmpfs once
    it is 0700 and another uid's: B is there, scanned 0, with why (a closed cause code) and none of the
    figures it could not read; said once in the log; A's leak still judged and NPD's verdict 1. B readable
    again: scanned 1 and judged, its failure series gone."""
    root = Path(node["root"])
    b = dshm(root, POD_B[2])
    mode = b.stat().st_mode & 0o7777
    os.chown(b, 1000, 1000)
    os.chmod(b, 0o700)
    verdict = tmp_path / "npd"
    try:
        e = Exporter(
            children, str(root), "--rescan-every", "1s", "--npd-file", str(verdict), wrap=tuple(AS_THE_DAEMONSET)
        )
        wait_for(lambda: _values(e.scrape(), "smgshm_node_scans_total")[frozenset()] >= 3, 60, "three full scans")
        text = e.scrape()
        assert _one(text, "smgshm_node_volume_scanned", POD_B) == 0
        failures = _values(text, "smgshm_node_volume_scan_failure")
        assert failures == {_pod(POD_B) | {("reason", "permission")}: 1}, failures
        assert _one(text, "smgshm_node_size_bytes", POD_B) is None, "no zeros for what it could not read"
        assert _one(text, "smgshm_node_segments", POD_B, "leaked") is None
        assert _one(text, "smgshm_node_hidden_bytes", POD_B) == HIDDEN, "what the look read of it stays"
        assert _one(text, "smgshm_node_volume_scanned", POD_A) == 1
        assert _one(text, "smgshm_node_segments", POD_A, "leaked") == 1, "the other tmpfs still judged"
        assert _values(text, "smgshm_node_volumes")[frozenset({("kind", "empty_dir")})] == 2
        assert _values(text, "smgshm_node_last_scan_errors")[frozenset()] == 1
        status, line = verdict.read_text(encoding="ascii").splitlines()
        assert (status.split()[-1], line.startswith("gc: 1 leaked")) == ("1", True), (status, line)
        said = [ln for ln in e.errs if "not scanned (permission)" in ln]
        assert len(said) == 1, e.errs
        assert str(b) in said[0]
        assert f"{POD_B[0]}/{POD_B[1]}" in said[0]
        # gc --node's textfile, run with the same privileges: the same series.
        prom = tmp_path / "node.prom"
        argv = smgshm_argv("gc", "--node", "--node-root", str(root), "--prometheus", str(prom))
        subprocess.run([*AS_THE_DAEMONSET, *argv], check=True, timeout=120, capture_output=True)
        text = prom.read_text(encoding="utf-8")
        assert exposition_problems(text) == []
        assert _values(text, "smgshm_node_volume_scan_failure") == failures
        assert _one(text, "smgshm_node_volume_scanned", POD_B) == 0
        assert _one(text, "smgshm_node_size_bytes", POD_B) is None
        assert _one(text, "smgshm_node_segments", POD_A, "leaked") == 1
        os.chown(b, 0, 0)
        os.chmod(b, mode)
        text = wait_for(
            lambda: (lambda t: t if _one(t, "smgshm_node_volume_scanned", POD_B) == 1 else None)(e.scrape()),
            60,
            "pod B scanned again",
        )
        assert _values(text, "smgshm_node_volume_scan_failure") == {}
        assert _one(text, "smgshm_node_segments", POD_B, "in_flight") == 1
        wait_for(lambda: any("scanned again" in ln for ln in e.errs), 30, "its line")
    finally:
        os.chown(b, 0, 0)
        os.chmod(b, mode)


@pytest.mark.slow
@needs_setpriv
def test_a_tmpfs_unscanned_then_gone_leaves_the_exposition(node: dict[str, Any], children: Children) -> None:
    """Pod B's tmpfs cannot be listed (as above), then its pod is deleted: its series, the failure's too, go,
    and the log says so once."""
    root = Path(node["root"])
    b = dshm(root, POD_B[2])
    os.chown(b, 1000, 1000)
    os.chmod(b, 0o700)
    e = Exporter(children, str(root), "--rescan-every", "1s", wrap=tuple(AS_THE_DAEMONSET))
    assert _values(e.scrape(), "smgshm_node_volume_scan_failure") == {_pod(POD_B) | {("reason", "permission")}: 1}
    node["b"].stdin.close()  # pod B deleted: its container exits, the kubelet unmounts and removes its dirs
    wait_for(lambda: node["b"].poll() is not None, 30, "pod B's pid 1 to exit")
    subprocess.run(["umount", str(b)], check=True, timeout=30)
    subprocess.run(
        ["rm", "-rf", str(root / "var/lib/kubelet/pods" / POD_B[2]), str(root / "var/log/pods" / "_".join(POD_B))],
        check=True,
        timeout=30,
    )

    def followed(t: str) -> set[frozenset[tuple[str, str]]]:
        return set(_values(t, "smgshm_node_volume_scanned"))  # every tmpfs followed, scanned or not

    assert followed(e.scrape()) == {_pod(POD_A), _pod(POD_B)}
    text = wait_for(lambda: (lambda t: t if followed(t) == {_pod(POD_A)} else None)(e.scrape()), 60, "B's series gone")
    assert _values(text, "smgshm_node_volume_scan_failure") == {}
    assert _one(text, "smgshm_node_hidden_bytes", POD_B) is None
    wait_for(lambda: any("gone (not scanned till then)" in ln and str(b) in ln for ln in e.errs), 30, "its line")
    assert sum("not scanned (permission)" in ln for ln in e.errs) == 1


def test_gc_node_prometheus_writes_the_same_series_as_a_textfile(node: dict[str, Any], tmp_path: Path) -> None:
    root, prom = node["root"], tmp_path / "node.prom"
    run_cli("gc", "--node", "--node-root", root, "--prometheus", str(prom))
    text = prom.read_text(encoding="utf-8")
    assert exposition_problems(text) == []
    cat = _node_catalogue()
    assert _agrees(text, cat) == {n for n, (_, _, w) in cat.items() if w == metrics.ALWAYS}, "no exporter counters"
    assert _one(text, "smgshm_node_segments", POD_A, "leaked") == 1
    assert _one(text, "smgshm_node_segments", POD_B, "in_flight") == 1
    assert _one(text, "smgshm_node_hidden_bytes", POD_B) == HIDDEN
    assert prom.stat().st_mode & 0o777 == 0o644
    # After a --delete: what is left, the leak gone.
    run_cli("gc", "--node", "--node-root", root, "--delete", "--min-age", "0", "--yes", "--prometheus", str(prom))
    text = prom.read_text(encoding="utf-8")
    assert exposition_problems(text) == []
    assert _one(text, "smgshm_node_segments", POD_A, "leaked") == 0
    assert _one(text, "smgshm_node_reclaimable_bytes", POD_A) == 0
    assert _one(text, "smgshm_node_segments", POD_B, "in_flight") == 1
    # A root that cannot be read: its time and the error, no figures.
    bad = run_cli("gc", "--node", "--node-root", str(tmp_path / "no-such-root"), "--prometheus", str(prom), exit=5)
    assert "node root" in bad.stderr
    text = prom.read_text(encoding="utf-8")
    assert exposition_problems(text) == []
    assert _values(text, "smgshm_node_last_scan_errors")[frozenset()] == 1
    assert not _values(text, "smgshm_node_size_bytes")


def test_node_refuses_what_it_does_not_do(tmp_path: Path) -> None:
    run_cli("watch", "--node", "--jsonl", exit=2)
    run_cli("watch", "--node", "--shm-dir", str(tmp_path), exit=2)
    run_cli("--json", "watch", "--node", "--count", "1", exit=2)


def test_label_values_from_the_node_are_escaped_once() -> None:
    assert metrics.label("dshm") == "dshm"
    assert metrics.label("a\nb\\c") == "a\\x0ab\\x5cc"
    assert metrics.label(os.fsdecode(b"x\xffy")) == "x\\xffy"
    assert metrics.label(None) == ""
    assert len(metrics.label("v" * 1000)) == metrics.MAX_LABEL_CHARS
