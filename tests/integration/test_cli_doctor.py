"""`smgshm doctor` against real failing conditions: real tmpfs mounts, real workers, real leaks.

Every scenario builds the condition it judges (no mocks): a private tmpfs in another mount
namespace, a tmpfs filled by a file, a 64 MiB tmpfs like Docker's default, segment files
named for a dead pid, a FIFO, an unreachable port, an SGLang-faced receiver, a bare gRPC
server, a small HTTP admin API. Scratch shm dirs are tmpfs mounts under tmp_path (as root)
or a tmpfs dir under /dev/shm not named ``smg-*`` (otherwise), so the leak check never sees
another suite's segments; one test runs doctor on the real /dev/shm.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import psutil
import pytest

from smgshm.cli.fmt import quote_cmd
from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.paths import smgshm_cmd
from tests.conftest import (
    HAVE_SMG,
    Children,
    LoopbackHttp,
    closed_port,
    make_file,
    mounted_tmpfs,
    run_cli,
    start_serve,
    wait_for,
)
from tests.support.cli_doctor import (
    CHECK_KEYS,
    ENVELOPE,
    IS_ROOT,
    RESULT_KEYS,
    SHM,
    checks,
    doctor,
    needs_init_pidns,
    trusted,
    unique,
    worst,
)

# Its checks judge leaks and liveness on private tmpfs: never beside a test that makes pid namespaces
# (tests/conftest.py).
pytestmark = pytest.mark.trust

PY = sys.executable
REAPERS = {"reaper: RemoveIPC", "reaper: tmpfiles"}
HOST_CHECKS = ["shm usage", "capacity", "page size"]  # between leaks and the reapers (plus one per gateway)

needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mount -t tmpfs)")
needs_unshare = pytest.mark.skipif(not IS_ROOT or shutil.which("unshare") is None, reason="needs root and unshare(1)")


# ---------------------------------------------------------------------------------------------
# helpers


def probe_check(doc: dict[str, Any], address: str) -> dict[str, Any]:
    c = checks(doc)
    assert f"probe {address}" in c, list(c)
    return c[f"probe {address}"]


def send_checks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in doc["result"]["checks"] if c["name"].startswith("send ")]


def dead_pid(children: Children) -> int:
    """The pid of a child that has exited and been reaped: no process has it now."""
    p = children.spawn([PY, "-c", ""])
    p.wait(timeout=30)
    assert not psutil.pid_exists(p.pid)
    return p.pid


def fill(path: str, nbytes: int | None = None) -> int:
    """Write zeros to ``path`` until ``nbytes`` are written or the filesystem is full; the size written."""
    chunk = b"\0" * 4096
    written = 0
    with open(path, "wb", buffering=0) as f:
        while nbytes is None or written < nbytes:
            try:
                written += f.write(chunk if nbytes is None else chunk[: nbytes - written])
            except OSError:
                break
    return os.path.getsize(path)


def refuses(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except OSError:
        return True


def is_tmpfs(path: str) -> bool:
    best, fstype = "", ""
    for part in psutil.disk_partitions(all=True):
        mnt = part.mountpoint
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, part.fstype
    return fstype == "tmpfs"


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[str]:
    """A 64 KiB tmpfs with one ordinary file (not smg-*) filling every page."""
    if not IS_ROOT:
        pytest.skip("needs root (mount -t tmpfs)")
    with mounted_tmpfs(tmp_path / f"packed-{unique()}", "64k") as d:
        fill(os.path.join(d, "filler"))
        vfs = os.statvfs(d)
        assert vfs.f_bavail == 0, "the filler did not fill the tmpfs"
        yield d


class FakeGateway:
    """A tiny admin API: ``serve(workers)`` returns its base URL; ``paths`` records each request."""

    def __init__(self) -> None:
        self.servers: list[LoopbackHttp] = []
        self.paths: list[str] = []

    def serve(self, workers: list[dict[str, Any]]) -> str:
        body = json.dumps({"workers": workers, "total": len(workers)}).encode()

        def listing(path: str) -> bytes:
            self.paths.append(path)  # every server's, in one list
            return body

        srv = LoopbackHttp(listing, content_type="application/json")
        self.servers.append(srv)
        return srv.base

    def close(self) -> None:
        for srv in self.servers:
            srv.close()


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    gw = FakeGateway()
    yield gw
    gw.close()


@pytest.fixture
def bare_grpc_server() -> Iterator[str]:
    """A real gRPC server that serves only grpc.health.v1: up, but neither an engine nor smgshm."""
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(10)


def gw_worker(url: str, mode: str = "grpc") -> dict[str, Any]:
    return {"url": url, "connection_mode": mode, "runtime_type": "vllm", "labels": {}}


# ---------------------------------------------------------------------------------------------
# the embedded default


def _assert_embedded_all_ok(doc: dict[str, Any], shm: str, shm_dir_status: str = "ok", private: bool = True) -> str:
    r = doc["result"]
    addr = r["embedded_receiver"]
    assert addr.startswith("127.0.0.1:")
    assert r["workers"] == [addr]
    names = [c["name"] for c in r["checks"]]
    if not private and "liveness" in names:
        # Another pid namespace shares the real /dev/shm right now: a warning, never a failure.
        assert checks(doc)["liveness"]["status"] == "warn"
        names.remove("liveness")
    # Gateways found on this (shared) machine are other processes': their checks vary.
    names = [n for n in names if not n.startswith("gateway")]
    # On the real /dev/shm with smg installed, the embedded e2e runs the real gateway per mode;
    # on any other shm dir it is skipped (SMG's gateway always writes /dev/shm).
    e2e = ["e2e shm", "e2e auto", "e2e inline"] if shm == SHM and HAVE_SMG else ["e2e"]
    assert names == [
        "namespace id",
        "shm dir",
        "writable",
        f"probe {addr}",
        "send inline",
        "send shm",
        *e2e,
        "leaks",
        *HOST_CHECKS,
        "reaper: RemoveIPC",
        "reaper: tmpfiles",
    ]
    for c in r["checks"]:
        allowed = (
            {"ok", "warn", "info"}
            if c["name"] in REAPERS | {"liveness", "page size"}
            else {"skip"}
            if c["name"] in ("e2e", "gateways")  # --no-gateways: other processes' gateways are not judged
            else {shm_dir_status}
            if c["name"] == "shm dir"
            else {"ok"}
        )
        assert c["status"] in allowed, c
    c = checks(doc)
    assert shm in c["namespace id"]["summary"]
    assert c["shm dir"]["summary"].startswith(shm)
    assert "verified with a canary segment" in c[f"probe {addr}"]["summary"]
    assert "via inline" in c["send inline"]["summary"]
    assert "via shm" in c["send shm"]["summary"]
    assert "nothing left behind" in c["send shm"]["summary"]
    if "e2e shm" in c:
        assert c["e2e shm"]["summary"].startswith("SHM: pixel_values")
        assert c["e2e inline"]["summary"].startswith("inline: mode is inline")
    if private:
        assert c["leaks"]["summary"].startswith("0 SMG segment(s)"), "the scratch dir holds no segment"
    else:  # other processes may have live segments in the real /dev/shm
        assert c["leaks"]["summary"].endswith("none leaked")
    # doctor stops the receiver it started.
    wait_for(lambda: refuses(addr), timeout=30, what=f"the embedded receiver on {addr} to stop")
    return addr


@pytest.mark.gateway
@needs_init_pidns
def test_embedded_default_on_the_real_dev_shm() -> None:
    from smgshm.core.names import GATEWAY_PROBE_PREFIX
    from smgshm.core.segments.judge import ScanOptions
    from smgshm.core.segments.scan import scan_segments

    # The real /dev/shm is shared: another run's leak would fail doctor's leaks check, not this test.
    r = scan_segments(ScanOptions(SHM))
    if r.counts["leaked"] or r.counts["hazard"] or any(n.startswith(GATEWAY_PROBE_PREFIX) for n in os.listdir(SHM)):
        pytest.skip("the shared /dev/shm holds other processes' leaks, hazards or probe files right now")
    doc = doctor(exit=0)
    assert doc["warnings"] == []
    _assert_embedded_all_ok(doc, SHM, private=False)


@pytest.mark.slow
def test_embedded_default_on_a_private_tmpfs(shm_dir: str) -> None:
    assert is_tmpfs(shm_dir)
    doc = doctor("--shm-dir", shm_dir, exit=0)
    _assert_embedded_all_ok(doc, shm_dir)
    assert os.listdir(shm_dir) == [], "the sends and probes left something in the shm dir"


@pytest.mark.slow
def test_human_mode_prints_one_line_per_check(shm_dir: str) -> None:
    res = run_cli("--no-color", "doctor", "--no-gateways", "--shm-dir", shm_dir, exit=0)
    lines = res.stdout.splitlines()
    warned = [ln for ln in lines if ln.startswith("[warn]")]
    # The first line says what the exit code says: warnings are counted, never "all passed".
    assert lines[0] == (f"doctor: passed with {len(warned)} warning(s)" if warned else "doctor: all checks passed")
    rows = [ln for ln in lines if ln.startswith("[") and not ln[7:].startswith("gateway")]
    names = [ln[7:].split(":", 1)[0] if not ln[7:].startswith("probe") else "probe" for ln in rows]
    assert names == [
        "namespace id",
        "shm dir",
        "writable",
        "probe",
        "send inline",
        "send shm",
        "e2e",
        "leaks",
        *HOST_CHECKS,
        "reaper",
        "reaper",
    ]
    for ln in rows:
        if ln.startswith(("[warn] reaper: ", "[info] page size: ", "[skip] e2e: ")):
            continue  # a reaper may warn on this machine, 4 KiB pages are advice; neither fails the run
        assert ln.startswith("[ok  ] "), ln
    assert rows[3].startswith("[ok  ] probe 127.0.0.1:")
    # Nothing else: no fix lines (nothing failed), no JSON.
    # (a fix that is longer than the terminal wraps, its continuation indented under it)
    extra = [ln for ln in lines[1:] if not ln.startswith(("[", "       fix: ", " " * 12))]
    assert extra == [], extra


@pytest.mark.slow
def test_not_tmpfs_warns_but_passes(tmp_path: Path) -> None:
    d = tmp_path / f"disk-{unique()}"
    d.mkdir()
    if is_tmpfs(str(d)):
        pytest.skip("tmp_path is itself on a tmpfs")
    doc = doctor("--shm-dir", str(d), exit=0)
    c = checks(doc)["shm dir"]
    assert c["status"] == "warn"
    assert "not tmpfs" in c["summary"]
    assert "mount a tmpfs" in c["fix"]
    # A dir on /tmp's disk is not private: another pid namespace may see it (a liveness warning).
    _assert_embedded_all_ok(doc, str(d), shm_dir_status="warn", private=False)
    assert os.listdir(d) == []


# ---------------------------------------------------------------------------------------------
# shm dir: Docker's default, nearly full, full, missing


@pytest.mark.slow
@needs_root
def test_docker_default_64_mib_tmpfs_warns(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / f"d64-{unique()}", "64m") as d:
        doc = doctor("--shm-dir", d, exit=0)
        c = checks(doc)
        assert c["shm dir"]["status"] == "warn"
        assert "Docker" in c["shm dir"]["summary"]
        assert "64 MiB" in c["shm dir"]["summary"]
        assert "--shm-size" in c["shm dir"]["fix"]
        assert c["send shm"]["status"] == "ok", "a warning is advice: the sends still pass"
        assert [x for x in doc["result"]["checks"] if x["status"] == "fail"] == []


@pytest.mark.slow
@needs_root
def test_nearly_full_tmpfs_warns(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / f"nearly-{unique()}", "100m") as d:
        vfs = os.statvfs(d)
        total = vfs.f_blocks * vfs.f_frsize
        fill(os.path.join(d, "filler"), total - total // 12)  # about 8% free: under the 10% line
        doc = doctor("--shm-dir", d, exit=0)
        c = checks(doc)["shm dir"]
        assert c["status"] == "warn"
        assert "nearly full" in c["summary"]
        assert c["fix_cmd"] == ["smgshm", "gc", "--delete", "--shm-dir", d]
        assert checks(doc)["send shm"]["status"] == "ok", "8 MiB still holds the test tensors"
        assert os.listdir(d) == ["filler"]


@pytest.mark.slow
@needs_root
def test_tmpfs_too_small_for_a_tensor_fails_send_shm_as_too_small(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / f"tiny-{unique()}", "64k") as d:
        fill(os.path.join(d, "filler"), 48 * 1024)  # 16 KiB left: room for a probe, not a 1 MiB tensor
        doc = doctor("--shm-dir", d, exit=5)
        c = checks(doc)
        assert c["writable"]["status"] == "ok", "a one-byte probe still fits"
        assert c["send inline"]["status"] == "ok", "inline needs no shm space"
        s = c["send shm"]
        assert s["status"] == "fail"
        assert s["code"] == 5
        # 64 KiB holds no 1 MiB tensor however empty: too small (enlarge it), whatever the filler takes.
        assert s["summary"].startswith("shm dir is too small")
        assert "needed_bytes=1048576" in s["summary"]
        assert s["cause"] == "shm_too_small"
        assert "gc --delete" not in s["fix"]
        assert "--shm-size" in s["fix"]
        assert os.listdir(d) == ["filler"], "a failed SHM send must not leave a partial segment"


@pytest.mark.slow
@needs_root
def test_an_empty_tmpfs_smaller_than_the_send_is_too_small_never_full(tmp_path: Path) -> None:
    """An empty 1 MiB tmpfs cannot take doctor's send (two 1 MiB tensors at once): too small, with its fix
    (enlarge it), never shm_full with gc --delete, which frees nothing there."""
    with mounted_tmpfs(tmp_path / f"one-mib-{unique()}", "1m") as d:
        doc = doctor("--shm-dir", d, exit=5)
        s = checks(doc)["send shm"]
        assert (s["status"], s["code"], s["cause"]) == ("fail", 5, "shm_too_small"), s
        assert s["summary"].startswith("shm dir is too small")
        assert "at_once_bytes=2097152" in s["summary"]
        assert s["fix"] == CATALOGUE[Cause.SHM_TOO_SMALL].fix
        assert os.listdir(d) == []
        text = run_cli("doctor", "--shm-dir", d, "--no-e2e", "--no-gateways", exit=5).stdout
        assert "(shm_too_small)" in text
        assert "shm_full" not in text
        assert "gc --delete" not in text


@pytest.mark.slow
@needs_root
def test_a_tmpfs_that_would_hold_the_send_empty_is_full(tmp_path: Path) -> None:
    """4 MiB would hold the send's 2 MiB at once; a filler leaves less than that free: full (free it)."""
    with mounted_tmpfs(tmp_path / f"four-mib-{unique()}", "4m") as d:
        fill(os.path.join(d, "filler"), 3 << 20)
        s = checks(doctor("--shm-dir", d, exit=5))["send shm"]
        assert (s["status"], s["cause"]) == ("fail", "shm_full"), s
        assert s["summary"].startswith("shm dir is full")
        assert shlex.join(["smgshm", "gc", "--delete", "--shm-dir", d]) in s["fix"]
        assert os.listdir(d) == ["filler"]


