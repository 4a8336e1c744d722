"""Peak memory of the node view over one crowded tmpfs: the exporter and ``gc --node --json``, as children.

It lays out a node under a private root (a fresh dir it mounts and unmounts): one pod's memory emptyDir
as a tmpfs of its own at the kubelet's path, its pod log dir, and ``--entries`` empty
``smg-tokenspeed-<dead pid>-<n>-0`` files in it (no process uses the tmpfs: every name is judged). Then,
``--runs`` times each:

    smgshm watch --node --node-root ROOT --serve-metrics 127.0.0.1:0   (its first full scan and a scrape)
    smgshm --json gc --node --node-root ROOT                           (the whole document to /dev/null)

and prints each one's peak RSS (the exporter's VmHWM after a scrape; gc's wait4 ru_maxrss) and median
wall time, with the DaemonSet's memory limit (deploy/k8s/exporter-daemonset.yaml: 160 MiB) beside.
Sightings go to a private state dir, removed at the end with the mount. Needs root.

    .venv/bin/python benchmarks/node_memory.py --entries 300000
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=300_000, help="empty smg-* files in the tmpfs (default 300000)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each command; the max peak, the median wall")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: it mounts a tmpfs")
    work = tempfile.mkdtemp(prefix="smgshm-node-memory-")
    root = os.path.join(work, "node")
    tmpfs = os.path.join(root, "var/lib/kubelet/pods", UID, "volumes/kubernetes.io~empty-dir/dshm")
    os.makedirs(tmpfs)
    os.makedirs(os.path.join(root, "var/log/pods", f"bench_crowded-0_{UID}"))
    env = {**os.environ, "SMGSHM_STATE_DIR": os.path.join(work, "state")}
    mounted = False
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=0,mode=1777", "tmpfs", tmpfs], check=True)
        mounted = True
        populate(tmpfs, args.entries, dead_pid())
        results: dict[str, tuple[list[float], list[float]]] = {"exporter": ([], []), "--json gc --node": ([], [])}
        for _ in range(args.runs):
            for form, fn in (("exporter", exporter), ("--json gc --node", gc_json)):
                peak, wall = fn(root, env)
                results[form][0].append(peak)
                results[form][1].append(wall)
        print(f"{args.entries} entries in one tmpfs; DaemonSet limit {LIMIT_MIB} MiB; load {os.getloadavg()[0]:.2f}")
        for form, (peaks, walls) in results.items():
            print(f"  {form:18} peak {max(peaks):7.1f} MiB  wall {statistics.median(walls):6.2f} s")
    finally:
        if mounted:
            subprocess.run(["umount", tmpfs], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
