"""`smgshm gc` against real processes, real holders and real shm dirs (no mocks).

Every scenario spawns the processes it judges: a SIGKILLed producer, a live holder
with an fd or only a mapping, a live producer, a younger process on an old pid,
a producer in another pid namespace. Scratch dirs are either a tmp dir on the root
filesystem or a tmpfs dir under /dev/shm that is not named ``smg-*`` (so the
autouse leak guard and other suites' segments are never involved); only the
pid-namespace tests write into the real /dev/shm, and they never pass --min-age 0
there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import Children, make_file, run_cli, wait_for
from tests.support.cli_gc import (
    HOLDER,
    JUDGE,
    PY,
    SHM,
    SLEEPER,
    WRITER,
    asked_on_a_terminal,
    dead_pid,
    deletions,
    first_line,
    gc,
    kill_and_reap,
    seg_name,
    segs,
    unique,
)

HOUR_NS = 3600 * 10**9
STATES = {"in_flight", "held", "leaked", "stale", "hazard", "unknown"}
ENVELOPE = {"smgshm_version", "schema_version", "command", "ok", "result", "warnings"}
RESULT_KEYS = {
    "shm_dir",
    "segments",
    "counts",
    "bytes_by_state",
    "reclaimable_bytes",
    "shm_total_bytes",
    "shm_used_bytes",
    "shm_free_bytes",
    "liveness_trusted",
    "liveness_note",
    "scan_ms",
    "deleted",
    "remaining_counts",
    "remaining_bytes_by_state",
    "counts_by_kind",
    "bytes_by_kind",
    "remaining_shm_used_bytes",
    "remaining_shm_free_bytes",
    "sightings_stored",
}
SEGMENT_KEYS = {
    "name",
    "kind",
    "file_type",
    "nbytes",
    "allocated_bytes",
    "age_s",
    "uid",
    "producer_pid",
    "producer_alive",
    "holders",
    "state",
    "reason",
    "ino",
    "name_hex",
    "nlink",
    "seen_s",
    "proven_dead",
}
HOLDER_KEYS = {"pid", "comm", "how"}
DELETION_KEYS = {"name", "name_hex", "nbytes", "deleted", "reason", "ino", "freed_bytes"}


# ---------------------------------------------------------------------------------------------
# helpers


def gc_trusting(d: str, *args: str, exit: int = 0) -> dict[str, Any]:
    """gc as an operator runs it: pid liveness only where gc can trust it."""
    doc: dict[str, Any] = run_cli("--json", "gc", "--shm-dir", d, *args, exit=exit).json
    return doc


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
        return f.read().strip()


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def tmp_dir(tmp_path: Path) -> str:
    """A scratch shm dir on the root filesystem (holder detection is by (st_dev, st_ino) anywhere)."""
    d = tmp_path / f"shm-{unique()}"
    d.mkdir()
    return str(d)


@pytest.fixture(params=["tmp", "tmpfs"])
def shm_dir(request: pytest.FixtureRequest) -> str:
    """Both kinds of scratch dir: ext4-or-whatever under /tmp, and tmpfs like production."""
    name = "tmp_dir" if request.param == "tmp" else "tmpfs_dir"
    d: str = request.getfixturevalue(name)
    return d


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
needs_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)


# ---------------------------------------------------------------------------------------------
# leaked, held, in flight, stale


def test_sigkilled_producer_is_leaked_and_deleted(children: Children, shm_dir: str) -> None:
    p, name = first_line(children, [PY, "-c", WRITER, shm_dir])
    path = os.path.join(shm_dir, name)
    kill_and_reap(p)
    assert p.returncode == -signal.SIGKILL

    doc = gc(shm_dir)
    s = segs(doc)[name]
    assert s["state"] == "leaked"
    assert s["kind"] == "gateway"
    assert s["file_type"] == "regular"
    assert s["producer_pid"] == p.pid
    assert s["producer_alive"] is False
    assert s["holders"] == []
    assert s["nbytes"] == 4096
    assert s["uid"] == os.getuid()
    assert s["ino"] == os.lstat(path).st_ino
    assert "no process has that pid" in s["reason"]
    assert doc["result"]["counts"]["leaked"] == 1
    assert doc["result"]["reclaimable_bytes"] == s["allocated_bytes"] > 0
    assert doc["result"]["deleted"] == []
    assert os.path.exists(path), "a scan without --delete must not delete"

    doc = gc(shm_dir, "--delete", "--min-age", "0", "--yes")
    d = deletions(doc)[name]
    assert d["deleted"] is True
    assert d["nbytes"] == s["allocated_bytes"]
    assert not os.path.lexists(path)
    assert gc(shm_dir)["result"]["segments"] == []


@pytest.mark.parametrize("how", ["fd", "map"])
def test_held_segment_is_kept_until_its_holder_dies(children: Children, shm_dir: str, how: str) -> None:
    # Named for a dead producer: without the holder it would be leaked, so "held" must win.
    name = seg_name(dead_pid(children))
    path = make_file(shm_dir, name)
    holder, _ = first_line(children, [PY, "-c", HOLDER, path, how])

    doc = gc(shm_dir)
    s = segs(doc)[name]
    assert s["state"] == "held"
    mine = [h for h in s["holders"] if h["pid"] == holder.pid]
    assert mine, s["holders"]
    assert {h["how"] for h in mine} == {how}, "the map case closed its fd; the fd case never mapped"
    assert mine[0]["comm"] == comm(holder.pid)
    assert str(holder.pid) in s["reason"]
    assert doc["result"]["counts"]["held"] == 1

    doc = gc(shm_dir, "--delete", "--min-age", "0", "--yes")
    assert name not in deletions(doc)
    assert segs(doc)[name]["state"] == "held"
    assert os.path.exists(path)

    kill_and_reap(holder)
    doc = gc(shm_dir, "--delete", "--min-age", "0", "--yes")
    assert segs(doc)[name]["state"] == "leaked"
    assert deletions(doc)[name]["deleted"] is True
    assert not os.path.lexists(path)


def test_live_producer_young_segment_is_in_flight(children: Children, shm_dir: str) -> None:
    p, name = first_line(children, [PY, "-c", WRITER, shm_dir])
    path = os.path.join(shm_dir, name)
    doc = gc(shm_dir, "--delete", "--min-age", "0", "--yes", "--check")
    s = segs(doc)[name]
    assert s["state"] == "in_flight"
    assert s["producer_pid"] == p.pid
    assert s["producer_alive"] is True
    assert s["holders"] == [], "the writer closed its fd: it is a producer, not a holder"
    assert name not in deletions(doc)
    assert os.path.exists(path)
    assert doc["ok"] is True
    os.unlink(path)


@pytest.mark.slow
def test_live_producer_old_segment_is_stale_and_reaped_only_with_include_stale(
    children: Children, tmp_dir: str
) -> None:
    p, name = first_line(children, [PY, "-c", WRITER, tmp_dir])
    path = os.path.join(tmp_dir, name)

    doc = gc(tmp_dir, "--stale-after", "0")
    s = segs(doc)[name]
    assert s["state"] == "stale"
    assert s["producer_alive"] is True
    assert f"producer pid {p.pid} lives, but" in s["reason"]
    # With the default --stale-after the same segment is in flight.
    assert segs(gc(tmp_dir))[name]["state"] == "in_flight"

    doc = gc(tmp_dir, "--stale-after", "0", "--delete", "--min-age", "0", "--yes")
    assert name not in deletions(doc)
    assert os.path.exists(path)

    doc = gc(tmp_dir, "--stale-after", "0", "--delete", "--include-stale", "--min-age", "0", "--yes")
    assert deletions(doc)[name]["deleted"] is True
    assert not os.path.lexists(path)
    assert p.poll() is None, "reaping a stale segment leaves its producer alone"


def test_old_segment_of_an_older_live_producer_is_stale_only_once_seen_that_long(tmp_dir: str) -> None:
    """Two hours old by the wall clock is no proof (a step fakes it): unknown, kept even with
    --include-stale, until smgshm has itself seen the segment for --stale-after (boot clock)."""
    pid = 1  # init started at boot; pretend it wrote a segment two hours ago
    if psutil.Process(pid).create_time() > time.time() - 2.5 * 3600:
        pytest.skip("pid 1 is younger than 2.5 h; no live process old enough")
    name = seg_name(pid, time.time_ns() - 2 * HOUR_NS)
    path = make_file(tmp_dir, name, age_s=2 * 3600)
    doc = gc(tmp_dir, "--delete", "--include-stale", "--min-age", "0", "--yes")
    s = segs(doc)[name]
    assert s["state"] == "unknown", s["reason"]
    assert s["producer_alive"] is True
    assert 7190 <= s["age_s"] <= 7300
    assert s["seen_s"] == 0.0
    assert "old by the wall clock, which can be stepped, but smgshm first saw it only 0 s ago" in s["reason"]
    assert name not in deletions(doc)
    assert os.path.exists(path)
    time.sleep(1.1)
    doc = gc(tmp_dir, "--delete", "--include-stale", "--stale-after", "1s", "--min-age", "1s", "--yes")
    assert segs(doc)[name]["state"] == "stale"
    assert segs(doc)[name]["seen_s"] >= 1.0
    assert deletions(doc)[name]["deleted"] is True
    assert "smgshm has seen the segment for 1 s" in deletions(doc)[name]["reason"]
    assert not os.path.lexists(path)


def test_a_pid_reused_by_the_wall_clock_alone_is_unknown_and_kept(children: Children, tmp_dir: str) -> None:
    """A segment an hour older than the process now holding its pid, first seen after that process
    started: reused unless the wall clock was stepped, which nothing proves. The proof, a sighting
    before the process started, is test_gc_sightings.py's."""
    fresh = children.spawn([PY, "-c", SLEEPER])
    assert psutil.pid_exists(fresh.pid)
    name = seg_name(fresh.pid, time.time_ns() - HOUR_NS)
    path = make_file(tmp_dir, name, age_s=3600)

    doc = gc(tmp_dir)
    s = segs(doc)[name]
    assert s["state"] == "unknown"
    assert "reused unless the clock was stepped" in s["reason"]
    assert s["producer_alive"] is None
    assert s["producer_pid"] == fresh.pid

    doc = gc(tmp_dir, "--delete", "--include-stale", "--yes")  # an hour old: past the default --min-age
    assert name not in deletions(doc)
    assert segs(doc)[name]["state"] == "unknown"
    assert os.path.exists(path)
    assert fresh.poll() is None


