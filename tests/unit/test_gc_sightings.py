"""gc's proofs on the boot clock (issue #21, finding 2): sightings, pid reuse, staleness, a hostile store.

The reuse proofs run for real in a fresh pid and mount namespace (``unshare --pid --fork --mount-proc
--mount``): a private tmpfs is the shm dir, another is /run (so the store, /run/smgshm, is private
to the run and goes with it), and ``ns_last_pid`` makes the next fork take the pid P that a segment
names. So a process holding P really starts after, or before, gc first saw the segment.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from smgshm.core.segments import sightings as sightings_mod
from smgshm.core.segments.judge import ScanOptions
from smgshm.core.segments.scan import Scan
from smgshm.core.segments.sightings import Sightings
from tests.conftest import make_file
from tests.support.gc_sightings import _forge, _plant, _store_path


def test_a_store_in_a_dir_another_user_may_write_is_ignored(tmp_path: Path, tmpfs_dir: str) -> None:
    name = f"smg-tokenspeed-1-{time.time_ns()}-0"
    make_file(tmpfs_dir, name)
    d = tmp_path / "store"
    d.mkdir(mode=0o700)
    path = str(d / Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev, directory=str(d)).file)
    _plant(path, _forge(tmpfs_dir, name))
    assert Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev, directory=str(d)).index
    os.chmod(d, 0o777)  # noqa: S103 - the point: a dir anyone may write in
    assert not Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev, directory=str(d)).index


def test_sightings_of_gone_segments_are_pruned_and_the_store_stays_private(tmpfs_dir: str) -> None:
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


def test_two_links_of_one_inode_leave_the_store_readable(tmpfs_dir: str) -> None:
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


def test_a_full_store_keeps_the_first_listed_and_says_how_many_it_dropped(
    tmpfs_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is bounded (MAX_RECORDS): a scan that first sees more keeps the first it listed, counts the
    rest as dropped, and does not claim its sightings stored; the listing itself is whole."""
    monkeypatch.setattr(sightings_mod, "MAX_RECORDS", 3)
    names = [f"smg-tokenspeed-1-{time.time_ns()}-{i}" for i in range(5)]
    for n in names:
        make_file(tmpfs_dir, n)
    store = _store_path(tmpfs_dir)
    try:
        scan = Scan(ScanOptions(shm_dir=tmpfs_dir, assume_dead=True))
        assert len(list(scan)) == 5
        assert (scan.sightings.dropped, scan.sightings.stored) == (2, False)
        assert len(Sightings(tmpfs_dir, os.stat(tmpfs_dir).st_dev).index) == 3
    finally:
        for n in names:
            os.unlink(os.path.join(tmpfs_dir, n))
        if os.path.exists(store):
            os.unlink(store)
