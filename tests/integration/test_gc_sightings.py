"""gc's proofs on the boot clock (issue #21, finding 2): sightings, pid reuse, staleness, a hostile store.

The reuse proofs run for real in a fresh pid and mount namespace (``unshare --pid --fork --mount-proc
--mount``): a private tmpfs is the shm dir, another is /run (so the store, /run/smgshm, is private
to the run and goes with it), and ``ns_last_pid`` makes the next fork take the pid P that a segment
names. So a process holding P really starts after, or before, gc first saw the segment.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest

from smgshm.core.host import clock
from smgshm.core.segments import sightings as sightings_mod
from smgshm.core.segments.judge import ScanOptions, State
from smgshm.core.segments.reaping import ReapRule, choose, reap_choice
from smgshm.core.segments.scan import Scan
from smgshm.core.segments.sightings import Sightings
from tests.conftest import Children, make_file, run_cli
from tests.support.cli_gc import PY, WRITER, dead_pid, gc, seg_name, segs
from tests.support.gc_sightings import _forge, _plant, _store_path, needs_pidns, run_scenario

# judges liveness trusted: never beside a test that makes pid namespaces (tests/conftest.py)
pytestmark = pytest.mark.trust

HOUR_S = 3600


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_live_producers_segment_is_stale_only_once_seen_for_stale_after(
    children: Children,
    tmpfs_dir: str,
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


def _judge_and_reap(d: str, name: str) -> tuple[State, bool]:
    scan = Scan(ScanOptions(shm_dir=d, assume_dead=True))
    got: dict[str, State] = {}
    rule = ReapRule(frozenset({State.LEAKED, State.STALE}), 0.0)
    choice = choose(scan, rule, lambda s, row: got.update({s.name: s.state}))
    done = {x.name: x.deleted for x in reap_choice(scan, choice).deleted}
    return got[name], done.get(name, False)


@pytest.mark.slow
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
    tmpfs_dir: str,
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


# --- a proven-dead producer's segment is reaped at once (issue #29: fixes that work when pasted) ------


@pytest.mark.usefixtures("trusting")
def test_gcs_own_hint_reaps_a_just_leaked_segment_when_pasted(children: Children, tmpfs_dir: str) -> None:
    """``smgshm gc`` lists a segment whose producer died a moment ago and hints ``smgshm gc ... --delete``:
    pasted, that reaps it now (the listing saw it before the delete's pid check), not 10 minutes later."""
    name = seg_name(dead_pid(children))
    path = make_file(tmpfs_dir, name)
    res = run_cli("gc", "--shm-dir", tmpfs_dir)
    lines = res.stderr.splitlines()
    at = next(i for i, ln in enumerate(lines) if "reap them with" in ln)
    argv = shlex.split(lines[at + 1])
    assert argv[:2] == ["smgshm", "gc"]
    assert "--delete" in argv
    doc = run_cli("--json", *argv[1:]).json  # as pasted: no --min-age, no --yes (a non-TTY run never asks)
    assert doc["result"]["liveness_trusted"] is True
    assert [(d["name"], d["deleted"]) for d in doc["result"]["deleted"]] == [(name, True)], doc["result"]["deleted"]
    assert not os.path.lexists(path)


@pytest.mark.usefixtures("trusting")
def test_a_segment_first_seen_by_the_delete_itself_waits_until_the_next_run(children: Children, tmpfs_dir: str) -> None:
    """Seen first by the very run whose pid check came before it: a process that joined another pid
    namespace since could have written it, so --min-age keeps it, and says when it is reclaimable; the
    next run's check comes after this run's sighting, and reaps it."""
    name = seg_name(dead_pid(children))
    path = make_file(tmpfs_dir, name)
    doc = run_cli("--json", "gc", "--shm-dir", tmpfs_dir, "--delete", "--yes").json
    assert doc["result"]["liveness_trusted"] is True
    d = {x["name"]: x for x in doc["result"]["deleted"]}[name]
    assert d["deleted"] is False
    assert "first saw it after its pid check: the next run" in d["reason"]
    assert "reaps it at once" in d["reason"]
    assert segs(doc)[name]["proven_dead"] is False
    doc = run_cli("--json", "gc", "--shm-dir", tmpfs_dir, "--delete", "--yes").json
    assert segs(doc)[name]["proven_dead"] is True
    assert {x["name"]: x["deleted"] for x in doc["result"]["deleted"]} == {name: True}
    assert not os.path.lexists(path)


@pytest.mark.usefixtures("trusting")
def test_a_delete_that_keeps_a_segment_by_min_age_hints_the_run_that_reaps_it(
    children: Children, tmpfs_dir: str
) -> None:
    name = seg_name(dead_pid(children))
    path = make_file(tmpfs_dir, name)
    res = run_cli("gc", "--shm-dir", tmpfs_dir, "--delete")
    kept = " ".join(res.stdout.split())
    assert f"kept {name}: its producer is dead, but this run first saw it after its pid check" in kept, kept
    assert "the next run, whose check follows this run's stored sighting, reaps it at once" in kept
    assert "younger than --min-age" not in kept
    lines = res.stderr.splitlines()
    at = next(i for i, ln in enumerate(lines) if "the next run's" in ln)
    assert "so it reaps them at once:" in " ".join(lines[at : at + 3])
    argv = shlex.split(next(ln for ln in lines[at:] if ln.strip().startswith("smgshm gc")))
    assert argv == ["smgshm", "gc", "--shm-dir", tmpfs_dir, "--delete"]
    run_cli(*argv[1:])
    assert not os.path.lexists(path)


def test_assume_dead_hints_when_min_age_lets_the_segment_go(children: Children, tmpfs_dir: str) -> None:
    make_file(tmpfs_dir, seg_name(dead_pid(children)), age_s=60)
    res = run_cli("gc", "--shm-dir", tmpfs_dir, "--assume-dead")
    hint = " ".join(ln.strip() for ln in res.stderr.splitlines())
    assert "--assume-dead proves no producer dead, so --min-age (10 min) keeps each until it is that old" in hint
    assert "the youngest is reclaimable in 9 min" in hint
    assert f"smgshm gc --shm-dir {tmpfs_dir} --delete --assume-dead" in hint


def test_assume_dead_keeps_min_age_however_often_a_segment_was_seen(children: Children, tmpfs_dir: str) -> None:
    name = seg_name(dead_pid(children))
    path = make_file(tmpfs_dir, name)
    gc(tmpfs_dir)  # a listing: a sighting
    doc = gc(tmpfs_dir, "--delete", "--yes")  # (gc() passes --assume-dead)
    assert segs(doc)[name]["state"] == "leaked"
    assert segs(doc)[name]["proven_dead"] is False
    assert {x["name"]: x["deleted"] for x in doc["result"]["deleted"]} == {name: False}
    assert os.path.exists(path)
