"""Human output says why a figure is unknown (never a bare ``-``) and shows sizes as sizes, never raw bytes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from smgshm.cli.app import App
from smgshm.core.client.bench import SizeResult, Stats
from smgshm.core.gateway.setting import Mode
from smgshm.core.transport.decision import decide


def _cells(out: str) -> list[list[str]]:
    return [ln.split() for ln in out.splitlines()]


def test_e2e_latency_table_says_none_ok_where_no_request_passed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from smgshm.cli import e2e_view

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(e2e_view, "_run_block", lambda *_a: None)  # the table is what is tested
    ok, failed = SimpleNamespace(ok=True), SimpleNamespace(ok=False)
    runs = [
        SimpleNamespace(label=label, path=path, p50_ms=12.0, requests=reqs, as_expected=True, failure_class="")
        for label, path, reqs in (("shm", "shm", [ok, ok]), ("inline", "inline", [failed, failed]))
    ]
    report = SimpleNamespace(
        runs=runs, embedded=False, ok=True, image_size=448, image_bytes=1600, model="m", removed_at_stop=[]
    )
    e2e_view.e2e_report(App(), report)
    out = capsys.readouterr().out
    rows = {row[0]: row for row in _cells(out) if row and row[0] in ("shm", "inline")}
    assert rows["shm"][2:4] == ["12.0", "ms"], out
    assert " ".join(rows["inline"][2:4]) == "none ok", out
    assert "-" not in rows["inline"], out


def test_bench_table_says_why_inline_and_its_speedup_are_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from smgshm.cli import bench_view

    monkeypatch.setenv("COLUMNS", "80")
    big = SizeResult(512 << 20, None, Stats(50.0, 50.0, 50.0, 10.0), 1.0, 1.0, 1.0, None, 0.5)
    small = SizeResult(1 << 20, Stats(3.0, 3.0, 3.0, 0.3), Stats(1.0, 1.0, 1.0, 1.0), 0.1, 0.1, 0.1, 3.0, 0.5)
    host = SimpleNamespace(
        cpu_count=2, memcpy_gb_per_s=9.0, fresh_page_gb_per_s=2.0, writer_pwrite_gb_per_s=1.7, writer_mmap_gb_per_s=1.0
    )
    report = SimpleNamespace(host=host, recommendation="set 1 MiB", sizes=[small, big])
    bench_view.bench_report()(App(), report)
    out = capsys.readouterr().out
    row = next(r for r in _cells(out) if r[:2] == ["512.0", "MiB"])
    assert row[2:6] == ["too", "big", "50.0", "ms"], out
    assert row[6:8] == ["no", "inline"], out
    assert "-" not in row, out
    assert "too big: larger than one gRPC message" in out  # the note says what the cell means
    assert "n/a" not in out


def test_sweep_table_says_which_figures_were_not_seen(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from smgshm.cli import e2e_view

    monkeypatch.setenv("COLUMNS", "120")
    row = SimpleNamespace(
        image_px=224,
        pixel_nbytes=600_000,
        inline_p50_ms=0.0,  # every inline request failed
        shm_p50_ms=8.0,
        speedup=None,
        shm_write_ms=None,
        worker_read_ms=1.0,
        floor_ms=0.3,
        preprocess_ms=None,
    )
    e2e_view.sweep_report(App(), SimpleNamespace(rows=[row], fresh_page_gb_per_s=2.0, memcpy_gb_per_s=9.0))
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.lstrip().startswith("224"))
    assert line.split()[3:] == ["none", "ok", "8.0", "none", "ok", "not", "seen", "1.0", "0.3", "not", "seen"], out


@pytest.mark.parametrize(
    ("nbytes", "said"),
    [
        (4096, "4.0 KiB is below shm_min_bytes 64.0 KiB"),
        (65535, "65535 B is below shm_min_bytes 65536 B"),  # both round to 64.0 KiB: exact, or they read equal
        (5 << 20, "5.0 MiB >= 64.0 KiB"),
    ],
)
def test_the_size_rule_names_sizes_as_sizes(nbytes: int, said: str) -> None:
    d = decide(Mode.SHM, nbytes=nbytes, engine="vllm", local_ns="a:1", worker_ns="a:1", writable=True)
    assert said in d.reason


def test_watch_says_none_ended_where_no_segment_was_consumed() -> None:
    from smgshm.cli.watch_view import flight_text
    from smgshm.core.watch.figures import FlightTimes

    assert flight_text(FlightTimes(0, None, None, None, None)) == "none ended"


def test_a_gc_row_whose_name_carries_no_pid_says_so() -> None:
    """A look-alike's row says "no pid" in the PID column, never a bare "-" (--raw keeps "-": a field)."""
    import os

    from smgshm.cli import gc_view
    from smgshm.core.segments.judge import SegmentInfo, State

    seg = SegmentInfo(
        "smg-tokenspeed-probe-", "other", "regular", 0, 0, 5.0, os.getuid(), None, None, (), State.UNKNOWN, "x", 1, 1, 0
    )
    cells = gc_view._row(seg).split()
    assert cells[-3:-1] == ["no", "pid"], cells
    assert gc_view.raw_row(seg).split()[4] == "-"


def test_watch_orphans_say_sizes_as_sizes_and_an_unknown_size_as_unknown() -> None:
    """watch's orphan summary gives sizes in units, never raw bytes, and a size it never read as unknown,
    never as 0."""
    from smgshm.core.watch.figures import Orphan
    from smgshm.core.watch.orphans import orphans_cause

    def leaked(*sizes: int | None) -> str:
        orphans = [Orphan(f"smg-x{i}", "gateway", 42, False, "leaked", "", n, 60.0, 0) for i, n in enumerate(sizes)]
        cause = orphans_cause(orphans, "/dev/shm")
        assert cause is not None
        return cause.message

    assert "1 orphan(s) leaked by a dead producer (2.9 KiB)" in leaked(3000)
    assert "(size unknown)" in leaked(None)
    assert "(at least 2.9 KiB: 1 size unknown)" in leaked(3000, None)
    assert "bytes" not in leaked(3000) + leaked(None)
