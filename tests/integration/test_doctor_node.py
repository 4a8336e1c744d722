"""doctor --node on a node laid out under a private root (tests/node_support.py): doctor's host checks
per pod tmpfs. Three pods: a gateway's (pid 1 titled smg::router) on a 64 MiB tmpfs, the container
runtime's default, with a leftover probe file; a healthy one (a live producer's segment in flight);
one whose producer died, leaving its segment leaked in its own pid namespace."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, run_cli, wait_for
from tests.support.node import POD_A, POD_B, dshm, laid_out, needs_root_and_unshare, start_pod

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = [needs_root_and_unshare, pytest.mark.trust]

POD_G = ("team-g", "smg-gateway-0", "cccccccc-0000-4000-8000-00000000000c")  # 64 MiB, a gateway, a probe file
PROBE = "smg-tokenspeed-probe-7"  # a gateway that died between creating and removing its probe, as pid 7


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    root = tmp_path / "node"
    with laid_out(root, [(POD_A, "16m", "dead"), (POD_B, "16m", "live"), (POD_G, "64m", "gateway")]) as pods:
        fd = os.open(dshm(root, POD_G[2]) / PROBE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        yield {"root": str(root), "pods": pods}


def _blocks(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["pod_uid"]: t for t in result["tmpfs"] if t["pod_uid"]}


def _checks(block: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in block["checks"]}


@pytest.mark.slow
def test_each_pod_tmpfs_gets_the_host_checks_with_causes_and_fixes(node: dict[str, Any]) -> None:
    root = node["root"]
    doc = run_cli("--json", "doctor", "--node", "--node-root", root, exit=3).json
    assert doc["ok"] is False
    res = doc["result"]
    blocks = _blocks(res)
    g, b, a = blocks[POD_G[2]], blocks[POD_B[2]], blocks[POD_A[2]]
    assert (g["namespace"], g["pod"], g["kind"], g["volume"]) == ("team-g", "smg-gateway-0", "empty_dir", "dshm")
    assert res["verdicts"]["fail"] == 2
    assert res["verdicts"]["ok"] == 1
    assert res["verdict"] == "fail"

    # The gateway's pod: 64 MiB with an SMG gateway writing there is the runtime default's trap.
    assert g["shm_total_bytes"] == 64 << 20
    (gw,) = g["gateways"]
    assert gw["ns_pid"] == 1
    assert gw["pid"] != 1
    assert f"SMG gateway pid 1 (pid {gw['pid']} here)" in _checks(g)["capacity"]["summary"]
    cap = _checks(g)["capacity"]
    assert (cap["status"], cap["cause"], cap["code"]) == ("warn", "shm_too_small", 0)
    assert "64 MiB default" in cap["summary"]
    assert "SMG gateway pid 1" in cap["summary"]
    assert "emptyDir medium: Memory sizeLimit: 1Gi" in cap["fix"]
    assert cap["fix_cmd"] is None  # a pod's tmpfs is sized in its spec: no remount (nor a --node-root path)
    assert "gc --delete" not in cap["fix"]  # nothing leaked: freeing space is no fix for a dir too small
    probe = _checks(g)["probe files"]
    assert (probe["status"], probe["cause"], probe["code"]) == ("fail", "probe_file_left", 3)
    assert "pid 7 in pod team-g/smg-gateway-0" in probe["summary"]
    path = str(dshm(Path(root), POD_G[2]) / PROBE)
    assert probe["fix_cmd"] == ["rm", "--", "/" + os.path.relpath(path, root)]  # the path on the node itself
    # gc's rule reaps a probe file proven dead at any age: the same command as the leaks' fix, no --min-age 0.
    assert probe["fix"].startswith(shlex.join(["smgshm", "gc", "--node", "--node-root", root, "--delete"]) + ", ")
    assert probe["names_hex"] == [PROBE.encode().hex()]
    assert g["verdict"] == "fail"

    # The healthy pod: a live producer's segment in flight, everything ok.
    assert b["verdict"] == "ok", [c for c in b["checks"] if c["status"] != "ok"]
    assert b["counts"]["in_flight"] == 1
    assert b["hidden_bytes"] == 1 << 20
    assert b["hidden_ratio"] == pytest.approx(1 / 16)
    assert _checks(b)["liveness"]["status"] == "ok"

    # The dead producer's pod: leaked in its own pid namespace, with gc --node's fix for this node root.
    leaks = _checks(a)["leaks"]
    assert (leaks["status"], leaks["cause"], leaks["code"]) == ("fail", "segments_leaked", 3)
    assert leaks["fix_cmd"] == ["smgshm", "gc", "--node", "--node-root", root, "--delete"]
    assert a["leaked_bytes"] == 8192
    assert a["leaked_ratio"] == pytest.approx(8192 / (16 << 20))
    assert a["verdict"] == "fail"

    # The fixes do what they say, pasted as they stand: doctor saw these young files before gc's look at the
    # pods' pid namespaces, so gc proves them dead and reaps them at any age. No pid 7 lives in the gateway's
    # pod: its probe file is leaked there too, and reaped with the rest.
    assert _checks(g)["leaks"]["status"] == "fail"
    run_cli("gc", *leaks["fix_cmd"][2:])
    assert not os.path.exists(path)
    after = run_cli("--json", "doctor", "--node", "--node-root", root).json  # the trap is a warning: exit 0
    assert after["ok"] is True
    assert {t["verdict"] for t in _blocks(after["result"]).values()} == {"ok", "warn"}
    assert _blocks(after["result"])[POD_G[2]]["verdict"] == "warn"


def test_an_in_flight_budget_the_tmpfs_cannot_hold_fails_as_too_small(node: dict[str, Any]) -> None:
    doc = run_cli("--json", "doctor", "--node", "--node-root", node["root"], "--inflight-bytes", "256MiB", exit=3).json
    g, b = _blocks(doc["result"])[POD_G[2]], _blocks(doc["result"])[POD_B[2]]
    cap = _checks(g)["capacity"]
    assert (cap["status"], cap["cause"], cap["code"]) == ("fail", "shm_too_small", 3)
    assert "emptyDir medium: Memory sizeLimit" in cap["fix"]
    # The healthy pod's 16 MiB holds SMG's names too: the budget is its need as well.
    assert _checks(b)["capacity"]["cause"] == "shm_too_small"


def test_a_tmpfs_whose_names_cannot_be_judged_is_unknown_never_failed(node: dict[str, Any]) -> None:
    """A second container on pod A's tmpfs, in its own pid namespace, has the dead producer's pid: which
    namespace wrote the name cannot be told, so it is unknown: never a failure, never a pass."""
    root = node["root"]
    (name,) = [n for n in os.listdir(dshm(Path(root), POD_A[2])) if n.startswith("smg-")]
    reg = Children()
    try:
        start_pod(reg, dshm(Path(root), POD_A[2]), f"hold={name.split('-')[2]}")
        doc = run_cli("--json", "doctor", "--node", "--node-root", root, exit=3).json
    finally:
        reg.reap()
    block = _blocks(doc["result"])[POD_A[2]]
    assert block["verdict"] == "unknown"
    live = _checks(block)["liveness"]
    assert live["status"] == "unknown"
    assert "which one wrote the name cannot be told" in live["summary"]
    leaks = _checks(block)["leaks"]  # its names judged nothing: never "none leaked", and exit 6 were it alone
    assert (leaks["status"], leaks["code"]) == ("unknown", 6)
    assert leaks["summary"].startswith("1 SMG segment(s), none could be judged: ")
    assert not [c for c in block["checks"] if c["status"] == "fail"]


def test_a_tmpfs_no_process_reaches_is_leaked(node: dict[str, Any]) -> None:
    """Pod A's container exits: no process reaches its tmpfs, so its names' writers are gone: a leak."""
    a = node["pods"][POD_A[2]]
    a.stdin.close()
    wait_for(lambda: a.poll() is not None, what="pod A's pid 1 to exit")
    doc = run_cli("--json", "doctor", "--node", "--node-root", node["root"], exit=3).json
    block = _blocks(doc["result"])[POD_A[2]]
    assert block["verdict"] == "fail"
    assert "no process reaches this tmpfs" in _checks(block)["liveness"]["summary"]
    assert _checks(block)["leaks"]["status"] == "fail"


def test_human_output_verdict_first_and_fits_80_columns(node: dict[str, Any]) -> None:
    root = node["root"]
    out = run_cli("doctor", "--node", "--node-root", root, exit=3, env={"COLUMNS": "80"}).stdout
    lines = out.splitlines()
    assert lines[0].startswith("doctor: node")  # the verdict first (wrapped: the node root is long)
    assert "2 failed, 1 ok" in " ".join(lines[:3])
    assert "[FAIL] pod team-g/smg-gateway-0 (uid cccccccc-0000-4000-8000-00000000000c)," in out
    assert "[warn] capacity (shm_too_small): " in out
    assert "[FAIL] probe files (probe_file_left): leftover smg-tokenspeed-probe-7" in out
    assert "[FAIL] leaks (segments_leaked)" in out
    assert "[ok  ] pod team-b/gateway-0" in out
    for line in lines:
        # Prose wraps at 80; a word longer than a line (a path) keeps a line of its own; a command to paste is
        # never wrapped (doctor's rule).
        assert len(line) <= 80 or " " not in line.strip() or line.startswith(" " * 12), line
    quiet = run_cli("-q", "doctor", "--node", "--node-root", root, exit=3, env={"COLUMNS": "80"}).stdout
    assert quiet.splitlines() == lines[: lines.index("")]


def test_node_refuses_options_that_choose_this_hosts_checks() -> None:
    run_cli("doctor", "--node", "--worker", "127.0.0.1:1", exit=2)
    run_cli("doctor", "--node", "--shm-dir", "/dev/shm", exit=2)
    run_cli("doctor", "--node", "--no-e2e", exit=2)
    run_cli("doctor", "--node", "--node-root", "/nonexistent/root", exit=5)


def test_a_tmpfs_gone_since_the_look_is_said_and_the_others_checked(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pod B's tmpfs is unmounted between the look and its checks (its pod deleted): its block says so and
    fails nothing; the other pods are checked as ever (pod A's leak: exit 3)."""
    import subprocess

    from smgshm.core.node import doctor

    b_dir = dshm(Path(node["root"]), POD_B[2])
    real = doctor.look

    def look_then_vanish(where: str, pids: Any = None, **kw: Any) -> Any:
        seen = real(where, pids, **kw)
        subprocess.run(["umount", "-l", str(b_dir)], check=True, timeout=30)
        return seen

    monkeypatch.setattr(doctor, "look", look_then_vanish)
    try:
        doc = run_cli("--json", "doctor", "--node", "--node-root", node["root"], exit=3).json
    finally:  # for the fixture's own unmount
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(b_dir)], check=True, timeout=30)
    blocks = _blocks(doc["result"])
    b = blocks[POD_B[2]]
    assert b["verdict"] == "unknown"
    shm = _checks(b)["shm dir"]
    assert shm["status"] == "skip"
    assert "gone since the node was looked at" in shm["summary"]
    assert blocks[POD_A[2]]["verdict"] == "fail"
