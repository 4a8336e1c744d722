"""The gc core directly: name parsing, the one-entry judgement, and what it shares with the scan.

Scratch dirs are per-test tmp dirs (never ``/dev/shm`` itself), and every judgement here passes
``assume_dead`` so that another process's pid namespace on this shared machine cannot turn a
verdict into "unknown"; the trust decision has its own tests (test_cli_gc.py, test_gc_trust.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from smgshm.core.names import parse_name
from smgshm.core.segments.judge import ScanOptions, State, Tally, _start_time
from smgshm.core.segments.scan import Scan, judge_entry, scan_segments
from tests.conftest import Children, make_file
from tests.support.cli_gc import HOLDER, dead_pid, first_line, kill_and_reap, seg_name


def test_the_scan_parses_names_as_parse_name_does(tmp_path: Path) -> None:
    # Judge.each parses inline (a call per entry costs a listing of a million); it must agree.
    names = [
        "smg-tokenspeed-\u0661\u0662\u0663-1-0",
        "smg-tokenspeed-123-1-0\n",
        "smg-tokenspeed-\uff11\uff12-1-0",
        "smg-tokenspeed-probe-12\n",
        "smg-smgshm-12-3-4x",
        "smg-tokenspeed-12-3",
        "smg-tokenspeed--1-2-3",
        "smg-tokenspeed-123-1700000000000000000-7",
        "smg-tokenspeed-probe-42",
        "smg-smgshm-9-5-0",
        "smg-smgshm-probe-9-5",
        f"smg-tokenspeed-{2**32}-1-0",
        "smg-smgshm-gc-1-abc",
        "smg-other",
    ]
    for name in names:
        make_file(str(tmp_path), name, age_s=3600)
    scanned = {s.name: s for s in scan_segments(ScanOptions(shm_dir=str(tmp_path), assume_dead=True)).segments}
    assert sorted(scanned) == sorted(names)
    for name in names:
        kind, pid, _ = parse_name(name)
        assert (scanned[name].kind, scanned[name].producer_pid) == (kind, pid), name
    assert scanned[f"smg-tokenspeed-{2**32}-1-0"].state is State.UNKNOWN, "beyond u32 is no pid: never judged dead"
    assert scanned["smg-tokenspeed-123-1700000000000000000-7"].kind == "gateway"


def test_start_times_are_psutils_even_with_a_parenthesis_in_the_name(children: Children, tmp_path: Path) -> None:
    # leaks reads /proc/P/stat itself (psutil's import cost a tenth of gc's start-up); the same figure,
    # on the boot clock (psutil adds /proc/stat's btime to it).
    odd = tmp_path / "a) 1 2 (b"  # its comm holds ")" and spaces: field 2 is not split on them
    odd.symlink_to(sys.executable)
    child = children.spawn([str(odd), "-c", "import time; print('up', flush=True); time.sleep(60)"])
    assert child.stdout is not None
    assert child.stdout.readline() == "up\n"
    for pid in (os.getpid(), child.pid):
        assert _start_time(pid) == pytest.approx(psutil.Process(pid).create_time() - psutil.boot_time(), abs=0.02), pid
    assert psutil.Process(child.pid).name().startswith("a) 1 2 (b")
    assert _start_time(dead_pid(children)) is None, "no process has it"


def test_a_name_with_unicode_digits_is_never_judged_by_a_pid(children: Children, tmp_path: Path) -> None:
    name = "smg-tokenspeed-\u0661\u0662\u0663-1-0"
    make_file(str(tmp_path), name, age_s=3600)
    seg = judge_entry(str(tmp_path), name, ScanOptions(assume_dead=True))
    assert seg is not None
    assert seg.kind == "other"
    assert seg.producer_pid is None
    assert seg.state is State.UNKNOWN


def test_judge_entry_is_the_scans_judgement(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    opts = ScanOptions(shm_dir=d, assume_dead=True)
    leaked = seg_name(dead_pid(children), seq=1)
    held = seg_name(dead_pid(children), seq=2)
    make_file(d, leaked)
    holder, _ = first_line(children, [sys.executable, "-c", HOLDER, make_file(d, held), "fd"])
    fifo = seg_name(dead_pid(children), seq=3)
    os.mkfifo(os.path.join(d, fifo), 0o600)
    try:
        scanned = {s.name: s for s in scan_segments(opts).segments}
        for name, state in ((leaked, State.LEAKED), (held, State.HELD), (fifo, State.HAZARD)):
            one = judge_entry(d, name, opts)
            assert one is not None
            assert one.state is state, (name, one.reason)
            assert (one.state, one.reason, one.ino, one.kind) == (
                scanned[name].state,
                scanned[name].reason,
                scanned[name].ino,
                scanned[name].kind,
            )
        assert holder.pid in {h.pid for h in judge_entry(d, held, opts).holders}  # type: ignore[union-attr]
        assert judge_entry(d, seg_name(dead_pid(children), seq=4), opts) is None, "a missing entry is None"
    finally:
        kill_and_reap(holder)
    assert holder.returncode == -signal.SIGKILL
    assert sorted(os.listdir(d)) == sorted([leaked, held, fifo]), "judging touches nothing"


def test_the_scans_inline_tally_is_tally_add(children: Children, tmp_path: Path) -> None:
    """Judge.each tallies inline (speed); it must count exactly as Tally.add does."""
    d = str(tmp_path)
    live = os.getpid()
    make_file(d, seg_name(dead_pid(children), seq=1), 8192)  # leaked
    linked = make_file(d, seg_name(dead_pid(children), seq=2), 4096)  # leaked, but another link: frees nothing
    os.link(linked, os.path.join(d, "elsewhere"))
    make_file(d, f"smg-tokenspeed-{live}-{time.time_ns()}-3", 4096)  # in flight
    make_file(d, "smg-no-pid-here", 4096)  # unknown
    os.mkfifo(os.path.join(d, seg_name(dead_pid(children), seq=4)), 0o600)  # hazard
    scan = Scan(ScanOptions(shm_dir=d, assume_dead=True))
    by_add = Tally()
    for seg in scan:
        by_add.add(seg)
    got = scan.tally
    assert got.total == by_add.total == 5
    assert (got.counts, got.bytes_by_state, got.counts_by_kind, got.bytes_by_kind, got.reclaimable_bytes) == (
        by_add.counts,
        by_add.bytes_by_state,
        by_add.counts_by_kind,
        by_add.bytes_by_kind,
        by_add.reclaimable_bytes,
    )
    assert got.counts["leaked"] == 2
    assert got.reclaimable_bytes == 8192, "the linked one frees nothing"
