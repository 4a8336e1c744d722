"""The state dir is someone else's (issue #31, item 4): a dir named by $SMGSHM_STATE_DIR that others may write
in, or that is not this user's, is refused for the sightings store, never chmod'ed, and the run says so.

A root gc once made a shared 1777 dir 1755: for /dev/shm that turns every non-root gateway's SHM off.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import make_file, run_cli
from tests.support.cli_gc import gc, seg_name, tmpfs_dir

__all__ = ["tmpfs_dir"]  # the fixture, used by name

NOBODY = 65534


@pytest.mark.parametrize(
    ("mode", "owner", "why"),
    [
        (0o1777, None, "writable by group and others (mode 1777)"),
        (0o770, None, "writable by group (mode 0770)"),
        (0o755, NOBODY, f"owned by uid {NOBODY}"),
    ],
    ids=["shared-1777", "group-writable", "another-users"],
)
def test_a_state_dir_others_may_write_is_refused_unchanged_and_said(
    tmp_path: Path, tmpfs_dir: str, monkeypatch: pytest.MonkeyPatch, mode: int, owner: int | None, why: str
) -> None:
    state = tmp_path / "shared"
    state.mkdir()
    os.chmod(state, mode)
    if owner is not None:
        os.chown(state, owner, owner)
    before = os.stat(state)
    monkeypatch.setenv("SMGSHM_STATE_DIR", str(state))
    make_file(tmpfs_dir, seg_name(os.getpid()))  # a name with a pid: one gc would record a sighting of
    doc = gc(tmpfs_dir)
    after = os.stat(state)
    assert (stat.S_IMODE(after.st_mode), after.st_uid) == (mode, before.st_uid)  # never chmod'ed
    assert os.listdir(state) == []  # nothing stored there, no lock file, no temp file
    assert doc["result"]["sightings_stored"] is False
    said = [w for w in doc["warnings"] if w.startswith("sightings not stored")]
    assert len(said) == 1, doc["warnings"]
    assert f"state dir {state}: {why}" in said[0]


def test_a_state_dir_smgshm_makes_is_private_and_stores(
    tmp_path: Path, tmpfs_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "made" / "state"
    monkeypatch.setenv("SMGSHM_STATE_DIR", str(state))
    make_file(tmpfs_dir, seg_name(os.getpid()))
    old = os.umask(0o002)  # a permissive umask: the dir smgshm makes is still exactly 0700
    try:
        doc = gc(tmpfs_dir)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert doc["result"]["sightings_stored"] is True
    assert not [w for w in doc["warnings"] if w.startswith("sightings not stored")]


def test_watch_says_a_refused_state_dir_and_leaves_it_as_it_was(
    tmp_path: Path, tmpfs_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "shared"
    state.mkdir()
    os.chmod(state, 0o1777)  # noqa: S103 - the point: a shared dir anyone may write in
    monkeypatch.setenv("SMGSHM_STATE_DIR", str(state))
    make_file(tmpfs_dir, seg_name(os.getpid()))  # found by watch's listing at once: a sighting it would store
    doc = run_cli("--json", "watch", "--shm-dir", tmpfs_dir, "--count", "2", "--interval", "0.1").json
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o1777
    assert os.listdir(state) == []
    said = [w for w in doc["warnings"] if w.startswith("sightings not stored")]
    assert len(said) == 1, doc["warnings"]
    assert f"state dir {state}: writable by group and others (mode 1777)" in said[0]
