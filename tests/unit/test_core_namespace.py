"""Namespace ids: parsing, reading this host's id as SMG does, and comparing two ids."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from smg_grpc_servicer import mm_shm

from smgshm.core.host.namespace import (
    NamespaceId,
    Sharing,
    compare_namespace_ids,
    parse_namespace_id,
    read_namespace_id,
)

A = "5ef74ec3-1111-4000-8000-000000000000"
B = "5ef74ec3-2222-4000-8000-000000000000"


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


@pytest.mark.parametrize(
    ("text", "boot_id", "dev"),
    [
        (f"{A}:27", A, 27),
        (f"{A}:0", A, 0),
        (f"  {A}:31\n", A, 31),
        (f"{A.upper()}:27", A, 27),
        (f"{B}:123456789012", B, 123456789012),
    ],
)
def test_parse_valid(text: str, boot_id: str, dev: int) -> None:
    parsed = parse_namespace_id(text)
    assert parsed == NamespaceId(boot_id, dev)
    assert str(parsed) == f"{boot_id}:{dev}"


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        A,  # no device part
        f"{A}:",
        ":27",
        f"{A}:-1",
        f"{A}:2x",
        f"{A}:1.5",
        f"{A[:-1]}:27",  # boot id one hex digit short
        f"{A[:-1]}g:27",  # non-hex digit
        "not-a-uuid-at-all-really:27",
        f"{A}:27:28",
    ],
)
def test_parse_malformed(text: str) -> None:
    assert parse_namespace_id(text) is None


@pytest.mark.parametrize("text", ["", None, "   "])
def test_parse_empty(text: str | None) -> None:
    assert parse_namespace_id(text) is None


def test_read_matches_smg_servicer() -> None:
    mm_shm._shm_namespace_id_cache = None
    try:
        theirs = mm_shm.shm_namespace_id()
    finally:
        mm_shm._shm_namespace_id_cache = None
    ours = read_namespace_id()
    assert theirs
    assert ours == theirs
    assert ours == f"{_boot_id()}:{os.stat('/dev/shm').st_dev}"
    parsed = parse_namespace_id(ours)
    assert parsed is not None
    assert parsed.shm_dev == os.stat("/dev/shm").st_dev


def test_read_other_dir_uses_its_st_dev(tmp_path: Path) -> None:
    assert read_namespace_id(str(tmp_path)) == f"{_boot_id()}:{os.stat(tmp_path).st_dev}"


def test_read_through_proc_root_of_self() -> None:
    assert read_namespace_id("/dev/shm", f"/proc/{os.getpid()}/root") == read_namespace_id()


def test_read_missing_shm_dir_is_empty(tmp_path: Path) -> None:
    assert read_namespace_id(str(tmp_path / "no-such-dir")) == ""


def test_compare_shared() -> None:
    cmp = compare_namespace_ids(f"{A}:27", f"{A}:27")
    assert cmp.sharing is Sharing.SHARED
    assert cmp.shared
    assert (cmp.local, cmp.peer) == (f"{A}:27", f"{A}:27")


def test_compare_this_host_with_itself() -> None:
    ns = read_namespace_id()
    assert compare_namespace_ids(ns, ns).shared


def test_compare_other_host() -> None:
    cmp = compare_namespace_ids(f"{A}:27", f"{B}:27")
    assert cmp.sharing is Sharing.OTHER_HOST
    assert not cmp.shared
    assert "boot ids differ" in cmp.reason


def test_compare_other_host_wins_over_dev() -> None:
    assert compare_namespace_ids(f"{A}:27", f"{B}:31").sharing is Sharing.OTHER_HOST


def test_compare_private_tmpfs() -> None:
    cmp = compare_namespace_ids(f"{A}:27", f"{A}:31")
    assert cmp.sharing is Sharing.PRIVATE_TMPFS
    assert not cmp.shared
    assert "27" in cmp.reason
    assert "31" in cmp.reason


@pytest.mark.parametrize(
    ("local", "peer", "words"),
    [
        (f"{A}:27", "", "advertises no namespace id"),
        (f"{A}:27", None, "advertises no namespace id"),
        (f"{A}:27", "garbage", "malformed"),
        ("", f"{A}:27", "unreadable"),
        (None, f"{A}:27", "unreadable"),
        ("garbage", f"{A}:27", "malformed"),
        ("", "", "advertises no namespace id"),
        ("garbage", "junk", "malformed"),
    ],
)
def test_compare_undetermined(local: str | None, peer: str | None, words: str) -> None:
    cmp = compare_namespace_ids(local, peer)
    assert cmp.sharing is Sharing.UNDETERMINED
    assert not cmp.shared
    assert words in cmp.reason
    assert cmp.local == (local or "")
    assert cmp.peer == (peer or "")


def test_sharing_values_are_stable() -> None:
    assert {s.value for s in Sharing} == {"shared", "other_host", "private_tmpfs", "undetermined", "spelling"}


@pytest.mark.parametrize(
    "peer", [f"{A.upper()}:27", f"{A}:027", f" {A}:27", f"{A}:27\n"], ids=["upper", "zero", "space", "newline"]
)
def test_compare_same_tmpfs_spelled_differently_is_not_shared(peer: str) -> None:
    """The gateway compares the strings, so a respelled id keeps `auto` inline."""
    cmp = compare_namespace_ids(f"{A}:27", peer)
    assert cmp.sharing is Sharing.SPELLING
    assert not cmp.shared
    assert "strings" in cmp.reason


def test_parse_superscript_digit_is_malformed_not_a_crash() -> None:
    assert parse_namespace_id(f"{A}:\u00b2") is None
    assert compare_namespace_ids(f"{A}:2", f"{A}:\u00b2").sharing is Sharing.UNDETERMINED


def test_parse_non_ascii_digits_is_malformed() -> None:
    assert parse_namespace_id(f"{A}:\u0661\u0662") is None
    assert compare_namespace_ids(f"{A}:12", f"{A}:\u0661\u0662").sharing is Sharing.UNDETERMINED


def test_parse_newline_inside_token_is_malformed() -> None:
    assert parse_namespace_id(f"{A}\n:27") is None
    assert compare_namespace_ids(f"{A}:27", f"{A}\n:27").sharing is Sharing.UNDETERMINED
