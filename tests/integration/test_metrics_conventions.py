"""Every exposition smgshm writes, judged by real ``promtool check metrics`` and by the same rules here.

``exposition_problems`` is the judge: promtool where it is installed, and always this module's own
rule checker (Prometheus's conventions as promtool lints them, and the project's: no gauge that
repeats a rate, ratios end in ``_ratio``, units last), so a machine without promtool still checks
them. Judged: ``watch --serve-metrics`` at its first scrape, idle after an interval, and under
real traffic (segments written and read in a private tmpfs, a loopback gateway ``/metrics``
beside it); gc's textfile after a real ``--delete`` and after a failed run. README's metrics
tables are checked against the catalogues (``export.METRICS``, ``textfile.METRICS``, the node's
``metrics.METRICS``), and the expositions against them (the node's in test_node_exporter.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.names import KINDS
from smgshm.core.segments import textfile
from smgshm.core.segments.judge import State, Tally
from smgshm.core.segments.reaping import KEPT_REASONS, ReapReport
from smgshm.core.segments.scan import Deletion
from smgshm.core.watch import export
from smgshm.core.watch.life import ENDS
from tests.conftest import Children, LoopbackHttp, make_file, run_cli, smgshm_argv, wait_for
from tests.support.cli_gc import dead_pid, seg_name
from tests.support.metrics_conventions import (
    PROMTOOL,
    Catalogue,
    _agrees,
    _node_catalogue,
    _values,
    exposition_problems,
    promtool_problems,
    rule_problems,
)

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

# -- the judge -------------------------------------------------------------------------------


# A clean exposition, then one broken way per case (the rule it breaks, promtool's verdict).
CLEAN = """# HELP x_things_total Things.
# TYPE x_things_total counter
x_things_total{kind="a"} 0.0
# HELP x_wait_seconds Waits.
# TYPE x_wait_seconds summary
x_wait_seconds{quantile="0.5"} NaN
x_wait_seconds_count 0.0
x_wait_seconds_sum 0.0
"""
PLANTED = [
    ('# HELP x_q_seconds q\n# TYPE x_q_seconds gauge\nx_q_seconds{quantile="0.5"} 1\n', "quantile", True),
    ("# HELP x_things t\n# TYPE x_things counter\nx_things 1\n", "_total", True),
    ("# TYPE x_things_total counter\nx_things_total 1\n", "no HELP", True),
    ("# HELP x_wait_milliseconds w\n# TYPE x_wait_milliseconds gauge\nx_wait_milliseconds 1\n", "non-base", True),
    ("# HELP x_made_per_second m\n# TYPE x_made_per_second gauge\nx_made_per_second 1\n", "rate", False),
    ("# HELP x_shm_byte_share s\n# TYPE x_shm_byte_share gauge\nx_shm_byte_share 1\n", "_ratio", False),
    ("# HELP x_bytes_ended_total b\n# TYPE x_bytes_ended_total counter\nx_bytes_ended_total 1\n", "unit", False),
    ('# HELP x_n n\n# TYPE x_n gauge\nx_n{a="1"} 1\nx_n{b="1"} 1\n', "different label names", False),
]


def test_the_judge_passes_a_clean_exposition() -> None:
    assert exposition_problems(CLEAN) == []


@pytest.mark.parametrize(("text", "rule", "promtool_too"), PLANTED)
def test_the_judge_sees_a_planted_violation(text: str, rule: str, promtool_too: bool) -> None:
    assert any(rule in p for p in rule_problems(text)), rule_problems(text)
    if promtool_too and PROMTOOL is not None:
        assert promtool_problems(text), f"promtool let {rule} through"


# -- the README's tables -----------------------------------------------------------------------


def _watch_catalogue() -> Catalogue:
    return {export.PREFIX + n: (t, ("shm_dir", *ls), w) for n, (t, ls, w, _) in export.METRICS.items()}


def _gc_catalogue() -> Catalogue:
    return {f"smgshm_gc_{n}": (t, ("shm_dir", *ls), w) for n, (t, ls, w, _) in textfile.METRICS.items()}


def _readme_rows(prefix: str) -> Catalogue:
    rows: Catalogue = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| `{prefix}"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            name, typ, labels, when = cells[0].strip("`"), cells[1], cells[2], cells[3]
            assert name not in rows, f"README lists {name} twice"
            names = () if labels in ("", "-") else tuple(x.strip().strip("`") for x in labels.split(","))
            rows[name] = (typ, names, when)
    return rows


@pytest.mark.parametrize(
    ("prefix", "catalogue"),
    [("smgshm_watch_", _watch_catalogue), ("smgshm_gc_", _gc_catalogue), ("smgshm_node_", _node_catalogue)],
)
def test_the_readme_tables_list_the_catalogue(prefix: str, catalogue: Any) -> None:
    assert _readme_rows(prefix) == catalogue()


def _when(catalogue: Catalogue, *whens: str) -> set[str]:
    return {n for n, (_, _, w) in catalogue.items() if w in whens}


# -- watch ---------------------------------------------------------------------------------------


class WatchChild:
    """``watch --jsonl --serve-metrics`` as a child, its records read by a thread (a busy run
    writes a record per segment: unread, the pipe would fill and stop it)."""

    def __init__(self, children: Children, *args: str) -> None:
        self.p = children.spawn(smgshm_argv("watch", "--jsonl", "--serve-metrics", "127.0.0.1:0", *args))
        self.records: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        exporter = wait_for(
            lambda: next((r for r in list(self.records) if r["type"] == "exporter"), None), 60, "watch's exporter"
        )
        self.url: str = exporter["url"]

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.records.append(json.loads(line))

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as r:  # noqa: S310 - our own loopback exporter
            text: str = r.read().decode("utf-8")
        return text

    def intervals(self) -> int:
        return sum(1 for r in list(self.records) if r["type"] == "interval")


@pytest.mark.slow
def test_watch_first_scrape_has_every_labelled_counter_at_0_and_idle_passes(tmpfs: str, children: Children) -> None:
    w = WatchChild(children, "--shm-dir", tmpfs, "--interval", "1")
    first = w.scrape()
    assert exposition_problems(first) == []
    cat = _watch_catalogue()
    exposed = _agrees(first, cat)
    assert _when(cat, export.ALWAYS) <= exposed <= _when(cat, export.ALWAYS, export.AFTER_INTERVAL)
    # Every labelled counter, every label value, at 0: rate() and increase() see the first burst.
    for name in ("smgshm_watch_segments_created_total", "smgshm_watch_created_bytes_total"):
        assert _values(first, name) == {frozenset({("kind", k)}): 0.0 for k in KINDS}, name
    for name in ("smgshm_watch_segments_ended_total", "smgshm_watch_ended_bytes_total"):
        want = {frozenset({("kind", k), ("end", e)}): 0.0 for k in KINDS for e in ENDS}
        assert _values(first, name) == want, name
    quantiles = _values(first, "smgshm_watch_interval_time_in_flight_seconds")
    assert set(quantiles) == {frozenset({("quantile", q)}) for q in export.QUANTILES}
    assert all(math.isnan(v) for v in quantiles.values()), "no interval yet: no quantile"
    # Idle, after intervals: the gauges are there too, the quantiles still NaN (none ended).
    wait_for(lambda: w.intervals() >= 2, 60, "two idle intervals")
    idle = w.scrape()
    assert exposition_problems(idle) == []
    assert _agrees(idle, cat) == _when(cat, export.ALWAYS, export.AFTER_INTERVAL)
    assert all(math.isnan(v) for v in _values(idle, "smgshm_watch_interval_time_in_flight_seconds").values())


# Writes N segments that a reader (this process, reopening each by name) consumes, then M it unlinks
# itself, a short pause in each so that watch reads the sizes; then says "done".
TRAFFIC = r"""
import os, sys, time
from smgshm.core.segments.io import read_segment, write_segment
d, consumed, cleaned = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pid = os.getpid()
for i in range(consumed + cleaned):
    ref = write_segment(b"\x07" * 50_000, shm_dir=d, name=f"smg-smgshm-{pid}-{time.time_ns()}-{i}")
    time.sleep(0.02)
    if i < consumed:
        read_segment(ref.name, 0, ref.nbytes, shm_dir=d).release()
    else:
        os.unlink(ref.path)
