"""A segment that shrinks while it is read: a typed error or the right bytes, never SIGBUS.

The zero-copy reader maps the file; a truncate under a mapping would kill the reader
with SIGBUS on the next touch. It maps only under a read lease, which makes a truncate
elsewhere wait, and copies when it cannot get one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from smgshm.core.segments.io import read_segment
from tests.conftest import SHM, wait_for
from tests.support.core_segments import _make_file

MIB = 1024 * 1024


def _wchan(pid: int) -> str:
    """Where in the kernel ``pid`` sleeps ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read()
    except OSError:
        return ""


def test_a_truncate_waits_for_the_zero_copy_reader_and_the_bytes_stay_readable(scratch: list[str]) -> None:
    blob = os.urandom(4 * MIB)
    name = _make_file(scratch, blob)
    path = os.path.join(SHM, name)
    seg = read_segment(name, 0, len(blob), mode="view", unlink=False)
    truncater = subprocess.Popen([sys.executable, "-c", f"import os; os.truncate({path!r}, 0)"])
    try:
        assert seg.mode == "view"
        # Blocked in the kernel on the lease: judged once it got there, not after a fixed sleep
        # (a loaded machine may not have started the child yet, and a sleep then proves nothing).
        wait_for(
            lambda: truncater.poll() is not None or _wchan(truncater.pid) == "__break_lease",
            30,
            "the truncate to reach the reader's lease",
        )
        assert truncater.poll() is None, "the truncate should wait for the reader's lease"
        # Without the lease this touch of every page would SIGBUS the test process.
        assert bytes(seg.data) == blob
    finally:
        seg.release()
        truncater.wait(timeout=30)
    assert truncater.returncode == 0
    assert os.path.getsize(path) == 0  # it went ahead once the reader let go


def test_a_segment_open_for_writing_elsewhere_is_copied_not_mapped(scratch: list[str]) -> None:
    blob = os.urandom(MIB)
    name = _make_file(scratch, blob)
    writer = os.open(os.path.join(SHM, name), os.O_WRONLY)
    try:
        seg = read_segment(name, 0, len(blob), mode="view", unlink=False)
        try:
            assert seg.mode == "copy"
            assert bytes(seg.data) == blob
        finally:
            seg.release()
    finally:
        os.close(writer)
    again = read_segment(name, 0, len(blob), mode="view", unlink=False)
    try:
        assert again.mode == "view"  # the writer is gone: the lease is granted
    finally:
        again.release()


# Shrinks and regrows a file as fast as it can for 2 s: by path (truncate(2)), or
# through its own write fd, which denies the reader its lease and forces the copy.
_HAMMER = """
import os, sys, time
path, how, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_WRONLY) if how == "fd" else -1
print("ready", flush=True)
end = time.monotonic() + 2.0
while time.monotonic() < end:
    for n in (size // 2, size):
        os.ftruncate(fd, n) if fd >= 0 else os.truncate(path, n)
"""

# Reads the segment in view mode in a loop while the hammer runs. A child, so that a
# SIGBUS shows as an exit status instead of killing pytest.
_READER = """
import os, subprocess, sys, time
from smgshm.core.errors import SegmentError
from smgshm.core.segments.io import read_segment
path, how, hammer_src = sys.argv[1], sys.argv[2], sys.argv[3]
name, size = os.path.basename(path), os.path.getsize(path)
head = open(path, "rb").read(size // 2)
hammer = subprocess.Popen([sys.executable, "-c", hammer_src, path, how, str(size)], stdout=subprocess.PIPE)
hammer.stdout.readline()
counts = {"view": 0, "copy": 0, "short": 0}
end = time.monotonic() + 1.5  # inside the hammer's 2 s, so every read races it
while time.monotonic() < end:
    try:
        seg = read_segment(name, 0, size, mode="view", unlink=False)
    except SegmentError as err:
        assert err.code == "short", err
        counts["short"] += 1
        continue
    try:
        data = bytes(seg.data)  # touches every page
        assert data[: size // 2] == head and len(data) == size
        counts[seg.mode] += 1
    finally:
        seg.release()
assert hammer.wait() == 0
print(counts["view"], counts["copy"], counts["short"])
"""


def _race(scratch: list[str], how: str) -> tuple[int, int, int]:
    name = _make_file(scratch, os.urandom(2 * MIB))
    out = subprocess.run(
        [sys.executable, "-c", _READER, os.path.join(SHM, name), how, _HAMMER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"reader died ({out.returncode}): {out.stderr[-800:]}"
    view, copy, short = map(int, out.stdout.split())
    return view, copy, short


@pytest.mark.slow
def test_a_file_truncated_by_path_while_read_never_kills_the_reader(scratch: list[str]) -> None:
    view, copy, short = _race(scratch, "path")
    assert view + copy + short > 10  # the loop really ran against the hammer
    assert view > 0  # and the lease let it map


@pytest.mark.slow
def test_a_file_shrunk_through_a_writers_fd_is_copied_or_refused(scratch: list[str]) -> None:
    view, copy, short = _race(scratch, "fd")
    assert view == 0  # an open writer means no lease, so never a mapping
    assert copy + short > 10


def test_the_receiver_reports_which_read_it_made(scratch: list[str]) -> None:
    from smgshm.core.receiver.reader import ReceiverConfig, receive_one
    from smgshm.core.transport.wire import InTensor

    blob = os.urandom(MIB)
    name = _make_file(scratch, blob)
    writer = os.open(os.path.join(SHM, name), os.O_WRONLY)
    try:
        t = InTensor("pixel_values", (MIB,), "uint8", "shm", shm_name=name, shm_offset=0, shm_nbytes=MIB)
        r = receive_one(t, ReceiverConfig(reader="view"))
    finally:
        os.close(writer)
    assert (r.ok, r.reader, r.unlinked) == (True, "copy", True)
    assert not os.path.exists(os.path.join(SHM, name))
