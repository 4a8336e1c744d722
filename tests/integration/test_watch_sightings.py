"""watch as a witness (issue #21, finding 2): the sightings it records are gc's proofs on the boot clock.

The reuse proof runs for real in a fresh pid and mount namespace, as tests/test_gc_sightings.py's do:
a real ``smgshm watch`` follows a private tmpfs, a producer with pid P makes a segment and exits, and
``ns_last_pid`` makes a later process take P. The first gc ever run on that dir must then prove the
pid reused from watch's sighting alone. The merge with a concurrent gc is watched from outside:
the store is read over and over while both write it, and no sighting may ever move later, or be
earlier than the segment.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.host import clock
from smgshm.core.segments import sightings as sightings_mod
from smgshm.core.segments.judge import ScanOptions, State
from smgshm.core.segments.scan import Scan
from smgshm.core.segments.sightings import Sightings, name_sum
from smgshm.core.watch.figures import WatchOptions
from smgshm.core.watch.orphans import OrphanJudge
from tests.conftest import Children, run_cli, smgshm_argv, wait_for
from tests.support.cli_gc import PY
from tests.support.cli_watch import spawn_watch
from tests.support.gc_sightings import needs_pidns

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = pytest.mark.trust

# Runs as pid 1 of a fresh pid namespace. argv: "watch" or "no-watch" (the control), the dir to mount
# the shm tmpfs on. Prints one JSON line: what watch stored, what the one gc --delete said and did.
SCENARIO = r"""
import json, os, signal, subprocess, sys, time
from smgshm.core.segments.sightings import Sightings, name_sum
with_watch, d = sys.argv[1] == "watch", sys.argv[2]
for where, mode in ((d, "1777"), ("/run", "755")):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode={mode},size=16m", "tmpfs", where], check=True)
P = 4242
boot = lambda: time.clock_gettime_ns(time.CLOCK_BOOTTIME)

def as_pid(argv):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(P - 1))
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert p.pid == P, p.pid
    return p

