"""Peak memory of the node view over crowded tmpfs: the exporter and ``gc --node --json``, as children.

For each ``--shape PODSxENTRIES`` (default: ``1x300000``, one crowded pod; ``10x100000`` and
``100x10000``, 1M entries across a node, the latter's tmpfs each small enough for the exporter's updates),
it lays out a node under a private root (a fresh dir, its mounts undone at the end whatever happens):
PODS pods, each with a memory emptyDir as a tmpfs of its own at the kubelet's path (``nr_inodes``
unbounded) and its pod log dir, and ENTRIES empty ``smg-tokenspeed-<dead pid>-<n>-0`` files in each (no
process uses the tmpfs: every name is judged). Then, ``--runs`` times each:

    smgshm watch --node --node-root ROOT --serve-metrics 127.0.0.1:0   (its first full scan and a scrape)
    smgshm --json gc --node --node-root ROOT                           (the whole document to /dev/null)

and prints each one's peak RSS (the exporter's VmHWM after a scrape; gc's wait4 ru_maxrss) and median
wall time, shape beside shape, with the DaemonSet's memory limit (deploy/k8s/exporter-daemonset.yaml:
160 MiB). Sightings go to a private state dir per shape, removed with it. Needs root, and about 1 KiB of
kernel memory per entry (inodes and dentries: ~1 GiB for 1M): it says the free memory before each shape.

    .venv/bin/python benchmarks/node_memory.py                       # the three default shapes
    .venv/bin/python benchmarks/node_memory.py --shape 4x250000
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
import urllib.request

SMGSHM = [sys.executable, "-m", "smgshm"]
UID = "cccccccc-0000-4000-8000-00000000000c"
LIMIT_MIB = 160


def populate(d: str, n: int, pid: int) -> None:
    code = (
        "import os,sys\n"
        "d,n,pid=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])\n"
        "fd=os.open(d,os.O_RDONLY|os.O_DIRECTORY)\n"
        "flags=os.O_WRONLY|os.O_CREAT|os.O_EXCL\n"
        "for i in range(n): os.close(os.open(f'smg-tokenspeed-{pid}-{i}-0',flags,0o600,dir_fd=fd))\n"
    )
    subprocess.run([sys.executable, "-c", code, d, str(n), str(pid)], check=True)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024


def exporter(root: str, env: dict[str, str]) -> tuple[float, float]:
    """(peak MiB after the first full scan and a scrape, seconds to the first scrape)."""
    t0 = time.perf_counter()
    argv = [*SMGSHM, "watch", "--node", "--node-root", root, "--serve-metrics", "127.0.0.1:0"]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stderr is not None
        line = p.stderr.readline()
        if "metrics at " not in line:
            raise SystemExit(f"exporter said: {line}{p.stderr.read()}")
        with urllib.request.urlopen(line.split("metrics at ", 1)[1].strip(), timeout=120) as r:  # noqa: S310
            r.read()
        wall = time.perf_counter() - t0
        return hwm_mib(p.pid), wall
    finally:
        p.terminate()
        p.wait(30)


def gc_json(root: str, env: dict[str, str]) -> tuple[float, float]:
    """(peak MiB, wall seconds) of ``--json gc --node``, its stdout discarded."""
    t0 = time.perf_counter()
    p = subprocess.Popen([*SMGSHM, "--json", "gc", "--node", "--node-root", root], stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 3):
        raise SystemExit(f"gc --node exited {code}")
    return usage.ru_maxrss / 1024, time.perf_counter() - t0


def free_mib() -> int:
    """MemAvailable, MiB: what the machine can still give the tmpfs' inodes."""
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:")) // 1024


def parse_shape(text: str) -> tuple[int, int]:
    pods, _, entries = text.lower().partition("x")
    try:
        shape = int(pods), int(entries)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not PODSxENTRIES: {text!r}") from None
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"PODS and ENTRIES must be at least 1: {text!r}")
    return shape


def measure(pods: int, entries: int, runs: int) -> dict[str, tuple[list[float], list[float]]]:
    """Lay out ``pods`` crowded tmpfs under a fresh root, run each command ``runs`` times; every mount undone."""
    work = tempfile.mkdtemp(prefix="smgshm-node-memory-")
    root = os.path.join(work, "node")
    env = {**os.environ, "SMGSHM_STATE_DIR": os.path.join(work, "state")}
    mounted: list[str] = []
    try:
        pid = dead_pid()
        for i in range(pods):
            uid = f"{UID[:-3]}{i:03x}"
            tmpfs = os.path.join(root, "var/lib/kubelet/pods", uid, "volumes/kubernetes.io~empty-dir/dshm")
            os.makedirs(tmpfs)
            os.makedirs(os.path.join(root, "var/log/pods", f"bench_crowded-{i}_{uid}"))
            opts = "size=64m,nr_inodes=0,mode=1777"  # nr_inodes=0: no inode limit (tmpfs(5))
            subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", tmpfs], check=True)
            mounted.append(tmpfs)
            populate(tmpfs, entries, pid)
        results: dict[str, tuple[list[float], list[float]]] = {"exporter": ([], []), "--json gc --node": ([], [])}
        for _ in range(runs):
            for form, fn in (("exporter", exporter), ("--json gc --node", gc_json)):
                peak, wall = fn(root, env)
                results[form][0].append(peak)
                results[form][1].append(wall)
        return results
    finally:
        for tmpfs in reversed(mounted):
            subprocess.run(["umount", tmpfs], check=False)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shape",
        type=parse_shape,
        action="append",
        help="PODSxENTRIES: PODS tmpfs of ENTRIES files each (repeatable; default 1x300000, 10x100000, 100x10000)",
    )
    ap.add_argument("--runs", type=int, default=3, help="runs of each command; the max peak, the median wall")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: it mounts tmpfs")
    shapes = args.shape or [(1, 300_000), (10, 100_000), (100, 10_000)]
    print(f"DaemonSet limit {LIMIT_MIB} MiB", flush=True)
    for pods, entries in shapes:
        print(f"{pods} tmpfs x {entries} entries: {free_mib()} MiB available before", flush=True)
        results = measure(pods, entries, args.runs)
        print(f"{pods * entries} entries in {pods} tmpfs; load {os.getloadavg()[0]:.2f}")
        for form, (peaks, walls) in results.items():
            print(f"  {form:18} peak {max(peaks):7.1f} MiB  wall {statistics.median(walls):6.2f} s", flush=True)


if __name__ == "__main__":
    main()
