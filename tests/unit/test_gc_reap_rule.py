"""gc --delete's rule (issue #29, item 3): a segment proven leaked with no clock is reaped at any age.

Proven: its producer's pid judged (not --assume-dead) under a trusted look at the pid namespaces, and
the segment seen (a sighting in the store) before that look began, so no process that joined another
pid namespace since can have written it under its own pid. Everything else keeps --min-age.
"""

from __future__ import annotations

import os
import re
import time

from smgshm.core.doctor.leaks import leak_checks, reap_wait
from smgshm.core.host import clock
from smgshm.core.host.pidtrust import Trust
from smgshm.core.node.judge import tmpfs_trust
from smgshm.core.node.volumes import PidSpace, ShmUser
from smgshm.core.segments.judge import Judge, ScanOptions, SegmentInfo, State
from smgshm.core.segments.reaping import TOO_YOUNG, keep_reason
from smgshm.core.segments.scan import Scan
from smgshm.core.segments.sightings import Sightings
from tests.conftest import make_file

DEAD = 3_999_999_999  # a pid no process can have (pid_max is at most 2**22), below names.PID_LIMIT
MIN_AGE_S = 600.0


def _seen(d: str, name: str) -> None:
    """One whole scan of ``d``, as gc's listing (or doctor's leak check) makes: it stores a sighting of ``name``."""
    assert name in [s.name for s in Scan(ScanOptions(d, assume_dead=True))]


def _judged(d: str, name: str, since_ns: int, assume_dead: bool = False) -> SegmentInfo:
    """``name`` judged under a trusted look that began at ``since_ns`` (boot clock)."""
    dev = os.stat(d).st_dev
    trust = Trust(True, "this namespace alone", frozenset(), since_ns)
    seg = Judge(ScanOptions(d, assume_dead=assume_dead), trust, {}, dev, Sightings(d, dev))(
        name, os.lstat(os.path.join(d, name))
    )
    assert seg.state is State.LEAKED, seg.reason
    return seg


def _keep(seg: SegmentInfo) -> tuple[str, str] | None:
    return keep_reason(seg, uid=os.getuid(), all_users=False, min_age_s=MIN_AGE_S)


def test_a_dead_producers_segment_seen_before_the_look_is_reaped_at_any_age(tmpfs_dir: str) -> None:
    name = f"smg-tokenspeed-{DEAD}-{time.time_ns()}-0"
    make_file(tmpfs_dir, name)  # just made: far younger than --min-age
    _seen(tmpfs_dir, name)
    seg = _judged(tmpfs_dir, name, since_ns=clock.boot_clock_ns())
    assert seg.proven_dead is True
    assert _keep(seg) is None, "a proven-dead segment waited for --min-age"


def test_a_segment_first_seen_after_the_look_keeps_min_age_and_says_the_next_run_reaps_it(tmpfs_dir: str) -> None:
    """A process that joined another pid namespace after the look may have written it under its own pid: kept,
    and the reason says what is true of it, that the next run (whose look follows this sighting) reaps it at
    once, not that it waits for --min-age; under --assume-dead, which proves nothing, --min-age is the wait."""
    name = f"smg-tokenspeed-{DEAD}-{time.time_ns()}-0"
    make_file(tmpfs_dir, name, age_s=60)
    before = clock.boot_clock_ns()  # the look began before smgshm first saw it
    _seen(tmpfs_dir, name)
    seg = _judged(tmpfs_dir, name, since_ns=before)
    assert seg.proven_dead is False
    why = _keep(seg)
    assert why is not None
    assert why[0] == TOO_YOUNG
    assert "first saw it after its pid check: the next run, whose check follows this run's stored sighting, " in why[1]
    assert "reaps it at once" in why[1]
    assert "younger than --min-age" not in why[1]
    why = keep_reason(seg, uid=os.getuid(), all_users=False, min_age_s=MIN_AGE_S, assume_dead=True)
    assert why is not None
    # The age is the file's mtime's, read when judged: a second or two more on a loaded machine.
    assert re.search(r"younger than --min-age \(6[0-2] s < 600 s\): reclaimable in (9 min|8 min 5\d s)", why[1]), why[1]


