"""core/units.py: every size, duration and rate style pinned at its boundaries, and the parsers.

The styles differ on purpose until issue #23 unifies them; these tests pin what each prints
today, quirks included (1 MiB - 1 is '1024.0 KiB'), so that no caller's output moves by accident.
"""

from __future__ import annotations

import pytest

from smgshm.core.units import (
    MAX_DURATION_S,
    binary_rate,
    binary_size,
    decimal_mb,
    decimal_size,
    gb_per_s,
    mib_size,
    parse_duration,
    parse_size,
    short_duration,
    whole_kib,
    whole_mib,
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
        (MIB - 1, "1024.0 KiB"),  # rounds up inside the unit: the next unit starts at 1024 exactly
        (MIB, "1.0 MiB"),
        (52 * MIB + 51 * KIB, "52.0 MiB"),
        (GIB - 1, "1024.0 MiB"),
        (GIB, "1.0 GiB"),
        (TIB, "1.0 TiB"),
        (2**60, "1048576.0 TiB"),  # TiB is the last unit, however large
        (-1, "-1 B"),  # a difference of two sizes can be negative: the unit follows its magnitude
        (-1536, "-1.5 KiB"),
        (-MIB, "-1.0 MiB"),
    ],
)
def test_binary_size(n: int, text: str) -> None:
    assert binary_size(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0.0 MiB"),
        (1023, "0.0 MiB"),
        (MIB - 1, "1.0 MiB"),
        (MIB, "1.0 MiB"),
        (GIB - 1, "1,024.0 MiB"),  # thousands separated, one decimal
        (GIB, "1.0 GiB"),
        (TIB, "1,024.0 GiB"),  # GiB is the last unit
        (1234.56 * GIB, "1,234.6 GiB"),
    ],
)
def test_mib_size(n: float, text: str) -> None:
    assert mib_size(n) == text


def test_whole_units() -> None:
    assert whole_mib(0) == "0 MiB"
    assert whole_mib(24105 * MIB) == "24105 MiB"  # no separator, never GiB
    assert whole_mib(MIB - 1) == "1 MiB"
    assert whole_kib(1023) == "1 KiB"
    assert whole_kib(1536) == "2 KiB"  # half to even
    assert whole_kib(2560) == "2 KiB"
    assert whole_kib(MIB) == "1024 KiB"


@pytest.mark.parametrize(
    ("n", "mb", "size"),
    [
        (0, "0.0 MB", "0.0 kB"),
        (1023, "0.0 MB", "1.0 kB"),
        (99_999, "0.1 MB", "100.0 kB"),  # decimal_size switches at 1e5 bytes, not at 1 MB
        (100_000, "0.1 MB", "0.1 MB"),
        (4_800_000, "4.8 MB", "4.8 MB"),
        (MIB, "1.0 MB", "1.0 MB"),
        (TIB, "1099511.6 MB", "1099511.6 MB"),
    ],
)
def test_decimal_sizes(n: float, mb: str, size: str) -> None:
    assert decimal_mb(n) == mb
    assert decimal_size(n) == size


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.5, "0s"),  # half to even
        (1.5, "2s"),
        (59.4, "59s"),
        (59.6, "60s"),  # below a minute it stays in seconds, rounded
        (60, "1.0m"),
        (89.9, "1.5m"),
        (3599, "60.0m"),
        (3600, "1.0h"),
        (86399, "24.0h"),
        (86400, "1.0d"),
        (10**7, "115.7d"),
        (-5, "-5s"),  # a clock step can make an age negative
    ],
)
def test_short_duration(seconds: float, text: str) -> None:
    assert short_duration(seconds) == text


def test_rates() -> None:
    assert binary_rate(1536.9) == "1.5 KiB/s"  # whole bytes per second
    assert binary_rate(0.5) == "0 B/s"
    assert binary_rate(MIB) == "1.0 MiB/s"
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
    [("", "is not a duration"), ("2d", "is not a duration"), ("-1s", "is not a duration"),
     ("721h", "longer than the longest duration"), ("9" * 400, "longer than the longest duration")],
)  # fmt: skip
def test_parse_duration_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)
