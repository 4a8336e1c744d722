"""The gateway's own words for its failed SHM writes (issue #29, item 3): doctor's fix quotes them.

doctor said "read the gateway's log for the write error" while it had read that log. Now the fix names
the log and quotes the last few write-error lines of the run since its start line, bounded and with
every control character replaced: the log is a stranger's file (any user can title a process
smg::router), so its text must not reach a terminal raw nor grow a report without bound.
"""

from __future__ import annotations

from pathlib import Path

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.gateway.log import MAX_QUOTE, MAX_WRITE_ERRORS, WRITE_ERROR, read_transport_config
from smgshm.core.gateway.metrics import MmTraffic
from smgshm.core.gateway.mode import judge

START = (
    "2026-12-04 10:00:00  INFO smg::multimodal: Multimodal tensor transport configured mode=shm "
    "shm_min_bytes=65536 dev_writable=true\n"
)


def _error(n: int, extra: str = "") -> str:
    return (
        f"2026-12-04 10:00:{n:02d}  WARN smg::multimodal: {WRITE_ERROR}; falling back to inline "
        f"error=No space left on device (os error 28) n={n}{extra}\n"
    )


def _failing() -> MmTraffic:
    return MmTraffic({"inline": 5}, {"inline": 5 << 20}, 5, {"router": 5}, True)


def test_the_last_write_errors_of_the_running_start_are_read_bounded_and_defused(tmp_path: Path) -> None:
    hostile = "\x1b[2K\r[ok] forged\x1b]0;pwned\x07\u202e\u2028" + "y" * 500
    log = tmp_path / "gw.log"
    log.write_text(
        START + _error(1) + START + "".join(_error(n) for n in range(2, 6)) + _error(6, hostile), encoding="utf-8"
    )
    config = read_transport_config(str(log))
    assert config is not None
    errors = config.write_errors
    assert len(errors) == MAX_WRITE_ERRORS
    assert ["n=4" in errors[0], "n=5" in errors[1], "n=6" in errors[2]] == [True] * 3
    assert not any("n=1 " in e or e.endswith("n=1") for e in errors), "an earlier run's errors are not this run's"
    assert all(e.isprintable() and len(e) <= MAX_QUOTE for e in errors), errors
    assert errors[2].endswith("\u2026")
    assert "\x1b" not in errors[2]
    assert "\u202e" not in errors[2]


def test_doctors_fix_quotes_the_logs_write_errors_and_names_the_log(tmp_path: Path) -> None:
    log = tmp_path / "gw.log"
    log.write_text(START + _error(1) + _error(2, " \x1b[31mred\x1b[0m\x07"), encoding="utf-8")
    config = read_transport_config(str(log))
    finding = judge("gateway pid 7", config, _failing(), "http://127.0.0.1:1/metrics")
    assert finding.cause is Cause.SHM_WRITES_FAILING
    assert "read the gateway's log for the write error" not in finding.fix
    assert f"the gateway's log {log} says why (its last 2 write error(s)): \u201c" in finding.fix
    assert "error=No space left on device (os error 28) n=1\u201d" in finding.fix
    assert "n=2 red\ufffd\u201d" in finding.fix, finding.fix  # colour gone, the bell replaced
    assert finding.fix.isprintable()
    assert any("write errors since" in e.says for e in finding.evidence)


def test_without_a_log_or_its_errors_the_fix_says_what_it_knows(tmp_path: Path) -> None:
    assert judge("gateway pid 7", None, _failing()).fix == CATALOGUE[Cause.SHM_WRITES_FAILING].fix
    log = tmp_path / "gw.log"
    log.write_text(START, encoding="utf-8")
    fix = judge("gateway pid 7", read_transport_config(str(log)), _failing()).fix
    assert f"read the gateway's log {log} for the write error (it has none since its start)" in fix
