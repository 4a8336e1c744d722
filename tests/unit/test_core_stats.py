"""core/stats.py: each percentile method on known data, the median against the stdlib's, and
StreamingQuantiles' bounded error and memory (moved here from test_core_watch)."""

from __future__ import annotations

import random
import statistics

import pytest

from smgshm.core.stats import StreamingQuantiles, median, percentiles

TEN = [10, 1, 9, 2, 8, 3, 7, 4, 6, 5]  # 1..10, shuffled: every method sorts first


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        # positions q * 9 = 4.5, 8.1, 8.91, 0, 9
        ("nearest", [5, 9, 10, 1, 10]),  # round half to even: 4.5 -> 4, so s[4] = 5
        ("higher", [6, 10, 10, 1, 10]),
        ("linear", [5.5, 9.1, 9.91, 1, 10]),
    ],
)
def test_each_method_on_one_to_ten(method: str, expected: list[float]) -> None:
    got = percentiles(TEN, (0.5, 0.9, 0.99, 0.0, 1.0), method)  # type: ignore[arg-type]
    assert got == pytest.approx(expected)


def test_nearest_is_what_send_and_bench_printed() -> None:
    """The index send's and bench's p50/p90/p99 took: round(q * (n - 1)), half to even."""
    rng = random.Random(3)  # noqa: S311 - reproducible test data, not a secret
    for n in (1, 2, 3, 4, 5, 10, 11, 100, 101, 1000):
        values = [rng.randrange(10**9) for _ in range(n)]
        s = sorted(values)
        for q in (0.5, 0.9, 0.99):
            assert percentiles(values, (q,), "nearest") == [s[min(n - 1, round(q * (n - 1)))]]
    assert percentiles([1, 2], (0.5,), "nearest") == [1]  # 0.5 rounds to 0
    assert percentiles([1, 2, 3, 4], (0.5,), "nearest") == [3]  # 1.5 rounds to 2


def test_higher_median_is_the_upper_middle() -> None:
    """e2e's "consumed in" took s[n // 2]: the middle, or the upper of the two middles."""
    for n in range(1, 40):
        values = list(range(n, 0, -1))
        assert median(values, method="higher") == sorted(values)[n // 2]


def test_linear_median_equals_statistics_median_to_the_bit() -> None:
    rng = random.Random(11)  # noqa: S311 - reproducible test data, not a secret
    for n in (*range(1, 12), 100, 101, 1000):
        ints = [rng.randrange(10**12) for _ in range(n)]  # ns, as bench and the what-if feed it
        floats = [rng.lognormvariate(3, 2) for _ in range(n)]  # ms, as e2e feeds it
        for values in (ints, floats):
            got, want = median(values), statistics.median(values)
            assert got == want, (n, got, want)
            assert type(got) is type(want), (n, got, want)


def test_an_element_comes_back_unconverted() -> None:
    assert median([3, 1, 2]) == 2
    assert isinstance(median([3, 1, 2]), int)
    assert percentiles([7], (0.0, 0.5, 0.99, 1.0), "linear") == [7, 7, 7, 7]


def test_no_values() -> None:
    with pytest.raises(ValueError, match="no values"):
        median([])
    with pytest.raises(ValueError, match="no values"):
        percentiles([], (0.5,), "nearest")
    assert median([], empty=0.0) == 0.0
    assert median([], empty=None) is None
    assert percentiles([], (0.5, 0.9, 0.99), "nearest", empty=0.0) == [0.0, 0.0, 0.0]
    assert median(iter([4, 2])) == 3.0  # any iterable, taken once


def test_quantiles_within_their_relative_error() -> None:
    rng = random.Random(7)  # noqa: S311 - reproducible test data, not a secret
    values = [rng.lognormvariate(15, 2) for _ in range(50_000)]  # ns, from µs to seconds
    q = StreamingQuantiles()
    for v in values:
        q.add(v)
    values.sort()
    for p in (0.5, 0.9, 0.99):
        true = values[int(p * len(values)) - 1]
        got = q.quantile(p)
        assert got is not None
        assert abs(got - true) / true < 0.02, (p, got, true)
    assert q.quantile(1.0) == values[-1]
    assert q.quantile(0.0) == values[0]
    assert q.count == len(values)
    assert q.buckets < 1500  # memory: distinct buckets, not values


def test_quantiles_empty_zero_and_merge() -> None:
    q = StreamingQuantiles()
    assert q.quantile(0.5) is None
    q.add(0)
    q.add(0)
    q.add(1000)
    assert q.quantile(0.5) == 0.0
    other = StreamingQuantiles()
    for _ in range(10):
        other.add(2000)
    q.merge(other)
    assert q.count == 13
    assert q.max == 2000
    assert q.min == 0
    assert abs(q.quantile(0.9) - 2000) / 2000 < 0.02  # type: ignore[operator]
