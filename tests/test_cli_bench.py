"""bench: the sweep's structure, the crossover logic and the JSON schema (never timings)."""

from __future__ import annotations

import pytest

from smgshm.core.client.bench import SizeResult, Stats, crossover, recommend
from tests.conftest import own_smg_entries, run_cli


def _size(nbytes: int, inline_ms: float | None, shm_ms: float) -> SizeResult:
    st = Stats(shm_ms, shm_ms, shm_ms, nbytes / (shm_ms * 1e6))
    inl = Stats(inline_ms, inline_ms, inline_ms, 0.0) if inline_ms is not None else None
    return SizeResult(nbytes, inl, st, 0.0, 0.0, 0.0, None, 0.0)


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        ([(4096, 0.5, 0.9), (65536, 0.8, 0.9), (1 << 20, 3.0, 1.0), (16 << 20, 40.0, 5.0)], 1 << 20),
        ([(4096, 0.5, 0.4), (65536, 0.8, 0.5)], 4096),  # SHM wins everywhere
        ([(4096, 0.5, 0.9), (65536, 0.8, 0.9)], None),  # never
        # a noisy win at a small size does not count when SHM loses above it
        ([(4096, 0.9, 0.5), (65536, 0.8, 0.9), (1 << 20, 3.0, 1.0)], 1 << 20),
        ([(1 << 20, 3.0, 1.0), (512 << 20, None, 50.0)], 1 << 20),  # the largest did not fit inline
    ],
)
def test_crossover(rows: list[tuple[int, float | None, float]], want: int | None) -> None:
    assert crossover([_size(*r) for r in rows]) == want


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        ([(65536, 0.8, 0.9), (131072, 1.0, 1.1), (262144, 2.0, 1.5), (1 << 20, 3.0, 1.0)], 262144),
        ([(65536, 0.8, 0.9), (1 << 20, 3.0, 1.0)], 1 << 20),  # nothing measured between: not a guess below
        ([(300_000, 2.0, 1.0), (1 << 20, 3.0, 1.0)], 300_000),  # SHM won everywhere: the smallest measured
    ],
)
def test_recommendation_is_at_or_above_the_measured_crossover(rows: list[tuple[int, float, float]], want: int) -> None:
    x, rec, why = recommend([_size(*r) for r in rows])
    assert x == want
    assert rec is not None
    assert rec >= x, "a threshold below the crossover sends sizes by SHM that SHM was measured to lose"
    assert f"--multimodal-shm-min-bytes {rec} " in why
    assert recommend([_size(4096, 0.5, 0.9)])[1] is None


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


def test_the_default_sweep_is_the_issues_4kib_to_256mib() -> None:
    from smgshm.cli.bench import _sizes

    assert _sizes(4096, 256 * 1024 * 1024, 4, None) == tuple(4096 * 4**i for i in range(9))
    out = run_cli("bench", "--help").stdout
    assert "[default: 4KiB]" in out
    assert "[default: 256MiB]" in out


def test_human_report_fits_a_pipe_without_cut_cells() -> None:
    out = run_cli("bench", "--sizes", "4KiB,256MiB", "--warmup", "0", "-n", "1").stdout
    assert "w/rpc/r ms" in out
    assert "rate by size" in out
    assert "256.0 MiB      n/a" in out
    assert "…" not in out  # rich shortens cells that do not fit 80 columns


def test_a_failed_gate_is_the_first_line_as_a_failure_not_a_warning() -> None:
    res = run_cli("bench", "--sizes", "4KiB", "--warmup", "0", "-n", "1", "--min-gbps", "1000000", exit=3)
    first = res.stdout.splitlines()[0]
    assert first.startswith("FAILED: SHM ")
    assert "below --min-gbps 1000000" in first
    assert "warning" not in res.stderr


def test_progress_is_weighted_by_work_so_the_eta_is_not_skewed() -> None:
    from smgshm.core.client.bench import BenchOptions, _round_weight

    opts = BenchOptions((4096, 256 * 1024 * 1024), 0, 1)
    small, big = (_round_weight(s, opts) for s in opts.sizes)
    assert big > 100 * small  # a 256 MiB round is counted as far more work than a 4 KiB one