def test_reused_pid_needs_both_name_and_mtime_old(children: Children, tmp_dir: str) -> None:
    """The later of name time and mtime counts: an old name on a fresh write is not a reuse."""
    fresh = children.spawn([PY, "-c", SLEEPER])
    name = seg_name(fresh.pid, time.time_ns() - HOUR_NS)
    path = make_file(tmp_dir, name)  # mtime now, after the child started
    s = segs(gc(tmp_dir))[name]
    assert s["state"] == "in_flight"
    assert s["producer_alive"] is True
    os.unlink(path)


# ---------------------------------------------------------------------------------------------
# another pid namespace


@pytest.mark.trust
@needs_unshare
@pytest.mark.timeout(60)
def test_producer_in_another_pid_namespace_makes_pids_untrusted(children: Children) -> None:
    p = children.spawn(["unshare", "--pid", "--fork", "--mount-proc", PY, "-c", WRITER, SHM])
    assert p.stdout is not None
    name = p.stdout.readline().strip()
    extra = seg_name(dead_pid(children), seq=uuid.uuid4().int % 10**9)
    made: list[str] = [os.path.join(SHM, n) for n in (name, extra) if n]
    try:
        if not name:
            p.wait(timeout=10)
            pytest.skip(f"unshare --pid --fork --mount-proc failed: {p.stderr.read() if p.stderr else ''}")
        ns_pid = int(name.split("-")[2])
        assert ns_pid == 1, "with --fork the python is pid 1 of the new namespace"
        make_file(SHM, extra)

        # Read-only first: only trust that has been seen to be off makes --delete safe on /dev/shm.
        doc = run_cli("--json", "gc").json
        r = doc["result"]
        assert r["liveness_trusted"] is False
        assert "another pid namespace" in r["liveness_note"]
        assert any("another pid namespace" in w for w in doc["warnings"])
        s = segs(doc)
        assert s[name]["state"] == "unknown"
        assert s[extra]["state"] == "unknown", "even a pid that is dead here proves nothing"
        judged = [x for x in r["segments"] if x["state"] not in ("hazard", "held")]
        assert judged
        assert {x["state"] for x in judged} == {"unknown"}
        assert r["counts"]["leaked"] == r["counts"]["in_flight"] == r["counts"]["stale"] == 0

        doc = run_cli("--json", "gc", "--delete", "--yes").json
        assert doc["result"]["liveness_trusted"] is False
        assert name not in deletions(doc)
        assert extra not in deletions(doc)
        assert all(os.path.exists(m) for m in made)

        # --assume-dead: judged by this namespace's pids (read-only: never --delete there).
        doc = run_cli("--json", "gc", "--assume-dead").json
        s = segs(doc)
        assert s[name]["state"] == "in_flight", "its pid 1 reads as this host's init"
        assert s[extra]["state"] == "leaked"
        assert not any("another pid namespace" in w for w in doc["warnings"])
    finally:
        kill_and_reap(p)
        for m in made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(m)


