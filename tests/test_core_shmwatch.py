"""core/watch/follow.py against real directories: /dev/shm itself and private tmpfs mounts."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from smgshm.core.errors import HostError
from smgshm.core.segments.io import read_segment, write_segment
from smgshm.core.watch.follow import SegmentLife, SegmentTracker, ShmEvent, ShmWatcher
from tests.conftest import SHM, make_file, remove_path, wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a private tmpfs needs root")
_seq = iter(range(1_000_000))


def seg_name(prefix: str) -> str:
    """A name in the smgshm family carrying this pid, as the leak guard and parse_name expect."""
    return f"{prefix}{time.time_ns()}-{next(_seq)}"


@pytest.fixture
def prefix() -> str:
    """Only this test's segments: the shared /dev/shm carries other helpers' traffic."""
    return f"smg-smgshm-{os.getpid()}-"


@pytest.fixture
def tmpfs(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A private tmpfs mounted for this test alone, always unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a private tmpfs needs root")
    mnt = os.path.join(str(tmp_path), "shm")
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=1777", "smgshm-test", mnt], check=True)
    try:
        yield mnt
    finally:
        while os.path.ismount(mnt):  # also whatever a test mounted over it
            subprocess.run(["umount", "-l", mnt], check=False)


def collect(w: ShmWatcher, until: object, timeout: float = 30.0) -> list[ShmEvent]:
    """Read events until ``until(events)`` holds (bounded)."""
    got: list[ShmEvent] = []

    def more() -> bool:
        got.extend(w.events(0.05))
        return bool(until(got))  # type: ignore[operator]

    wait_for(more, timeout, "inotify events")
    return got


def removed(name: str) -> object:
    return lambda evs: any(e.kind == "removed" and e.name == name for e in evs)


def test_segment_life_on_real_dev_shm(prefix: str) -> None:
    tracker = SegmentTracker()
    with ShmWatcher(SHM, prefix) as w:
        start = w.events(0)
        assert start[-1].kind == "rescanned"
        assert start[-1].detail == "start"
        tracker.feed(start)
        ref = write_segment(b"\x01" * 12345, name=seg_name(prefix))
        os.unlink(ref.path)  # the producer cleans up: nobody read it
        evs = collect(w, removed(ref.name))
    mine = [e for e in evs if e.name == ref.name]
    assert [e.kind for e in mine] == ["created", "opened", "closed", "removed"]
    lives = tracker.feed(evs)
    (life,) = [x for x in lives if x.name == ref.name]
    assert isinstance(life, SegmentLife)
    assert (life.kind, life.producer_pid, life.end, life.reads, life.observed) == (
        "smgshm",
        os.getpid(),
        "cleaned",
        0,
        True,
    )
    assert life.removed_ns is not None
    assert life.in_flight_ns == life.removed_ns - life.created_ns >= 0
    # The size at close, where the close and the unlink were read apart.
    closed = next(e for e in mine if e.kind == "closed")
    assert closed.nbytes in (12345, None)


def test_a_reader_makes_it_consumed(prefix: str) -> None:
    tracker = SegmentTracker()
    with ShmWatcher(SHM, prefix) as w:
        tracker.feed(w.events(0))
        ref = write_segment(b"\x02" * 4096, name=seg_name(prefix))
        tracker.feed(collect(w, lambda evs: any(e.kind == "closed" and e.name == ref.name for e in evs)))
        (flying,) = [x for x in tracker.in_flight() if x.name == ref.name]
        assert flying.removed_ns is None
        assert flying.end is None
        assert flying.nbytes == 4096
        read_segment(ref.name, 0, 4096).release()  # smgshm's reader: O_PATH pin, then open, read, unlink
        lives = tracker.feed(collect(w, removed(ref.name)))
    (life,) = [x for x in lives if x.name == ref.name]
    assert (life.end, life.reads, life.nbytes) == ("consumed", 1, 4096)
    assert life.first_read_ns is not None
    assert life.created_ns <= life.first_read_ns <= life.removed_ns


def test_a_reader_whose_open_the_kernel_merged_is_still_a_read(tmp_path: os.PathLike[str]) -> None:
    """The kernel drops an inotify event identical to the last one queued: a reader opening while
    its creator's close is pending (its fd still open here; a /proc/PID/fd reader holding the last
    reference a moment does the same) leaves one IN_OPEN for both. Its read-only close says it."""
    d, name = str(tmp_path), "smg-smgshm-7-1-1"
    tracker = SegmentTracker()
    with ShmWatcher(d, "smg-") as w:
        tracker.feed(w.events(0))
        fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"\x03" * 64)
        os.close(os.open(os.path.join(d, name), os.O_RDONLY))  # the reader, before the creator's close
        os.close(fd)
        os.unlink(os.path.join(d, name))
        evs = collect(w, removed(name))  # read only now: the reader's IN_OPEN was queued behind the creator's
    assert [e.kind for e in evs if e.name == name] == ["created", "opened", "closed_nowrite", "closed", "removed"]
    (life,) = tracker.feed(evs)
    assert (life.end, life.reads) == ("consumed", 1)
    assert life.first_read_ns is not None


def test_existing_entries_are_listed_and_their_end_unknown(prefix: str, scratch: list[str]) -> None:
    name = seg_name(prefix)
    scratch.append(make_file(SHM, name, 777, age_s=120))
    tracker = SegmentTracker()
    with ShmWatcher(SHM, prefix) as w:
        start = w.events(0)
        listed = [e for e in start if e.name == name]
        assert len(listed) == 1
        assert listed[0].rescan
        assert listed[0].nbytes == 777
        tracker.feed(start)
        (flying,) = [x for x in tracker.in_flight() if x.name == name]
        assert not flying.observed
        # Its age comes from the later of its name's time and mtime: here the name's (now).
        assert flying.created_ns >= time.time_ns() - 60 * 10**9
        os.unlink(os.path.join(SHM, name))
        lives = tracker.feed(collect(w, removed(name)))
    (life,) = [x for x in lives if x.name == name]
    assert life.end == "unknown"
    assert "listing" in life.note


def test_hostile_names_stay_lossless(prefix: str, scratch: list[str]) -> None:
    raw = os.fsencode(seg_name(prefix)) + b"\n\x1b[31m\xff"
    path = os.path.join(os.fsencode(SHM), raw)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    scratch.append(os.fsdecode(path))
    with ShmWatcher(SHM, prefix) as w:
        w.events(0)
        os.unlink(path)
        evs = collect(w, lambda evs: any(e.kind == "removed" for e in evs))
    gone = next(e for e in evs if e.kind == "removed")
    assert os.fsencode(gone.name) == raw


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


def test_deleted_dir_waits_bounded_then_rewatches(tmp_path: os.PathLike[str]) -> None:
    d = os.path.join(str(tmp_path), "shm")
    os.mkdir(d)
    with ShmWatcher(d, "smg-") as w:
        w.events(0)
        os.rmdir(d)
        evs = collect(w, lambda evs: any(e.kind == "dir_gone" for e in evs))
        assert next(e for e in evs if e.kind == "dir_gone").detail == "deleted"
        assert w.events(0.2) == []  # bounded: nothing to watch, nothing waits forever
        assert not w.watching
        os.mkdir(d)
        evs = collect(w, lambda evs: any(e.kind == "rescanned" for e in evs))
        assert w.watching
        make_file(d, "smg-smgshm-9-3-1", 1)
        assert any(e.name == "smg-smgshm-9-3-1" for e in collect(w, lambda evs: any(e.kind == "closed" for e in evs)))
        remove_path(os.path.join(d, "smg-smgshm-9-3-1"))


def test_a_missing_dir_is_a_host_error(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(HostError, match="does not exist"):
        ShmWatcher(os.path.join(str(tmp_path), "nope")).open()
    f = os.path.join(str(tmp_path), "file")
    open(f, "w").close()
    with pytest.raises(HostError, match="does not exist"):
        ShmWatcher(f).open()


def test_tracker_memory_is_bounded() -> None:
    t = SegmentTracker(max_tracked=10)
    t.feed([ShmEvent("created", f"smg-smgshm-1-{i}-0", i) for i in range(25)])
    assert len(t) == 10
    assert t.untracked == 15
    done = t.feed([ShmEvent("removed", f"smg-smgshm-1-{i}-0", 100) for i in range(25)])
    assert len(done) == 10
    assert len(t) == 0


def test_a_life_begun_after_an_overflow_is_not_cut_by_its_rescan() -> None:
    """The listing follows the batch that read the overflow; a segment created after the overflow
    (its IN_CREATE in that batch) and unlinked before the listing is still followed to its end."""
    t = SegmentTracker()
    spanned, after = "smg-tokenspeed-42-1-0", "smg-tokenspeed-42-2-1"
    t.feed([ShmEvent("created", spanned, 10), ShmEvent("opened", spanned, 11)])
    cut = t.feed(
        [
            ShmEvent("overflow", "", 20),
            ShmEvent("created", after, 21),
            ShmEvent("opened", after, 21),
            ShmEvent("closed", after, 21, 64),
            ShmEvent("opened", after, 22),
            ShmEvent("rescanned", "", 23, detail="overflow"),
        ]
    )  # the listing: both unlinked by then
    assert [(x.name, x.end) for x in cut] == [(spanned, "unknown")]
    (life,) = t.feed([ShmEvent("removed", after, 24)])
    assert (life.name, life.end, life.reads, life.nbytes) == (after, "consumed", 1, 64)
    assert len(t) == 0


def test_creator_open_is_not_a_read() -> None:
    t = SegmentTracker()
    n = "smg-tokenspeed-42-1-0"
    (life,) = t.feed(
        [
            ShmEvent("created", n, 10),
            ShmEvent("opened", n, 11),
            ShmEvent("closed", n, 12, 64),
            ShmEvent("opened", n, 20),
            ShmEvent("opened", n, 21),
            ShmEvent("removed", n, 30),
        ]
    )
    assert (life.kind, life.producer_pid, life.reads, life.first_read_ns, life.nbytes) == ("gateway", 42, 2, 20, 64)
    assert (life.end, life.in_flight_ns) == ("consumed", 20)


def test_a_name_time_inside_the_read_window_dates_the_creation() -> None:
    t = SegmentTracker()
    inside, outside, forged = "smg-tokenspeed-42-1500-0", "smg-tokenspeed-42-999-1", "smg-tokenspeed-42-9999-2"
    t.feed([ShmEvent("created", n, 2000, since_ns=1000) for n in (inside, outside, forged)])
    born = {x.name: x.created_ns for x in t.in_flight(3000)}
    # Only a time the event could have happened at (after the previous read, by this one) is believed.
    assert born == {inside: 1500, outside: 2000, forged: 2000}
