"""``smgshm watch`` run as a real child against a private tmpfs, with real producers and readers.

A private tmpfs per test: other helpers' traffic in /dev/shm cannot disturb the counts.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from smgshm.core.gateway.metrics import scrape
from tests.conftest import Children, LoopbackHttp, closed_port, make_file, run_cli, smgshm_argv, wait_for
from tests.support.cli_gc import dead_pid
from tests.support.cli_watch import drain, spawn_watch
from tests.support.json_schema import WATCH_SEGMENT_KEYS

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = pytest.mark.trust

PY = sys.executable

# A producer child: N segments a reader consumes (smgshm's reader), M it cleans up
# itself, and with "keep" one it leaves in place until its stdin closes. A pause
# between write and read stands for the RPC, so that the watch can read the size
# (inotify carries none: watch stats the file at close-after-write, when it still exists).
# A loaded watch may read every close after the unlink, so the first consumed one waits
# ("written", then a line on stdin) until the test has seen the watch count its bytes.
PRODUCER = r"""
import os, sys, time
from smgshm.core.segments.io import read_segment, write_segment
d, consumed, cleaned, keep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "keep"
pid, seq = os.getpid(), 0
def name():
    global seq
    seq += 1
    return f"smg-smgshm-{pid}-{time.time_ns()}-{seq}"
for i in range(consumed):
    ref = write_segment(b"\x07" * 100_000, shm_dir=d, name=name())
    if i == 0:
        print("written", flush=True)
        sys.stdin.readline()
    time.sleep(0.05)
    read_segment(ref.name, 0, ref.nbytes, shm_dir=d).release()
for _ in range(cleaned):
    ref = write_segment(b"\x08" * 2048, shm_dir=d, name=name())
    time.sleep(0.05)
    os.unlink(ref.path)
kept = write_segment(b"\x09" * 4096, shm_dir=d, name=name()) if keep else None
print("done", flush=True)
if kept:
    sys.stdin.read()
    os.unlink(kept.path)