@pytest.mark.trust
@needs_unshare
@pytest.mark.timeout(60)
def test_relative_shm_dir_still_sees_another_pid_namespace(children: Children, tmp_dir: str) -> None:
    _, name = first_line(children, ["unshare", "--pid", "--fork", "--mount-proc", PY, "-c", WRITER, tmp_dir])
    absolute = gc_trusting(tmp_dir)["result"]
    assert absolute["liveness_trusted"] is False  # the control: the absolute path is judged right
    assert segs({"result": absolute})[name]["state"] == "unknown"
    rel = gc_trusting(os.path.relpath(tmp_dir))["result"]
    assert rel["liveness_trusted"] is False
    assert segs({"result": rel})[name]["state"] == "unknown"


@pytest.mark.trust
@needs_unshare
@pytest.mark.timeout(60)
def test_container_shm_dir_is_untrusted(children: Children) -> None:
    # A "container": its own pid namespace, mount namespace and private /dev/shm tmpfs.
    inner = f"mount -t tmpfs -o size=1m tmpfs {SHM} && exec {PY} -c '{WRITER}' {SHM}"
    p, name = first_line(children, ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inner])
    host_pid = wait_for(lambda: [c.pid for c in psutil.Process(p.pid).children()], what="the container's pid 1")[0]
    cdir = f"/proc/{host_pid}/root{SHM}"
    assert name in os.listdir(cdir)
    assert name not in os.listdir(SHM), "the container's tmpfs is private"
    doc = gc_trusting(cdir, "--delete", "--yes")
    assert name not in deletions(doc)
    r = doc["result"]
    assert r["liveness_trusted"] is False
    assert segs(doc)[name]["state"] == "unknown"


# ---------------------------------------------------------------------------------------------
# hazards, foreign files, probes, age and owner guards


