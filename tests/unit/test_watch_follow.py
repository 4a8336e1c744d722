"""core/watch/follow.py in-process: the segment tracker fed events, and the watcher on a plain dir."""

from __future__ import annotations

import os
import time

from smgshm.core.segments.io import read_segment, write_segment
from smgshm.core.watch.follow import SegmentLife, SegmentTracker, ShmEvent, ShmWatcher
from tests.conftest import SHM, make_file, remove_path
from tests.support.watch_follow import collect, removed

_seq = iter(range(1_000_000))


def seg_name(prefix: str) -> str:
    """A name in the smgshm family carrying this pid, as the leak guard and parse_name expect."""
    return f"{prefix}{time.time_ns()}-{next(_seq)}"


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
