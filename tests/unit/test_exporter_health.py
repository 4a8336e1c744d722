"""/healthz's rule (smgshm/core/watch/health.py) and the web config's Authorization parsing, pure: no
server. The servers themselves are tested in tests/integration/test_exporter_web.py."""

from __future__ import annotations

import base64

import pytest

from smgshm.core.watch.health import MIN_SLACK_S, STALE_PERIODS, judge
from smgshm.core.watch.webconfig import _basic_credentials


def test_no_scan_yet_is_starting_not_ok() -> None:
    v = judge(None, 30.0)
    assert not v.ok
    assert v.reason == "starting: no scan has finished yet"


def test_recent_is_ok_and_a_few_periods_old_is_stale() -> None:
    limit = STALE_PERIODS * 30.0 + MIN_SLACK_S
    assert judge(0.0, 30.0).ok
    assert judge(limit, 30.0).ok
    v = judge(limit + 0.5, 30.0)
    assert not v.ok
    assert v.reason == "stale: the last scan finished 92s ago, one is due every 30s"


def test_a_slow_scan_widens_the_slack_so_a_short_period_does_not_flap() -> None:
    assert judge(1.5, 0.1, scan_s=0.8).ok  # three times the scan's 0.8 s, over 3 x 0.1 s
    assert not judge(3.0, 0.1, scan_s=0.8).ok


def test_failing_wins_over_recent_and_is_one_line() -> None:
    v = judge(0.0, 30.0, failing="the last full scan could not look at the node")
    assert not v.ok
    assert v.reason == "failing: the last full scan could not look at the node"
    assert "\n" not in v.reason


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("header", "want"),
    [
        (None, (None, b"")),
        ("", (None, b"")),
        ("Bearer abc", (None, b"")),
        ("Basic !!!", (None, b"")),
        (f"Basic {_b64(b'alice')}", (None, b"")),  # no colon: no password given
        (f"Basic {_b64(b'alice:pw:with:colons')}", ("alice", b"pw:with:colons")),
        (f"basic {_b64(b'alice:')}", ("alice", b"")),
        ("Basic " + _b64(b"al\xffice:pw"), ("al\ufffdice", b"pw")),
    ],
)
def test_basic_credentials_are_read_strictly(header: str | None, want: tuple[str | None, bytes]) -> None:
    assert _basic_credentials(header) == want
