"""smgshm preflight on real tmpfs mounts, in real pid, mount and IPC namespaces (unshare): a "pod" is a
new pid namespace whose pid 1 has the pod's tmpfs bound at /dev/shm. A first gateway stand-in, pid 1 of
one pod incarnation, writes a payload and a probe file and dies; preflight, pid 1 of the next, reclaims
them and execs the next stand-in, which keeps pid 1 and finds them gone."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, make_file, mounted_tmpfs, run_cli, smgshm_argv, wait_for
from tests.support.e2e import needs_smg

# makes pid namespaces: never beside a test whose verdicts need liveness trusted (tests/conftest.py)
pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None,
        reason="needs root and unshare(1) for mounts and namespaces",
    ),
    pytest.mark.pidns,
]

# The previous incarnation: pid 1 writes a payload and its probe file, then dies (as a crash would leave them).
OLD_GATEWAY = r"""
import os, time
assert os.getpid() == 1, os.getpid()
for name in (f"smg-tokenspeed-1-{time.time_ns()}-0", "smg-tokenspeed-probe-1"):
    fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, b"x" * 8192)
    os.close(fd)
"""
# The next one, exec'd by preflight: says its pid and what /dev/shm holds.
NEW_GATEWAY = "import json, os; print(json.dumps({'pid': os.getpid(), 'shm': sorted(os.listdir('/dev/shm'))}))"
# A live producer of another pid in the same pod (and pid namespace): its segment, then a marker, then it waits.
PRODUCER = r"""
import os, time
open(f"/dev/shm/smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0", "wb").write(b"y" * 4096)
open("/dev/shm/ready", "w").close()
time.sleep(600)
"""
WAIT_READY = "while [ ! -e /dev/shm/ready ]; do sleep 0.02; done"


def _flat(lines: list[str]) -> str:
    """The human output as one line of words: a headline wrapped at 80 columns (stdout is no TTY) reads whole."""
    return " ".join(" ".join(lines).split())


def pod(argv: list[str], dshm: str, *, before: str = "", ipc: bool = True, timeout: float = 120) -> list[str]:
    """Run ``argv`` as pid 1 of a new pid + mount (+ IPC) namespace with ``dshm`` at /dev/shm (``before``:
    shell run first, as pid 1, in the background of which the argv is exec'd); its stdout lines."""
    script = f'mount --bind "$0" /dev/shm && {before}exec "$@"'
    cmd = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--propagation",
        "private",
        *(["--ipc"] if ipc else []),
        "sh",
        "-c",
        script,
        dshm,
        *argv,
    ]
    # The whole namespace dies with its pid 1 (the kernel kills the rest): nothing outlives the run.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    assert p.returncode in (0, 3), (p.returncode, p.stdout, p.stderr)
    pod.last = p  # type: ignore[attr-defined]
    return p.stdout.splitlines()


@pytest.fixture
def dshm(tmp_path: Path) -> Iterator[str]:
    with mounted_tmpfs(tmp_path / "dshm", "16m") as d:
        yield d


def _crash_old_gateway(dshm: str) -> None:
    pod([sys.executable, "-c", OLD_GATEWAY], dshm)
    assert sorted(n for n in os.listdir(dshm) if n.startswith("smg-tokenspeed-1") or "probe" in n)


