"""bench: the sweep's structure, the crossover logic and the JSON schema (never timings)."""

from __future__ import annotations

import pytest

from smgshm.core.client.bench import SizeResult, Stats, crossover, recommend
from tests.conftest import run_cli


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


def test_the_default_sweep_is_the_issues_4kib_to_256mib() -> None:
    from smgshm.cli.bench import _sizes

    assert _sizes(4096, 256 * 1024 * 1024, 4, None) == tuple(4096 * 4**i for i in range(9))
    out = run_cli("bench", "--help").stdout
    assert "[default: 4KiB]" in out
    assert "[default: 256MiB]" in out


def test_progress_is_weighted_by_work_so_the_eta_is_not_skewed() -> None:
    from smgshm.core.client.bench import BenchOptions, _round_weight

    opts = BenchOptions((4096, 256 * 1024 * 1024), 0, 1)
    small, big = (_round_weight(s, opts) for s in opts.sizes)
    assert big > 100 * small  # a 256 MiB round is counted as far more work than a 4 KiB one