@pytest.mark.slow
def test_full_tmpfs_fails_writable_and_send_shm_with_exit_5(full_tmpfs: str) -> None:
    doc = doctor("--shm-dir", full_tmpfs, exit=5)
    c = checks(doc)
    assert c["writable"]["status"] == "fail"
    assert c["writable"]["code"] == 5
    assert c["writable"]["cause"] == "shm_full"
    assert "No space left on device" in c["writable"]["summary"]
    assert c["send inline"]["status"] == "ok"
    assert c["send shm"]["status"] == "fail"
    assert c["send shm"]["code"] == 5
    assert c["leaks"]["status"] == "ok"
    assert os.listdir(full_tmpfs) == ["filler"], "nothing but the filler may be left"


@pytest.mark.slow
def test_full_tmpfs_send_shm_says_why_and_how_to_fix(full_tmpfs: str) -> None:
    s = checks(doctor("--shm-dir", full_tmpfs, exit=5))["send shm"]
    assert "shm dir is too small" in s["summary"], s  # 64 KiB holds no 1 MiB tensor, full or empty
    assert s["fix"], s


@pytest.mark.slow
def test_full_tmpfs_writable_fix_is_about_space(full_tmpfs: str) -> None:
    w = checks(doctor("--shm-dir", full_tmpfs, exit=5))["writable"]
    assert "No space left on device" in w["summary"]
    assert "uid" not in w["fix"], w
    assert "gc --delete" in w["fix"] or "enlarge" in w["fix"] or "--shm-size" in w["fix"], w