print("done", flush=True)
"""


def _gateway_metrics() -> Iterator[bytes]:
    """A gateway's /metrics whose counters grow at each scrape: SHM and inline tensors."""
    n = 0
    while True:
        n += 1
        yield (
            "# TYPE smg_mm_tensors_total counter\n"
            f'smg_mm_tensors_total{{runtime="vllm",path="shm"}} {3 * n}\n'
            f'smg_mm_tensors_total{{runtime="vllm",path="inline"}} {n}\n'
            "# TYPE smg_mm_tensor_bytes_total counter\n"
            f'smg_mm_tensor_bytes_total{{runtime="vllm",path="shm"}} {3_000_000 * n}\n'
            f'smg_mm_tensor_bytes_total{{runtime="vllm",path="inline"}} {1000 * n}\n'
        ).encode()


@pytest.mark.slow
def test_watch_under_traffic_passes_and_agrees_with_the_catalogue(tmpfs: str, children: Children) -> None:
    pages = _gateway_metrics()
    lock = threading.Lock()

    def answer(_path: str) -> bytes:
        with lock:
            return next(pages)

    with LoopbackHttp(answer) as gw:
        w = WatchChild(children, "--shm-dir", tmpfs, "--interval", "0.25", "--metrics", f"{gw.base}/metrics")
        before = w.scrape()
        prod = children.spawn([PY, "-c", TRAFFIC, tmpfs, "150", "20"])
        cat = _watch_catalogue()
        judged: list[str] = []

        # Scrape while the traffic flows, judging every scrape, until one was taken while the last
        # interval carried consumed segments (the state promtool once rejected) with every family.
        def busy_scrape() -> str | None:
            text = w.scrape()
            judged.append(text)
            assert exposition_problems(text) == [], text
            q = _values(text, "smgshm_watch_interval_time_in_flight_seconds") if "interval_time" in text else {}
            full = _agrees(text, cat) == set(cat)
            return text if full and q and not any(math.isnan(v) for v in q.values()) else None

        busy = wait_for(busy_scrape, 120, "a scrape with the last interval's quantiles and every family")
        assert prod.stdout is not None
        assert prod.stdout.readline().strip() == "done", prod.stderr.read() if prod.stderr else ""
        assert prod.wait(timeout=30) == 0
        # Every life ended and counted: then the last scrape is checked too.
        final = wait_for(
            lambda: (lambda t: t if sum(_values(t, "smgshm_watch_segments_ended_total").values()) >= 170 else None)(
                w.scrape()
            ),
            60,
            "170 ended segments",
        )
    assert exposition_problems(final) == []
    q = _values(busy, "smgshm_watch_interval_time_in_flight_seconds")
    assert 0 < q[frozenset({("quantile", "0.5")})] <= q[frozenset({("quantile", "1")})]
    ended = _values(final, "smgshm_watch_segments_ended_total")
    assert ended[frozenset({("kind", "smgshm"), ("end", "consumed")})] == 150
    assert ended[frozenset({("kind", "smgshm"), ("end", "cleaned")})] == 20
    assert (
        _values(before, "smgshm_watch_segments_ended_total")[frozenset({("kind", "smgshm"), ("end", "consumed")})] == 0
    )
    ended_bytes = _values(final, "smgshm_watch_ended_bytes_total")
    assert 0 < ended_bytes[frozenset({("kind", "smgshm"), ("end", "consumed")})] <= 150 * 50_000
    counts = _values(final, "smgshm_watch_interval_time_in_flight_seconds_count")
    assert counts == {frozenset(): 150.0}, "the summary's _count is the run's consumed segments"
    ratio = _values(final, "smgshm_watch_gateway_shm_byte_ratio")[frozenset()]
    assert ratio == pytest.approx(3_000_000 / 3_001_000)
    assert len(judged) >= 1