@pytest.mark.timeout(20)
def test_non_regular_entries_are_hazards_and_never_touched(tmp_path: Path, shm_dir: str) -> None:
    outside = tmp_path / f"outside-{unique()}"
    outside.mkdir()
    target = outside / "precious"
    target.write_bytes(b"do not touch")
    before = os.stat(target)
    u = uuid.uuid4().int % 10**9
    kinds = {
        f"smg-tokenspeed-1-{u}-1": "symlink",  # to a real file outside the shm dir
        f"smg-tokenspeed-1-{u}-2": "symlink",  # to a directory
        f"smg-tokenspeed-1-{u}-3": "symlink",  # dangling
        f"smg-tokenspeed-1-{u}-4": "fifo",
        f"smg-tokenspeed-1-{u}-5": "directory",
        f"smg-tokenspeed-1-{u}-6": "socket",
    }
    names = list(kinds)
    os.symlink(target, os.path.join(shm_dir, names[0]))
    os.symlink(outside, os.path.join(shm_dir, names[1]))
    os.symlink(os.path.join(shm_dir, f"gone-{u}"), os.path.join(shm_dir, names[2]))
    os.mkfifo(os.path.join(shm_dir, names[3]), 0o600)
    os.mkdir(os.path.join(shm_dir, names[4]))
    # AF_UNIX paths are short (108 bytes): bind by a relative name from inside the dir.
    bind = "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"
    subprocess.run([PY, "-c", bind, names[5]], cwd=shm_dir, check=True, timeout=30)
    tests = {"symlink": stat.S_ISLNK, "fifo": stat.S_ISFIFO, "directory": stat.S_ISDIR, "socket": stat.S_ISSOCK}
    for n in names:  # hazards even when old: the guards are not the age filter
        os.utime(os.path.join(shm_dir, n), (time.time() - 3600,) * 2, follow_symlinks=False)

    doc = gc(shm_dir, exit=0)
    s = segs(doc)
    assert set(s) == set(names)
    for n, kind in kinds.items():
        assert s[n]["state"] == "hazard", s[n]
        assert s[n]["file_type"] == kind
        assert "never touched" in s[n]["reason"]
    assert "a FIFO would hang" in s[names[3]]["reason"]
    assert doc["result"]["counts"]["hazard"] == len(names)

    doc = gc(shm_dir, "--delete", "--include-stale", "--min-age", "0", "--yes", "--check", exit=3)
    assert doc["result"]["deleted"] == []
    assert doc["ok"] is False
    for n, kind in kinds.items():
        assert tests[kind](os.lstat(os.path.join(shm_dir, n)).st_mode), n
    assert target.read_bytes() == b"do not touch"
    after = os.stat(target)
    assert (after.st_ino, after.st_mtime_ns, after.st_nlink) == (before.st_ino, before.st_mtime_ns, before.st_nlink)
    assert os.readlink(os.path.join(shm_dir, names[0])) == str(target)


def test_foreign_files_are_not_listed_nor_touched(children: Children, tmp_dir: str) -> None:
    foreign = ["psm_5de18b27", f"torch_{os.getpid()}_{uuid.uuid4().hex[:8]}", f"nccl-{uuid.uuid4().hex[:8]}"]
    stamps: dict[str, tuple[int, int, bytes]] = {}
    for f in foreign:
        path = make_file(tmp_dir, f, size=64, age_s=3600)
        st = os.stat(path)
        stamps[f] = (st.st_ino, st.st_mtime_ns, Path(path).read_bytes())
    leak = seg_name(dead_pid(children))
    make_file(tmp_dir, leak)

    doc = gc(tmp_dir, "--delete", "--min-age", "0", "--include-stale", "--yes")
    listed = set(segs(doc))
    assert listed == {leak}
    assert set(deletions(doc)) == {leak}
    assert deletions(doc)[leak]["deleted"] is True
    for f in foreign:
        path = os.path.join(tmp_dir, f)
        st = os.stat(path)
        assert (st.st_ino, st.st_mtime_ns, Path(path).read_bytes()) == stamps[f], f
    assert sorted(os.listdir(tmp_dir)) == sorted(foreign)


def test_leftover_gateway_probe_is_leaked_with_its_consequence(children: Children, tmp_dir: str) -> None:
    pid = dead_pid(children)
    probe = f"smg-tokenspeed-probe-{pid}"
    own_probe = f"smg-smgshm-probe-{pid}-{time.time_ns()}"
    make_file(tmp_dir, probe, size=0)
    make_file(tmp_dir, own_probe, size=0)

    s = segs(gc(tmp_dir))
    assert s[probe]["kind"] == "gateway_probe"
    assert s[probe]["state"] == "leaked"
    assert s[probe]["producer_pid"] == pid
    assert f"a gateway with pid {pid} will find /dev/shm unwritable and stay inline" in s[probe]["reason"]
    assert s[own_probe]["kind"] == "smgshm_probe"
    assert s[own_probe]["state"] == "leaked"
    assert "stay inline" not in s[own_probe]["reason"], "only the gateway's probe name blocks a gateway"

    doc = gc(tmp_dir, "--delete", "--min-age", "0", "--yes")
    assert deletions(doc)[probe]["deleted"] is True
    assert deletions(doc)[own_probe]["deleted"] is True
    assert os.listdir(tmp_dir) == []


@pytest.mark.slow
def test_default_min_age_keeps_a_just_leaked_segment(children: Children, tmp_dir: str) -> None:
    name = seg_name(dead_pid(children))
    path = make_file(tmp_dir, name)
    doc = gc(tmp_dir, "--delete", "--yes", "--check", exit=3)
    assert segs(doc)[name]["state"] == "leaked"
    d = deletions(doc)[name]
    assert d["deleted"] is False
    assert "--min-age" in d["reason"]
    assert os.path.exists(path)
    # An explicit --min-age that the segment is past lets it go.
    doc = gc(tmp_dir, "--delete", "--yes", "--min-age", "0", "--check")
    assert deletions(doc)[name]["deleted"] is True


@pytest.mark.slow
@needs_root
def test_other_users_segment_is_kept_unless_all_users(children: Children, tmp_dir: str) -> None:
    name = seg_name(dead_pid(children))
    path = make_file(tmp_dir, name)
    os.chown(path, 65534, 65534)

    doc = gc(tmp_dir, "--delete", "--min-age", "0", "--yes")
    assert segs(doc)[name]["uid"] == 65534
    assert segs(doc)[name]["state"] == "leaked"
    d = deletions(doc)[name]
    assert d["deleted"] is False
    assert "owned by uid 65534" in d["reason"]
    assert os.path.exists(path)

    doc = gc(tmp_dir, "--delete", "--min-age", "0", "--yes", "--all-users")
    assert deletions(doc)[name]["deleted"] is True
    assert not os.path.lexists(path)