out = {}
if with_watch:
    w = subprocess.Popen([sys.executable, "-m", "smgshm", "watch", "--shm-dir", d, "--interval", "0.1", "--jsonl"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(w.stdout.readline())["type"] == "rescanned"  # watching
# The producer, pid P: its segment (a fresh name: the wall clock alone says it may be the next P's own), then exit.
out["made_after"] = boot()
producer = as_pid([sys.executable, "-c", "import os, sys, time\n"
                   "n = f'smg-tokenspeed-{os.getpid()}-{time.time_ns()}-0'\n"
                   "fd = os.open(os.path.join(sys.argv[1], n), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)\n"
                   "os.write(fd, b'x' * 4096); os.close(fd); print(n, flush=True)", d])
name = producer.stdout.readline().strip()
producer.wait()
st = os.lstat(os.path.join(d, name))
if with_watch:
    deadline = time.monotonic() + 60
    while True:  # until watch has stored its sighting (an interval is 0.1 s)
        s = Sightings(d, os.stat(d).st_dev)
        row = s.index.get(st.st_ino)
        if row is not None and s.ctimes[row] == st.st_ctime_ns and s.sums[row] == name_sum(name):
            out["seen"] = s.seen[row]
            break
        assert time.monotonic() < deadline, "watch stored no sighting"
        time.sleep(0.02)
    out["stored_after"] = boot()
time.sleep(0.05)  # a start is read in clock ticks (1/100 s): one within a tick of the sighting proves nothing
holder = as_pid([sys.executable, "-c", "import signal; signal.pause()"])
doc = json.loads(subprocess.run([sys.executable, "-m", "smgshm", "--json", "gc", "--shm-dir", d, "--assume-dead",
                                 "--delete", "--min-age", "0s", "--yes"],
                                capture_output=True, text=True, timeout=60).stdout)
seg = {s["name"]: s for s in doc["result"]["segments"]}[name]
out.update(state=seg["state"], reason=seg["reason"],
           deleted=any(x["name"] == name and x["deleted"] for x in doc["result"]["deleted"]),
           exists=os.path.exists(os.path.join(d, name)), holder_alive=holder.poll() is None)
holder.kill()
holder.wait()
if with_watch:
    store = os.path.join(os.environ.get("SMGSHM_STATE_DIR") or "/run/smgshm", Sightings(d, os.stat(d).st_dev).file)
    fst = os.lstat(store)
    out.update(store_mode=fst.st_mode & 0o7777, store_uid=fst.st_uid, euid=os.geteuid())
    w.send_signal(signal.SIGINT)
    w.communicate(timeout=60)
    out["watch_rc"] = w.returncode
if os.path.exists(os.path.join(d, name)):
    os.unlink(os.path.join(d, name))
print(json.dumps(out), flush=True)
"""


def run_scenario(children: Children, tmp_path: Path, with_watch: bool) -> Any:
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
        "watch" if with_watch else "no-watch",
        str(d),
    ]
    p = children.spawn(argv)
    out, err = p.communicate(timeout=180)
    if p.returncode != 0 and "unshare failed" in err:
        pytest.skip(f"unshare --pid --mount failed: {err.strip()}")
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
@needs_pidns
def test_a_pid_taken_after_watch_saw_its_segment_made_is_proven_reused_by_the_first_gc(
    children: Children, tmp_path: Path
) -> None:
    got = run_scenario(children, tmp_path, with_watch=True)
    # watch's sighting is of the segment made, never before it was
    assert got["made_after"] <= got["seen"] <= got["stored_after"]
    assert got["state"] == "leaked", got
    assert "its pid now belongs to a process that started" in got["reason"]
    assert "after smgshm first saw this segment (reused)" in got["reason"]
    assert got["deleted"] is True
    assert got["exists"] is False
    assert got["holder_alive"] is True, "reaping the old segment leaves the pid's new process alone"
    # the store watch wrote is a private file of this user's
    assert got["store_mode"] == 0o600
    assert got["store_uid"] == got["euid"]
    assert got["watch_rc"] == 0


@pytest.mark.slow
@needs_pidns
def test_without_watch_the_same_segment_is_kept(children: Children, tmp_path: Path) -> None:
    """The control: the first gc ever sees the segment after its pid's new process started, and the
    wall clock says the segment may be that process's own: nothing proves otherwise, it is kept."""
    got = run_scenario(children, tmp_path, with_watch=False)
    assert got["state"] == "in_flight", got
    assert got["deleted"] is False
    assert got["exists"] is True


def _store(d: str) -> dict[tuple[int, int, int, int], int]:
    """The stored sightings of ``d``: (inode, uid, ctime, name checksum) -> first seen (boot clock, ns)."""
    s = Sightings(d, os.stat(d).st_dev)
    return {(s.inos[i], s.uids[i], s.ctimes[i], s.sums[i]): s.seen[i] for i in range(len(s.inos))}


def _identity(d: str, name: str) -> tuple[int, int, int, int]:
    st = os.lstat(os.path.join(d, name))
    return st.st_ino, st.st_uid, st.st_ctime_ns, name_sum(name)


def _make(d: str, seq: int) -> str:
    """A segment of this (live) process's, written and closed."""
    name = f"smg-smgshm-{os.getpid()}-{time.time_ns()}-{seq}"
    fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"s" * 512)
    os.close(fd)
    return name


@pytest.mark.slow
def test_a_concurrent_gc_and_watch_keep_the_earlier_true_sighting(
    children: Children,
    tmpfs: str,
) -> None:
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.05")
    made: dict[tuple[int, int, int, int], int] = {}  # identity -> boot clock before it was made
    history: dict[tuple[int, int, int, int], list[int]] = {}  # every stored value, in order
    names: list[str] = []

    def poll() -> None:
        for ident, seen in _store(tmpfs).items():
            h = history.setdefault(ident, [])
            if not h or h[-1] != seen:
                h.append(seen)

    gcs: list[subprocess.Popen[str]] = []
    seq = 0
    try:
        for _ in range(6):  # gc runs, each overlapping watch's writes and new segments
            gcs.append(children.spawn(smgshm_argv("--json", "gc", "--shm-dir", tmpfs), stdout=subprocess.DEVNULL))
            made_now = 0
            while gcs[-1].poll() is None:
                if made_now < 50:  # a few dozen a run: the store is read over and over in between
                    made_now += 1
                    seq += 1
                    before = clock.boot_clock_ns()
                    names.append(_make(tmpfs, seq))
                    made[_identity(tmpfs, names[-1])] = before
                for _ in range(5):
                    poll()
            assert gcs[-1].returncode == 0, gcs[-1].stderr.read() if gcs[-1].stderr else ""
        wait_for(lambda: set(made) <= set(_store(tmpfs)), what="watch to store every segment")
        poll()
    finally:
        w.send_signal(signal.SIGINT)
        w.communicate(timeout=60)
        for name in names:
            os.unlink(os.path.join(tmpfs, name))
    assert w.returncode == 0
    assert len(made) >= 6
    for ident, before in made.items():
        h = history[ident]
        assert h[0] >= before, "a sighting earlier than the segment"
        assert h == sorted(h, reverse=True), f"a sighting moved later: {h}"


@pytest.mark.slow
def test_a_gc_that_read_the_store_before_watch_wrote_keeps_watchs_earlier_sighting(
    children: Children,
    tmpfs: str,
) -> None:
    """The interleaving that made a later sighting: gc reads the store, watch sees a segment made and
    stores it, then gc's listing first sees it and writes. gc's own code path, in this process."""
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.05")
    try:
        scan = Scan(ScanOptions(shm_dir=tmpfs))  # gc has read the store: nothing in it
        name = _make(tmpfs, 1)
        ident = _identity(tmpfs, name)
        by_watch = wait_for(lambda: _store(tmpfs).get(ident), what="watch to store the segment")
        assert {s.name: s for s in scan}[name].state is State.IN_FLIGHT  # the listing, then gc's write
        assert _store(tmpfs)[ident] == by_watch, "gc kept watch's earlier sighting"
    finally:
        w.send_signal(signal.SIGINT)
        w.communicate(timeout=60)
        os.unlink(os.path.join(tmpfs, name))
    assert _store(tmpfs)[ident] == by_watch


@pytest.mark.slow
def test_a_watch_started_after_gc_keeps_gcs_earlier_sighting(
    children: Children,
    tmpfs: str,
) -> None:
    """The converse: gc saw the segment first; watch's start listing sees it again, later."""
    old = _make(tmpfs, 1)
    ident = _identity(tmpfs, old)
    run_cli("gc", "--shm-dir", tmpfs)
    by_gc = _store(tmpfs)[ident]
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.05")
    try:
        new = _make(tmpfs, 2)  # stored by watch: so watch has written since its listing of the old one
        wait_for(lambda: _identity(tmpfs, new) in _store(tmpfs), what="watch to store the new segment")
        assert _store(tmpfs)[ident] == by_gc
    finally:
        w.send_signal(signal.SIGINT)
        w.communicate(timeout=60)
        os.unlink(os.path.join(tmpfs, new))
        os.unlink(os.path.join(tmpfs, old))
    assert w.returncode == 0


@pytest.mark.slow
def test_watch_drops_the_sightings_of_what_it_saw_unlinked(
    children: Children,
    tmpfs: str,
) -> None:
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.05")
    try:
        names = [_make(tmpfs, i) for i in range(20)]
        idents = [_identity(tmpfs, n) for n in names]
        wait_for(lambda: set(idents) <= set(_store(tmpfs)), what="watch to store every segment")
        for n in names[:15]:
            os.unlink(os.path.join(tmpfs, n))
        wait_for(lambda: set(_store(tmpfs)) == set(idents[15:]), what="watch to drop the unlinked ones")
    finally:
        w.send_signal(signal.SIGINT)
        w.communicate(timeout=60)
        for n in names[15:]:
            os.unlink(os.path.join(tmpfs, n))
    assert w.returncode == 0


def test_watch_records_a_segment_renamed_in_or_still_being_written(
    children: Children,
    tmpfs: str,
) -> None:
    """No close-after-write follows a rename, nor (yet) a creation whose producer still writes:
    the first is looked at when watch reads the rename, the second by the next store write."""
    w, _ = spawn_watch(children, "--shm-dir", tmpfs, "--interval", "0.05")
    renamed = os.path.join(tmpfs, f"smg-smgshm-{os.getpid()}-{time.time_ns()}-1")
    open_one = os.path.join(tmpfs, f"smg-smgshm-{os.getpid()}-{time.time_ns()}-2")
    fd = -1
    try:
        tmp = os.path.join(tmpfs, "tmp-being-written")
        with open(tmp, "wb") as f:
            f.write(b"r" * 512)
        os.rename(tmp, renamed)
        fd = os.open(open_one, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"o" * 512)
        wanted = {_identity(tmpfs, os.path.basename(p)) for p in (renamed, open_one)}
        wait_for(lambda: wanted <= set(_store(tmpfs)), what="watch to store both")
    finally:
        if fd >= 0:
            os.close(fd)
        w.send_signal(signal.SIGINT)
        w.communicate(timeout=60)
        for path in (renamed, open_one):
            if os.path.exists(path):
                os.unlink(path)
    assert w.returncode == 0


@pytest.fixture
def open_tmpfs() -> Iterator[str]:
    """A private tmpfs (1777) at a path any user can reach, always unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    top = tempfile.mkdtemp(prefix="smgshm-ws-", dir="/tmp")  # not the session tmp: another user must reach it
    os.chmod(top, 0o755)  # noqa: S103 - another user's watch must reach the tmpfs mounted in it
    mnt = os.path.join(top, "shm")
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "smgshm-test", mnt], check=True)
    try:
        yield mnt
    finally:
        while os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt], check=False)
        shutil.rmtree(top, ignore_errors=True)


NOBODY = 65534


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv(1)")
def test_a_users_watch_stores_its_sightings_privately_in_its_cache(children: Children, open_tmpfs: str) -> None:
    cache = Path(open_tmpfs).parent / "nobody-cache"  # where nobody can reach it
    cache.mkdir()
    os.chown(cache, NOBODY, NOBODY)
    env = {k: v for k, v in os.environ.items() if k != sightings_mod.STATE_DIR_ENV}
    env["XDG_CACHE_HOME"] = str(cache)
    argv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        *smgshm_argv("watch", "--jsonl", "--shm-dir", open_tmpfs, "--interval", "0.05"),
    ]
    w = children.spawn(argv, env=env)
    assert w.stdout is not None
    assert json.loads(w.stdout.readline())["type"] == "rescanned", w.stderr.read() if w.stderr else ""
    name = _make(open_tmpfs, 1)
    try:
        d = cache / "smgshm"
        store = wait_for(
            lambda: next(iter(d.glob("sightings-*")), None) if d.is_dir() else None,
            what="nobody's watch to write its store",
        )
    finally:
        w.send_signal(signal.SIGINT)
        w.communicate(timeout=60)
        os.unlink(os.path.join(open_tmpfs, name))
    assert w.returncode == 0
    st, dst = os.lstat(store), os.lstat(d)
    assert (st.st_uid, st.st_mode & 0o7777) == (NOBODY, 0o600)
    assert (dst.st_uid, dst.st_mode & 0o7777) == (NOBODY, 0o700)
    assert not list(d.glob(".*tmp")), "no temp file left behind"


def test_the_orphans_judgement_reads_the_store_once_until_it_changes(tmpfs: str) -> None:
    judge = OrphanJudge(WatchOptions(shm_dir=tmpfs))
    first = judge.sightings()
    assert first is not None
    assert judge.sightings() is first, "read once, not per judgement"
    s = Sightings(tmpfs, os.stat(tmpfs).st_dev)
    name = _make(tmpfs, 1)
    try:
        s.new.append((*_identity(tmpfs, name)[:3], name))
        assert s.save()
        again = judge.sightings()
        assert again is not first, "read again once the file changed"
        assert again is not None
        assert os.lstat(os.path.join(tmpfs, name)).st_ino in again.index
        assert judge.sightings() is again
    finally:
        os.unlink(os.path.join(tmpfs, name))