def test_missing_shm_dir_exits_5(tmp_path: Path) -> None:
    missing = str(tmp_path / f"missing-{unique()}")
    doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", missing, "--timeout", "2s", exit=5).json
    assert doc["ok"] is False
    assert missing in json.dumps(doc)
    assert not os.path.exists(missing), "doctor must not create the shm dir"


def test_missing_shm_dir_still_reports_every_check(tmp_path: Path) -> None:
    missing = str(tmp_path / f"missing-{unique()}")
    doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", missing, "--timeout", "2s", exit=5).json
    assert "result" in doc, doc
    c = {x["name"]: x for x in doc["result"]["checks"]}
    assert c["shm dir"]["status"] == "fail"
    assert c["shm dir"]["code"] == 5


# ---------------------------------------------------------------------------------------------
# the namespace id (a private mount namespace with boot_id bind-mounted over)


def _doctor_with_boot_id(tmp_path: Path, children: Children, shm: str, boot_id: str) -> tuple[int, dict[str, Any]]:
    fake = tmp_path / f"boot_id-{unique()}"
    fake.write_text(boot_id, encoding="ascii")
    # --no-gateways: other tests' gateways on this machine are not this test's to judge.
    doctor = f"{PY} -m smgshm --json doctor --no-gateways --shm-dir {shm}"
    inner = f"mount --bind {fake} /proc/sys/kernel/random/boot_id && exec {doctor}"
    p = children.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner])
    out, err = p.communicate(timeout=60)
    assert out, f"doctor printed nothing (exit {p.returncode}): {err}"
    doc: dict[str, Any] = json.loads(out)
    assert set(doc) == ENVELOPE
    return p.returncode, doc


