"""The JSON interface is pinned: a JSON Schema per command (schemas/), key sets, within schema_version 1.

Every document run_cli sees is validated against its schema (tests/schema_check.py); the tests here
run each command for real once more, explicitly, and check the schemas themselves: fresh, valid
draft 2020-12, enums that follow the code, named in the README.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, mounted_tmpfs, run_cli, smgshm_argv, start_serve, wait_for
from tests.support.json_schema import _check_envelope, check_e2e_schema
from tests.support.schema_check import STREAMS, validate, validate_document

# Segment records are pinned in tests/test_cli_watch.py, where real lives end.


@pytest.mark.gateway
def test_e2e_schema(tmp_path: Any, children: Any, model_dir: str) -> None:
    """Against the real gateway with a smgshm serve worker: every source present, every key pinned."""
    import pytest

    from smgshm.core.gateway.process import GatewayConfig, start_gateway
    from tests.conftest import HAVE_SMG, start_serve

    if not HAVE_SMG:
        pytest.skip("SMG gateway (smg) not installed")
    _, ready = start_serve(children, "--model-dir", model_dir)
    cfg = GatewayConfig(
        worker_urls=(ready["result"]["address"],),
        model_path=model_dir,
        transport="shm",
        log_path=str(tmp_path / "gw.log"),
    )
    with start_gateway(cfg) as gw:
        doc = run_cli("--json", "e2e", "--gateway", gw.http_url, "--metrics", gw.metrics_url, "-n", "1").json
    check_e2e_schema(doc)
    [run] = doc["result"]["runs"]
    assert run["shm_dir"]["segments"]
    assert run["receipts"]["receipts"]
    # Size at close-after-write; None when the reader unlinked it before the watcher could stat it.
    assert all(s["nbytes"] is None or isinstance(s["nbytes"], int) for s in run["shm_dir"]["segments"])
    assert isinstance(run["receipts"]["receipts"][0]["nbytes"], int)


E2E_SWEEP_KEYS = {"rows", "fresh_page_gb_per_s", "memcpy_gb_per_s", "model", "gateway_logs"}
E2E_SWEEP_ROW_KEYS = {
    "image_px",
    "pixel_nbytes",
    "requests",
    "failed",
    "inline_p50_ms",
    "shm_p50_ms",
    "speedup",
    "shm_write_ms",
    "worker_read_ms",
    "preprocess_ms",
    "floor_ms",
    "write_floor_fraction",
}


@pytest.mark.gateway
def test_e2e_sizes_schema() -> None:
    """e2e --sizes: the real pair of gateways at one small size; every key pinned."""
    import pytest

    from tests.conftest import HAVE_SMG

    if not HAVE_SMG:
        pytest.skip("SMG gateway (smg) not installed")
    doc = run_cli("--json", "e2e", "--sizes", "224", "-n", "1").json
    _check_envelope(doc, "e2e")
    assert set(doc["result"]) == E2E_SWEEP_KEYS
    [row] = doc["result"]["rows"]
    assert set(row) == E2E_SWEEP_ROW_KEYS
    assert row["image_px"] == 224
    assert row["failed"] == 0
    assert row["pixel_nbytes"] == 256 * 1176 * 4  # 224 px: 16x16 patches of 1176 float32
    assert row["shm_write_ms"] is not None  # the gateway logged its SHM write


# -- the schemas themselves ---------------------------------------------------------------------


# -- one encoding ----------------------------------------------------------------------------------


def _one_line(stdout: str) -> dict[str, Any]:
    """One document, one line, compact and ASCII: what jsonout writes for every command."""
    assert stdout.endswith("\n")
    assert stdout.count("\n") == 1
    doc = json.loads(stdout)
    assert stdout == json.dumps(doc, separators=(",", ":")) + "\n"
    return doc


def test_one_encoding_for_every_document(tmp_path: Path) -> None:
    (tmp_path / "smg-smgshm-4194305-1-1").write_bytes(b"x")
    (tmp_path / "smg-smgshm-4194305-1-\u00e9").write_bytes(b"x")  # non-ASCII: \u escaped like the rest
    for args in (
        ("ns",),
        ("gc", "--shm-dir", str(tmp_path)),
        ("watch", "--shm-dir", str(tmp_path), "--count", "1", "--interval", "0.1"),
    ):
        _one_line(run_cli("--json", *args).stdout)
    _one_line(run_cli("--json", "ns", "--shm-dir", "/nonexistent-smgshm", exit=5).stdout)
    out = run_cli("watch", "--jsonl", "--shm-dir", str(tmp_path), "--count", "1", "--interval", "0.1").stdout
    for line in out.splitlines():
        assert line == json.dumps(json.loads(line), separators=(",", ":"))


# -- each command, for real, validated -----------------------------------------------------------


@pytest.mark.slow
def test_probe_and_send_against_a_real_serve(children: Children) -> None:
    _, ready = start_serve(children)  # its ready document: validated by start_serve
    addr = ready["result"]["address"]
    doc = run_cli("--json", "probe", addr, "--verify").json
    validate_document(doc)
    assert doc["result"]["workers"][0]["verdict"] == "shared"
    doc = run_cli("--json", "send", addr, "-n", "2", "--shape", "64x64", "--transport", "shm").json
    validate_document(doc)
    assert all(isinstance(p["nbytes"], int) for p in doc["result"]["paths"])


def test_gc_listing_delete_check_and_watch_on_a_tmpfs(tmp_path: Path) -> None:
    # --assume-dead: another job's pid namespace on the machine would make liveness untrusted
    # (every state unknown); the producer pid is above any pid_max, dead in every namespace.
    with mounted_tmpfs(tmp_path / "shm", "4m") as d:
        old = time.time() - 3600  # older than --min-age, by its name and by its mtime
        for i in range(3):
            name = os.path.join(d, f"smg-tokenspeed-4194305-{int(old * 1e9)}-{i}")  # a dead producer's: leaked
            with open(name, "wb") as f:
                f.write(b"x" * 5000)
            os.utime(name, (old, old))
        validate_document(run_cli("--json", "gc", "--shm-dir", d, "--assume-dead").json)
        doc = run_cli("--json", "gc", "--check", "--shm-dir", d, "--assume-dead", exit=3).json
        validate_document(doc)
        assert doc["ok"] is False
        assert doc["result"]["counts"]["leaked"] == 3
        doc = run_cli("--json", "gc", "--delete", "--yes", "--shm-dir", d, "--assume-dead").json
        validate_document(doc)
        assert [x["deleted"] for x in doc["result"]["deleted"]] == [True] * 3
        assert all(isinstance(x["freed_bytes"], int) for x in doc["result"]["deleted"])
        doc = run_cli("--json", "gc", "--watch", "0.05s", "--watch-count", "2", "--shm-dir", d).json
        validate_document(doc)
        assert doc["result"]["scans"] == 2


def test_bench_json_jsonl_and_what_if() -> None:
    doc = run_cli("--json", "bench", "--sizes", "64KiB", "-n", "1", "--warmup", "0").json
    validate_document(doc)
    assert doc["result"]["sizes"][0]["nbytes"] == 65536
    out = run_cli("bench", "--jsonl", "--sizes", "4KiB,64KiB", "-n", "1", "--warmup", "0").stdout
    recs = [json.loads(ln) for ln in out.splitlines()]
    for rec in recs:
        validate(rec, STREAMS["bench"])
    assert [r["nbytes"] for r in recs] == [4096, 65536]
    assert all(isinstance(ns, int) for r in recs for v in r["samples_ns"].values() for ns in v)


@pytest.mark.skipif(os.geteuid() != 0, reason="the what-if mounts a tmpfs: root only")
def test_bench_what_if_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # its figures are kept: keep the test's apart
    doc = run_cli("--json", "bench", "--what-if", "huge-pages", "--sizes", "1MiB", "-n", "1").json
    validate_document(doc)
    assert doc["result"]["sizes"][0]["nbytes"] == 1024 * 1024


@pytest.mark.slow
def test_doctor_json() -> None:
    doc = run_cli("--json", "doctor", "--no-gateways", "--no-e2e").json
    validate_document(doc)
    assert all(isinstance(c["code"], int) for c in doc["result"]["checks"])


def test_created_ns_round_trips_exactly(tmp_path: Path, children: Children) -> None:
    """A segment's created_ns in watch's JSON is the integer in its name, to the nanosecond (a float
    would lose the last three digits: 2**53 is about 9e15)."""
    nanos = time.time_ns() - 10 * 10**9
    name = f"smg-tokenspeed-{os.getpid()}-{nanos}-0"
    path = tmp_path / name
    path.write_bytes(b"abc")
    os.utime(path, ns=(nanos - 10**9, nanos - 10**9))  # older than its name: the name's time is the birth
    p = children.spawn(
        smgshm_argv("watch", "--jsonl", "--shm-dir", str(tmp_path), "--duration", "30", "--interval", "0.2")
    )
    assert p.stdout is not None
    first = json.loads(p.stdout.readline())
    assert first["type"] == "rescanned"  # the start-up listing is done: the segment is tracked
    path.unlink()
    recs = []
    for line in p.stdout:
        rec = json.loads(line)
        validate(rec, STREAMS["watch"])
        recs.append(rec)
        if rec["type"] == "segment":
            break
    p.terminate()
    wait_for(lambda: p.poll() is not None, 30, "watch to stop")
    seg = recs[-1]
    assert seg["type"] == "segment"
    assert seg["name"] == name
    assert type(seg["created_ns"]) is int
    assert seg["created_ns"] == nanos
    assert str(nanos) in line  # the very digits, whatever parser reads them