# -- gc's textfile -------------------------------------------------------------------------------


def test_gc_textfile_after_a_real_delete(children: Children, tmp_path: Path) -> None:
    d = tmp_path / "shm"
    d.mkdir()
    pid, old = dead_pid(children), time.time_ns() - 7200 * 10**9
    for i in range(2):  # leaked and old: reclaimed
        make_file(str(d), seg_name(pid, nanos=old, seq=i), size=8192, age_s=7200)
    make_file(str(d), seg_name(pid, seq=5), size=4096)  # leaked but young: kept, too_young
    root = os.geteuid() == 0
    if root:  # another user's, and gc runs as root without --all-users: kept, other_user
        os.chown(make_file(str(d), seg_name(pid, nanos=old, seq=6), size=4096, age_s=7200), 65534, 65534)
    prom = tmp_path / "gc.prom"
    t0 = time.time()
    doc = run_cli(
        "--json",
        "gc",
        "--shm-dir",
        str(d),
        "--assume-dead",
        "--delete",
        "--min-age",
        "10m",
        "--yes",
        "--prometheus",
        str(prom),
    ).json
    t1 = time.time()
    assert sum(x["deleted"] for x in doc["result"]["deleted"]) == 2
    text = prom.read_text(encoding="utf-8")
    assert exposition_problems(text) == []
    cat = _gc_catalogue()
    assert _agrees(text, cat) == set(cat)
    one = lambda name: _values(text, name)[frozenset()]  # noqa: E731
    assert t0 <= one("smgshm_gc_last_run_timestamp_seconds") <= t1
    assert 0 <= one("smgshm_gc_last_run_duration_seconds") <= t1 - t0
    assert one("smgshm_gc_last_run_success") == 1
    states = [s.value for s in State]
    reclaimed = _values(text, "smgshm_gc_reclaimed_segments")
    assert reclaimed == {frozenset({("state", s)}): (2.0 if s == "leaked" else 0.0) for s in states}
    assert _values(text, "smgshm_gc_reclaimed_bytes")[frozenset({("state", "leaked")})] >= 2 * 8192
    assert one("smgshm_gc_freed_bytes") >= 2 * 8192
    kept = _values(text, "smgshm_gc_kept_segments")
    want = {"too_young": 1.0, "other_user": 1.0 if root else 0.0}
    assert kept == {frozenset({("reason", r)}): want.get(r, 0.0) for r in KEPT_REASONS}
    assert _values(text, "smgshm_gc_segments")[frozenset({("state", "leaked")})] == 2
    assert one("smgshm_gc_shm_free_bytes") > 0