"""


def records(p: subprocess.Popen[str], timeout: float = 60) -> tuple[list[dict[str, Any]], str]:
    out, err = drain(p, timeout)
    try:
        return [json.loads(line) for line in out.splitlines()], err
    except json.JSONDecodeError as e:
        raise AssertionError(f"not JSON lines: {out[-3000:]!r}\nstderr: {err[-3000:]}") from e


def read_records_until(w: subprocess.Popen[str], recs: list[dict[str, Any]], pred: Any, timeout: float = 60) -> None:
    """Append ``--jsonl`` records of ``w`` to ``recs`` until ``pred(recs)`` holds (an interval
    comes every --interval, so a read never blocks for long)."""
    deadline = time.monotonic() + timeout
    while not pred(recs):
        assert time.monotonic() < deadline, f"watch saw only: {recs[-20:]}"
        line = w.stdout.readline()  # type: ignore[union-attr]
        assert line, f"watch ended: {w.stderr.read() if w.stderr else ''}"
        recs.append(json.loads(line))


Watched = tuple[subprocess.Popen[str], list[dict[str, Any]]]  # a watch child and the records read from it


def produce(
    children: Children, d: str, consumed: int, cleaned: int, keep: bool = False, watch: Watched | None = None
) -> subprocess.Popen[str]:
    """The producer, returned once it is done (but for a kept segment). Given ``watch`` (its
    child and a list its records go to), the first consumed segment is read only after an
    interval shows its bytes in flight: then at least one consumed size is known."""
    p = children.spawn(
        [PY, "-c", PRODUCER, d, str(consumed), str(cleaned), "keep" if keep else "no"], stdin=subprocess.PIPE
    )
    assert p.stdout is not None
    assert p.stdin is not None
    if consumed:
        assert p.stdout.readline().strip() == "written", p.stderr.read() if p.stderr else ""
        if watch is not None:
            w, recs = watch
            counted = lambda rs: bool(rs) and rs[-1]["type"] == "interval" and rs[-1]["in_flight_bytes"] >= 100_000  # noqa: E731
            read_records_until(w, recs, counted)
        p.stdin.write("go\n")
        p.stdin.flush()
    assert p.stdout.readline().strip() == "done", p.stderr.read() if p.stderr else ""
    return p


@pytest.mark.slow
def test_consumed_cleaned_and_orphans_with_their_producers(tmpfs: str, children: Children) -> None:
    dead = dead_pid(children)
    make_file(tmpfs, f"smg-tokenspeed-{dead}-{time.time_ns()}-0", 8192)  # a dead gateway's leftover
    w, recs = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.25", "--orphan-after", "1s", "--check")
    prod = produce(children, tmpfs, consumed=5, cleaned=3, keep=True, watch=(w, recs))
    # No --duration: a loaded machine can start the producer late enough that a fixed run ends
    # before its eight segments end or its kept one is a second old. Read until both orphans are
    # judged and the eight have ended, then to the end of that interval, and stop it as Ctrl-C does.

    def seen(rs: list[dict[str, Any]]) -> bool:
        ended = [r for r in rs if r["type"] == "segment" and r["producer_pid"] == prod.pid]
        judged = {r["producer_pid"] for r in rs if r["type"] == "orphan"}
        return len(ended) >= 8 and {dead, prod.pid} <= judged and rs[-1]["type"] == "interval"

    read_records_until(w, recs, seen)
    os.kill(w.pid, signal.SIGINT)
    rest, err = records(w)
    recs += rest
    assert w.returncode == 3, err  # --check: orphans were seen
    prod.stdin.close()  # type: ignore[union-attr]
    prod.wait(timeout=30)
    segs = [r for r in recs if r["type"] == "segment"]
    ends = sorted((r["end"], r["reads"]) for r in segs)
    assert ends == [("cleaned", 0)] * 3 + [("consumed", 1)] * 5
    # A size is exact where known (a slow watch may read the close after the unlink).
    sizes = {"cleaned": 2048, "consumed": 100_000}
    assert all(r["nbytes"] in (None, sizes[r["end"]]) for r in segs)
    known = [r for r in segs if r["end"] == "consumed" and r["nbytes"] is not None]
    assert known, "no consumed size known though the first was read only once its bytes were counted"
    assert {r["producer_pid"] for r in segs} == {prod.pid}
    assert all(r["kind"] == "smgshm" and r["observed"] and r["in_flight_ns"] > 0 for r in segs)  # the name dates them
    assert all(set(r) == WATCH_SEGMENT_KEYS for r in segs)
    orphans = {r["producer_pid"]: r for r in recs if r["type"] == "orphan"}
    assert orphans[dead]["state"] == "leaked"
    assert orphans[dead]["producer_alive"] is False
    assert orphans[dead]["kind"] == "gateway"
    assert orphans[prod.pid]["producer_alive"] is True  # alive, but nobody consumes its segment
    assert orphans[prod.pid]["state"] == "in_flight"
    summary = recs[-1]
    assert summary["type"] == "summary"
    assert (summary["created"], summary["consumed"], summary["cleaned"], summary["listed"]) == (9, 5, 3, 1)
    assert summary["orphans_seen"] == 2
    assert summary["cause_info"]["code"] == "segments_leaked"  # the dead producer's orphan leads; gc frees it
    assert summary["consumed_bytes"] == 100_000 * len(known)
    assert summary["flight"]["count"] == 5
    assert summary["ends_by_kind"] == {"smgshm": {"consumed": 5, "cleaned": 3, "unknown": 0}}
    intervals = [r for r in recs if r["type"] == "interval"]
    assert sum(r["created"] for r in intervals) == 9
    assert sum(r["consumed"] for r in intervals) == 5


@pytest.mark.slow
def test_json_summary_and_check(tmpfs: str, children: Children) -> None:
    dead = dead_pid(children)
    name = f"smg-tokenspeed-{dead}-{time.time_ns()}-0"
    make_file(tmpfs, name, 100)
    res = run_cli(
        "--json",
        "watch",
        "--shm-dir",
        tmpfs,
        "--count",
        "1",
        "--interval",
        "0.2",
        "--orphan-after",
        "0s",
        "--check",
        exit=3,
    )
    doc = res.json
    assert doc["ok"] is False
    (o,) = doc["result"]["orphan_list"]
    assert (o["name"], o["state"], o["producer_pid"], o["producer_alive"]) == (name, "leaked", dead, False)
    hostile = "smg-x\x1b[31m\udcff"  # a terminal escape and an undecodable byte
    make_file(tmpfs, hostile, 1)
    doc = run_cli(
        "--json",
        "watch",
        "--shm-dir",
        tmpfs,
        "--count",
        "1",
        "--interval",
        "0.1",
        "--orphan-after",
        "0s",
        "--check",
        exit=3,
    ).json
    o = next(o for o in doc["result"]["orphan_list"] if o["kind"] == "other")
    assert o["name"] == "smg-x\\x1b[31m\\xff"
    assert bytes.fromhex(o["name_hex"]) == b"smg-x\x1b[31m\xff"
    assert o["state"] == "unknown"  # no pid in the name: gc cannot judge its producer
    os.unlink(os.path.join(tmpfs, hostile))
    # Without --check the same run passes; without orphans --check passes.
    run_cli("--json", "watch", "--shm-dir", tmpfs, "--count", "1", "--interval", "0.1", "--orphan-after", "0s")
    os.unlink(os.path.join(tmpfs, name))
    assert run_cli("--json", "watch", "--shm-dir", tmpfs, "--count", "1", "--interval", "0.1", "--check").json["ok"]


@pytest.mark.slow
def test_piped_output_is_one_line_per_interval(tmpfs: str) -> None:
    res = run_cli("watch", "--shm-dir", tmpfs, "--count", "3", "--interval", "0.1")
    interval = re.compile(r"^\d\d:\d\d:\d\d created .* time in flight .* orphans \d+$", re.M)
    assert len(interval.findall(res.stdout)) == 3
    assert "watched" in res.stdout  # then the summary of the run
    quiet = run_cli("-q", "watch", "--shm-dir", tmpfs, "--count", "2", "--interval", "0.1").stdout
    assert quiet == "", "--quiet and nothing failed: no interval line, no summary"


def test_piped_orphan_rows_never_wrap_or_cut_a_name(tmpfs: str) -> None:
    name = "smg-orphan-" + "x" * 150  # far wider than 80 columns
    make_file(tmpfs, name, 100)
    try:
        out = run_cli(
            "watch",
            "--shm-dir",
            tmpfs,
            "--count",
            "1",
            "--interval",
            "0.1",
            "--orphan-after",
            "0s",
            env={"COLUMNS": "80"},
        ).stdout
    finally:
        os.unlink(os.path.join(tmpfs, name))
    lines = out.splitlines()
    [i] = [i for i, ln in enumerate(lines) if ln.startswith("other ")]
    assert lines[i].split()[1:3] == ["100", "B"]
    assert lines[i].split()[-1] == "unknown", "the columns, with no trailing space"
    assert lines[i + 1] == f"  {name}", "a name too long for the row: on a line of its own, whole"
    assert "xxxx" not in out.replace(name, ""), "no piece of the name folded onto another line"


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["--json", "watch"], "--duration or --count"),
        (["--json", "watch", "--jsonl", "--count", "1"], "choose one"),
        (["watch", "--serve-metrics", "127.0.0.1:http", "--count", "1"], "not [HOST:]PORT"),
        (["watch", "--interval", "0", "--count", "1"], "more than 0"),
    ],
)
def test_usage_errors(args: list[str], what: str) -> None:
    assert what in run_cli(*args, exit=2).stderr


def test_missing_shm_dir_is_exit_5(tmp_path: Any) -> None:
    res = run_cli("watch", "--shm-dir", str(tmp_path / "nope"), "--count", "1", exit=5)
    assert "shm dir does not exist" in res.stderr


@pytest.mark.slow
def test_ctrl_c_and_sigterm_print_the_summary(tmpfs: str, children: Children) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        w = children.spawn(smgshm_argv("watch", "--shm-dir", tmpfs, "--interval", "0.1"))
        assert w.stdout is not None
        assert "created" in w.stdout.readline()  # an interval went by: it is running
        os.kill(w.pid, sig)
        out, err = drain(w, 30)
        assert w.returncode == 0, err
        assert re.search(r"^watched\s", out, re.M), out


@pytest.mark.slow
def test_exporter_serves_the_figures(tmpfs: str, children: Children) -> None:
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.2", "--serve-metrics", "127.0.0.1:0")
    assert w.stdout is not None
    exporter = json.loads(w.stdout.readline())
    assert exporter["type"] == "exporter"
    produce(children, tmpfs, consumed=4, cleaned=2, watch=(w, []))

    # Wait for all six to end, whatever their class: a scrape between the watch's
    # events can see the consumed ones counted and a cleaned one not yet.
    def scraped() -> Any:
        snap = scrape(exporter["url"], 5.0)
        ended = snap.value("smgshm_watch_segments_ended_total")  # summed over every end
        return snap if ended >= 6 else None

    snap = wait_for(scraped, 30, "the exporter to count 6 ended segments")
    assert snap.value("smgshm_watch_segments_ended_total", end="consumed") == 4
    assert snap.value("smgshm_watch_segments_ended_total", end="cleaned") == 2
    assert snap.value("smgshm_watch_segments_created_total", kind="smgshm") == 6
    assert snap.value("smgshm_watch_ended_bytes_total", end="consumed") in (100_000, 200_000, 300_000, 400_000)
    assert snap.value("smgshm_watch_time_in_flight_seconds_count") == 4
    assert snap.value("smgshm_watch_overflows_total") == 0
    assert snap.has("smgshm_watch_in_flight_segments")
    os.kill(w.pid, signal.SIGTERM)
    recs, _ = records(w)
    assert w.returncode == 0
    assert recs[-1]["type"] == "summary"


@pytest.mark.slow
def test_exporter_off_loopback_is_loud(tmpfs: str) -> None:
    res = run_cli("watch", "--shm-dir", tmpfs, "--count", "1", "--interval", "0.1", "--serve-metrics", "0.0.0.0:0")
    assert "NOT loopback" in res.stderr


def test_busy_exporter_port_is_exit_4(tmpfs: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_cli("watch", "--shm-dir", tmpfs, "--count", "1", "--serve-metrics", str(port), exit=4)
    assert "cannot listen" in res.stderr


@pytest.mark.slow
def test_overflow_is_said_and_counts_recover(tmpfs: str, children: Children) -> None:
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        limit = int(f.read())
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.2")
    os.kill(w.pid, signal.SIGSTOP)  # the watch falls behind: the kernel queue fills and overflows
    try:
        for i in range(limit // 4 + 200):
            p = os.path.join(tmpfs, f"smg-smgshm-flood-{i}")
            os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            os.unlink(p)
    finally:
        os.kill(w.pid, signal.SIGCONT)
    assert w.stdout is not None
    seen: list[dict[str, Any]] = []

    def read_until(pred: Any, times: int = 1) -> None:
        """Read records until ``times`` of them satisfy ``pred`` (checked once each: the flood is
        thousands of lines, and a slow reader would stall watch on a full pipe)."""
        while times:
            line = w.stdout.readline()  # type: ignore[union-attr]
            assert line, f"watch ended: {w.stderr.read() if w.stderr else ''}"
            seen.append(json.loads(line))
            times -= bool(pred(seen[-1]))

    read_until(lambda r: r["type"] == "rescanned" and r["detail"] == "overflow")
    assert [r["type"] for r in seen].count("overflow") >= 1
    produce(children, tmpfs, consumed=2, cleaned=0)  # after the overflow: followed exactly again
    read_until(lambda r: r["type"] == "segment" and r["end"] == "consumed", times=2)
    os.kill(w.pid, signal.SIGINT)
    recs, _ = records(w)
    summary = recs[-1]
    assert summary["overflows"] >= 1
    assert any("overflow" in n for n in summary["notes"])
    assert summary["consumed"] == 2
    flood = [r for r in seen + recs if r["type"] == "segment" and "flood" in r["name"]]
    # Lives wholly before the overflow were followed; one cut by it ended unknown; the rest were never seen.
    assert 0 < len(flood) < limit // 4 + 200
    assert {r["end"] for r in flood} <= {"cleaned", "unknown"}


@pytest.mark.slow
def test_tty_gets_a_live_dashboard(tmpfs: str) -> None:
    leader, follower = pty.openpty()
    argv = smgshm_argv("watch", "--shm-dir", tmpfs, "--count", "3", "--interval", "0.2")
    env = {**os.environ, "COLUMNS": "120"}
    p = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        p.wait(timeout=30)
    text = out.decode(errors="replace")
    assert p.returncode == 0, text
    assert "watching" in text  # the dashboard's first row
    assert "time in flight" in text
    assert "watched" in text  # the summary after the dashboard


def test_a_failed_first_scrape_is_said_and_survived_as_any_later_one(tmpfs: str) -> None:
    """One bad first answer (an endpoint down or trickling at start) never ends an unattended watch: it is said
    once, each interval reports its failed scrape, and the run ends as it would (it was exit 4)."""
    url = f"http://127.0.0.1:{closed_port()}/metrics"
    res = run_cli("watch", "--jsonl", "--shm-dir", tmpfs, "--count", "2", "--interval", "0.1", "--metrics", url)
    assert res.stderr.count("--metrics: the first scrape failed, watching on:") == 1, res.stderr
    intervals = [r for r in map(json.loads, res.stdout.splitlines()) if r["type"] == "interval"]
    assert len(intervals) == 2
    assert all("127.0.0.1" in r["gateway"]["error"] for r in intervals)


@pytest.mark.slow
def test_a_scrape_failing_mid_run_is_said_per_interval(tmpfs: str, children: Children) -> None:
    # A real Prometheus endpoint to scrape: another watch's exporter (no SMG counters in it).
    exporter_watch, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.2", "--serve-metrics", "0")
    assert exporter_watch.stdout is not None
    url = json.loads(exporter_watch.stdout.readline())["url"]
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.2", "--metrics", url)
    assert w.stdout is not None

    def next_interval() -> dict[str, Any]:
        while True:
            r = json.loads(w.stdout.readline())  # type: ignore[union-attr]
            if r["type"] == "interval":
                return r

    gw = next_interval()["gateway"]
    assert gw["error"] == ""
    assert gw["exported"] is False  # a Prometheus endpoint, but no smg_mm_* counters in it
    assert gw["tensors"] == {}
    os.kill(exporter_watch.pid, signal.SIGTERM)
    drain(exporter_watch)
    failed = wait_for(lambda: (lambda i: i if i["gateway"]["error"] else None)(next_interval()), 30, "a failed scrape")
    assert "127.0.0.1" in failed["gateway"]["error"]
    os.kill(w.pid, signal.SIGINT)
    out, err = drain(w)
    assert w.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["type"] == "summary"


@pytest.mark.slow
def test_metrics_showing_shm_write_failures_name_the_cause_and_the_fix(tmp_path: Any) -> None:
    scrapes = [0]

    def metrics(_path: str) -> bytes:
        n = scrapes[0] = scrapes[0] + 1  # every scrape: 2 more tensors inline, 2 more failed SHM writes
        return (
            "# TYPE smg_mm_tensors_total counter\n"
            f'smg_mm_tensors_total{{runtime="vllm",path="inline"}} {2 * n}\n'
            "# TYPE smg_mm_tensor_bytes_total counter\n"
            f'smg_mm_tensor_bytes_total{{runtime="vllm",path="inline"}} {400_000 * n}\n'
            "# TYPE smg_mm_shm_write_failures_total counter\n"
            f'smg_mm_shm_write_failures_total{{runtime="vllm"}} {2 * n}\n'
        ).encode()

    with LoopbackHttp(metrics) as srv:
        url = f"{srv.base}/metrics"
        args = ("watch", "--shm-dir", str(tmp_path), "--metrics", url, "--interval", "0.2", "--count", "2")
        doc = run_cli("--json", *args).json
        cause = doc["result"]["gateway"]["cause_info"]
        # The gateway is on this host, so its shm dir was read: a roomy, writable dir leaves the general cause.
        assert cause["code"] == "shm_writes_failing"
        assert cause["fix_cmd"] == ["smgshm", "doctor", "--shm-dir", str(tmp_path)]
        assert "SHM write(s) failed" in cause["message"]
        out = run_cli(*args).stdout
        assert "  fix: read the gateway's log for the write error" in out
        assert f"smgshm doctor --shm-dir {tmp_path}" in out
        recs = [json.loads(ln) for ln in run_cli("watch", "--jsonl", *args[1:]).stdout.splitlines()]
        intervals = [r for r in recs if r["type"] == "interval"]
        assert intervals
        assert all(r["gateway"]["cause_info"]["code"] == "shm_writes_failing" for r in intervals)
