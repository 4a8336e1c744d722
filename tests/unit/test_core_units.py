"""core/units.py: the one style of sizes, rates and durations pinned at its boundaries, and the parsers."""

from __future__ import annotations

import pytest

from smgshm.core.units import (
    MAX_DURATION_S,
    gb_per_s,
    human_duration,
    human_gb_per_s,
    human_ms,
    human_rate,
    human_size,
    parse_duration,
    parse_size,
)

KIB, MIB, GIB, TIB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (MIB - 1, "1.0 MiB"),  # decided on the rounded figure: never '1024.0 KiB'
        (MIB - 52, "1023.9 KiB"),
        (MIB, "1.0 MiB"),
        (4_710_000, "4.5 MiB"),
        (52 * MIB + 51 * KIB, "52.0 MiB"),
        (24105 * MIB, "23.5 GiB"),  # never '24105 MiB': the same rule however large
        (GIB - 1, "1.0 GiB"),
        (GIB, "1.0 GiB"),
        (TIB, "1.0 TiB"),
        (2**60, "1048576.0 TiB"),  # TiB is the last unit, however large
        (-1, "-1 B"),  # a difference of two sizes can be negative: the unit follows its magnitude
        (-1536, "-1.5 KiB"),
        (-MIB, "-1.0 MiB"),
        (1536.9, "1.5 KiB"),  # a mean is a float
        (None, "?"),  # not known yet: never a '0 B' that reads as measured
    ],
)
def test_human_size(n: float | None, text: str) -> None:
    assert human_size(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (0.00003, "0.03 ms"),
        (0.0012, "1.20 ms"),
        (0.0099999, "10.0 ms"),  # decided on the rounded figure
        (0.0125, "12.5 ms"),
        (0.9999, "999.9 ms"),
        (0.99996, "1.0 s"),
        (1.0, "1.0 s"),
        (3.44, "3.4 s"),
        (9.96, "10 s"),
        (42, "42 s"),
        (59.6, "1 min"),
        (125, "2 min 5 s"),
        (3599.6, "1 h"),
        (11040, "3 h 4 min"),
        (5 * 86400 + 3 * 3600 + 5, "5 d 3 h"),
        (-5, "-5.0 s"),  # a clock step can make an age negative
        (None, "?"),
        (float("nan"), "?"),
    ],
)
def test_human_duration(seconds: float | None, text: str) -> None:
    assert human_duration(seconds) == text


def test_every_duration_fits_an_age_column_of_eleven() -> None:
    for s in range(0, 400 * 86400, 997):
        assert len(human_duration(s)) <= 11, s


def test_rates_and_milliseconds() -> None:
    assert human_rate(1536.9) == "1.5 KiB/s"
    assert human_rate(0.5) == "0 B/s"
    assert human_rate(MIB) == "1.0 MiB/s"
    assert human_rate(None) == "?"
    assert human_gb_per_s(2.5) == "2.3 GiB/s"  # GB = 1e9 bytes in, binary out
    assert human_ms(250) == "250.0 ms"
    assert human_ms(None) == "?"
    assert gb_per_s(10**9, 10**9) == 1.0  # bytes per ns is GB/s
    assert gb_per_s(64 * MIB, 20_000_000) == 64 * MIB / 20_000_000
    assert gb_per_s(5, 0) == 0.0


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("0", 0),
        ("4096", 4096),
        (" 3 kb ", 3000),
        ("64KiB", 64 * KIB),
        ("16MiB", 16 * MIB),
        ("2.5mib", int(2.5 * MIB)),
        ("1 GiB", GIB),
        ("1GB", 10**9),
        ("1.5g", 1_500_000_000),
        ("9223372036854774784", 2**63 - 1024),  # the largest a float carries below 2**63
    ],
)
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a size"),
        ("x", "is not a size"),
        ("-5", "is not a size"),
        ("1e3", "is not a size"),
        ("5 TiB", "is not a size"),
        ("9223372036854775807", "is too large a size"),  # 2**63 - 1 is 2**63 as a float
        ("9" * 400, "is too large a size"),
    ],
)
def test_parse_size_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("2s", 2.0), ("1.5", 1.5), ("1m", 60.0), ("1h", 3600.0), (" 720h ", MAX_DURATION_S)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a duration"),
        ("2d", "is not a duration"),
        ("-1s", "is not a duration"),
        ("721h", "longer than the longest duration"),
        ("9" * 400, "longer than the longest duration"),
    ],
)
def test_parse_duration_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)
