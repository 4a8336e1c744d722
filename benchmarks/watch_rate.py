"""How many segments per second ``smgshm watch`` follows without losing an event.

A producer child creates segments as fast as one process can (open O_CREAT|O_EXCL,
write, close, a reader's open and close, unlink: the six inotify events of a
consumed segment) in a scratch tmpfs dir under /dev/shm (``smgshm-bench-<pid>-<uuid>``,
never ``smg-*``, so SMG's sweep and the test suite's leak guard never see it), while
this process follows it with the very WatchSession ``smgshm watch`` runs. Each round
reports the producer's rate, the segments watch followed to a ``consumed`` end, and
the queue overflows; then the same at fixed rates below the maximum, to find the
highest rate followed with no loss. Medians of ``--runs`` rounds, side by side in one
run; also the watch's CPU time per segment (independent of how busy the machine is).
watch records a sighting of each segment (watch/witness.py) as ``smgshm watch`` does, into a
store dir of the run's own ($SMGSHM_STATE_DIR), removed at the end.

    .venv/bin/python benchmarks/watch_rate.py
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from smgshm.core.watch.figures import WatchOptions
from smgshm.core.watch.session import WatchSession

PRODUCER = r"""
import os, sys, time
d, n, rate, bare = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "bare"
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
pid, payload = os.getpid(), b"\x00" * 64
flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
t0 = time.perf_counter()
for i in range(n):
    if rate and i % 64 == 0:  # pace in small steps: ahead of the schedule, wait for it
        ahead = i / rate - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)
    name = f"smg-smgshm-{pid}-{time.time_ns()}-{i}"
    fd = os.open(name, flags, 0o600, dir_fd=dfd)
    if bare:  # the least a segment can be: created, closed, unlinked (four events)
        os.close(fd)
    else:
        os.write(fd, payload)
        os.close(fd)
        os.close(os.open(name, os.O_RDONLY, dir_fd=dfd))  # the reader
    os.unlink(name, dir_fd=dfd)