def _wrapper(dshm: str, *flags: str, before: str = "", ipc: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    lines = pod(
        smgshm_argv("--json", "preflight", *flags, "--", sys.executable, "-c", NEW_GATEWAY),
        dshm,
        before=before,
        ipc=ipc,
    )
    doc = json.loads(lines[0])
    assert len(lines) == 2, lines
    return doc, json.loads(lines[1])


def test_wrapper_reclaims_pid_1s_previous_incarnation_and_execs_the_gateway_as_pid_1(dshm: str) -> None:
    _crash_old_gateway(dshm)
    old = sorted(n for n in os.listdir(dshm) if n.startswith("smg-"))
    dead = make_file(dshm, "smg-tokenspeed-4242-1-0", age_s=3600)  # another pid, absent in the pod: gc's rule
    before = f"{{ {shlex.join([sys.executable, '-c', PRODUCER])} & }}; {WAIT_READY}; "
    doc, gw = _wrapper(dshm, "--pod-private", "--inflight-bytes", "1MiB", before=before)
    r = doc["result"]
    assert (r["verdict"], r["may_start"], r["mode"], r["pid"]) == ("ok", True, "wrapper", 1)
    assert (r["proof"]["rule"], r["proof"]["holds"]) == ("pid", True), r["proof"]
    assert sorted(e["name"] for e in r["reclaimed"]) == sorted([*old, os.path.basename(dead)])
    by_name = {e["name"]: e for e in r["reclaimed"]}
    assert "preflight's and the gateway's it execs" in by_name["smg-tokenspeed-probe-1"]["reason"]
    assert r["reclaimed_bytes"] == 2 * 8192 + 4096
    # The live producer's segment (a small pid there, after sh's mount) is in flight: kept.
    (kept,) = r["kept"]
    assert kept["state"] == "in_flight", kept
    assert 1 < kept["producer_pid"] < 10, kept
    # The exec'd program is the gateway: pid 1, and the old incarnation's names are gone before it runs.
    assert gw["pid"] == 1
    assert gw["shm"] == sorted([kept["name"], "ready"])
    # The producer died with its pod. Its young segment is judged by gc's rules, as gc --delete reaps: its
    # pid is dead (or taken since) in this pid namespace, and the run before saw it before this run's look at
    # the pid namespaces, so it is proven leaked and reclaimed at any age (no --min-age wait).
    doc, gw = _wrapper(dshm, "--pod-private")
    assert (doc["result"]["verdict"], doc["result"]["reclaimed_count"]) == ("ok", 1), doc["result"]
    assert [e["name"] for e in doc["result"]["reclaimed"]] == [kept["name"]]
    assert gw["shm"] == ["ready"]
    # Idempotent: the next start reclaims nothing and may start.
    doc, gw = _wrapper(dshm, "--pod-private")
    assert (doc["result"]["verdict"], doc["result"]["reclaimed_count"], doc["result"]["kept"]) == ("ok", 0, [])


@pytest.mark.parametrize("how", ["no_pod_private", "host_ipc", "nested_pid_namespace"])
def test_wrapper_reclaims_nothing_by_pid_where_the_proof_does_not_hold(dshm: str, how: str) -> None:
    """The gateway may start (exit 0), but the verdict is unknown and the old payload stays, said so."""
    _crash_old_gateway(dshm)
    os.unlink(os.path.join(dshm, "smg-tokenspeed-probe-1"))  # (a probe file left decides alone: next test)
    flags, ipc, before = ["--pod-private"], True, ""
    if how == "no_pod_private":
        flags = []
    elif how == "host_ipc":
        ipc = False
    else:  # a process in a pid namespace nested in the pod's, which sees the tmpfs
        nested = shlex.join(
            [
                "unshare",
                "--pid",
                "--fork",
                sys.executable,
                "-c",
                "import time; open('/dev/shm/ready', 'w').close(); time.sleep(600)",
            ]
        )
        before = f"{{ {nested} & }}; {WAIT_READY}; "
    doc, gw = _wrapper(dshm, *flags, before=before, ipc=ipc)
    r = doc["result"]
    assert (r["verdict"], r["may_start"], r["proof"]["holds"], r["reclaimed_count"]) == ("unknown", True, False, 0)
    note = r["proof"]["note"]
    assert {
        "no_pod_private": "--pod-private",
        "host_ipc": "host's IPC namespace",
        "nested_pid_namespace": "another pid namespace",
    }[how] in note
    (kept,) = r["kept"]
    assert kept["state"] == "unknown"
    assert kept["name"].startswith("smg-tokenspeed-1-")
    assert kept["name"] in gw["shm"]  # the gateway started, and the payload is still there


def test_a_probe_file_left_degrades_the_wrapper_and_stops_it_only_with_require_shm(dshm: str) -> None:
    """SMG turns SHM off for its life when its probe file is there, and serves inline: the gateway starts (the
    cause and its fix said), unless --require-shm."""
    _crash_old_gateway(dshm)
    lines = pod(smgshm_argv("preflight", "--", sys.executable, "-c", NEW_GATEWAY), dshm)
    assert pod.last.returncode == 0  # type: ignore[attr-defined]
    text = "\n".join(lines)
    assert _flat(lines).startswith(
        "preflight degraded: the gateway is exec'd next; SHM will be off (inline): probe_file_left"
    )
    assert "must not start" not in text
    assert "fix:" in text
    assert "--pod-private" in text
    assert json.loads(lines[-1])["pid"] == 1  # exec'd: the gateway is pid 1
    lines = pod(smgshm_argv("preflight", "--require-shm", "--", sys.executable, "-c", NEW_GATEWAY), dshm)
    assert pod.last.returncode == 3  # type: ignore[attr-defined]
    assert _flat(lines).startswith("preflight failed (probe_file_left): the gateway must not start")
    assert not any(line.startswith("{") for line in lines)  # the gateway was not exec'd
    # --start-anyway (the old gate's way out) still runs: it is the default now
    lines = pod(smgshm_argv("--json", "preflight", "--start-anyway", "--", sys.executable, "-c", NEW_GATEWAY), dshm)
    r = json.loads(lines[0])["result"]
    assert (r["causes"][0]["code"], r["verdict"], r["may_start"], r["require_shm"]) == (
        "probe_file_left",
        "fail",
        True,
        False,
    )
    assert json.loads(lines[1])["pid"] == 1
    assert pod.last.returncode == 0  # type: ignore[attr-defined]


HOLD_PROBE = (
    "import os, time; fd = os.open('/dev/shm/smg-tokenspeed-probe-1', os.O_RDONLY); "
    "open('/dev/shm/ready', 'w').close(); time.sleep(600)"
)


@pytest.mark.parametrize("how", ["no_pod_private", "host_ipc", "host_ipc_pod_private", "nested_pid_namespace", "held"])
def test_a_probe_file_lefts_fix_names_the_cause_that_holds(dshm: str, how: str) -> None:
    """The fix said "pass --pod-private" to a run that had passed it, where the cause was the host's IPC
    namespace (or a process of another pid namespace, or a holder): each cause gets its own fix."""
    _crash_old_gateway(dshm)
    flags, ipc, before = ["--pod-private"], True, ""
    if how == "no_pod_private":
        flags = []
    elif how in ("host_ipc", "host_ipc_pod_private"):
        ipc, flags = False, (["--pod-private"] if how == "host_ipc_pod_private" else [])
    elif how == "nested_pid_namespace":
        nested = shlex.join(
            ["unshare", "--pid", "--fork", sys.executable, "-c", "import time; open('/dev/shm/ready', 'w').close(); "
             "time.sleep(600)"]
        )  # fmt: skip
        before = f"{{ {nested} & }}; {WAIT_READY}; "
    else:  # held: the proof holds, and a process of the pod keeps the probe file open
        before = f"{{ {shlex.join([sys.executable, '-c', HOLD_PROBE])} & }}; {WAIT_READY}; "
    argv = smgshm_argv("--json", "preflight", *flags, "--", sys.executable, "-c", NEW_GATEWAY)
    lines = pod(argv, dshm, before=before, ipc=ipc)
    r = json.loads(lines[0])["result"]
    (cause,) = [c for c in r["causes"] if c["code"] == "probe_file_left"]
    fix = cause["fix"]
    assert ("pass --pod-private" in fix) is (how == "no_pod_private"), fix
    expect = {
        "no_pod_private": "if every process that writes SMG names in this tmpfs is in this pid namespace",
        "host_ipc": "shares the host's IPC namespace",
        "host_ipc_pod_private": "shares the host's IPC namespace",
        "nested_pid_namespace": "another pid namespace",
        "held": "end the process that holds it (open or mapped by",
    }[how]
    assert expect in fix, fix
    assert r["proof"]["holds"] is (how == "held")


def test_init_container_reclaims_every_smg_name_and_nothing_else(dshm: str) -> None:
    _crash_old_gateway(dshm)
    make_file(dshm, "smg-tokenspeed-7-1-0")  # young, another pid: the proof needs no age
    make_file(dshm, "sem.mp-other")
    os.symlink("/etc/hostname", os.path.join(dshm, "smg-tokenspeed-3-1-0"))
    lines = pod(smgshm_argv("--json", "preflight", "--init-container"), dshm)
    r = json.loads(lines[0])["result"]
    assert (r["verdict"], r["mode"], r["proof"]["holds"], r["reclaimed_count"]) == ("ok", "init_container", True, 3)
    assert sorted(os.listdir(dshm)) == ["sem.mp-other", "smg-tokenspeed-3-1-0"]  # the link is a hazard, untouched
    assert r["kept"][0]["state"] == "hazard"
    assert os.path.exists("/etc/hostname")


def test_init_container_is_refused_while_another_process_uses_the_tmpfs(dshm: str) -> None:
    _crash_old_gateway(dshm)
    user = shlex.join([sys.executable, "-c", "import time; open('/dev/shm/ready', 'w').close(); time.sleep(600)"])
    lines = pod(smgshm_argv("--json", "preflight", "--init-container"), dshm, before=f"{{ {user} & }}; {WAIT_READY}; ")
    r = json.loads(lines[0])["result"]
    assert (r["verdict"], r["proof"]["holds"], r["reclaimed_count"]) == ("unknown", False, 0)
    assert "(python" in r["proof"]["note"], r["proof"]["note"]
    assert "does not hold" in r["proof"]["note"]
    assert len([n for n in os.listdir(dshm) if n.startswith("smg-tokenspeed-")]) == 2


def test_a_check_deletes_nothing_unless_asked_to_reclaim(dshm: str) -> None:
    """preflight --npd (as the shipped NPD rule runs it, every 5 minutes as root) and a standalone run are
    read-only: the leak is reported as reclaimable and left; --reclaim reclaims it."""
    leak = os.path.basename(make_file(dshm, "smg-tokenspeed-4242-1-0", age_s=3600))  # pid 4242: none in the pod
    npd = pod(smgshm_argv("preflight", "--npd", "--pod-private"), dshm)
    assert npd[0].startswith("preflight ok"), npd
    assert "1 reclaimable (read-only)" in npd[0], npd
    assert os.listdir(dshm) == [leak], "a check deleted a segment"
    r = json.loads(pod(smgshm_argv("--json", "preflight", "--pod-private"), dshm)[0])["result"]
    assert (r["reclaims"], r["reclaimed_count"], r["would_reclaim_count"]) == (False, 0, 1)
    assert [e["name"] for e in r["would_reclaim"]] == [leak]
    assert os.listdir(dshm) == [leak]
    r = json.loads(pod(smgshm_argv("--json", "preflight", "--pod-private", "--reclaim"), dshm)[0])["result"]
    assert (r["reclaims"], r["reclaimed_count"], r["would_reclaim_count"]) == (True, 1, 0)
    assert os.listdir(dshm) == []


def test_reclaiming_keeps_gcs_owner_rule(dshm: str) -> None:
    """Root reclaims another user's segment only when told --all-users, as gc --delete: in every mode."""
    path = make_file(dshm, "smg-tokenspeed-4242-1-0", age_s=3600)
    os.chown(path, 4321, 4321)
    r = json.loads(pod(smgshm_argv("--json", "preflight", "--init-container"), dshm)[0])["result"]
    assert r["reclaimed_count"] == 0
    assert "owned by uid 4321" in r["kept"][0]["reason"], r["kept"]
    r = json.loads(pod(smgshm_argv("--json", "preflight", "--pod-private", "--reclaim"), dshm)[0])["result"]
    assert r["reclaimed_count"] == 0
    assert os.path.exists(path)
    r = json.loads(pod(smgshm_argv("--json", "preflight", "--init-container", "--all-users"), dshm)[0])["result"]
    assert r["reclaimed_count"] == 1
    assert not os.path.exists(path)


@pytest.mark.slow
def test_a_timeout_mid_reclaim_leaves_nothing_set_aside(dshm: str) -> None:
    """A deadline that passes while a batch holds entries under their private aside names lets that
    batch settle before exiting: an entry left aside is one no gc ever reaps (its space stays used)."""
    from smgshm.core.names import ASIDE_PREFIX

    for i in range(12000):  # empty files: ~12 batches, so the deadline lands inside the reclaim
        os.close(os.open(os.path.join(dshm, f"smg-tokenspeed-7-{i}-0"), os.O_CREAT | os.O_WRONLY, 0o600))
    lines = pod(smgshm_argv("--json", "preflight", "--init-container", "--timeout", "0.4"), dshm)
    codes = [c["code"] for c in json.loads(lines[0])["result"]["causes"]]
    assert codes in ([], ["preflight_timeout"]), codes
    assert [n for n in os.listdir(dshm) if n.startswith(ASIDE_PREFIX)] == []


@pytest.fixture
def small(tmp_path: Path) -> Iterator[str]:
    with mounted_tmpfs(tmp_path / "small", "4m") as d:
        yield d


def test_capacity_too_small_full_and_enough(small: str) -> None:
    out = run_cli("preflight", "--require-shm", "--shm-dir", small, "--inflight-bytes", "8MiB", exit=3).stdout
    assert out.startswith("preflight failed (shm_too_small)")
    assert "fix:" in out
    assert "sizeLimit" in out
    assert "--shm-size" in out
    doc = run_cli(
        "--json", "preflight", "--shm-dir", small, "--tensor-bytes", "1MiB", "--tensor-bytes", "5MiB", exit=0
    ).json
    assert doc["result"]["causes"][0]["code"] == "shm_too_small"
    assert (doc["result"]["verdict"], doc["result"]["may_start"]) == ("fail", True)
    assert doc["result"]["need_bytes"] == 5 << 20
    make_file(small, "torch_big", size=3 << 20)  # not SMG's: never reclaimed, but it takes the space
    doc = run_cli("--json", "preflight", "--require-shm", "--shm-dir", small, "--inflight-bytes", "2MiB", exit=3).json
    assert [c["code"] for c in doc["result"]["causes"]] == ["shm_full"]
    assert os.path.exists(os.path.join(small, "torch_big"))
    doc = run_cli("--json", "preflight", "--shm-dir", small, "--inflight-bytes", "512KiB").json
    assert (doc["result"]["verdict"], doc["result"]["writable"], doc["ok"]) == ("ok", True, True)


def test_timeout_fails_with_its_cause(small: str) -> None:
    """Nothing checked: SHM may be off, so the gateway may start (SMG serves inline); --require-shm stops it."""
    doc = run_cli("--json", "preflight", "--shm-dir", small, "--timeout", "0").json
    assert [c["code"] for c in doc["result"]["causes"]] == ["preflight_timeout"]
    assert (doc["result"]["verdict"], doc["result"]["may_start"]) == ("fail", True)
    assert "SHM may be off (inline): preflight_timeout" in doc["result"]["headline"]
    doc = run_cli("--json", "preflight", "--require-shm", "--shm-dir", small, "--timeout", "0", exit=3).json
    assert [c["code"] for c in doc["result"]["causes"]] == ["preflight_timeout"]
    assert doc["result"]["may_start"] is False


# The gateway stand-in of the degraded runs: it proves it ran by a marker file outside the pod's tmpfs.
MARK = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()))"