@pytest.mark.slow
@needs_unshare
def test_unreadable_boot_id_fails_namespace_id(tmp_path: Path, children: Children, shm_dir: str) -> None:
    code, doc = _doctor_with_boot_id(tmp_path, children, shm_dir, "")
    c = checks(doc)
    assert c["namespace id"]["status"] == "fail"
    assert c["namespace id"]["code"] == 6
    assert "boot_id" in c["namespace id"]["fix"]
    addr = doc["result"]["embedded_receiver"]
    assert c[f"probe {addr}"]["status"] == "fail"
    assert c[f"probe {addr}"]["code"] == 6
    # One fact, one cause, as probe names it (test_causes.py): this host's id, not the worker's.
    assert c["namespace id"]["cause"] == c[f"probe {addr}"]["cause"] == "namespace_unreadable"
    assert code == 6 == worst([x["code"] for x in doc["result"]["checks"] if x["status"] == "fail"])
    assert os.listdir(shm_dir) == []


@pytest.mark.slow
@needs_unshare
def test_malformed_boot_id_fails_namespace_id(tmp_path: Path, children: Children, shm_dir: str) -> None:
    code, doc = _doctor_with_boot_id(tmp_path, children, shm_dir, "garbage\n")
    assert code == 6
    assert checks(doc)["namespace id"]["status"] == "fail", checks(doc)["namespace id"]