print(n / (time.perf_counter() - t0), flush=True)
"""


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _timed(spent: list[float], f: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t0

    return timed


def round_(d: str, n: int, rate: float, bare: bool) -> tuple[float, int, int, float, bool, float | None]:
    """One round: (producer segments/s, segments followed to their end, overflows, watch CPU µs/segment,
    whether segments were lost without an overflow, of that the µs/segment its sightings took)."""
    opts = WatchOptions(shm_dir=d, interval_s=0.25, orphan_after_s=3600)
    with WatchSession(opts) as session:
        witness = getattr(session, "witness", None)  # none before watch recorded sightings: compare with it
        spent = [0.0]
        if witness is not None:  # what recording them costs, apart from the rest (the same calls, timed)
            witness.feed, witness.save = _timed(spent, witness.feed), _timed(spent, witness.save)
        argv = [sys.executable, "-c", PRODUCER, d, str(n), str(rate), "bare" if bare else "read"]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if p.stdout is None or p.stdin is None or p.stdout.readline().strip() != "ready":
            raise SystemExit("the producer did not start")
        c0 = cpu_s()
        p.stdin.write("go\n")
        p.stdin.flush()
        exited = False
        while True:
            st = session.step()
            if exited and st.events_read == 0:
                # The producer had exited before this step began, so every event it caused was
                # queued (inotify queues in the syscall), and the step's reads found the queue
                # empty (a step reads at least once, even when it begins late).
                break
            exited = p.poll() is not None
        used = cpu_s() - c0
        produced = float(p.stdout.readline())
        p.wait()
        s = session.summary()
    followed = s.cleaned if bare else s.consumed
    unexplained = followed != n and not s.overflows
    if unexplained:  # say what became of them: this would be a bug
        sys.stdout.write(
            f"  unexplained: consumed {s.consumed} cleaned {s.cleaned} unknown {s.unknown} untracked "
            f"{s.untracked} dir_gone {s.dir_gone} in flight {s.in_flight} created {s.created}\n"
        )
    return produced, followed, s.overflows, used / n * 1e6, unexplained, spent[0] / n * 1e6 if witness else None


# label, producer segments/s, followed, overflows, watch CPU us/segment, lossless, rounds lost without an overflow
Row = tuple[str, float, float, int, float, bool, int]


def sweep(d: str, args: argparse.Namespace, bare: bool) -> list[Row]:
    """As fast as possible, then each paced rate below that: one row per rate, medians of --runs rounds."""
    rows: list[Row] = []
    pattern = "bare" if bare else "consumed"
    max_rate = None
    for rate in [0.0] + [float(r) for r in args.rates.split(",") if r]:
        if max_rate is not None and rate >= max_rate:
            continue  # the producer cannot go that fast here
        runs = [round_(d, args.segments, rate, bare) for _ in range(args.runs)]
        produced = statistics.median(r[0] for r in runs)
        followed = statistics.median(r[1] for r in runs)
        overflows = max(r[2] for r in runs)
        cpu = statistics.median(r[3] for r in runs)
        sights = [r[5] for r in runs if r[5] is not None]
        of_which = f" (sightings {statistics.median(sights):.1f})" if sights else ""
        lossless = all(r[1] == args.segments and r[2] == 0 for r in runs)
        unexplained = sum(r[4] for r in runs)  # judged per round: another round's overflow explains nothing
        if rate == 0:
            max_rate = produced
        label = f"{pattern:<8} " + ("max" if rate == 0 else f"{rate:,.0f}/s")
        rows.append((label, produced, followed, overflows, cpu, lossless, unexplained))
        verdict = "no loss" if lossless else "LOSS" + (f" ({unexplained} without an overflow)" if unexplained else "")
        sys.stdout.write(
            f"{label:<17} producer {produced:>6,.0f}/s  followed {followed:>6,.0f}/{args.segments:,}"
            f"  overflows {overflows:>2}  {cpu:4.1f} us/seg{of_which}  {verdict}\n"
        )
        sys.stdout.flush()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=30_000, help="segments per round (default 30000)")
    ap.add_argument("--runs", type=int, default=3, help="rounds per rate; medians are reported (default 3)")
    ap.add_argument("--rates", default="20000,10000,5000", help="fixed rates to try below the maximum")
    ap.add_argument("--parent", default="/dev/shm", help="tmpfs to create the scratch dir in")  # noqa: S108
    args = ap.parse_args()
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        queue = int(f.read())
    d = os.path.join(args.parent, f"smgshm-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(d, 0o700)
    state = tempfile.mkdtemp(prefix="smgshm-bench-state-")  # the sightings' store: the run's own
    os.environ["SMGSHM_STATE_DIR"] = state
    try:
        # bare: created, closed, unlinked (4 events), the fastest one process makes segments;
        # consumed: also written and opened and closed by a reader first (6 events), as SMG's traffic is.
        bare, consumed = sweep(d, args, True), sweep(d, args, False)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    rows = bare + consumed
    tail = [f"inotify queue (fs.inotify.max_queued_events) {queue} events = {queue // 6} consumed segments of backlog"]
    for name, part in (("bare", bare), ("consumed", consumed)):
        best = max((r[1] for r in part if r[5]), default=0.0)
        cpu = statistics.median(r[4] for r in part)
        tail.append(
            f"{name}: highest rate followed with no event lost {best:,.0f} segments/s "
            f"(goal 10,000: {'met' if best >= 10_000 else 'NOT met'}); watch CPU {cpu:.1f} us/segment, "
            f"so one free core follows about {1e6 / cpu:,.0f}/s"
        )
    unexplained = sum(r[6] for r in rows)
    tail.append(
        "every loss above was reported as an overflow"
        if not unexplained
        else f"A LOSS WITHOUT AN OVERFLOW WAS SEEN in {unexplained} round(s)"
    )
    sys.stdout.write("\n".join(tail) + "\n")


if __name__ == "__main__":
    main()