# ---------------------------------------------------------------------------------------------
# --check, --json, --prometheus, --watch, errors, human output


@pytest.mark.slow
def test_check_exit_codes(children: Children, tmp_dir: str) -> None:
    doc = gc(tmp_dir, "--check")
    assert doc["ok"] is True
    assert doc["result"]["segments"] == []
    assert set(doc["result"]["counts"].values()) == {0}

    names = [seg_name(dead_pid(children), seq=i) for i in range(3)]
    for n in names:
        make_file(tmp_dir, n)
    doc = gc(tmp_dir, "--check", exit=3)
    assert doc["ok"] is False
    assert doc["result"]["counts"]["leaked"] == 3
    run_cli("gc", "--shm-dir", tmp_dir, *JUDGE, "--check", exit=3)  # human mode too

    doc = gc(tmp_dir, "--check", "--delete", "--min-age", "0", "--yes")
    assert all(d["deleted"] for d in doc["result"]["deleted"])
    assert len(doc["result"]["deleted"]) == 3
    assert gc(tmp_dir, "--check")["result"]["segments"] == []


def test_check_of_look_alikes_alone_is_inconclusive_never_passed(tmp_dir: str) -> None:
    """SMG-family names without a pid are unknown whoever looks: a --check of only them judged nothing, so it
    exits 6 (2 under --npd), never "check passed"."""
    for n in ("smg-foo", "smg-tokenspeed-12x"):
        make_file(tmp_dir, n)
    doc = gc(tmp_dir, "--check", exit=6)
    assert doc["result"]["counts"]["unknown"] == 2
    assert [w for w in doc["warnings"] if w.startswith("check inconclusive: all 2 SMG segment(s) unknown")]
    text = run_cli("gc", "--shm-dir", tmp_dir, *JUDGE, "--check", exit=6).stdout
    assert text.startswith("check inconclusive: 2 SMG segment(s)"), text
    assert "check passed" not in text
    assert run_cli("gc", "--shm-dir", tmp_dir, *JUDGE, "--check", "--npd", exit=2).stdout.startswith("gc: 2 unknown")


@pytest.mark.slow
@pytest.mark.pidns
@needs_unshare
@pytest.mark.timeout(60)
def test_check_of_only_unknown_segments_is_inconclusive_never_passed(children: Children, tmp_dir: str) -> None:
    """A producer in another pid namespace reaches the dir: no pid there means anything, every segment is
    unknown, and a --check that judged nothing exits 6 with how many and why (2 under --npd), never 0."""
    _, name = first_line(children, ["unshare", "--pid", "--fork", "--mount-proc", PY, "-c", WRITER, tmp_dir])
    extra = seg_name(dead_pid(children), seq=1)  # dead here: proves nothing either
    make_file(tmp_dir, extra)

    doc = gc_trusting(tmp_dir, "--check", exit=6)
    assert doc["ok"] is False
    assert doc["result"]["liveness_trusted"] is False
    assert doc["result"]["counts"]["unknown"] == 2
    [said] = [w for w in doc["warnings"] if w.startswith("check inconclusive")]
    assert "all 2 SMG segment(s) unknown" in said
    assert "another pid namespace" in said

    text = run_cli("gc", "--shm-dir", tmp_dir, "--check", exit=6).stdout
    head = " ".join(text.split("\nby state:", 1)[0].split())
    assert head.startswith("check inconclusive: 2 SMG segment(s)"), head
    assert "2 unknown" in head
    assert "nothing could be judged: processes in another pid namespace" in head
    assert "check passed" not in text
    raw = run_cli("gc", "--shm-dir", tmp_dir, "--check", "--raw", exit=6)
    assert "check inconclusive" in raw.stderr
    assert run_cli("gc", "--shm-dir", tmp_dir, "--check", "--npd", exit=2).stdout.startswith("gc: 2 unknown")

    # Judged by this namespace's pids, the dead producer's segment is leaked: a verdict again (3).
    gc(tmp_dir, "--check", exit=3)
    os.unlink(os.path.join(tmp_dir, extra))
    os.unlink(os.path.join(tmp_dir, name))
    # An empty dir is judged, untrusted or not: nothing there is nothing leaked.
    assert gc_trusting(tmp_dir, "--check")["ok"] is True
    assert run_cli("gc", "--shm-dir", tmp_dir, "--check").stdout.startswith("check passed: 0 SMG segment(s)")