# ---------------------------------------------------------------------------------------------
# leaks, hazards, leftover probe files


@pytest.mark.slow
@needs_init_pidns
def test_leaked_segment_fails_leaks(children: Children, shm_dir: str) -> None:
    name = f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0"
    path = make_file(shm_dir, name)
    # On a shared machine another job's pid namespace can reach this mount for a while; doctor
    # then rightly says unknown (a warning), which is not what this test is about.
    doc = trusted(shm_dir, lambda: doctor("--shm-dir", shm_dir, exit=3))
    c = checks(doc)["leaks"]
    assert c["status"] == "fail"
    assert c["code"] == 3
    assert c["fix_cmd"] == ["smgshm", "gc", "--delete", "--shm-dir", shm_dir]
    assert c["summary"].startswith("1 leaked segment(s)")
    assert "hazards" not in checks(doc)
    assert checks(doc)["send shm"]["status"] == "ok", "a leak elsewhere does not stop a send"
    assert os.path.exists(path), "doctor reports; it never deletes"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_fifo_named_like_a_segment_fails_hazards(shm_dir: str) -> None:
    fifo = os.path.join(shm_dir, "smg-tokenspeed-fifo-x")
    os.mkfifo(fifo, 0o600)
    t0 = time.monotonic()
    doc = doctor("--shm-dir", shm_dir, exit=3)
    assert time.monotonic() - t0 < 45, "doctor must not block on the FIFO"
    c = checks(doc)
    assert c["hazards"]["status"] == "fail"
    assert c["hazards"]["code"] == 3
    assert "FIFO" in c["hazards"]["summary"]
    assert c["hazards"]["fix_cmd"] == ["smgshm", "gc", "--all", "--shm-dir", shm_dir]
    assert c["leaks"]["status"] == "ok", "a FIFO is a hazard, not a leak"
    assert os.path.exists(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.slow
@needs_init_pidns
def test_leftover_gateway_probe_file_fails_probe_files(children: Children, shm_dir: str) -> None:
    pid = dead_pid(children)
    name = f"smg-tokenspeed-probe-{pid}"
    make_file(shm_dir, name, size=0)
    doc = trusted(shm_dir, lambda: doctor("--shm-dir", shm_dir, exit=3))
    c = checks(doc)
    pf = c["probe files"]
    assert pf["status"] == "fail"
    assert pf["code"] == 3
    assert pf["cause"] == "probe_file_left"
    assert name in pf["summary"]
    assert f"a gateway with pid {pid} will stay inline" in pf["summary"]
    assert shlex.join(["smgshm", "gc", "--delete", "--shm-dir", shm_dir]) in pf["fix"]
    assert c["leaks"]["status"] == "fail", "a probe file of a dead pid is also a leaked entry"
    assert os.path.exists(os.path.join(shm_dir, name))


@pytest.mark.slow
@needs_init_pidns
def test_human_mode_prints_the_fix_and_the_failure_count(children: Children, shm_dir: str) -> None:
    make_file(shm_dir, f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0")
    res = trusted(shm_dir, lambda: run_cli("--no-color", "doctor", "--no-gateways", "--shm-dir", shm_dir, exit=3))
    lines = res.stdout.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("[FAIL] leaks: "))
    assert lines[i + 1] == "       fix: reap them:"
    assert lines[i + 2] == "            " + quote_cmd(["smgshm", "gc", "--delete", "--shm-dir", shm_dir])
    assert lines[0] == "doctor: 1 check(s) failed: leaks", "the verdict first, naming what failed"


@pytest.mark.slow
@needs_init_pidns
def test_quiet_mode_keeps_the_exit_code(children: Children, shm_dir: str) -> None:
    make_file(shm_dir, f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0")
    res = trusted(shm_dir, lambda: run_cli("-q", "doctor", "--no-gateways", "--shm-dir", shm_dir, exit=3))
    assert "[ok  ]" not in res.stdout, "--quiet prints no progress lines"


# ---------------------------------------------------------------------------------------------
# workers


@pytest.mark.slow
@needs_unshare
@pytest.mark.timeout(90)
def test_private_tmpfs_worker_fails_the_probe(children: Children, shm_dir: str) -> None:
    inner = f"mount -t tmpfs -o size=4m tmpfs {SHM} && exec {PY} -m smgshm --json serve --listen 127.0.0.1:0"
    p = children.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner])
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, f"serve exited early: {p.stderr.read() if p.stderr else ''}"
    ready = json.loads(line)["result"]
    addr = ready["address"]
    from smgshm.core.host.namespace import read_namespace_id

    assert ready["namespace_id"] != read_namespace_id(shm_dir), "the worker has its own tmpfs"

    doc = doctor("--worker", addr, "--shm-dir", shm_dir, exit=3)
    assert doc["result"]["embedded_receiver"] == ""
    assert doc["result"]["workers"] == [addr]
    c = probe_check(doc, addr)
    assert c["status"] == "fail"
    assert c["code"] == 3
    assert c["summary"].startswith("private_tmpfs: ")
    assert c["cause"] == "namespace_private_tmpfs"
    assert "different tmpfs" in c["summary"]
    assert "--ipc" in c["fix"]
    # It is a smgshm receiver, so the sends run: inline works, SHM cannot (the tmpfs is not shared).
    assert checks(doc)["send inline"]["status"] == "ok"
    assert checks(doc)["send shm"]["status"] == "fail"
    assert os.listdir(shm_dir) == [], "the failed SHM sends left their segments behind"
    assert p.poll() is None, "the worker outlives the doctor run"


