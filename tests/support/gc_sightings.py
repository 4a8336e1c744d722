"""Shared by the tests of gc_sightings (moved out of tests/test_gc_sightings.py)."""

from __future__ import annotations

import array
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.segments import sightings as sightings_mod
from smgshm.core.segments.sightings import Sightings, name_sum
from tests.conftest import Children
from tests.support.cli_gc import PY

needs_pidns = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)


# Runs as pid 1 of a fresh pid namespace. argv: order (sighted-first | started-first), how gc runs
# (cli | core), the wall-clock step the in-process gc reads (core only), the dir to mount the shm tmpfs on.
SCENARIO = r"""
import json, os, subprocess, sys, time
order, how, step, d = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
for where, mode in ((d, "1777"), ("/run", "755")):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode={mode},size=16m", "tmpfs", where], check=True)
P = 4242
name = f"smg-tokenspeed-{P}-{time.time_ns() - 3600 * 10**9}-0"  # an hour old by the wall clock
path = os.path.join(d, name)
with open(path, "wb") as f:
    f.write(b"x" * 4096)
os.utime(path, (time.time() - 3600, time.time() - 3600))

def gc(*args):
    if how == "cli":
        out = subprocess.run([sys.executable, "-m", "smgshm", "--json", "gc", "--shm-dir", d, "--assume-dead", *args],
                             capture_output=True, text=True, timeout=60)
        doc = json.loads(out.stdout)
        seg = {s["name"]: s for s in doc["result"]["segments"]}.get(name)
        gone = {x["name"]: x for x in doc["result"]["deleted"]}.get(name)
        return {"state": seg and seg["state"], "reason": seg and seg["reason"], "seen_s": seg and seg["seen_s"],
                "deleted": bool(gone and gone["deleted"])}
    from smgshm.core.host import clock
    from smgshm.core.segments.judge import ScanOptions, State
    from smgshm.core.segments.reaping import ReapRule, choose, reap_choice
    from smgshm.core.segments.scan import Scan
    real = clock.boot_offset
    clock.boot_offset = lambda: real() + step  # the wall clock stepped by `step` since everything was stamped
    try:
        scan = Scan(ScanOptions(shm_dir=d, assume_dead=True))
        got = {}
        rule = ReapRule(frozenset({State.LEAKED, State.STALE}), 0.0) if "--delete" in args else None
        choice = choose(scan, rule, lambda s, row: got.update({s.name: s}) if s.name == name else None)
        done = {x.name: x.deleted for x in reap_choice(scan, choice).deleted}
        seg = got[name]
        return {"state": seg.state.value, "reason": seg.reason, "seen_s": seg.seen_s, "deleted": done.get(name, False)}
    finally:
        clock.boot_offset = real

def take_pid():
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(P - 1))
    p = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    assert p.pid == P, p.pid
    return p

steps = {}
if order == "sighted-first":
    steps["first"] = gc()  # no process has P: leaked, and seen
    time.sleep(0.05)  # a start is read in clock ticks (1/100 s): one within a tick of the sighting proves nothing
    holder = take_pid()
else:
    holder = take_pid()
    time.sleep(0.05)
    steps["first"] = gc()
steps["delete"] = gc("--delete", "--min-age", "0s", "--include-stale", "--yes")
steps["exists"] = os.path.exists(path)
steps["holder_alive"] = holder.poll() is None
holder.kill()
holder.wait()
print(json.dumps(steps), flush=True)
"""


def run_scenario(children: Children, tmp_path: Path, order: str, how: str = "cli", step: float = 0.0) -> Any:
    d = tmp_path / "shm"
    d.mkdir()
    argv = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "--propagation",
        "private",
        PY,
        "-c",
        SCENARIO,
        order,
        how,
        str(step),
        str(d),
    ]
    p = children.spawn(argv)
    out, err = p.communicate(timeout=120)
    if p.returncode != 0 and "unshare failed" in err:
        pytest.skip(f"unshare --pid --mount failed: {err.strip()}")
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _forge(d: str, name: str, *, header: bytes | None = None, seen_ns: int = 1) -> bytes:
    """The store a scan of ``d`` would read, claiming ``name`` was seen at boot-clock ``seen_ns``
    (long before any process started): if believed, its live producer's pid reads as reused."""
    st = os.lstat(os.path.join(d, name))
    s = Sightings(d, os.stat(d).st_dev)
    assert s.header is not None
    cols = [
        array.array(c, [v])
        for c, v in zip("QIqIQ", (st.st_ino, st.st_uid, st.st_ctime_ns, name_sum(name), seen_ns), strict=True)
    ]
    return b"".join([header or s.header, b" 1\n", *(c.tobytes() for c in cols)])


def _store_path(d: str) -> str:
    return os.path.join(sightings_mod.store_dir(), Sightings(d, os.stat(d).st_dev).file)


def _plant(path: str, data: bytes, mode: int = 0o600, uid: int | None = None) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = path + ".plant"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    if uid is not None:
        os.chown(tmp, uid, -1)
    os.replace(tmp, path)
