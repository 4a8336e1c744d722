"""`smgshm probe` end to end: real gRPC receivers on loopback, the real CLI, the real /dev/shm.

Every receiver is a real server (in-process via ``start_receiver``, or a child
``smgshm serve`` where another mount namespace or uid is the point); nothing is mocked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import shutil
import site
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import smgshm
from smgshm.core.client.probe import Health, LocalChecks, VerifyResult, WorkerReport
from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.names import GATEWAY_PROBE_PREFIX, SMGSHM_PREFIX
from smgshm.core.receiver.reader import ReceiverConfig
from smgshm.core.receiver.services import RunningReceiver, start_receiver
from tests.conftest import Children, closed_port, run_cli, wait_for

SHM = "/dev/shm"
OTHER_BOOT = "00000000-0000-4000-8000-000000000000"
NOBODY = 65534

StartReceiver = Callable[..., RunningReceiver]

# The JSON schema of `probe`, pinned: fields may be added in schema 1, never dropped or renamed.
RESULT_KEYS = {"local", "workers", "cause_info"}
LOCAL_KEYS = {
    "namespace_id",
    "writable",
    "writable_error",
    "leftover_probe_files",
    "shm_free_bytes",
    "leftover_probe_files_hex",
    "probe_lookalikes",
    "probe_lookalikes_hex",
}
WORKER_KEYS = {
    "address",
    "verdict",
    "reason",
    "engine",
    "health",
    "namespace_id",
    "comparison",
    "decisions",
    "facts",
    "smgshm_receiver",
    "verify",
    "elapsed_ms",
    "gateway_label",
    "cause_info",
}
HEALTH_KEYS = {"engine_healthy", "engine_message", "grpc_health"}
COMPARISON_KEYS = {"local", "peer", "sharing", "reason"}
VERIFY_KEYS = {"ok", "code", "message"}
DECISION_KEYS = {"path", "reason", "cause"}
MODES = {"inline", "shm", "auto"}


# --------------------------------------------------------------------------- helpers


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def _shm_dev() -> int:
    return os.stat(SHM).st_dev


def _probe(*args: str, exit: int = 0) -> dict[str, Any]:
    """``smgshm --json probe ARGS``: the whole JSON document."""
    doc: dict[str, Any] = run_cli("--json", "probe", *args, exit=exit).json
    assert doc["command"] == "probe"
    assert doc["ok"] is (exit == 0)
    return doc


def _probe_any(*args: str) -> dict[str, Any]:
    """``smgshm --json probe ARGS`` without asserting the exit code."""
    import json

    from click.testing import CliRunner

    from smgshm.cli import cli

    res = CliRunner().invoke(cli, ["--json", "probe", *args], catch_exceptions=False)
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _worker(doc: dict[str, Any], i: int = 0) -> dict[str, Any]:
    w: dict[str, Any] = doc["result"]["workers"][i]
    return w


def _ready_address(p: subprocess.Popen[str], timeout: float = 30.0) -> str | None:
    """The address from a ``--json serve`` child's ready line; ``None`` if it exited first.

    The line is read on a thread so a child that never speaks fails the test instead of hanging it.
    """
    import json

    box: list[str] = []
    assert p.stdout is not None
    out = p.stdout
    threading.Thread(target=lambda: box.append(out.readline()), daemon=True).start()
    line = wait_for(lambda: box, timeout=timeout, what="the serve child's ready line")[0]
    if not line:
        return None
    address: str = json.loads(line)["result"]["address"]
    return address


def _table_rows(text: str) -> list[list[str]]:
    """The cells of each table body row: columns apart by two spaces or more (the table has no box)."""
    rows = []
    for line in text.splitlines():
        cells = [c for c in re.split(r"\s{2,}|│|\|", line.strip()) if c.strip()]
        if len(cells) >= 3:  # a row of the table, not a sentence
            rows.append([c.strip() for c in cells])
    return rows


def _my_segments() -> set[str]:
    """Segments this process wrote (the prober's canaries are ``smg-smgshm-<our pid>-...``).

    Only our own names: other test runs may share /dev/shm concurrently.
    """
    mine = f"{SMGSHM_PREFIX}{os.getpid()}-"
    return {n for n in os.listdir(SHM) if n.startswith(mine)}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def start() -> Iterator[StartReceiver]:
    """Start in-process receivers on random loopback ports; all are stopped at teardown."""
    running: list[RunningReceiver] = []

    def _start(**cfg: Any) -> RunningReceiver:
        r = start_receiver(ReceiverConfig(**cfg), "127.0.0.1:0")
        running.append(r)
        return r

    yield _start
    for r in running:
        r.stop(0)


@pytest.fixture
def vllm(start: StartReceiver) -> RunningReceiver:
    return start(engine="vllm")


@contextlib.contextmanager
def _leftover_probe_file(shm_dir: str) -> Iterator[str]:
    """A gateway probe file left by a pid that is not running (near the top of the 2**22 pid range)."""
    while True:
        pid = 4194000 + random.randrange(300)  # noqa: S311 - not cryptographic
        if not os.path.exists(f"/proc/{pid}") and not os.path.exists(
            os.path.join(shm_dir, f"{GATEWAY_PROBE_PREFIX}{pid}")
        ):
            break
    name = f"{GATEWAY_PROBE_PREFIX}{pid}"
    path = os.path.join(shm_dir, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.close(fd)
        yield name
    finally:
        with contextlib.suppress(FileNotFoundError):  # a concurrent run's sweep may beat us to it
            os.unlink(path)


# --------------------------------------------------------------------------- vLLM, shared


def test_vllm_receiver_here_is_shared_and_detected_as_vllm(vllm: RunningReceiver) -> None:
    doc = _probe(vllm.address)
    w = _worker(doc)
    me = read_namespace_id()
    assert me, "this host's namespace id must be readable for this test"
    assert w["address"] == vllm.address
    assert w["verdict"] == "shared"
    # No --engine: detection tries sglang first (UNIMPLEMENTED here), then vllm.
    assert w["engine"] == "vllm"
    assert w["namespace_id"] == me
    assert w["comparison"]["sharing"] == "shared"
    assert w["comparison"]["local"] == w["comparison"]["peer"] == me
    assert w["health"] == {"engine_healthy": True, "engine_message": "Health", "grpc_health": "SERVING"}
    assert w["smgshm_receiver"] is True
    assert w["verify"] is None  # no --verify, no canary
    assert w["gateway_label"] is None
    assert w["facts"]["server_type"] == "smgshm"
    assert w["decisions"]["auto"]["path"] == "shm"
    assert w["decisions"]["shm"]["path"] == "shm"
    assert w["decisions"]["inline"]["path"] == "inline"
    assert doc["result"]["local"]["namespace_id"] == me
    assert doc["result"]["local"]["writable"] is True
    assert doc["warnings"] == []


def test_grpc_scheme_and_dp_rank_suffix_are_dialled_as_host_port(vllm: RunningReceiver) -> None:
    addr = f"grpc://{vllm.address}@2"
    w = _worker(_probe(addr))
    assert w["address"] == addr  # reported as given
    assert (w["verdict"], w["engine"]) == ("shared", "vllm")


@pytest.mark.parametrize(
    ("extra", "auto", "shm"),
    [
        pytest.param(("--tensor-bytes", "1KiB"), "inline", "inline", id="1KiB-below-default-64KiB"),
        pytest.param(("--shm-min-bytes", "512", "--tensor-bytes", "1KiB"), "shm", "shm", id="1KiB-above-512"),
        pytest.param(("--tensor-bytes", "64KiB"), "shm", "shm", id="exactly-min-is-shm"),
        pytest.param(("--tensor-bytes", "65535"), "inline", "inline", id="one-below-min"),
    ],
)
def test_size_rule_in_decisions(vllm: RunningReceiver, extra: tuple[str, ...], auto: str, shm: str) -> None:
    w = _worker(_probe(*extra, vllm.address))
    assert w["verdict"] == "shared"  # the size rule changes decisions, never the verdict
    assert w["decisions"]["auto"]["path"] == auto
    assert w["decisions"]["shm"]["path"] == shm
    assert w["decisions"]["inline"]["path"] == "inline"
    if auto == "inline":
        assert "below shm_min_bytes" in w["decisions"]["auto"]["reason"]


# --------------------------------------------------------------------------- not shared


@pytest.fixture
def other_host(start: StartReceiver) -> RunningReceiver:
    return start(namespace_id=f"{OTHER_BOOT}:{_shm_dev()}")


@pytest.fixture
def private_tmpfs(start: StartReceiver) -> RunningReceiver:
    return start(namespace_id=f"{_boot_id()}:{_shm_dev() + 1}")


def test_other_boot_id_is_other_host(other_host: RunningReceiver) -> None:
    w = _worker(_probe(other_host.address, exit=3))
    assert w["verdict"] == "other_host"
    assert w["cause_info"]["code"] == "namespace_other_host"
    assert w["namespace_id"] == f"{OTHER_BOOT}:{_shm_dev()}"
    assert "boot ids differ" in w["reason"]
    assert w["decisions"]["auto"]["path"] == "inline"
    # mode shm is an operator assertion: the gateway does not check ids under it.
    assert w["decisions"]["shm"]["path"] == "shm"


def test_same_boot_other_st_dev_is_private_tmpfs(private_tmpfs: RunningReceiver) -> None:
    w = _worker(_probe(private_tmpfs.address, exit=3))
    assert w["verdict"] == "private_tmpfs"
    assert w["cause_info"]["code"] == "namespace_private_tmpfs"
    assert f"st_dev {_shm_dev()} here, {_shm_dev() + 1} there" in w["reason"]
    assert w["decisions"]["auto"]["path"] == "inline"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("which", "verdict", "default_exit", "flipped_exit"),
    [
        ("vllm", "shared", 0, 3),
        ("other_host", "other_host", 3, 0),
        ("private_tmpfs", "private_tmpfs", 3, 0),
    ],
)
def test_expect_not_shared_flips_the_exit_code(
    request: pytest.FixtureRequest, which: str, verdict: str, default_exit: int, flipped_exit: int
) -> None:
    r: RunningReceiver = request.getfixturevalue(which)
    assert _worker(_probe(r.address, exit=default_exit))["verdict"] == verdict
    assert _worker(_probe("--expect", "shared", r.address, exit=default_exit))["verdict"] == verdict
    assert _worker(_probe("--expect", "not-shared", r.address, exit=flipped_exit))["verdict"] == verdict


def test_expect_not_shared_does_not_hide_undetermined_or_unreachable(start: StartReceiver) -> None:
    sg = start(engine="sglang")
    assert _worker(_probe("--expect", "not-shared", sg.address, exit=6))["verdict"] == "undetermined"
    dead = f"127.0.0.1:{closed_port()}"
    doc = _probe("--expect", "not-shared", "--connect-timeout", "300ms", dead, exit=4)
    assert _worker(doc)["verdict"] == "unreachable"


# --------------------------------------------------------------------------- SGLang, TokenSpeed


def test_sglang_receiver_is_undetermined(start: StartReceiver) -> None:
    sg = start(engine="sglang")
    w = _worker(_probe(sg.address, exit=6))
    assert w["verdict"] == "undetermined"
    assert w["cause_info"]["code"] == "engine_inline_only"  # no id would change that (test_causes: no_namespace_id)
    assert w["engine"] == "sglang"  # the first runtime in the gateway's order answers
    assert w["namespace_id"] == ""
    assert "advertises no namespace id" in w["reason"]
    assert w["health"]["grpc_health"] == "SERVING"
    for mode in ("auto", "shm"):
        assert w["decisions"][mode]["path"] == "inline"
        assert "sglang workers take tensors inline only" in w["decisions"][mode]["reason"]


def test_tokenspeed_receiver_id_comes_from_scheduler_info(start: StartReceiver) -> None:
    ts = start(engine="tokenspeed")
    w = _worker(_probe(ts.address))
    assert w["verdict"] == "shared"
    assert w["engine"] == "tokenspeed"
    assert w["namespace_id"] == read_namespace_id()
    assert w["facts"]["tokenspeed_version"].startswith("smgshm-")
    assert w["decisions"]["auto"]["path"] == "shm"


def test_tokenspeed_receiver_reports_the_id_it_advertises(start: StartReceiver) -> None:
    """Not this host's id read locally: the one in the worker's scheduler_info."""
    advertised = f"{OTHER_BOOT}:{_shm_dev()}"
    ts = start(engine="tokenspeed", namespace_id=advertised)
    w = _worker(_probe(ts.address, exit=3))
    assert (w["engine"], w["verdict"], w["namespace_id"]) == ("tokenspeed", "other_host", advertised)


def test_tokenspeed_receiver_without_an_id_is_undetermined(start: StartReceiver) -> None:
    ts = start(engine="tokenspeed", namespace_id="")  # scheduler_info then lacks the key
    w = _worker(_probe(ts.address, exit=6))
    assert (w["engine"], w["verdict"], w["namespace_id"]) == ("tokenspeed", "undetermined", "")
    assert w["decisions"]["auto"]["path"] == "inline"


def test_wrong_engine_flag_is_unreachable(start: StartReceiver) -> None:
    ts = start(engine="tokenspeed")
    w = _worker(_probe("--engine", "vllm", ts.address, exit=4))
    assert w["verdict"] == "unreachable"
    assert w["cause_info"]["code"] == "worker_unreachable"
    assert "no SMG engine service" in w["reason"]
    assert w["engine"] == ""
    assert w["decisions"] == {}
    assert w["health"] is None


def test_engine_flag_skips_detection(start: StartReceiver) -> None:
    ts = start(engine="tokenspeed")
    w = _worker(_probe("--engine", "tokenspeed", ts.address))
    assert (w["engine"], w["verdict"]) == ("tokenspeed", "shared")


# --------------------------------------------------------------------------- unreachable, many workers


def test_closed_port_is_unreachable_within_the_connect_timeout() -> None:
    dead = f"127.0.0.1:{closed_port()}"
    t0 = time.monotonic()
    doc = _probe("--connect-timeout", "300ms", dead, exit=4)
    assert time.monotonic() - t0 < 10.0, "probe of a closed port hung (hang guard, not a perf check)"
    w = _worker(doc)
    assert w["verdict"] == "unreachable"
    assert "connection refused" in w["reason"]
    assert w["address"] == dead
    assert (w["engine"], w["health"], w["decisions"], w["smgshm_receiver"]) == ("", None, {}, False)
    assert w["cause_info"]["code"] == "worker_unreachable"
    head = run_cli("probe", "--connect-timeout", "300ms", dead, exit=4).stdout.splitlines()[0]
    assert head == "UNREACHABLE: 1 of 1 worker(s) did not answer (worker_unreachable)", head


def test_several_workers_worst_exit_wins(vllm: RunningReceiver, start: StartReceiver) -> None:
    sg = start(engine="sglang")
    dead = f"127.0.0.1:{closed_port()}"
    addrs = [vllm.address, sg.address, dead]
    # The live workers connect within --connect-timeout too: generous for a loaded machine (the
    # closed port is refused at once whatever the timeout).
    doc = _probe("--connect-timeout", "20s", *addrs, exit=4)  # unreachable(4) beats undetermined(6)
    workers = doc["result"]["workers"]
    assert len(workers) == 3
    assert [w["address"] for w in workers] == addrs  # in the order given
    assert [w["verdict"] for w in workers] == ["shared", "undetermined", "unreachable"]

    # Without the unreachable one, undetermined (6) beats shared (0).
    assert _probe(vllm.address, sg.address, exit=6)["result"]["workers"][1]["verdict"] == "undetermined"


def test_several_workers_human_output(vllm: RunningReceiver, start: StartReceiver) -> None:
    sg = start(engine="sglang")
    dead = f"127.0.0.1:{closed_port()}"
    res = run_cli("probe", "--connect-timeout", "20s", vllm.address, sg.address, dead, exit=4)  # as above
    lines = res.stdout.splitlines()
    assert lines[0].startswith("UNREACHABLE: 1 of 3"), res.stdout  # the headline says what exit 4 says
    assert "SHM not usable for 2 of 3" in lines[0]
    rows = {r[0]: r for r in _table_rows(res.stdout) if r[0].startswith("127.0.0.1:")}
    assert set(rows) == {vllm.address, sg.address, dead}, res.stdout
    assert rows[vllm.address][1:] == ["vllm", "ok", "shared", "shm"]
    assert rows[sg.address][1:] == ["sglang", "ok", "undetermined", "inline"]
    assert rows[dead][1:] == ["unknown", "unknown", "unreachable", "unknown"]
    assert f"hint: {dead}:" in res.stderr
    assert f"hint: {sg.address}:" in res.stderr


def test_single_shared_worker_human_output(vllm: RunningReceiver) -> None:
    res = run_cli("probe", vllm.address)
    assert res.stdout.splitlines()[0].startswith("SHM usable"), res.stdout
    assert "hint:" not in res.stderr


# --------------------------------------------------------------------------- --verify


def test_verify_against_a_smgshm_receiver(vllm: RunningReceiver) -> None:
    w = _worker(_probe("--verify", vllm.address))
    assert w["verdict"] == "shared"
    assert w["smgshm_receiver"] is True
    assert w["verify"]["ok"] is True
    assert w["verify"]["code"] == "ok"
    assert _my_segments() == set()  # the canary is gone


def test_verify_cleans_up_when_the_receiver_keeps_segments(start: StartReceiver) -> None:
    keep = start(unlink_after_read=False)
    w = _worker(_probe("--verify", keep.address))
    assert w["verify"]["ok"] is True
    assert w["verdict"] == "shared"
    assert _my_segments() == set()  # the receiver kept it, so the prober unlinked it


# --------------------------------------------------------------------------- host-side checks


LEFTOVER_PHRASE = "will find /dev/shm unwritable and stay inline"


def _check_leftover_warning(address: str, name: str, shm_dir: str, still_there: Callable[[], bool]) -> None:
    pid = name.rsplit("-", 1)[-1]
    flags = ("--shm-dir", shm_dir)

    human = run_cli("probe", *flags, address)
    doc = _probe(*flags, address)  # a warning, not a failure: only a gateway with that pid is affected
    if not still_there():
        pytest.skip(f"a concurrent process removed {name} from {shm_dir} mid-test")
    assert LEFTOVER_PHRASE in human.stderr
    assert name in human.stderr
    assert doc["result"]["local"]["leftover_probe_files"] == [name]
    matching = [m for m in doc["warnings"] if LEFTOVER_PHRASE in m]
    assert len(matching) == 1
    assert name in matching[0]
    assert f"pid {pid}" in matching[0]
    assert _worker(doc)["verdict"] == "shared"


def test_leftover_gateway_probe_file_in_dev_shm_is_warned_about(vllm: RunningReceiver) -> None:
    with _leftover_probe_file(SHM) as name:
        _check_leftover_warning(vllm.address, name, SHM, lambda: os.path.exists(os.path.join(SHM, name)))
    assert not os.path.exists(os.path.join(SHM, name))


def test_leftover_gateway_probe_file_in_a_private_shm_dir(start: StartReceiver, tmp_path: Path) -> None:
    """The same check in a directory no other test run touches (and the receiver's id computed there)."""
    shm_dir = str(tmp_path)
    r = start(shm_dir=shm_dir)
    with _leftover_probe_file(shm_dir) as name:
        _check_leftover_warning(r.address, name, shm_dir, lambda: True)
    assert os.listdir(shm_dir) == []  # the writability probe cleaned up after itself too


def test_need_more_space_than_there_is(vllm: RunningReceiver) -> None:
    doc = _probe("--need", "1000000GiB", vllm.address, exit=3)
    assert _worker(doc)["verdict"] == "shared"  # the worker is fine; the space check fails
    free = doc["result"]["local"]["shm_free_bytes"]
    assert any("free" in m and str(free) in m and "--need" in m for m in doc["warnings"]), doc["warnings"]

    ok = _probe("--need", "1KiB", vllm.address)
    assert not any("--need" in m for m in ok["warnings"])


# --------------------------------------------------------------------------- JSON schema


def test_json_key_sets_are_pinned(vllm: RunningReceiver) -> None:
    dead = f"127.0.0.1:{closed_port()}"
    doc = _probe("--verify", "--connect-timeout", "20s", vllm.address, dead, exit=4)  # live ones connect within it too
    result = doc["result"]
    assert set(result) == RESULT_KEYS
    assert set(result["local"]) == LOCAL_KEYS
    assert {f.name for f in dataclasses.fields(LocalChecks)} == LOCAL_KEYS
    assert {f.name for f in dataclasses.fields(WorkerReport)} == WORKER_KEYS
    assert {f.name for f in dataclasses.fields(Health)} == HEALTH_KEYS
    assert {f.name for f in dataclasses.fields(VerifyResult)} == VERIFY_KEYS
    for w in result["workers"]:  # a full report and an unreachable one carry the same keys
        assert set(w) == WORKER_KEYS
    full, dead_row = result["workers"]
    assert set(full["health"]) == HEALTH_KEYS
    assert set(full["comparison"]) == COMPARISON_KEYS
    assert set(full["verify"]) == VERIFY_KEYS
    assert set(full["decisions"]) == MODES
    for d in full["decisions"].values():
        assert set(d) == DECISION_KEYS
        assert d["path"] in ("inline", "shm")
        assert isinstance(d["reason"], str)
        assert d["reason"]
    assert dead_row["decisions"] == {}
    assert isinstance(full["elapsed_ms"], float)
    assert isinstance(result["local"]["leftover_probe_files"], list)
    assert isinstance(result["local"]["shm_free_bytes"], int)


# --------------------------------------------------------------------------- gateway parity


@pytest.mark.parametrize(
    "spelling",
    [
        pytest.param(lambda me: me.upper(), id="uppercase-boot-id"),
        pytest.param(lambda me: "{}:0{}".format(*me.rsplit(":", 1)), id="zero-padded-st-dev"),
    ],
)
def test_auto_decision_matches_the_gateways_string_equality(
    start: StartReceiver, spelling: Callable[[str], str]
) -> None:
    me = read_namespace_id()
    r = start(namespace_id=spelling(me))
    w = _worker(_probe_any(r.address))  # whatever the exit code: the decision is the point
    assert w["namespace_id"] == spelling(me)
    assert w["decisions"]["auto"]["path"] == "inline"
    assert w["verdict"] == "spelling"
    assert w["cause_info"]["code"] == "namespace_id_spelling"


# --------------------------------------------------------------------------- root only: real namespaces, real uids


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.mark.slow
@needs_root
def test_real_private_tmpfs_receiver(children: Children) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    script = 'mount -t tmpfs -o size=4m tmpfs /dev/shm && exec "$0" -m smgshm --json serve --listen 127.0.0.1:0'
    p = children.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable])
    address = _ready_address(p)
    if address is None:
        err = p.stderr.read() if p.stderr else ""
        pytest.skip(f"cannot mount a private tmpfs here: {err.strip()[:200]}")

    w = _worker(_probe(address, exit=3))
    assert w["verdict"] == "private_tmpfs"
    assert w["cause_info"]["code"] == "namespace_private_tmpfs"
    assert w["namespace_id"].startswith(_boot_id() + ":")
    assert w["namespace_id"] != read_namespace_id()
    assert w["decisions"]["auto"]["path"] == "inline"

    # --verify proves it: the receiver cannot see the canary, and the verdict stays private_tmpfs.
    w = _worker(_probe("--verify", address, exit=3))
    assert w["verdict"] == "private_tmpfs"
    assert w["verify"]["ok"] is False
    assert w["verify"]["code"] == "missing"
    assert p.poll() is None  # the receiver survived both probes