@pytest.mark.timeout(60)
def test_unreachable_worker_exits_4_quickly(shm_dir: str) -> None:
    addr = f"127.0.0.1:{closed_port()}"
    t0 = time.monotonic()
    doc = doctor("--worker", addr, "--timeout", "500ms", "--shm-dir", shm_dir, exit=4)
    assert time.monotonic() - t0 < 20, "a 500 ms timeout must bound the run"
    c = probe_check(doc, addr)
    assert c["status"] == "fail"
    assert c["code"] == 4
    assert c["summary"].startswith("unreachable: ")
    assert c["cause"] == "worker_unreachable"
    assert "gRPC server is up" in c["fix"]
    assert send_checks(doc) == [], "no send to a worker that does not answer"
    assert doc["result"]["workers"] == [addr]
    assert doc["result"]["embedded_receiver"] == ""
    assert checks(doc)["leaks"]["status"] == "ok", "the local checks still run"


@pytest.mark.slow
def test_sglang_faced_receiver_is_undetermined_but_still_sent_to(children: Children, shm_dir: str) -> None:
    p, ready = start_serve(children, "--engine", "sglang", "--shm-dir", shm_dir)
    addr = ready["result"]["address"]
    assert ready["result"]["engine"] == "sglang"
    doc = doctor("--worker", addr, "--shm-dir", shm_dir, exit=6)
    c = probe_check(doc, addr)
    assert c["status"] == "fail"
    assert c["code"] == 6
    assert c["summary"].startswith("undetermined: ")
    assert "SGLang" in c["fix"]
    assert c["cause"] == "engine_inline_only"  # its engine, not its missing id
    # The gateway sends SGLang inline only, but this worker is still smgshm's receiver (it
    # serves Diagnostics), so doctor does run both sends, and they pass.
    sends = {s["name"]: s for s in send_checks(doc)}
    assert set(sends) == {"send inline", "send shm"}
    assert {s["status"] for s in sends.values()} == {"ok"}
    assert os.listdir(shm_dir) == []
    assert p.poll() is None


def test_non_smgshm_grpc_server_gets_no_send_checks(bare_grpc_server: str, shm_dir: str) -> None:
    addr = bare_grpc_server
    doc = doctor("--worker", addr, "--timeout", "2s", "--shm-dir", shm_dir, exit=4)
    c = probe_check(doc, addr)
    assert c["status"] == "fail"
    assert c["code"] == 4
    assert "no SMG engine service answers" in c["summary"]
    assert send_checks(doc) == [], "only a smgshm receiver can verify a send"


@pytest.mark.slow
def test_shared_worker_passes(children: Children, shm_dir: str) -> None:
    _, ready = start_serve(children, "--shm-dir", shm_dir)
    addr = ready["result"]["address"]
    doc = doctor("--worker", addr, "--shm-dir", shm_dir, exit=0)
    c = probe_check(doc, addr)
    assert c["status"] == "ok"
    assert "verified with a canary segment" in c["summary"]
    assert [s["status"] for s in send_checks(doc)] == ["ok", "ok"]
    assert os.listdir(shm_dir) == [], "the receiver unlinked every segment it read"


