"""How fast ``smgshm gc`` lists a crowded shm dir, through the CLI, beside ``find -printf`` in the same run.

For each ``--entries`` count it creates that many empty ``smg-tokenspeed-<dead pid>-<nanos>-<i>``
files in a scratch dir under /dev/shm (``smgshm-bench-<pid>-<uuid>``, never ``smg-*``, so neither
SMG's sweep nor the test suite's leak guard sees it), then runs, in alternation and ``--runs``
times each, as child processes with stdout to /dev/null:

    find DIR -maxdepth 1 -name 'smg-*' -printf '%f %s %T@ %U %i %n\\n'     (the floor)
    smgshm gc --shm-dir DIR --assume-dead              (the summary people see)
    smgshm gc --shm-dir DIR --assume-dead --all        (every row)
    smgshm gc --shm-dir DIR --assume-dead --raw        (every row, for scripts)
    smgshm --json gc --shm-dir DIR --assume-dead       (one streamed document)
    smgshm --json gc --shm-dir DIR                     (as a user runs it: liveness judged, sightings kept)

and prints each one's median wall and CPU time, its ratios to find's (the median of the ratios run
by run: each run of a form is paired with find's of the same round, so a machine whose speed drifts
moves both alike), and its peak RSS (wait4's ru_maxrss) against the same command on a dir a tenth
the size, which shows whether memory grows with the listing. --assume-dead makes gc judge every entry
fully (the dead pid makes all of them leaked), whatever other pid namespaces this machine has. The
last form judges liveness as a user's gc does: it says whether this machine let it (another pid
namespace that sees the dir, another job's container, makes every entry unknown, a cheaper path),
and the goal line gives its ratios and gc --json --assume-dead's. The dirs are removed at the end,
whatever happens.

smgshm's bytecode is compiled first, as pip does when it installs a wheel: an editable install run
under PYTHONDONTWRITEBYTECODE would otherwise compile some 40 modules from source in every run
(~45 ms here), which no installed smgshm pays. The 1-minute load average is printed before and
after each count: on a shared machine it says what the wall times are worth. The scratch dirs are
filled and removed by child processes, so that this one stays small: a child's peak RSS includes
its parent's at the fork, until the exec.

    .venv/bin/python benchmarks/gc_scan.py --entries 100000 1000000

On a machine shared with containers (which see /dev/shm, and any tmpfs mounted on the host before
they started), ``--private`` (root) runs it all in a mount namespace of its own, on a tmpfs there
that no other namespace sees, so that the judged form judges liveness as it would on a quiet host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

FIND = ["find", "{d}", "-maxdepth", "1", "-name", "smg-*", "-printf", "%f %s %T@ %U %i %n\\n"]
SMGSHM = [sys.executable, "-m", "smgshm"]
_PRIVATE = "SMGSHM_BENCH_PRIVATE"  # the pid that moved into a mount namespace of its own
FORMS: dict[str, list[str]] = {
    "find -printf": FIND,
    "gc (summary)": [*SMGSHM, "gc", "--shm-dir", "{d}", "--assume-dead"],
    "gc --all": [*SMGSHM, "gc", "--shm-dir", "{d}", "--assume-dead", "--all"],
    "gc --raw": [*SMGSHM, "gc", "--shm-dir", "{d}", "--assume-dead", "--raw"],
    "--json gc": [*SMGSHM, "--json", "gc", "--shm-dir", "{d}", "--assume-dead"],
    "--json gc (judged)": [*SMGSHM, "--json", "gc", "--shm-dir", "{d}"],
}


def dead_pid() -> int:
    """A pid no process has: a child that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def populate(d: str, n: int, pid: int) -> None:
    nanos = time.time_ns() - 3600 * 10**9
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            os.close(
                os.open(
                    f"smg-tokenspeed-{pid}-{nanos + i}-{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dfd
                )
            )
    finally:
        os.close(dfd)


def apart(code: str) -> None:
    """Run ``code`` in a child: the kernel records a child's RSS at exec into its peak (ru_maxrss), so
    a parent grown by making or removing a million files would show as every measured command's peak."""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.abspath(__file__)))


def timed(argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in KiB) of one child, its stdout discarded."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"{argv[:6]} exited {p.returncode}: {err}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


Figures = tuple[float, float, int, float, float]  # wall, CPU, peak RSS (KiB), wall / find's, CPU / find's