@pytest.mark.slow
def test_json_schema(children: Children, tmp_dir: str) -> None:
    leak = seg_name(dead_pid(children), seq=0)
    held = seg_name(dead_pid(children), seq=1)
    make_file(tmp_dir, leak)
    holder, _ = first_line(children, [PY, "-c", HOLDER, make_file(tmp_dir, held), "fd"])

    doc = gc(tmp_dir, "--delete", "--min-age", "0", "--yes")
    assert set(doc) == ENVELOPE
    assert doc["schema_version"] == 1
    assert doc["command"] == "gc"
    r = doc["result"]
    assert set(r) == RESULT_KEYS
    assert set(r["counts"]) == STATES
    assert set(r["bytes_by_state"]) == STATES
    assert r["shm_dir"] == tmp_dir
    assert isinstance(r["scan_ms"], float)
    assert r["scan_ms"] >= 0
    assert isinstance(r["liveness_trusted"], bool)
    assert r["shm_total_bytes"] >= r["shm_free_bytes"] >= 0
    assert r["shm_used_bytes"] == r["shm_total_bytes"] - r["shm_free_bytes"]
    assert sorted(s["name"] for s in r["segments"]) == sorted([leak, held]), "streamed in dir order"
    for s in r["segments"]:
        assert set(s) == SEGMENT_KEYS
        assert s["state"] in STATES
        assert isinstance(s["age_s"], float)
    h = segs(doc)[held]["holders"]
    assert h
    for entry in h:
        assert set(entry) == HOLDER_KEYS
    assert holder.pid in {entry["pid"] for entry in h}
    assert len(r["deleted"]) == 1
    for d in r["deleted"]:
        assert set(d) == DELETION_KEYS
        assert isinstance(d["deleted"], bool)
    assert r["deleted"][0]["name"] == leak
    kill_and_reap(holder)
    os.unlink(os.path.join(tmp_dir, held))