def test_a_failed_gc_run_says_so_with_its_time_and_no_figures(tmp_path: Path) -> None:
    prom = tmp_path / "gc.prom"
    t0 = time.time()
    res = run_cli("gc", "--shm-dir", str(tmp_path / "no-such-dir"), "--prometheus", str(prom), exit=5)
    assert "shm dir does not exist" in res.stderr
    text = prom.read_text(encoding="utf-8")
    assert exposition_problems(text) == []
    cat = _gc_catalogue()
    assert _agrees(text, cat) == _when(cat, textfile.ALWAYS), "no figures: zeros would lie"
    assert _values(text, "smgshm_gc_last_run_success")[frozenset()] == 0
    assert _values(text, "smgshm_gc_last_run_timestamp_seconds")[frozenset()] >= t0


def test_a_segment_that_could_not_be_set_aside_is_a_failed_run() -> None:
    # The one kept reason that is a failure to do what was asked (a rename refused, say EPERM);
    # the others are gc's checks keeping their promise.
    report = ReapReport(
        [Deletion("smg-x", 4096, False, "cannot set it aside atomically: EPERM", 1, kept="set_aside_failed")],
        Tally(),
        Tally(),
        0,
        1 << 20,
        set(),
    )
    text = textfile.textfile_text(textfile.RunRecord("gc", "/dev/shm", 1.0, 2.0, report)).decode()
    assert exposition_problems(text) == []
    assert _values(text, "smgshm_gc_last_run_success")[frozenset()] == 0
    assert _values(text, "smgshm_gc_kept_segments")[frozenset({("reason", "set_aside_failed")})] == 1
    assert _values(text, "smgshm_gc_last_run_duration_seconds")[frozenset()] == 1.0
    kept_by_a_check = ReapReport(
        [Deletion("smg-x", 4096, False, "opened or mapped since the scan", 1, kept="opened_since_scan")],
        Tally(),
        Tally(),
        0,
        1 << 20,
        set(),
    )
    text = textfile.textfile_text(textfile.RunRecord("gc", "/dev/shm", 1.0, 2.0, kept_by_a_check)).decode()
    assert _values(text, "smgshm_gc_last_run_success")[frozenset()] == 1
