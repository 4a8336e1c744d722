"""Capacity and the family listing, on private tmpfs mounts (root): what fills the shm dir, read-only."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.host.capacity import family_of, record_tensor_seen, recorded_needs, shm_usage
from tests.conftest import mounted_tmpfs, run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount -t tmpfs)")
MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench and e2e keep the largest tensor they moved in the user's cache: keep the test's to itself."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[str]:
    with mounted_tmpfs(tmp_path / "shm", "32m") as d:
        yield d


def write(d: str, name: str, nbytes: int) -> str:
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(b"\x01" * nbytes)
    return path


def snapshot(d: str) -> dict[str, tuple[int, int, float]]:
    out = {}
    for e in os.scandir(d):
        st = e.stat(follow_symlinks=False)
        out[e.name] = (st.st_ino, st.st_size, st.st_mtime)
    return out


def test_families_counts_and_bytes_without_touching_anything(shm: str) -> None:
    write(shm, "smg-tokenspeed-4242-1733230000000000000-0", 2 * MIB)
    write(shm, "smg-smgshm-1-2-3", MIB)
    write(shm, "psm_5de18b27", MIB)
    write(shm, "sgl_shm_load_0", 4096)
    write(shm, "nccl-AbCdEf", 3 * MIB)
    write(shm, "torch_123_456_0", 8192)
    write(shm, "vllm-rpc-buffer", 4096)
    write(shm, "sem.mp-xyz", 32)
    write(shm, "random \x1b[31mname\n", MIB)
    os.link(os.path.join(shm, "nccl-AbCdEf"), os.path.join(shm, "nccl-hardlink"))  # one inode, two names
    os.mkfifo(os.path.join(shm, "smg-tokenspeed-1-2-3"))
    os.symlink("/etc/passwd", os.path.join(shm, "torch_link"))
    # A file unlinked while still open: its memory is used but no name accounts for it.
    held = os.open(write(shm, "gone-soon", 2 * MIB), os.O_RDONLY)
    os.unlink(os.path.join(shm, "gone-soon"))
    try:
        before = snapshot(shm)
        u = shm_usage(shm)
        assert snapshot(shm) == before, "the listing changed the shm dir"
    finally:
        os.close(held)
    fams = {f.family: f for f in u.families}
    assert {k: v.count for k, v in fams.items()} == {
        "smg": 3,
        "psm": 1,
        "sglang": 1,
        "vllm": 1,
        "nccl": 2,
        "torch": 2,
        "semaphore": 1,
        "other": 1,
    }
    assert fams["smg"].nbytes == 3 * MIB, "a FIFO holds no memory"
    assert fams["nccl"].nbytes == 3 * MIB, "a hard link is one inode, counted once"
    assert fams["other"].nbytes == MIB
    assert fams["psm"].apparent_bytes == MIB
    assert u.unattributed_bytes >= 2 * MIB, "the unlinked, still open file"
    assert u.entries == 12
    assert u.used_bytes >= 10 * MIB
    assert u.total_bytes == 32 * MIB
    assert stat.S_ISFIFO(os.lstat(os.path.join(shm, "smg-tokenspeed-1-2-3")).st_mode), "the FIFO is still there"


def test_family_patterns() -> None:
    assert family_of("smg-tokenspeed-probe-1") == "smg"
    assert family_of("psm_deadbeef") == "psm"
    assert family_of("sgl_shm_x") == "sglang"
    assert family_of("my-VLLM-thing") == "vllm"
    assert family_of("nccl-1") == "nccl"
    assert family_of("torch_1") == "torch"
    assert family_of("sem.x") == "semaphore"
    assert family_of("smg") == "other", "only the smg- family, not any name starting smg"


def _doctor(*args: str, exit: int) -> dict[str, Any]:
    doc: dict[str, Any] = run_cli("--json", "doctor", "--no-gateways", *args, exit=exit).json
    return doc


def checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["result"]["checks"]}


@pytest.mark.slow
def test_doctor_capacity_fails_when_the_inflight_budget_does_not_fit(shm: str) -> None:
    write(shm, "psm_0badf00d", 8 * MIB)
    doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", shm, "--inflight-bytes", "64MiB", exit=3).json
    c = checks(doc)["capacity"]
    assert c["status"] == "fail"
    assert c["code"] == 3
    assert "64.0 MiB (--inflight-bytes)" in c["summary"]
    assert c["fix_cmd"] == ["mount", "-o", "remount,size=1G", shm]
    assert "--shm-size=1g" in c["fix"]
    # 32 MiB could not hold 64 MiB however empty: too small, and freeing space is no fix.
    assert c["cause"] == "shm_too_small"
    assert "gc --delete" not in c["fix"]
    usage = checks(doc)["shm usage"]
    assert "psm 1 (8.0 MiB)" in usage["summary"]
    assert doc["result"]["host"]["capacity"]["largest"] == {"source": "--inflight-bytes", "nbytes": 64 * MIB}
    assert doc["result"]["host"]["capacity"]["fits"] is False


@pytest.mark.slow
def test_doctor_capacity_of_a_dir_that_would_hold_the_budget_empty_is_shm_full(shm: str) -> None:
    write(shm, "psm_0badf00d", 24 * MIB)
    text = run_cli("doctor", "--no-gateways", "--shm-dir", shm, "--inflight-bytes", "16MiB", exit=3).stdout
    assert "(shm_full)" in text
    c = checks(_doctor("--shm-dir", shm, "--inflight-bytes", "16MiB", exit=3))["capacity"]
    assert (c["status"], c["cause"]) == ("fail", "shm_full")
    assert "gc --delete" in c["fix"]  # here freeing space is a fix


@pytest.mark.slow
def test_doctor_capacity_passes_when_it_fits_and_says_so_without_a_budget(shm: str) -> None:
    c = checks(_doctor("--shm-dir", shm, "--inflight-bytes", "4MiB", exit=0))["capacity"]
    assert c["status"] == "ok"
    assert "holds the largest need" in c["summary"]
    c = checks(_doctor("--shm-dir", shm, exit=0))["capacity"]
    assert c["status"] == "ok"
    assert "no in-flight budget known" in c["summary"]
    assert "--inflight-bytes" in c["fix"]


@pytest.mark.slow
def test_docker_default_size_is_named_in_capacity(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "docker", "64m") as d:
        doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", d, "--inflight-bytes", "16MiB", exit=0).json
        c = checks(doc)["capacity"]
        assert c["status"] == "warn"
        assert "Docker's 64 MiB default" in c["summary"]
        assert "--shm-size=" in c["fix"]


@pytest.mark.slow
def test_the_largest_tensor_bench_moved_is_a_capacity_need(shm: str) -> None:
    run_cli("--json", "bench", "--sizes", "256KiB,2MiB", "-n", "1", "--warmup", "0", "--shm-dir", shm)
    assert recorded_needs("/dev/shm") == [], "a need belongs to the tmpfs it was measured on"
    record_tensor_seen("smgshm bench", 4096, shm)  # a smaller one later never lowers the figure
    assert [n.nbytes for n in recorded_needs(shm)] == [2 * MIB]
    doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", shm, exit=0).json
    needs = doc["result"]["host"]["capacity"]["needs"]
    assert any(n["source"].startswith("the largest tensor smgshm bench moved here") for n in needs), needs
    c = checks(doc)["capacity"]
    assert "2.0 MiB (the largest tensor smgshm bench moved here" in c["summary"]


@pytest.mark.slow
def test_doctor_host_json_keys_are_pinned(shm: str) -> None:
    argv = ["--json", "doctor", "--no-gateways", "--shm-dir", shm, "--inflight-bytes", "1MiB"]
    host = run_cli(*argv, exit=0).json["result"]["host"]
    assert set(host) == {"gateways", "shm_usage", "capacity", "page_policy", "last_what_if"}
    assert set(host["shm_usage"]) == {
        "shm_dir",
        "total_bytes",
        "free_bytes",
        "used_bytes",
        "families",
        "unattributed_bytes",
        "entries",
        "truncated",
    }
    assert set(host["capacity"]) == {
        "free_bytes",
        "total_bytes",
        "needs",
        "largest",
        "fits",
        "explicit_unmet",
        "docker_default",
    }
    assert set(host["page_policy"]) == {"shm_dir", "mount_huge", "shmem_enabled", "huge_pages", "reason"}
