"""core/watch/follow.py against real directories: /dev/shm itself and private tmpfs mounts."""

from __future__ import annotations

import os
import subprocess

import pytest

from smgshm.core.errors import HostError
from smgshm.core.watch.follow import SegmentTracker, ShmWatcher
from tests.conftest import make_file
from tests.support.watch_follow import collect, removed

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a private tmpfs needs root")


def test_renames_are_created_and_removed(tmpfs: str) -> None:
    prefix = "smg-smgshm-"
    tracker = SegmentTracker()
    with ShmWatcher(tmpfs, prefix) as w:
        tracker.feed(w.events(0))
        tmp = make_file(tmpfs, "staging", 10)  # outside SMG's names: not reported
        os.rename(tmp, os.path.join(tmpfs, "smg-smgshm-1-2-3"))
        os.rename(os.path.join(tmpfs, "smg-smgshm-1-2-3"), os.path.join(tmpfs, "elsewhere"))
        evs = collect(w, removed("smg-smgshm-1-2-3"))
        os.unlink(os.path.join(tmpfs, "elsewhere"))
    assert [(e.kind, e.detail) for e in evs] == [("created", "moved"), ("removed", "moved")]
    (life,) = tracker.feed(evs)
    assert life.end == "unknown"
    assert "renamed" in life.note


def _flood(d: str, prefix: str, n: int) -> None:
    for i in range(n):
        p = os.path.join(d, f"{prefix}flood-{i}")
        os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(p)


def test_queue_overflow_is_said_and_followed_by_a_rescan(tmpfs: str) -> None:
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        limit = int(f.read())
    prefix = "smg-smgshm-"
    tracker = SegmentTracker()
    with ShmWatcher(tmpfs, prefix) as w:
        tracker.feed(w.events(0))
        keep = make_file(tmpfs, "smg-smgshm-7-1-1", 100)
        lost = make_file(tmpfs, "smg-smgshm-7-1-2", 100)
        tracker.feed(collect(w, lambda evs: sum(e.kind == "closed" for e in evs) >= 2))
        assert len(tracker) == 2
        _flood(tmpfs, prefix, limit // 4 + 100)  # 4 events each, never read: the queue overflows
        os.unlink(lost)
        late = make_file(tmpfs, "smg-smgshm-7-1-3", 100)
        evs = collect(w, lambda evs: any(e.kind == "rescanned" for e in evs))
        assert w.overflows == 1
        kinds = [e.kind for e in evs]
        assert "overflow" in kinds
        assert kinds.index("overflow") < kinds.index("rescanned")
        assert next(e for e in evs if e.kind == "rescanned").detail == "overflow"
        lives = tracker.feed(evs)
        # Also whatever was still queued behind the overflow.
        lives += tracker.feed(w.events(0.2))
        ended = {x.name: x for x in lives}
        assert ended["smg-smgshm-7-1-2"].end == "unknown"
        flying = {x.name for x in tracker.in_flight()}
        assert {"smg-smgshm-7-1-1", "smg-smgshm-7-1-3"} <= flying
        assert not any(n.startswith("smg-smgshm-flood") for n in flying)
        for p in (keep, late):
            os.unlink(p)


@needs_root
def test_unmount_is_dir_gone_then_rewatched(tmpfs: str) -> None:
    tracker = SegmentTracker()
    with ShmWatcher(tmpfs, "smg-") as w:
        tracker.feed(w.events(0))
        make_file(tmpfs, "smg-smgshm-9-1-1", 10)
        tracker.feed(collect(w, lambda evs: any(e.kind == "closed" for e in evs)))
        subprocess.run(["umount", tmpfs], check=True)
        evs = collect(w, lambda evs: any(e.kind == "rescanned" for e in evs))
        gone = [e for e in evs if e.kind == "dir_gone"]
        assert gone
        assert gone[0].detail == "unmounted"
        assert next(e for e in evs if e.kind == "rescanned").detail == "rewatch"
        (life,) = tracker.feed(evs)
        assert life.end == "unknown"
        assert "went away" in life.note
        assert w.watching  # the mount point itself is a directory again
        make_file(tmpfs, "smg-smgshm-9-1-2", 10)  # now on the underlying filesystem
        evs = collect(w, lambda evs: any(e.kind == "closed" for e in evs))
        assert any(e.name == "smg-smgshm-9-1-2" for e in evs)
        os.unlink(os.path.join(tmpfs, "smg-smgshm-9-1-2"))


@pytest.mark.slow
@needs_root
def test_a_mount_over_the_dir_is_noticed(tmpfs: str) -> None:
    with ShmWatcher(tmpfs, "smg-") as w:
        w.events(0)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "smgshm-over", tmpfs], check=True)
        evs = collect(w, lambda evs: any(e.kind == "rescanned" for e in evs))
        assert [e.detail for e in evs if e.kind == "dir_gone"] == ["remounted"]
        make_file(tmpfs, "smg-smgshm-9-2-1", 10)  # in the new mount: seen through the new watch
        evs = collect(w, lambda evs: any(e.kind == "closed" for e in evs))
        assert any(e.name == "smg-smgshm-9-2-1" for e in evs)


def test_a_missing_dir_is_a_host_error(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(HostError, match="does not exist"):
        ShmWatcher(os.path.join(str(tmp_path), "nope")).open()
    f = os.path.join(str(tmp_path), "file")
    open(f, "w").close()
    with pytest.raises(HostError, match="does not exist"):
        ShmWatcher(f).open()