def _metrics(path: str) -> dict[str, dict[str, float]]:
    """metric name -> state (or '') -> value, with every sample's shm_dir label collected too."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(Path(path).read_text(encoding="utf-8")):
        for sample in fam.samples:
            out.setdefault(sample.name, {})[sample.labels.get("state", "")] = sample.value
            out.setdefault("_shm_dir", {})[sample.labels["shm_dir"]] = 1
    return out


def test_prometheus_textfile(children: Children, tmp_path: Path, tmp_dir: str) -> None:
    for i in range(2):
        make_file(tmp_dir, seg_name(dead_pid(children), seq=i), size=8192)
    os.mkfifo(os.path.join(tmp_dir, seg_name(1, seq=9)))
    prom = str(tmp_path / "smgshm.prom")
    doc = gc(tmp_dir, "--prometheus", prom)
    r = doc["result"]
    m = _metrics(prom)
    assert m["smgshm_gc_segments"]["leaked"] == r["counts"]["leaked"] == 2
    assert m["smgshm_gc_segments"]["hazard"] == 1
    assert set(m["smgshm_gc_segments"]) == STATES
    assert set(m["smgshm_gc_segment_bytes"]) == STATES
    assert m["smgshm_gc_segment_bytes"]["leaked"] == r["bytes_by_state"]["leaked"] >= 2 * 8192
    assert m["smgshm_gc_shm_free_bytes"][""] > 0
    assert set(m["_shm_dir"]) == {tmp_dir}


@pytest.mark.slow
def test_prometheus_after_delete_counts_what_is_left(children: Children, tmp_path: Path, tmp_dir: str) -> None:
    for i in range(2):
        make_file(tmp_dir, seg_name(dead_pid(children), seq=i))
    prom = str(tmp_path / "smgshm.prom")
    doc = gc(tmp_dir, "--delete", "--min-age", "0", "--yes", "--check", "--prometheus", prom)
    assert all(d["deleted"] for d in doc["result"]["deleted"])
    assert os.listdir(tmp_dir) == []
    assert _metrics(prom)["smgshm_gc_segments"]["leaked"] == 0


@pytest.mark.slow
def test_watch_json_and_human(children: Children, tmp_dir: str) -> None:
    make_file(tmp_dir, seg_name(dead_pid(children)))
    doc = gc(tmp_dir, "--watch", "0.05", "--watch-count", "3")
    r = doc["result"]
    assert r["scans"] == 3
    assert set(r["growth"]) == STATES
    assert set(r["growth"].values()) == {0}
    assert r["first"] == r["last"]
    assert r["last"]["leaked"] == 1

    out = run_cli("gc", "--shm-dir", tmp_dir, *JUDGE, "--watch", "0.05", "--watch-count", "3").stdout
    lines = out.splitlines()
    assert len(lines) == 3, out
    for line in lines:
        assert re.fullmatch(r"\d\d:\d\d:\d\d 1 segments: in_flight 0, held 0, leaked 1, .*unknown 0", line), line


@pytest.mark.parametrize("flag", ["--delete", "--check", "--prometheus"])
def test_watch_does_not_silently_drop_flags(children: Children, tmp_path: Path, tmp_dir: str, flag: str) -> None:
    from click.testing import CliRunner

    from smgshm.cli import cli

    path = make_file(tmp_dir, seg_name(dead_pid(children)))
    prom = tmp_path / "watch.prom"
    extra = {
        "--delete": ["--delete", "--min-age", "0", "--yes"],
        "--check": ["--check"],
        "--prometheus": ["--prometheus", str(prom)],
    }[flag]
    argv = ["gc", "--shm-dir", tmp_dir, *JUDGE, "--watch", "0.05", "--watch-count", "1", *extra]
    res = CliRunner().invoke(cli, argv, catch_exceptions=False)
    honoured = {
        "--delete": not os.path.lexists(path),
        "--check": res.exit_code == 3,
        "--prometheus": prom.exists(),
    }[flag]
    assert res.exit_code == 2 or honoured, (res.exit_code, res.stdout, res.stderr)


def test_missing_shm_dir_is_a_host_error() -> None:
    missing = f"/nonexistent-smgshm-{unique()}"
    res = run_cli("gc", "--shm-dir", missing, exit=5)
    assert "shm dir does not exist" in res.stderr
    assert missing in res.stderr
    doc = run_cli("--json", "gc", "--shm-dir", missing, exit=5).json
    assert doc["ok"] is False
    assert doc["error"]["kind"] == "host"
    run_cli("gc", "--shm-dir", missing, "--watch", "0.05", "--watch-count", "2", exit=5)


def test_human_output_tells_the_story(children: Children, tmp_dir: str) -> None:
    from smgshm.cli.fmt import quote_cmd

    name = seg_name(dead_pid(children))
    make_file(tmp_dir, name)
    res = run_cli("gc", "--shm-dir", tmp_dir, *JUDGE)
    lines = res.stdout.splitlines()
    assert lines[0] == f"1 SMG segment(s) in {tmp_dir}: 1 leaked"
    assert "by state: leaked 1 (4.0 KiB)" in lines
    assert "by kind: gateway 1 (4.0 KiB)" in lines
    assert any(ln.startswith("leaked ") and ln.endswith(f"  {name}") for ln in lines), res.stdout
    assert "why: producer pid" in res.stdout
    assert "no process has that pid" in res.stdout
    assert quote_cmd(["smgshm", "gc", "--shm-dir", tmp_dir, "--delete", *JUDGE]) in res.stderr

    res = run_cli("gc", "--shm-dir", tmp_dir, *JUDGE, "--delete", "--min-age", "0", "--yes")
    lines = res.stdout.splitlines()
    # Shown before, done after: the first line says what was done and what is left.
    assert "will delete 1 segment(s), 4.0 KiB:" in res.stderr
    assert name in res.stderr
    assert lines[0] == f"deleted 1, freed 4.0 KiB; 0 SMG segment(s) left in {tmp_dir}: none"
    assert any(ln.startswith("deleted ") and ln.endswith(f"  {name}") for ln in lines), res.stdout
    assert res.stdout.count(name) == 1, "each reaped segment is listed once: its row, marked deleted"
    assert not [ln for ln in lines if ln.startswith("leaked") and name in ln], "a deleted entry is not listed leaked"
    assert "--delete" not in res.stderr.split("will delete")[0]
    assert not os.path.lexists(os.path.join(tmp_dir, name))


PROBE = (
    "import sys\n"
    "from smgshm.cli import main\n"
    "sys.argv = ['smgshm', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    "heavy = sorted(m for m in ('torch', 'grpc', 'smgshm.rpc', 'smg_grpc_proto') if m in sys.modules)\n"
    "sys.stderr.write('HEAVY=' + ','.join(heavy) + '\\n')\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["gc", "--help"], ["gc"], ["--json", "gc", "--prometheus", "PROM"]])
def test_gc_does_not_import_torch_or_grpc(argv: list[str], tmp_path: Path) -> None:
    argv = [str(tmp_path / "x.prom") if a == "PROM" else a for a in argv]
    res = subprocess.run([PY, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60)
    assert "HEAVY=\n" in res.stderr, res.stderr
    assert res.stdout.strip(), "the command printed nothing"


@needs_root
@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", ["other_fs", "same_fs"])
def test_a_file_bind_mounted_over_a_segment_name_is_a_hazard_never_touched(
    children: Children, tmp_path: Path, source: str
) -> None:
    """A bind mount over a segment name: its inode is the mounted file's (another filesystem's, or
    this one's if bound from inside it, then with the same st_dev). unlink says EBUSY; gc must not
    call it leaked nor count it reclaimable."""
    from smgshm.core.host.mountpoints import mounted_names
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "shm", "4m") as d:
        victim = tmp_path / "victim.dat" if source == "other_fs" else Path(d) / "victim.dat"
        victim.write_bytes(b"v" * 8192)
        name = seg_name(dead_pid(children), nanos=1700000000000000000)
        over = make_file(d, name, age_s=3600)
        subprocess.run(["mount", "--bind", str(victim), over], check=True, timeout=30)
        try:
            doc = run_cli("--json", "gc", "--shm-dir", d, "--assume-dead").json
            seg = segs(doc)[name]
            assert seg["state"] == "hazard", seg
            assert "mount point" in seg["reason"]
            assert doc["result"]["reclaimable_bytes"] == 0
            doc = run_cli("--json", "gc", "--shm-dir", d, "--assume-dead", "--delete", "--yes", "--min-age", "0").json
            assert name not in deletions(doc), "a mount point is never chosen for deletion"
            assert victim.read_bytes() == b"v" * 8192
            assert name in mounted_names(d), "still mounted"
        finally:
            subprocess.run(["umount", over], check=True, timeout=30)


@needs_unshare
@pytest.mark.timeout(60)
def test_a_segment_name_mounted_on_only_in_another_mount_namespace_is_a_hazard(
    children: Children, tmp_path: Path
) -> None:
    """A file of this very filesystem bind-mounted over a segment name in another mount namespace
    only: here the name is a plain regular file of the dir's st_dev, and rename and unlink succeed
    (Linux refuses them with EBUSY only for this namespace's mounts) and silently detach that
    namespace's mount. gc lists it as a hazard, says where it is mounted, and never deletes it."""
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "shm", "4m") as d:
        victim = Path(d) / "victim.dat"
        victim.write_bytes(b"v" * 8192)
        name = seg_name(dead_pid(children), nanos=1700000000000000000)
        over = make_file(d, name, age_s=3600)
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount --bind {victim} {over} && echo ready && exec sleep 600",
        ]
        p, _ = first_line(children, argv)
        inside = f"/proc/{p.pid}/root{over}"  # the name as that namespace sees it: the victim
        assert Path(inside).read_bytes() == b"v" * 8192
        assert Path(over).read_bytes() == b"\x5a" * 4096
        assert os.stat(over).st_dev == os.stat(d).st_dev

        seg = segs(gc(d))[name]  # --assume-dead: the pid is dead, so only the mount keeps it
        assert seg["state"] == "hazard", seg
        assert "another mount namespace" in seg["reason"], seg
        assert f"pid {p.pid}" in seg["reason"], seg
        doc = gc(d, "--delete", "--yes", "--min-age", "0")
        assert name not in deletions(doc), "a mount point elsewhere is never chosen for deletion"
        assert doc["result"]["reclaimable_bytes"] == 0
        assert Path(inside).read_bytes() == b"v" * 8192, "that namespace's mount is still there"
        assert Path(over).read_bytes() == b"\x5a" * 4096
        kill_and_reap(p)  # its mount namespace, and the bind mount, go with it