def measure(d: str, runs: int) -> dict[str, Figures]:
    """Each form's medians over ``runs`` rounds, its ratios to find's taken round by round."""
    walls: dict[str, list[float]] = {k: [] for k in FORMS}
    cpus: dict[str, list[float]] = {k: [] for k in FORMS}
    rss: dict[str, int] = {}
    for _ in range(runs):
        for form, argv in FORMS.items():  # in alternation: a noisy neighbour hits every form alike
            wall, cpu, peak = timed([a.replace("{d}", d) for a in argv])
            walls[form].append(wall)
            cpus[form].append(cpu)
            rss[form] = max(rss.get(form, 0), peak)
    floor, floor_cpu = walls["find -printf"], cpus["find -printf"]
    return {
        k: (
            statistics.median(walls[k]),
            statistics.median(cpus[k]),
            rss[k],
            statistics.median(w / f for w, f in zip(walls[k], floor, strict=True)),
            statistics.median(c / f for c, f in zip(cpus[k], floor_cpu, strict=True)),
        )
        for k in FORMS
    }


def judged(d: str) -> str:
    """Whether a user's ``gc --json`` judged liveness on ``d`` here, and what it found."""
    import json

    argv = [a.replace("{d}", d) for a in FORMS["--json gc (judged)"]]
    doc = json.loads(subprocess.run(argv, capture_output=True, check=True).stdout)["result"]
    counts = ", ".join(f"{k} {v:,}" for k, v in doc["counts"].items() if v)
    if doc["liveness_trusted"]:
        return f"liveness judged ({counts})"
    return f"liveness NOT judged here, so its figure is not the goal's ({counts}): {doc['liveness_note']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, nargs="+", default=[100_000], help="entry counts (default 100000)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each form per count; medians (default 3)")
    ap.add_argument("--parent", default="/dev/shm", help="tmpfs to create the scratch dirs in")  # noqa: S108
    ap.add_argument("--private", action="store_true", help="(root) on a tmpfs of a mount namespace of its own")
    args = ap.parse_args()
    if args.private and os.environ.get(_PRIVATE) != str(os.getpid()):
        os.environ[_PRIVATE] = str(os.getpid())  # exec keeps the pid: this process, in its own namespace
        argv = ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv]
        os.execvp("unshare", argv)  # noqa: S606 - this very benchmark again, its own argv
    if args.private:
        args.parent = tempfile.mkdtemp(prefix="smgshm-bench-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g,mode=1777", "tmpfs", args.parent], check=True)

    import importlib.util

    spec = importlib.util.find_spec("smgshm")
    if spec and spec.submodule_search_locations:  # in a child too: this process stays small
        subprocess.run([sys.executable, "-m", "compileall", "-q", spec.submodule_search_locations[0]], check=True)
    pid = dead_pid()
    made: list[str] = []
    try:
        for n in args.entries:
            results: dict[int, dict[str, Figures]] = {}
            said = ""
            loads: dict[int, tuple[float, float]] = {}
            for count in (max(1, n // 10), n):
                d = os.path.join(args.parent, f"smgshm-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}")
                os.mkdir(d, 0o700)
                made.append(d)
                apart(f"import gc_scan\ngc_scan.populate({d!r}, {count}, {pid})")
                load = os.getloadavg()[0]
                results[count] = measure(d, args.runs)
                loads[count] = (load, os.getloadavg()[0])
                said = judged(d)
                apart(f"import shutil\nshutil.rmtree({d!r}, ignore_errors=True)")  # rmtree lists it all in memory
            small, big = results[max(1, n // 10)], results[n]
            print(
                f"{n:,} entries (medians of {args.runs} runs, alternating; wall, CPU, and peak RSS at "
                f"{n:,} vs {n // 10:,} entries; load average {loads[n][0]:.1f} before, "
                f"{loads[n][1]:.1f} after):"
            )
            for form, (wall, cpu, peak, ratio, cratio) in big.items():
                wr = "" if form == "find -printf" else f"{ratio:5.2f}x"
                cr = "" if form == "find -printf" else f"{cratio:5.2f}x"
                print(
                    f"  {form:<18} wall {wall:7.3f} s {wr:<6}  cpu {cpu:7.3f} s {cr:<6}  "
                    f"RSS {peak / 1024:6.1f} MiB (vs {small[form][2] / 1024:6.1f})"
                )
            user, dead = big["--json gc (judged)"], big["--json gc"]
            print(
                f"  goal, within 3x find: --json gc as a user runs it {user[3]:.2f}x wall, {user[4]:.2f}x CPU; "
                f"with --assume-dead {dead[3]:.2f}x wall, {dead[4]:.2f}x CPU\n  ({said})"
            )
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
        if args.private:
            subprocess.run(["umount", args.parent], check=False)
            os.rmdir(args.parent)


if __name__ == "__main__":
    main()