def test_a_too_small_tmpfs_degrades_the_wrapper_it_execs_the_gateway_and_says_why(tmp_path: Path) -> None:
    """SMG falls back to inline when its SHM writes fail: a tmpfs smaller than --inflight-bytes costs speed, not
    service. The wrapper execs the gateway (exit 0) with the cause and its fix in its output, --json and
    --textfile, and a headline that says it starts; with --require-shm it does not exec it and exits 3."""
    marker, prom = tmp_path / "gateway-ran", tmp_path / "preflight.prom"
    gateway = ["--", sys.executable, "-c", MARK, str(marker)]
    flags = ["--pod-private", "--inflight-bytes", "8MiB", "--textfile", str(prom)]
    with mounted_tmpfs(tmp_path / "tiny", "1m") as d:
        lines = pod(smgshm_argv("preflight", *flags, *gateway), d)
        assert pod.last.returncode == 0, pod.last.stderr  # type: ignore[attr-defined]
        assert marker.read_text() == "1"  # the gateway ran, as pid 1: preflight became it
        text = "\n".join(lines)
        assert _flat(lines).startswith(
            "preflight degraded: the gateway is exec'd next; SHM will be off (inline): shm_too_small"
        )
        assert "must not start" not in text
        assert "fix: give the pod a /dev/shm of at least 8.0 MiB" in _flat(lines)
        metrics = prom.read_text()
        assert 'smgshm_preflight_shm_degraded{cause="shm_too_small",shm_dir="/dev/shm"} 1.0' in metrics
        assert 'smgshm_preflight_shm_degraded{cause="probe_file_left",shm_dir="/dev/shm"} 0.0' in metrics
        if shutil.which("promtool"):
            check = subprocess.run(
                ["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True, timeout=60
            )
            assert check.returncode == 0, check.stdout + check.stderr
        marker.unlink()
        r = json.loads(pod(smgshm_argv("--json", "preflight", *flags, *gateway), d)[0])["result"]
        assert (r["verdict"], r["may_start"], r["require_shm"]) == ("fail", True, False)
        assert [c["code"] for c in r["causes"]] == ["shm_too_small"]
        assert "must not start" not in r["headline"]
        assert marker.exists()
        marker.unlink()
        lines = pod(smgshm_argv("preflight", "--require-shm", *flags, *gateway), d)
        assert pod.last.returncode == 3  # type: ignore[attr-defined]
        assert not marker.exists()  # not exec'd
        assert _flat(lines).startswith("preflight failed (shm_too_small): the gateway must not start")
        assert 'smgshm_preflight_shm_degraded{cause="shm_too_small",shm_dir="/dev/shm"} 1.0' in prom.read_text()


def test_a_too_small_tmpfs_lets_the_init_container_exit_0_unless_require_shm(tmp_path: Path) -> None:
    flags = ["--init-container", "--inflight-bytes", "8MiB"]
    with mounted_tmpfs(tmp_path / "tiny", "1m") as d:
        lines = pod(smgshm_argv("preflight", *flags), d)
        assert pod.last.returncode == 0, pod.last.stderr  # type: ignore[attr-defined]
        assert _flat(lines).startswith(
            "preflight degraded: the gateway starts; SHM will be off (inline): shm_too_small"
        )
        assert "must not start" not in "\n".join(lines)
        lines = pod(smgshm_argv("preflight", "--require-shm", *flags), d)
        assert pod.last.returncode == 3  # type: ignore[attr-defined]
        assert _flat(lines).startswith("preflight failed (shm_too_small): the gateway must not start")
        # NPD keeps its view of the node: a degraded SHM is a problem, with or without --require-shm
        assert _npd("preflight", "--npd", "--shm-dir", d, "--inflight-bytes", "8MiB", exit=1).startswith(
            "shm_too_small"
        )


def test_require_shm_with_start_anyway_is_a_usage_error() -> None:
    err = run_cli("preflight", "--require-shm", "--start-anyway", "--", "true", exit=2).stderr
    assert "--start-anyway contradicts --require-shm" in err


def _npd(*args: str, exit: int) -> str:
    out = run_cli(*args, exit=exit).stdout
    assert out.endswith("\n"), out
    assert out.count("\n") == 1, out
    line = out[:-1]
    assert len(line) <= 80, line
    assert line.isascii(), line
    assert "\x1b" not in line
    return line


def test_npd_plugin_lines_and_codes(small: str) -> None:
    assert _npd("gc", "--check", "--npd", "--shm-dir", small, exit=0).startswith("gc: ok")
    assert _npd("preflight", "--npd", "--shm-dir", small, "--inflight-bytes", "1MiB", exit=0).startswith("preflight ok")
    assert _npd("preflight", "--npd", "--shm-dir", small, "--inflight-bytes", "1GiB", exit=1).startswith(
        "shm_too_small"
    )
    assert _npd("preflight", "--npd", "--shm-dir", small, "--timeout", "0", exit=2).startswith("preflight_timeout")
    make_file(small, "smg-tokenspeed-4242-1-0", age_s=3600)
    assert "1 leaked" in _npd("gc", "--check", "--npd", "--assume-dead", "--shm-dir", small, exit=1)
    os.unlink(os.path.join(small, "smg-tokenspeed-4242-1-0"))
    make_file(small, "smg-x" + "\x1b" * 200)  # SMG's family, no pid: unknown; a hostile name stays one short line
    assert _npd("gc", "--check", "--npd", "--shm-dir", small, exit=2).startswith("gc: 1 unknown")
    assert _npd("preflight", "--npd", "--shm-dir", small, exit=2).startswith("preflight unknown")
    assert _npd("gc", "--check", "--npd", "--shm-dir", small + "/nope", exit=2).startswith("error: host")
    assert _npd("gc", "--npd", "--shm-dir", small, exit=2).startswith("usage error")


@needs_smg
def test_the_real_gateway_exec_d_through_preflight_starts_and_serves(dshm: str, children: Children) -> None:
    from smgshm.core.gateway.process import free_port

    _crash_old_gateway(dshm)
    port, prom = free_port(), free_port()
    smg = shutil.which("smg", path=os.path.dirname(sys.executable)) or "smg"
    argv = smgshm_argv(
        "preflight",
        "--pod-private",
        "--",
        smg,
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prom),
        "--disable-tokenizer-autoload",
    )
    script = 'mount --bind "$0" /dev/shm && exec "$@"'
    p = children.spawn(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "--ipc",
            "sh",
            "-c",
            script,
            dshm,
            *argv,
        ]
    )

    def workers() -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/workers", timeout=2) as r:
            return r.status == 200
        return False

    wait_for(lambda: workers() or p.poll() is not None, timeout=90, what="the gateway's HTTP")
    assert p.poll() is None, p.communicate()
    child = int(Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()[0])
    status = Path(f"/proc/{child}/status").read_text()
    nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
    assert nspid[-1] == "1"  # the gateway is pid 1 of its pid namespace: preflight became it
    assert Path(f"/proc/{child}/comm").read_text().strip() == "smg::router"
    assert not [n for n in os.listdir(dshm) if n.startswith("smg-tokenspeed-")]


def test_textfile_says_what_the_wrapper_reclaimed(dshm: str, tmp_path: Path) -> None:
    _crash_old_gateway(dshm)
    prom = tmp_path / "preflight.prom"
    pod(smgshm_argv("-q", "preflight", "--pod-private", "--textfile", str(prom), "--", "true"), dshm)
    assert pod.last.returncode == 0  # type: ignore[attr-defined]
    text = prom.read_text()
    # (the shm dir as the pod sees it)
    assert 'smgshm_preflight_reclaimed_segments{shm_dir="/dev/shm",state="leaked"} 2.0' in text
    assert 'smgshm_preflight_last_run_success{shm_dir="/dev/shm"} 1.0' in text
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
