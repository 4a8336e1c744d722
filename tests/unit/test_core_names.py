"""SMG's segment-name grammar (core/names.py): building, parsing, validating, and gc's fast form of it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgshm.core.errors import HandleError
from smgshm.core.host.pidtrust import Trust
from smgshm.core.names import (
    ASIDE_PREFIX,
    GATEWAY_PREFIX,
    GATEWAY_PROBE_PREFIX,
    KINDS,
    NAME_MAX,
    SMGSHM_PREFIX,
    SMGSHM_PROBE_PREFIX,
    aside_name,
    floor_name,
    gateway_probe_name,
    in_family,
    new_segment_name,
    parse_aside,
    parse_name,
    payload_name,
    payload_prefix,
    probe_file_name,
    probe_file_pid,
    validated_name,
)
from smgshm.core.segments.judge import Judge, ScanOptions

PIDS = st.integers(0, 2**32 - 1)
NANOS = st.integers(0, 2**64)
# Names near the grammar: its own pieces and the characters that have fooled parsers (non-ASCII
# digits, a trailing newline, shell punctuation), so most examples are near misses, not noise.
PIECES = st.sampled_from(
    [
        "smg-",
        "tokenspeed-",
        "smgshm-",
        "probe-",
        "gc-",
        "floor-",
        "-",
        "0",
        "7",
        "42",
        "4294967296",
        "\u0661",
        "\uff11",
        "\n",
        ";touch x",
        "x",
        " ",
    ]
)
# A prefix of the grammar and fields that are numbers (the pid limit's edges among them) or odd ones.
FIELDS = st.one_of(
    st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**64]).map(str),
    st.integers(0).map(str),
    st.sampled_from(["", "x", "\u0661", "1\n", "1;touch x", "-1"]),
)
SHAPED = st.builds(
    lambda prefix, fields: prefix + "-".join(fields),
    st.sampled_from([GATEWAY_PREFIX, GATEWAY_PROBE_PREFIX, SMGSHM_PREFIX, SMGSHM_PROBE_PREFIX, ASIDE_PREFIX, "smg-"]),
    st.lists(FIELDS, min_size=1, max_size=4),
)
NAMES = st.one_of(SHAPED, st.lists(PIECES, max_size=10).map("".join), st.text(max_size=40))


@given(pid=PIDS, nanos=NANOS, seq=st.integers(0, 2**32))
def test_payload_names_round_trip(pid: int, nanos: int, seq: int) -> None:
    assert parse_name(payload_name(pid, nanos, seq, GATEWAY_PREFIX)) == ("gateway", pid, nanos)
    assert parse_name(payload_name(pid, nanos, seq)) == ("smgshm", pid, nanos)
    assert payload_name(pid, nanos, seq).startswith(payload_prefix(pid))


@given(pid=PIDS)
def test_gateway_probe_names_round_trip(pid: int) -> None:
    name = gateway_probe_name(pid)
    assert parse_name(name) == ("gateway_probe", pid, None)
    assert probe_file_pid(name) == pid


ASIDE = f"{ASIDE_PREFIX}12-345-4026531836-smg-tokenspeed-7-1-0"


def test_a_set_aside_name_carries_its_gc_and_the_way_back() -> None:
    """gc's set-aside name says which gc (pid, start ticks, pid namespace) and what name it stood for; an older
    gc's (pid and random hex), or one whose original is not SMG's grammar, carries no way back."""
    name = aside_name("smg-tokenspeed-7-1-0", 12, 345, 4026531836)
    assert name == ASIDE
    assert parse_aside(name) == (12, 345, 4026531836, "smg-tokenspeed-7-1-0")
    assert parse_name(name) == ("gc_aside", None, None), "never a producer's pid"
    assert parse_aside(f"{ASIDE_PREFIX}12-{os.urandom(8).hex()}") is None
    assert parse_aside(f"{ASIDE_PREFIX}12-345-6-smg-tokenspeed-7-1-0\n") is None
    assert parse_aside(f"{ASIDE_PREFIX}12-345-6-../etc") is None
    assert parse_aside(f"{ASIDE_PREFIX}0-345-6-smg-tokenspeed-7-1-0") is None
    long = payload_name(7, int("9" * 220), 0, GATEWAY_PREFIX)  # 241 bytes: a name, but no room for the gc
    assert aside_name(long, 12, 345, 6) is None, "past NAME_MAX: no name"


def test_names_this_process_builds_parse_as_their_kind() -> None:
    before = time.time_ns()
    kind, pid, nanos = parse_name(probe_file_name())
    assert (kind, pid) == ("smgshm_probe", os.getpid())
    assert nanos is not None
    assert before <= nanos <= time.time_ns()
    assert parse_name(new_segment_name())[:2] == ("smgshm", os.getpid())
    assert parse_name(new_segment_name(GATEWAY_PREFIX))[:2] == ("gateway", os.getpid())
    assert new_segment_name() != new_segment_name(), "a sequence number keeps two in one ns apart"
    assert parse_name(ASIDE) == ("gc_aside", None, None)
    assert parse_name(floor_name()) == ("other", None, None)
    assert all(in_family(n) for n in (probe_file_name(), new_segment_name(), ASIDE, floor_name()))


def test_every_kind_is_one_the_parser_can_give() -> None:
    names = [
        payload_name(1, 2, 3, GATEWAY_PREFIX),
        gateway_probe_name(1),
        payload_name(1, 2, 3),
        probe_file_name(),
        ASIDE,
        "smg-other",
    ]
    assert tuple(parse_name(n).kind for n in names) == KINDS


@pytest.mark.parametrize(
    "name",
    [
        "smg-tokenspeed-\u0661\u0662\u0663-1-0",  # Arabic-Indic digits: \d matches them, a pid does not
        "smg-tokenspeed-123-1-0\n",  # `$` matches before a trailing newline
        "smg-tokenspeed-123-1-0\nsmg-tokenspeed-1-1-0",
        "smg-tokenspeed-\uff11\uff12-1-0",  # fullwidth digits
        "smg-tokenspeed-probe-12\n",
        "smg-smgshm-12-3-4x",
        "smg-tokenspeed-12-3",
        "smg-tokenspeed--1-2-3",
        "smg-tokenspeed-probe-1;touch x",  # a non-numeric probe suffix
        "smg-tokenspeed-probe-",
        "smg-smgshm-probe-9",
        "smg-tokenspeed-probe-1-2",
    ],
)
def test_names_parse_only_with_ascii_digits_and_a_full_match(name: str) -> None:
    kind, pid, nanos = parse_name(name)
    assert (kind, pid, nanos) == ("other", None, None), name


def test_well_formed_names_parse() -> None:
    assert parse_name("smg-tokenspeed-123-1700000000000000000-7") == ("gateway", 123, 1700000000000000000)
    assert parse_name("smg-tokenspeed-probe-42") == ("gateway_probe", 42, None)
    assert parse_name("smg-smgshm-9-5-0") == ("smgshm", 9, 5)
    assert parse_name("smg-smgshm-probe-9-5") == ("smgshm_probe", 9, 5)
    assert parse_name(f"smg-tokenspeed-{2**32}-1-0")[1] is None, "beyond u32 is no pid"


@pytest.mark.slow
@given(name=NAMES)
def test_a_name_that_does_not_parse_carries_nothing(name: str) -> None:
    kind, pid, nanos = parse_name(name)
    assert kind in KINDS
    if kind in ("other", "gc_aside"):
        assert (pid, nanos) == (None, None), name
    else:
        assert name.startswith((GATEWAY_PREFIX, SMGSHM_PREFIX)), name
        assert name.isascii(), name
        assert "\n" not in name


def test_the_family_is_the_smg_prefix_and_one_entry() -> None:
    assert in_family("smg-tokenspeed-probe-1;touch x"), "in the family, though not SMG's writing"
    assert not in_family("smgshm-bench-1")
    assert not in_family("psm_1234")
    assert not in_family("smg-a/b")


def test_validated_name_refuses_what_smgs_reader_refuses_and_overlong_names() -> None:
    for bad in ["", "/", "//", ".", "..", "/..", "a/b", "x\x00y", "../etc/passwd"]:
        with pytest.raises(HandleError, match="invalid segment name"):
            validated_name(bad)
    assert validated_name("//smg-smgshm-1-2-3") == "smg-smgshm-1-2-3"
    assert validated_name("n" * NAME_MAX) == "n" * NAME_MAX
    for long in ["n" * (NAME_MAX + 1), "\u00e9" * (NAME_MAX // 2 + 1), os.fsdecode(b"\xff" * (NAME_MAX + 1))]:
        with pytest.raises(HandleError, match="longer than NAME_MAX"):
            validated_name(long)  # counted in bytes, undecodable ones included


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> tuple[Judge, os.stat_result]:
    d: Path = tmp_path_factory.mktemp("names")
    f = d / "entry"
    f.write_bytes(b"")
    return Judge(ScanOptions(shm_dir=str(d), assume_dead=True), Trust(True, ""), {}, os.stat(d).st_dev), f.stat()


@pytest.mark.slow
@settings(max_examples=500)
@given(name=NAMES)
def test_judges_fast_path_agrees_with_parse_name(judge: tuple[Judge, os.stat_result], name: str) -> None:
    j, st_ = judge
    seg = j(name, st_)
    kind, pid, _ = parse_name(name)
    assert (seg.kind, seg.producer_pid) == (kind, pid)


@pytest.mark.parametrize(
    "name",
    [
        "smg-tokenspeed-probe-1;touch x",
        "smg-tokenspeed-probe-",
        "smg-tokenspeed-probe-1\n",
        "smg-tokenspeed-probe-\u0661",
    ],
)
def test_a_probe_lookalike_carries_no_pid(name: str) -> None:
    assert probe_file_pid(name) is None