@pytest.mark.slow
def test_send_checks_name_their_worker(children: Children, shm_dir: str) -> None:
    _, a = start_serve(children, "--shm-dir", shm_dir)
    _, b = start_serve(children, "--shm-dir", shm_dir)
    doc = doctor("--worker", a["result"]["address"], "--worker", b["result"]["address"], "--shm-dir", shm_dir, exit=0)
    names = [s["name"] for s in send_checks(doc)]
    assert len(names) == 4
    assert len(set(names)) == 4, names


# ---------------------------------------------------------------------------------------------
# --from-gateway


@pytest.mark.slow
def test_from_gateway_probes_the_registered_worker(children: Children, gateway: FakeGateway, shm_dir: str) -> None:
    _, ready = start_serve(children, "--shm-dir", shm_dir)
    addr = ready["result"]["address"]
    url = gateway.serve([gw_worker(f"grpc://{addr}"), gw_worker("http://127.0.0.1:1", mode="http")])
    # --no-e2e: this fake gateway has only /workers (tests/test_cli_e2e.py runs doctor's e2e on the real one).
    doc = doctor("--from-gateway", url, "--shm-dir", shm_dir, "--no-e2e", exit=0)
    assert gateway.paths == ["/workers"]
    assert doc["result"]["workers"] == [f"grpc://{addr}"], "the HTTP worker is not a gRPC worker to check"
    assert doc["result"]["embedded_receiver"] == ""
    c = probe_check(doc, f"grpc://{addr}")
    assert c["status"] == "ok"
    assert [s["status"] for s in send_checks(doc)] == ["ok", "ok"]


@pytest.mark.slow
def test_from_gateway_with_no_grpc_workers_is_judged_not_refused(gateway: FakeGateway, shm_dir: str) -> None:
    """No gRPC worker is the gateway's state, not a usage error: doctor checks this host with its embedded
    receiver (tests/test_causes.py runs it against a real gateway with none: no_workers, gateway_not_ready)."""
    url = gateway.serve([gw_worker("http://127.0.0.1:1", mode="http")])
    doc = doctor("--no-gateways", "--from-gateway", url, "--shm-dir", shm_dir, "--no-e2e", exit=0)
    assert doc["result"]["workers"] == [doc["result"]["embedded_receiver"]] != [""]


@pytest.mark.slow
def test_from_gateway_with_no_workers_is_inconclusive_never_passed(gateway: FakeGateway, shm_dir: str) -> None:
    """A gateway that lists no worker: its SHM was judged on nothing, so doctor is inconclusive (exit 6), naming
    no_workers first, in JSON and in the headline (it was a warning, exit 0)."""
    url = gateway.serve([])
    args = ("doctor", "--no-gateways", "--from-gateway", url, "--shm-dir", shm_dir, "--no-e2e")
    doc = doctor(*args[2:], exit=6)
    none = checks(doc)[f"gateway {url} workers"]
    assert (none["status"], none["cause"], none["code"]) == ("unknown", "no_workers", 6)
    text = run_cli(*args, exit=6, env={"COLUMNS": "200"}).stdout
    assert text.splitlines()[0] == f"doctor: inconclusive: 1 check(s) judged nothing: gateway {url} workers"


def test_from_gateway_unreachable_exits_4() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    res = run_cli("--json", "doctor", "--no-gateways", "--from-gateway", url, "--timeout", "1s", exit=4)
    assert res.json["ok"] is False
    msg = res.json["error"]["message"]
    assert "gateway unreachable" in msg or "connection refused" in msg


# ---------------------------------------------------------------------------------------------
# the exit code is the worst check's, in the order 4, 5, 3, 6


