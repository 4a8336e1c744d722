"""`send`'s arguments: impossible shapes and sizes are usage errors (exit 2) before anything is allocated."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

# An address nothing listens on: a usage error must come before any dial.
NOWHERE = "127.0.0.1:1"


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (("--shape", "1000000x1000000"), "per tensor is over"),
        (("--size", "1000GB"), "per tensor is over"),
        (("--size", "9" * 400), "too large a size"),
        (("--shape", "3x-1"), "is not a shape"),
        (("--shape", "3xfoo"), "is not a shape"),
        (("--shape", "3x\u0663"), "is not a shape"),  # an Arabic-Indic digit is not a dimension
        (("--shape", "1x4294967296", "--dtype", "uint8"), "over 2^32-1"),
        (("--size", "2GiB", "--tensors", "8"), "this sender holds at once"),
        (("--timeout", "9" * 400 + "h"), "longest duration"),
        (("--duration", "1e9"), "is not a duration"),
    ],
)
def test_impossible_arguments_are_usage_errors(args: tuple[str, ...], phrase: str) -> None:
    res = run_cli("send", *args, NOWHERE, exit=2)
    assert phrase in res.stderr
    assert "internal error" not in res.stderr


def test_usage_error_as_json() -> None:
    doc = run_cli("--json", "send", "--shape", "1000000x1000000", NOWHERE, exit=2).json
    assert doc["error"]["kind"] == "usage"


def test_help_lists_every_exit_code_send_uses() -> None:
    out = " ".join(run_cli("send", "--help").stdout.split())
    assert "Exit 0 when all verified, 1 when a request is refused" in out
    for phrase in ("2 on bad arguments", "3 on a mismatch", "4 when the receiver", "5 when /dev/shm", "130/143/129"):
        assert phrase in out
