"""What the node view costs on a node laid out for real: ``gc --node`` beside ``find``, and the exporter's footprint.

Lays out a node under a private root (a scratch dir under /tmp, removed at the end whatever happens):
``--pods`` real tmpfs mounts (4 MiB each) where the kubelet mounts memory emptyDirs,
``var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~empty-dir/dshm``, each with its pod log dir, and
per pod one process (``sleep``, in a mount namespace of its own) whose /dev/shm is that tmpfs, as a
pod's container: so each tmpfs is judged in a pid namespace (the host's here), as on a node.

(a) ``--entries`` SMG names per tmpfs (``smg-tokenspeed-<dead pid>-<nanos>-<i>``, empty files: a dead
    producer, so every entry is judged to the end: leaked), then, in alternation and ``--runs`` times
    each, as child processes with stdout to /dev/null:

        find DIR... -maxdepth 1 -name 'smg-*' -printf '%f %s %T@ %U %i %n\\n'   (the floor, every tmpfs)
        smgshm gc --node --node-root ROOT                                     (the summary people see)
        smgshm gc --node --node-root ROOT --raw                               (every row)
        smgshm --json gc --node --node-root ROOT                              (one streamed document)

    and prints each one's median wall and CPU time (user + system: what other jobs on a shared machine
    inflate least) and their ratios to find's (the median of the ratios round by round: each run paired
    with find's of the same round). Goal: gc --node at most 3x find.

(b) The exporter, ``smgshm watch --node --node-root ROOT --serve-metrics 127.0.0.1:0 -q`` on the first
    ``--volumes`` tmpfs (the rest unmounted first), scraped every 15 s as Prometheus would: its CPU
    (utime + stime from /proc/PID/stat over ``--window`` seconds) and RSS (VmRSS, VmHWM), idle, then
    while a writer process creates and unlinks SMG-named segments (4 KiB, each unlinked 50 later)
    round-robin across the volumes at ``--rate`` a second. Goals: idle under 1 % of a core and
    80 MiB; under 10 % of a core at 1,000/s.

The sightings the runs store go to a scratch $SMGSHM_STATE_DIR, removed too. Needs root (mounts,
namespaces). The 1-minute load average is printed before and after: on a shared machine it says
what the figures are worth.

    sudo .venv/bin/python benchmarks/node.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator

SMGSHM = [sys.executable, "-m", "smgshm"]
EMPTY_DIR = ("volumes", "kubernetes.io~empty-dir", "dshm")


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


@contextlib.contextmanager
def node(pods: int, entries: int) -> Iterator[tuple[str, list[str], list[subprocess.Popen[bytes]]]]:
    """(root, each pod's tmpfs dir, each pod's process); all unmounted, stopped and removed at the end."""
    root = tempfile.mkdtemp(prefix="smgshm-nodebench-")
    dirs: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        pid, nanos = dead_pid(), time.time_ns() - 3600 * 10**9
        for i in range(pods):
            uid = str(uuid.uuid4())
            d = os.path.join(root, "var/lib/kubelet/pods", uid, *EMPTY_DIR)
            os.makedirs(d)
            os.makedirs(os.path.join(root, "var/log/pods", f"bench_pod-{i}_{uid}"))
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=1777", "tmpfs", d], check=True)
            dirs.append(d)
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for j in range(entries):
                    os.close(
                        os.open(f"smg-tokenspeed-{pid}-{nanos + j}-{j}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=dfd)
                    )
            finally:
                os.close(dfd)
            # The pod's container: its /dev/shm this tmpfs, in a mount namespace of its own.
            script = 'mount --bind "$0" /dev/shm && exec sleep 100000'
            procs.append(subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, d]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(_uses(p.pid, d) for p, d in zip(procs, dirs, strict=True)):
            time.sleep(0.1)
        yield root, dirs, procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        for d in dirs:
            subprocess.run(["umount", "-l", d], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _uses(pid: int, d: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/root/dev/shm").st_dev == os.stat(d).st_dev
    except OSError:
        return False


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; the CPU its user and system time (what a busy machine does not inflate)."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def bench_gc(root: str, dirs: list[str], runs: int) -> None:
    forms = {
        "find -printf": ["find", *dirs, "-maxdepth", "1", "-name", "smg-*", "-printf", "%f %s %T@ %U %i %n\\n"],
        "gc --node": [*SMGSHM, "gc", "--node", "--node-root", root],
        "gc --node --raw": [*SMGSHM, "gc", "--node", "--node-root", root, "--raw"],
        "--json gc --node": [*SMGSHM, "--json", "gc", "--node", "--node-root", root],
    }
    for argv in forms.values():  # warm: the page cache, the bytecode, the sightings stores
        timed(argv)
    walls: dict[str, list[float]] = {k: [] for k in forms}
    cpus: dict[str, list[float]] = {k: [] for k in forms}
    for _ in range(runs):
        for k, argv in forms.items():
            wall, cpu = timed(argv)
            walls[k].append(wall)
            cpus[k].append(cpu)
    floor, cpu_floor = walls["find -printf"], cpus["find -printf"]
    print(f"(a) {len(dirs)} tmpfs x {len(os.listdir(dirs[0])):,} entries, medians of {runs} alternating runs:")
    got: dict[str, tuple[float, float]] = {}
    for k in forms:
        wall, cpu = statistics.median(walls[k]), statistics.median(cpus[k])
        got[k] = (
            statistics.median(w / f for w, f in zip(walls[k], floor, strict=True)),
            statistics.median(c / f for c, f in zip(cpus[k], cpu_floor, strict=True)),
        )
        ratios = f"wall {wall * 1e3:6.0f} ms {got[k][0]:5.2f}x find   "
        ratios += f"CPU {cpu * 1e3:6.0f} ms {got[k][1]:5.2f}x find"
        print(f"    {k:<18} {ratios}")
    print(f"    goal, gc --node within 3x find: {got['gc --node'][0]:.2f}x wall, {got['gc --node'][1]:.2f}x CPU")


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)


def rss(pid: int) -> tuple[int, int]:
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                got[line.split(":")[0]] = int(line.split()[1]) * 1024
    return got["VmRSS"], got["VmHWM"]


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - the exporter started here, on loopback
        data: bytes = r.read()
    return data


def window(pid: int, url: str, seconds: float) -> tuple[float, int, int]:
    """The share of one core ``pid`` used over ``seconds`` (scraped every 15 s), then its RSS and peak."""
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.monotonic(), cpu_ticks(pid)
    while (left := seconds - (time.monotonic() - t0)) > 0:
        scrape(url)
        time.sleep(min(15.0, left))
    share = (cpu_ticks(pid) - c0) / hz / (time.monotonic() - t0)
    return share, *rss(pid)


WRITER = r"""
import os, sys, time
dirs, rate, seconds = sys.argv[1].split("\n"), float(sys.argv[2]), float(sys.argv[3])
pid, data, made, i = os.getpid(), b"\x07" * 4096, [], 0
t0 = time.monotonic()
while (now := time.monotonic()) - t0 < seconds:
    due = int((now - t0) * rate)
    while i < due:
        path = os.path.join(dirs[i % len(dirs)], f"smg-tokenspeed-{pid}-{time.time_ns()}-{i}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.write(fd, data)
        os.close(fd)
        made.append(path)
        if len(made) > 50:
            os.unlink(made.pop(0))
        i += 1
    time.sleep(0.002)
for path in made:
    os.unlink(path)
print(i / (time.monotonic() - t0), flush=True)
"""


def bench_exporter(root: str, dirs: list[str], seconds: float, rate: float) -> None:
    p = subprocess.Popen(
        [*SMGSHM, "watch", "--node", "--node-root", root, "--serve-metrics", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = p.stderr.readline() if p.stderr is not None else ""
        url = line.split("metrics at ", 1)[1].strip()
        scrape(url)
        time.sleep(5)  # past the start-up (imports, the first full scan)
        idle = window(p.pid, url, seconds)
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, "\n".join(dirs), str(rate), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        busy = window(p.pid, url, seconds)
        achieved = float((writer.stdout.readline() if writer.stdout is not None else "") or 0)
        writer.wait()
        text = scrape(url).decode()
        updates = next((ln.split()[-1] for ln in text.splitlines() if ln.startswith("smgshm_node_updates_total")), "?")
    finally:
        p.terminate()
        p.wait(timeout=30)
    print(f"(b) the exporter on {len(dirs)} pod volumes, {seconds:.0f} s windows, scraped every 15 s:")
    for what, (share, now, peak) in (("idle", idle), (f"{achieved:,.0f} segments/s", busy)):
        mib = f"RSS {now / 2**20:5.1f} MiB (peak {peak / 2**20:.1f})"
        print(f"    {what:<20} CPU {share * 100:5.2f} % of a core   {mib}")
    print(f"    updates between full scans: {updates}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=100, help="tmpfs mounts for (a) (default 100)")
    ap.add_argument("--entries", type=int, default=1000, help="SMG entries per tmpfs for (a) (default 1000)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each form for (a); medians (default 5)")
    ap.add_argument("--volumes", type=int, default=50, help="pod volumes for (b) (default 50)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds per footprint window (default 60)")
    ap.add_argument("--rate", type=float, default=1000.0, help="segments/s the writer makes in (b) (default 1000)")
    ap.add_argument("--no-exporter", action="store_true", help="run (a) only")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: it mounts tmpfs and makes mount namespaces")
    state = tempfile.mkdtemp(prefix="smgshm-nodebench-state-")
    os.environ["SMGSHM_STATE_DIR"] = state
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", os.path.join(here, "smgshm")], stdout=subprocess.DEVNULL, check=False
    )
    print(f"{os.cpu_count()} cores, {load()}")
    try:
        with node(args.pods, args.entries) as (root, dirs, _procs):
            bench_gc(root, dirs, args.runs)
        print(f"    ({load()})")
        if args.no_exporter:
            return
        with node(args.volumes, 0) as (root, dirs, _procs):
            bench_exporter(root, dirs, args.window, args.rate)
        print(f"    ({load()})")
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
