"""How fast ``smgshm gc`` lists and judges a crowded shm dir.

Creates ``--entries`` small ``smg-tokenspeed-<dead pid>-<nanos>-<i>`` files in a
scratch tmpfs dir under /dev/shm (named ``smgshm-bench-<pid>-<uuid>``, never
``smg-*``, so neither SMG's sweep nor the test suite's leak guard sees it), times
``scan_segments`` over it ``--runs`` times and prints the median and entries/s.
The dir is removed at the end, whatever happens.

    .venv/bin/python benchmarks/gc_scan.py --entries 100000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

from smgshm.core.leaks import ScanOptions, State, scan_segments


def dead_pid() -> int:
    """A pid no process has: a child that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def populate(d: str, n: int, pid: int, size: int) -> None:
    payload = b"\0" * size
    nanos = time.time_ns()
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            fd = os.open(f"smg-tokenspeed-{pid}-{nanos + i}-{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600,
                         dir_fd=dfd)  # fmt: skip
            try:
                if payload:
                    os.write(fd, payload)
            finally:
                os.close(fd)
    finally:
        os.close(dfd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000, help="segments to create (default 100000)")
    ap.add_argument("--runs", type=int, default=3, help="timed scans; the median is reported (default 3)")
    ap.add_argument("--size", type=int, default=64, help="bytes per segment (default 64)")
    ap.add_argument("--parent", default="/dev/shm", help="tmpfs to create the scratch dir in")  # noqa: S108
    args = ap.parse_args()

    d = os.path.join(args.parent, f"smgshm-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(d, 0o700)
    try:
        pid = dead_pid()
        t0 = time.perf_counter()
        populate(d, args.entries, pid, args.size)
        made = time.perf_counter() - t0
        print(f"created {args.entries} entries of {args.size} B in {d} in {made:.2f} s")  # noqa: T201
        opts = ScanOptions(shm_dir=d)
        times: list[float] = []
        for run in range(args.runs):
            t0 = time.perf_counter()
            report = scan_segments(opts)
            times.append(time.perf_counter() - t0)
            leaked = report.counts[State.LEAKED.value]
            if len(report.segments) != args.entries:
                raise SystemExit(f"scan {run} listed {len(report.segments)} of {args.entries} entries")
            print(  # noqa: T201
                f"run {run + 1}: {times[-1]:.3f} s ({len(report.segments)} segments, {leaked} leaked, "
                f"liveness_trusted={report.liveness_trusted}, scan_ms={report.scan_ms:.0f})"
            )
        med = statistics.median(times)
        print(f"median scan_segments over {args.runs} runs: {med:.3f} s, {args.entries / med:,.0f} entries/s")  # noqa: T201
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