@pytest.mark.slow
@needs_root
@pytest.mark.timeout(60)
def test_after_delete_the_usage_shown_is_read_again(children: Children, tmp_path: Path) -> None:
    """The footer's used/free (and JSON's remaining_shm_*, the textfile's free bytes) are the
    filesystem after the delete, not the statvfs the scan took before it."""
    from smgshm.core.units import human_size
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "shm", "8m") as d:
        make_file(d, seg_name(dead_pid(children), seq=1), size=2 << 20, age_s=3600)
        make_file(d, seg_name(dead_pid(children), seq=2), size=2 << 20, age_s=3600)
        res = run_cli("--no-color", "gc", "--shm-dir", d, "--assume-dead", "--delete", "--yes")
        vfs = os.statvfs(d)
        used, free = (vfs.f_blocks - vfs.f_bavail) * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize
        assert (
            f"{d}: {human_size(used)} used of {human_size(vfs.f_blocks * vfs.f_frsize)}, "
            f"{human_size(free)} free" in " ".join(res.stdout.split())
        ), res.stdout
        make_file(d, seg_name(dead_pid(children), seq=3), size=2 << 20, age_s=3600)
        prom = tmp_path / "gc.prom"
        r = run_cli(
            "--json", "gc", "--shm-dir", d, "--assume-dead", "--delete", "--yes", "--prometheus", str(prom)
        ).json["result"]
        assert r["shm_used_bytes"] - r["remaining_shm_used_bytes"] >= 2 << 20, "the scan's figure is before"
        assert r["remaining_shm_free_bytes"] == os.statvfs(d).f_bavail * vfs.f_frsize
        line = next(ln for ln in prom.read_text().splitlines() if ln.startswith("smgshm_gc_shm_free_bytes{"))
        assert float(line.rsplit(" ", 1)[1]) == r["remaining_shm_free_bytes"]


# ---------------------------------------------------------------------------------------------
# the question --delete asks on a terminal: a real pty for stdin, the answer typed into it


def _asked(children: Children, d: str, *extra: str) -> tuple[subprocess.Popen[str], int, str]:
    """``gc --delete`` with a pty for stdin, returned once it has asked."""
    argv = [PY, "-m", "smgshm", "gc", "--shm-dir", d, *JUDGE, "--delete", "--min-age", "0", *extra]
    return asked_on_a_terminal(children, argv)


@pytest.mark.parametrize(("answer", "what"), [(b"n\n", "no"), (b"\n", "empty"), (b"\x04", "end of input")])
def test_declining_deletes_nothing_and_is_no_error(children: Children, tmp_dir: str, answer: bytes, what: str) -> None:
    path = make_file(tmp_dir, seg_name(dead_pid(children)))
    p, master, said = _asked(children, tmp_dir)
    try:
        assert "delete these 1 segment(s)?" in said
        os.write(master, answer)  # \x04 is the terminal's end of file (Ctrl-D at the start of a line)
        out, err = p.communicate(timeout=60)
    finally:
        os.close(master)
    assert p.returncode == 0, f"{what}: {err}"
    assert "nothing deleted" in err
    headline = out.splitlines()[0]  # the leak is still there, and said so
    assert headline.startswith("1 SMG segment(s)"), out
    assert headline.endswith(": 1 leaked"), out
    assert "Aborted" not in err
    assert "Traceback" not in err
    assert os.path.exists(path)


def test_declining_with_check_still_fails_the_check(children: Children, tmp_dir: str) -> None:
    """--check judges what is left: a declined delete leaves the leak, so exit 3 (not 1, not 0)."""
    path = make_file(tmp_dir, seg_name(dead_pid(children)))
    p, master, _ = _asked(children, tmp_dir, "--check")
    try:
        os.write(master, b"no\n")
        _, err = p.communicate(timeout=60)
    finally:
        os.close(master)
    assert p.returncode == 3, err
    assert os.path.exists(path)


@pytest.mark.slow
def test_yes_deletes_and_ctrl_c_at_the_question_is_an_interruption(children: Children, tmp_dir: str) -> None:
    path = make_file(tmp_dir, seg_name(dead_pid(children)))
    p, master, _ = _asked(children, tmp_dir)
    try:
        p.send_signal(signal.SIGINT)  # Ctrl-C while it waits for the answer
        _, err = p.communicate(timeout=60)
    finally:
        os.close(master)
    assert p.returncode == 130, err
    assert "Traceback" not in err
    assert os.path.exists(path)
    p, master, _ = _asked(children, tmp_dir)
    try:
        os.write(master, b"y\n")
        _, err = p.communicate(timeout=60)
    finally:
        os.close(master)
    assert p.returncode == 0, err
    assert not os.path.lexists(path)
