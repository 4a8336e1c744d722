"""bench: the sweep's structure, the crossover logic and the JSON schema (never timings)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import own_smg_entries, run_cli


def test_bench_embedded_json_schema_and_no_leftovers() -> None:
    before = own_smg_entries()  # the machine is shared: judge only what this test's processes made
    doc = run_cli("--json", "bench", "--sizes", "4KiB,256KiB", "--warmup", "0", "-n", "2").json
    assert own_smg_entries() <= before
    r = doc["result"]
    assert set(r) == {
        "address",
        "reader",
        "host",
        "sizes",
        "crossover_bytes",
        "recommended_shm_min_bytes",
        "recommendation",
        "verified",
    }
    assert set(r["host"]) == {
        "cpu_count",
        "python",
        "torch",
        "memcpy_gb_per_s",
        "fresh_page_gb_per_s",
        "writer_pwrite_gb_per_s",
        "writer_mmap_gb_per_s",
    }
    assert [s["nbytes"] for s in r["sizes"]] == [4096, 262144]
    for s in r["sizes"]:
        assert set(s) == {
            "nbytes",
            "inline",
            "shm",
            "shm_write_ms",
            "shm_rpc_ms",
            "shm_read_ms",
            "speedup",
            "shm_fraction_of_memcpy",
            "samples_ns",
        }
        assert set(s["shm"]) == {"p50_ms", "p90_ms", "p99_ms", "gb_per_s"}
        assert len(s["samples_ns"]["shm"]) == 2
        assert len(s["samples_ns"]["inline"]) == 2
    assert r["verified"] is True
    assert r["reader"] == "view"


def test_bench_jsonl_and_copy_reader() -> None:
    out = run_cli("bench", "--sizes", "4KiB,8KiB", "--warmup", "0", "-n", "1", "--jsonl", "--reader", "copy").stdout
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 2
    import json

    assert [json.loads(ln)["nbytes"] for ln in lines] == [4096, 8192]


def test_bench_gate_exits_3() -> None:
    res = run_cli("--json", "bench", "--sizes", "4KiB", "--warmup", "0", "-n", "1", "--min-shm-speedup", "1000", exit=3)
    assert any("below --min-shm-speedup" in w for w in res.json["warnings"])


def test_bench_unreachable_and_usage() -> None:
    run_cli("bench", "127.0.0.1:1", "--sizes", "4KiB", exit=4)
    run_cli("bench", "--min", "1MiB", "--max", "4KiB", exit=2)


@pytest.mark.slow
def test_a_size_over_the_message_limit_is_shm_only_and_the_gate_uses_the_largest_shared_size() -> None:
    argv = ["--json", "bench", "--sizes", "1MiB,256MiB", "--warmup", "0", "-n", "1"]
    doc = run_cli(*argv, "--min-shm-speedup", "0.001").json
    small, big = doc["result"]["sizes"]
    assert big["nbytes"] == 256 * 1024 * 1024
    assert (big["inline"], big["speedup"]) == (None, None)  # 256 MiB inline exceeds SMG's message limit
    assert big["shm"]["gb_per_s"] > 0
    assert small["inline"] is not None
    assert small["speedup"] > 0
    res = run_cli(*argv, "--min-shm-speedup", "1000", exit=3)
    assert any("at 1.0 MiB (1048576 B) is below --min-shm-speedup" in w for w in res.json["warnings"])


@pytest.mark.slow
def test_human_report_fits_a_pipe_without_cut_cells() -> None:
    out = run_cli("bench", "--sizes", "4KiB,256MiB", "--warmup", "0", "-n", "1").stdout
    assert "w/rpc/r ms" in out
    assert "rate by size" in out
    assert re.search(r"256\.0 MiB +too big ", out), out  # the unknown cell says why, as does the note
    assert "too big: larger than one gRPC message" in out
    assert "…" not in out  # rich shortens cells that do not fit 80 columns


def test_a_failed_gate_is_the_first_line_as_a_failure_not_a_warning() -> None:
    res = run_cli("bench", "--sizes", "4KiB", "--warmup", "0", "-n", "1", "--min-gbps", "1000000", exit=3)
    first = res.stdout.splitlines()[0]
    assert first.startswith("FAILED: SHM ")
    assert "below --min-gbps 1000000" in first
    assert "warning" not in res.stderr