def test_a_segment_never_seen_before_keeps_min_age(tmpfs_dir: str) -> None:
    name = f"smg-tokenspeed-{DEAD}-{time.time_ns()}-0"
    make_file(tmpfs_dir, name)
    seg = _judged(tmpfs_dir, name, since_ns=clock.boot_clock_ns())
    assert (seg.proven_dead, seg.seen_s) == (False, None)
    assert _keep(seg) is not None


def test_assume_dead_proves_nothing_and_keeps_min_age(tmpfs_dir: str) -> None:
    """--assume-dead judges pids in this namespace where another may have written them."""
    name = f"smg-tokenspeed-{DEAD}-{time.time_ns()}-0"
    make_file(tmpfs_dir, name)
    _seen(tmpfs_dir, name)
    seg = _judged(tmpfs_dir, name, since_ns=clock.boot_clock_ns(), assume_dead=True)
    assert seg.proven_dead is False
    assert _keep(seg) is not None


def test_a_trust_with_no_look_time_proves_nothing(tmpfs_dir: str) -> None:
    name = f"smg-tokenspeed-{DEAD}-{time.time_ns()}-0"
    make_file(tmpfs_dir, name)
    _seen(tmpfs_dir, name)
    assert _judged(tmpfs_dir, name, since_ns=0).proven_dead is False


def test_stale_segments_keep_min_age_on_the_boot_clock() -> None:
    seg = SegmentInfo(
        "smg-tokenspeed-1-1-0", "gateway", "regular", 1, 4096, 7200.0, os.getuid(), 1, True, (), State.STALE, "",
        seen_s=5.0, proven_dead=True,
    )  # fmt: skip
    why = _keep(seg)
    assert why is not None
    assert "seen for less than --min-age" in why[1]


def test_the_node_views_trust_carries_when_its_look_began() -> None:
    user = ShmUser(1, "pid:[1]", 1, 0, None)
    trust = tmpfs_trust([user], [PidSpace("pid:[1]", 1)], "pid:[4026531836]", frozenset(), since_ns=42)
    assert (trust.trusted, trust.since_ns) == (True, 42)


def test_doctors_leak_fix_says_when_gc_reaps_what_this_scan_could_not_record() -> None:
    """doctor's scan records its sightings, so the gc it suggests proves the leaks dead and reaps them at
    once; a scan whose store could not be written leaves gc only --min-age, and the fix says when."""
    leaked = SegmentInfo(
        "smg-tokenspeed-7-1-0", "gateway", "regular", 1, 4096, 60.0, os.getuid(), 7, False, (), State.LEAKED, "",
    )  # fmt: skip
    assert reap_wait([leaked], stored=True) is None
    assert reap_wait([leaked], stored=False) == 540.0
    assert reap_wait([leaked._replace(proven_dead=True)], stored=False) is None
    counts = {s.value: 0 for s in State} | {"leaked": 1}
    cmd = ["smgshm", "gc", "--delete"]
    (now,) = leak_checks(counts, [leaked], 4096, lambda *a: ["smgshm", "gc", *a])
    assert (now.fix, now.fix_cmd) == ("reap them:", cmd)
    (later,) = leak_checks(counts, [leaked], 4096, lambda *a: ["smgshm", "gc", *a], wait_s=540.0)
    assert "the youngest in 9 min, with:" in later.fix
    assert later.fix_cmd == cmd


def test_doctors_leaks_check_of_look_alikes_alone_is_inconclusive_never_ok() -> None:
    """Names in SMG's family without a pid (``smg-foo``, ``smg-tokenspeed-12x``) are all unknown: doctor's leaks
    check judged nothing, as gc --check says (exit 6), never ok."""
    why = "the name carries no producer pid"
    looks = [
        SegmentInfo(n, "other", "regular", 0, 0, 1.0, 0, None, None, (), State.UNKNOWN, why)
        for n in ("smg-foo", "smg-tokenspeed-12x")
    ]
    counts = {s.value: 0 for s in State} | {"unknown": 2}
    (check,) = leak_checks(counts, looks, 0, lambda *a: ["smgshm", "gc", *a])
    assert check.status.value == "unknown", check
    assert "none could be judged: the name carries no producer pid" in check.summary