@pytest.mark.slow
@needs_init_pidns
def test_unreachable_beats_full_beats_leaked(children: Children, full_tmpfs: str) -> None:
    # The leak goes in before the filler fills the tmpfs: delete the filler, add it, refill.
    os.unlink(os.path.join(full_tmpfs, "filler"))
    make_file(full_tmpfs, f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0")
    fill(os.path.join(full_tmpfs, "filler"))
    dead = f"127.0.0.1:{closed_port()}"
    doc = trusted(full_tmpfs, lambda: doctor("--worker", dead, "--timeout", "500ms", "--shm-dir", full_tmpfs, exit=4))
    codes = {c["name"]: c["code"] for c in doc["result"]["checks"] if c["status"] == "fail"}
    assert codes[f"probe {dead}"] == 4
    assert codes["writable"] == 5
    assert codes["leaks"] == 3
    # Without the unreachable worker, the full tmpfs (5) outranks the leak (3).
    doc = trusted(full_tmpfs, lambda: doctor("--shm-dir", full_tmpfs, exit=5))
    assert checks(doc)["leaks"]["code"] == 3


@pytest.mark.slow
@needs_init_pidns
def test_leaked_beats_undetermined(children: Children, shm_dir: str) -> None:
    make_file(shm_dir, f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0")
    _, ready = start_serve(children, "--engine", "sglang", "--shm-dir", shm_dir)
    addr = ready["result"]["address"]
    doc = trusted(shm_dir, lambda: doctor("--worker", addr, "--shm-dir", shm_dir, exit=3))
    assert probe_check(doc, addr)["code"] == 6
    assert checks(doc)["leaks"]["code"] == 3


# ---------------------------------------------------------------------------------------------
# the JSON document


@pytest.mark.slow
@needs_init_pidns
def test_json_envelope_on_success_and_failure(children: Children, shm_dir: str) -> None:
    ok = doctor("--shm-dir", shm_dir, exit=0)
    assert set(ok) == ENVELOPE
    assert set(ok["result"]) == RESULT_KEYS
    assert ok["ok"] is True
    assert isinstance(ok["smgshm_version"], str)
    assert ok["smgshm_version"]
    assert isinstance(ok["warnings"], list)
    make_file(shm_dir, f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0")
    bad = trusted(shm_dir, lambda: doctor("--shm-dir", shm_dir, exit=3))
    assert set(bad) == ENVELOPE, "a failing check is a result, not an error document"
    assert set(bad["result"]) == RESULT_KEYS
    assert bad["ok"] is False
    for doc in (ok, bad):
        for c in doc["result"]["checks"]:
            assert set(c) == CHECK_KEYS


@pytest.mark.slow
@needs_init_pidns
@pytest.mark.timeout(90)
def test_every_suggested_command_names_the_shm_dir_examined(children: Children, shm_dir: str) -> None:
    """Pasted, doctor's fixes act on the dir it examined (a leak, a leftover probe file, a FIFO), not /dev/shm."""
    # In a private tmpfs, not on the root filesystem: every other job's pid namespace on this
    # machine sees that one, and doctor then rightly calls the leak unknown, not leaked.
    d = os.path.join(shm_dir, "odd dir;$(x)")
    os.mkdir(d)
    leaked = make_file(d, f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0", age_s=3600)
    make_file(d, f"smg-tokenspeed-probe-{dead_pid(children)}", size=0)
    os.mkfifo(os.path.join(d, "smg-tokenspeed-fifo-x"), 0o600)
    doc = trusted(d, lambda: doctor("--shm-dir", d, "--no-e2e", exit=3))
    c = checks(doc)
    for name in ("leaks", "hazards"):
        assert c[name]["fix_cmd"][-2:] == ["--shm-dir", d], c[name]
    assert shlex.join(["--shm-dir", d]) in c["probe files"]["fix"]
    res = trusted(d, lambda: run_cli("--no-color", "doctor", "--no-gateways", "--shm-dir", d, "--no-e2e", exit=3))
    assert quote_cmd(["smgshm", "gc", "--delete", "--shm-dir", d]) in res.stdout
    # What the leak's fix line says, run (its argv after "smgshm"), reaps the leak in d.
    run_cli(*c["leaks"]["fix_cmd"][1:], "--yes", "--assume-dead")
    assert not os.path.exists(leaked)
    # The default dir is not named: the command stays as short as it was.
    assert smgshm_cmd("/dev/shm", "gc", "--delete") == ["smgshm", "gc", "--delete"]


# Names itself (comm, as PR_SET_NAME sets it: what ps shows) and waits.
NAMED = """
import ctypes, signal, sys
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
print("ready", flush=True)
signal.pause()
"""


@pytest.mark.parametrize("command", ["doctor", "e2e"])
def test_a_gateway_pid_that_is_no_gateway_is_a_usage_error(children: Children, command: str) -> None:
    """--gateway-pid of no process, or of a process that is not an SMG gateway, is exit 2 with one
    error line naming the pid (it was 4, "unreachable"); the process's own name comes out escaped."""
    gone = children.spawn([sys.executable, "-c", ""])
    gone.wait(timeout=30)
    assert not psutil.pid_exists(gone.pid)
    res = run_cli(command, "--gateway-pid", str(gone.pid), exit=2)
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("Error: ")]
    assert line.endswith(f"--gateway-pid: no process has pid {gone.pid} (in this pid namespace)"), line
    other = children.spawn([sys.executable, "-c", NAMED, "evil\x1b[2J"])
    assert other.stdout is not None
    assert other.stdout.readline().strip() == "ready"
    res = run_cli(command, "--gateway-pid", str(other.pid), exit=2)
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("Error: ")]
    assert f"pid {other.pid} (evil\\x1b[2J) is not an SMG gateway (process title smg::router)" in line, line
    assert "\x1b" not in res.stderr
    doc = run_cli("--json", command, "--gateway-pid", str(gone.pid), exit=2).json
    assert doc["error"]["kind"] == "usage"
    assert str(gone.pid) in doc["error"]["message"]
