"""`smgshm ns`, `ns --pid` and `ns compare` in-process: ids, refusals and what they print."""

from __future__ import annotations

import os

import pytest

from smgshm.core.host.namespace import read_namespace_id
from tests.conftest import run_cli
from tests.support.cli_ns import A

B = "5ef74ec3-2222-4000-8000-000000000000"


def test_ns_human_and_json_agree() -> None:
    human = run_cli("ns").stdout
    doc = run_cli("--json", "ns").json
    assert doc["result"]["namespace_id"] == read_namespace_id()
    assert doc["result"]["namespace_id"] in human
    assert doc["result"]["shm_dev"] == os.stat("/dev/shm").st_dev
    assert doc["result"]["pid"] == os.getpid()


@pytest.mark.parametrize(
    ("a", "b", "sharing", "code"),
    [
        (f"{A}:27", f"{A}:27", "shared", 0),
        (f"{A}:27", f"{B}:27", "other_host", 3),
        (f"{A}:27", f"{A}:31", "private_tmpfs", 3),
        ("", f"{A}:27", "undetermined", 6),
        ("garbage", f"{A}:27", "undetermined", 6),
    ],
)
def test_compare_causes(a: str, b: str, sharing: str, code: int) -> None:
    doc = run_cli("--json", "ns", "compare", a, b, exit=code).json
    assert doc["result"]["sharing"] == sharing
    assert doc["command"] == "ns compare"
    human = run_cli("ns", "compare", a, b, exit=code)
    assert sharing.replace("_", "") in human.stdout.replace("_", "").replace(" ", "") or sharing == "shared"


def test_compare_defaults_to_this_host() -> None:
    run_cli("ns", "compare", read_namespace_id(), exit=0)


def test_ns_pid_missing_process() -> None:
    # A pid that names no process is a bad argument (exit 2), not this host's environment (5).
    res = run_cli("ns", "--pid", "999999999", exit=2)
    assert "no process has pid 999999999" in res.stderr
    assert run_cli("--json", "ns", "--pid", "999999999", exit=2).json["error"]["kind"] == "usage"


def test_compare_two_ids_names_them_a_and_b_not_here_and_peer() -> None:
    boot = "5ef74ec3-0000-4000-8000-000000000000"
    doc = run_cli("--json", "ns", "compare", f"{boot}:27", f"{boot}:99", exit=3).json
    reason = doc["result"]["reason"]
    assert "st_dev 99 in B, 27 in A" in reason
    assert "here" not in reason
    other = run_cli("--json", "ns", "compare", f"{boot}:27", "d05353d0-0000-4000-8000-000000000000:27", exit=3)
    assert "the peer" not in other.json["result"]["reason"]
    assert "different hosts" in other.json["result"]["reason"]
    empty = run_cli("--json", "ns", "compare", "", f"{boot}:27", exit=6).json["result"]["reason"]
    assert empty == "id A is empty"


def test_compare_with_this_host_says_here() -> None:
    from smgshm.core.host.namespace import read_namespace_id

    mine = read_namespace_id()
    boot, dev = mine.rsplit(":", 1)
    reason = run_cli("--json", "ns", "compare", f"{boot}:{int(dev) + 1}", exit=3).json["result"]["reason"]
    assert f"st_dev {dev} here, {int(dev) + 1} there" in reason


def test_a_hostile_id_is_shown_escaped() -> None:
    res = run_cli("ns", "compare", "\x1b[2J\x1b]0;pwned\x07", exit=6)
    assert "\x1b" not in res.stdout
    assert "pwned" in res.stdout


# Control bytes, a quote and an invalid UTF-8 byte (argv carries it as a surrogate, as Python does).
RAW_ID = 'a\x1b[31m\udcff"\\b:1'


@pytest.mark.parametrize("two_ids", [True, False])
def test_a_malformed_ids_reason_is_escaped_once_and_exact_in_json(two_ids: bool) -> None:
    """The reason carries the id raw, not its repr(), so the display escapes it once: a repr
    inside an escaped reason showed every backslash doubled (``\\x1b``, ``\\udcff``)."""
    args = ("ns", "compare", RAW_ID, *([f"{A}:27"] if two_ids else []))
    line = run_cli(*args, exit=6).stdout.splitlines()[0]
    assert line.endswith(' "a\\x1b[31m\\xff"\\\\b:1" is malformed'), line  # exactly fmt.escape's form
    assert "\x1b" not in line
    assert "\\\\x1b" not in line
    assert "udcff" not in line
    reason = run_cli("--json", *args, exit=6).json["result"]["reason"]
    assert reason.endswith(f'"{RAW_ID}" is malformed'), reason  # JSON: the very value