def _python_for(uid: int) -> tuple[str, dict[str, str]] | None:
    """An interpreter ``uid`` can run that imports smgshm and its dependencies, or ``None``.

    ``sys.executable`` first; else a system python of the same minor version, with this
    environment's site-packages on PYTHONPATH (e.g. when the venv's base lives under /root).
    """
    project = str(Path(smgshm.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([project, *site.getsitepackages()]))
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, *(shutil.which(n) or "" for n in (minor, "python3"))]
    for py in dict.fromkeys(c for c in candidates if c):
        argv = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            py,
            "-c",
            "import grpc, smg_grpc_proto, smgshm.core.receiver.services",
        ]
        try:
            ok = subprocess.run(argv, env=env, cwd="/", capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok.returncode == 0:
            return py, env
    return None


@pytest.mark.slow
@needs_root
def test_uid_mismatch_is_found_by_verify(children: Children) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv(1) is not installed")
    found = _python_for(NOBODY)
    if found is None:
        pytest.skip(f"no python that uid {NOBODY} can run with smgshm importable")
    py, env = found
    argv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        py,
        "-m",
        "smgshm",
        "--json",
        "serve",
        "--listen",
        "127.0.0.1:0",
    ]
    p = children.spawn(argv, env=env, cwd="/")
    address = _ready_address(p)
    assert address is not None, p.stderr.read() if p.stderr else ""

    # Without --verify the ids match: nothing the ids can show is wrong.
    assert _worker(_probe(address))["verdict"] == "shared"

    w = _worker(_probe("--verify", address, exit=3))
    assert w["verdict"] == "uid_mismatch"
    assert w["cause_info"]["code"] == "uid_mismatch"
    assert f"uid {NOBODY}" in w["reason"]
    assert w["verify"]["ok"] is False
    assert w["verify"]["code"] == "permission"
    assert w["comparison"]["sharing"] == "shared"  # the ids still match; the canary says otherwise
    assert _my_segments() == set()  # the refused canary was unlinked by the prober
