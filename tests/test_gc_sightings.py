"""gc's proofs on the boot clock (issue #21, finding 2): sightings, pid reuse, staleness, a hostile store.

The reuse proofs run for real in a fresh pid and mount namespace (``unshare --pid --fork --mount-proc
--mount``): a private tmpfs is the shm dir, another is /run (so the store, /run/smgshm, is private
to the run and goes with it), and ``ns_last_pid`` makes the next fork take the pid P that a segment
names. So a process holding P really starts after, or before, gc first saw the segment.
"""

from __future__ import annotations

import array
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.host import clock
from smgshm.core.segments import sightings as sightings_mod
from smgshm.core.segments.judge import ScanOptions, State
from smgshm.core.segments.reaping import ReapRule, choose, reap_choice
from smgshm.core.segments.scan import Scan
from smgshm.core.segments.sightings import Sightings, name_sum
from tests.conftest import Children, make_file
from tests.test_cli_gc import PY, WRITER, gc, segs, tmpfs_dir  # noqa: F401 - a fixture

HOUR_S = 3600

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


@needs_pidns
def test_a_pid_taken_after_a_scan_saw_its_segment_is_proven_reused_and_reaped(
    children: Children, tmp_path: Path
) -> None:
    got = run_scenario(children, tmp_path, "sighted-first")
    assert got["first"]["state"] == "leaked"
    assert "no process has that pid" in got["first"]["reason"]
    assert got["delete"]["state"] == "leaked", got["delete"]
    assert "its pid now belongs to a process that started" in got["delete"]["reason"]
    assert "after smgshm first saw this segment (reused)" in got["delete"]["reason"]
    assert got["delete"]["deleted"] is True
    assert got["exists"] is False
    assert got["holder_alive"] is True, "reaping the old segment leaves the pid's new process alone"


@needs_pidns
def test_a_process_that_started_before_the_first_sighting_is_never_proven_reused(
    children: Children, tmp_path: Path
) -> None:
    """The converse: the wall clock says reused (the segment is an hour older than the process), but
    no sighting precedes the process, so nothing proves it: unknown, kept, scan after scan."""
    got = run_scenario(children, tmp_path, "started-first")
    for step in ("first", "delete"):
        assert got[step]["state"] == "unknown", got[step]
        assert "reused unless the clock was stepped" in got[step]["reason"]
        assert "never deleted on the wall clock" in got[step]["reason"]
        assert got[step]["deleted"] is False
    assert got["exists"] is True


def test_a_live_producers_segment_is_stale_only_once_seen_for_stale_after(
    children: Children,
    tmpfs_dir: str,  # noqa: F811 - test_cli_gc's fixture
) -> None:
    p = children.spawn([PY, "-c", WRITER, tmpfs_dir])
    assert p.stdout is not None
    name = p.stdout.readline().strip()
    path = os.path.join(tmpfs_dir, name)
    os.utime(path, (time.time() - HOUR_S, time.time() - HOUR_S))  # an hour old by the wall clock
    args = ("--stale-after", "1s", "--delete", "--include-stale", "--min-age", "0s", "--yes")
    s = segs(doc := gc(tmpfs_dir, *args))[name]
    assert s["state"] == "unknown", s["reason"]  # first seen now: an hour by the wall clock proves nothing
    assert s["producer_alive"] is True
    assert "smgshm first saw it only 0 s ago: stale, and reapable, once seen for 1 s" in s["reason"]
    assert not doc["result"]["deleted"]
    time.sleep(1.1)
    s = segs(doc := gc(tmpfs_dir, *args))[name]
    assert s["state"] == "stale", s["reason"]
    assert s["seen_s"] >= 1.0
    assert [d["name"] for d in doc["result"]["deleted"] if d["deleted"]] == [name]
    assert not os.path.lexists(path)
    assert p.poll() is None


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


def _judge_and_reap(d: str, name: str) -> tuple[State, bool]:
    scan = Scan(ScanOptions(shm_dir=d, assume_dead=True))
    got: dict[str, State] = {}
    rule = ReapRule(frozenset({State.LEAKED, State.STALE}), 0.0)
    choice = choose(scan, rule, lambda s, row: got.update({s.name: s.state}))
    done = {x.name: x.deleted for x in reap_choice(scan, choice).deleted}
    return got[name], done.get(name, False)


@pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another owner in root's store")
@pytest.mark.parametrize(
    "how",
    [
        "another_owner",
        "others_writable",
        "group_writable",
        "garbage",
        "huge",
        "another_boot",
        "seen_in_the_future",
        "a_symlink",
    ],
)
def test_a_planted_store_is_ignored_and_deletes_nothing(
    children: Children,
    tmpfs_dir: str,  # noqa: F811 - test_cli_gc's fixture
    how: str,
) -> None:
    p = children.spawn([PY, "-c", WRITER, tmpfs_dir])
    assert p.stdout is not None
    name = p.stdout.readline().strip()
    store = _store_path(tmpfs_dir)
    try:
        # The control: root's own well-formed store with that claim is believed (so the plants below
        # would delete a live producer's segment if they were): only root can write root's store.
        _plant(store, _forge(tmpfs_dir, name))
        assert Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev).index, "the control store is read"
        s = Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev)
        assert s.first_seen(s.index[os.lstat(os.path.join(tmpfs_dir, name)).st_ino], name) == 1
        control = {x.name: x for x in Scan(ScanOptions(shm_dir=tmpfs_dir, assume_dead=True))}[name]
        assert control.state is State.LEAKED, control.reason  # believed: "reused", which a deletion would follow

        good = _forge(tmpfs_dir, name)
        if how == "another_owner":
            _plant(store, good, uid=65534)
        elif how == "others_writable":
            _plant(store, good, mode=0o602)
        elif how == "group_writable":
            _plant(store, good, mode=0o620)
        elif how == "garbage":
            _plant(store, good + b"\x00garbage")
        elif how == "huge":
            _plant(store, good[: good.index(b"\n")] + b" 3000000\n" + b"\x00" * (sightings_mod.MAX_BYTES + 1))
        elif how == "another_boot":
            s = Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev)
            assert s.header is not None
            boot = (clock.boot_clock_id() or "").split("/")[0].encode()
            _plant(store, _forge(tmpfs_dir, name, header=s.header.replace(boot, b"0" * len(boot))))
        elif how == "seen_in_the_future":
            _plant(store, _forge(tmpfs_dir, name, seen_ns=clock.boot_clock_ns() + 10**12))
        elif how == "a_symlink":
            elsewhere = store + ".real"
            _plant(elsewhere, good)
            os.unlink(store)
            os.symlink(elsewhere, store)
        assert not Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev).index, "the planted store is read as empty"
        state, deleted = _judge_and_reap(tmpfs_dir, name)
        assert state is State.IN_FLIGHT
        assert not deleted
        assert os.path.exists(os.path.join(tmpfs_dir, name))
    finally:
        for f in (store, store + ".real", store + ".plant"):
            if os.path.lexists(f):
                os.unlink(f)


def test_a_store_in_a_dir_another_user_may_write_is_ignored(tmp_path: Path, tmpfs_dir: str) -> None:  # noqa: F811
    name = f"smg-tokenspeed-1-{time.time_ns()}-0"
    make_file(tmpfs_dir, name)
    d = tmp_path / "store"
    d.mkdir(mode=0o700)
    path = str(d / Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev, directory=str(d)).file)
    _plant(path, _forge(tmpfs_dir, name))
    assert Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev, directory=str(d)).index
    os.chmod(d, 0o777)  # noqa: S103 - the point: a dir anyone may write in
    assert not Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev, directory=str(d)).index


def test_sightings_of_gone_segments_are_pruned_and_the_store_stays_private(tmpfs_dir: str) -> None:  # noqa: F811
    names = [f"smg-tokenspeed-1-{time.time_ns()}-{i}" for i in range(3)]
    for n in names:
        make_file(tmpfs_dir, n)
    list(Scan(ScanOptions(shm_dir=tmpfs_dir, assume_dead=True)))
    store = _store_path(tmpfs_dir)
    try:
        st = os.stat(store)
        assert st.st_mode & 0o077 == 0
        assert st.st_uid == os.geteuid()
        assert len(Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev).index) == 3
        os.unlink(os.path.join(tmpfs_dir, names[0]))
        list(Scan(ScanOptions(shm_dir=tmpfs_dir, assume_dead=True)))
        assert len(Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev).index) == 2
    finally:
        for n in names[1:]:
            os.unlink(os.path.join(tmpfs_dir, n))
        if os.path.exists(store):
            os.unlink(store)


def test_the_store_of_root_is_under_run_and_of_others_in_their_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMGSHM_STATE_DIR", raising=False)  # the suite's own (conftest): off here
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert sightings_mod.store_dir() == "/run/smgshm"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_CACHE_HOME", "/home/u/.cache")
    assert sightings_mod.store_dir() == "/home/u/.cache/smgshm"


def test_an_absolute_state_dir_from_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMGSHM_STATE_DIR", "/var/lib/smgshm")
    assert sightings_mod.store_dir() == "/var/lib/smgshm"
    monkeypatch.setenv("SMGSHM_STATE_DIR", "relative/dir")  # not absolute: ignored
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert sightings_mod.store_dir() == "/run/smgshm"


def test_two_links_of_one_inode_leave_the_store_readable(tmpfs_dir: str) -> None:  # noqa: F811
    """Two names of one inode are one entry to the store (the first name's): written twice, the
    inode made the whole store unreadable, and so every proof in it void."""
    first = make_file(tmpfs_dir, f"smg-tokenspeed-1-{time.time_ns()}-0")
    second = os.path.join(tmpfs_dir, f"smg-tokenspeed-1-{time.time_ns()}-1")
    os.link(first, second)
    other = make_file(tmpfs_dir, f"smg-tokenspeed-1-{time.time_ns()}-2")
    try:
        for _ in range(2):  # the second scan reads what the first wrote
            list(Scan(ScanOptions(shm_dir=tmpfs_dir, assume_dead=True)))
            s = Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev)
            assert not s.note, s.note
            assert sorted(s.index) == sorted({os.lstat(first).st_ino, os.lstat(other).st_ino})
    finally:
        for path in (first, second, other):
            os.unlink(path)
