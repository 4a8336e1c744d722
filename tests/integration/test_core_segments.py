"""Segments on the real /dev/shm: the writer, the reader, and every hostile entry it must refuse."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from smgshm.core.causes import CATALOGUE, Cause
from smgshm.core.errors import HostError, NoSpaceError, SegmentError
from smgshm.core.segments.io import WriteStrategy, read_segment, write_segment
from tests.support.core_segments import SHM, _make_file, _name, _read, needs_root


def _make_fifo(path: str) -> None:
    os.mkfifo(path, 0o600)


def _make_dir(path: str) -> None:
    os.mkdir(path, 0o700)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("mode", ["view", "copy"])
@pytest.mark.parametrize(
    ("make", "is_kind"),
    [(_make_fifo, stat.S_ISFIFO), (_make_dir, stat.S_ISDIR), (None, stat.S_ISSOCK)],
    ids=["fifo", "directory", "unix_socket"],
)
def test_non_regular_entries_are_refused_without_hanging(
    scratch: list[str], mode: str, make: Callable[[str], None] | None, is_kind: Callable[[int], bool]
) -> None:
    name = _name()
    path = os.path.join(SHM, name)
    scratch.append(path)
    with contextlib.ExitStack() as stack:
        if make is None:  # a listening unix socket bound at a /dev/shm path
            sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            sock.bind(path)
            sock.listen(1)
        else:
            make(path)
        with pytest.raises(SegmentError) as ei:
            read_segment(name, 0, 4, mode=mode, unlink=True)  # type: ignore[arg-type]
        assert ei.value.code == "not_regular"
        assert is_kind(os.lstat(path).st_mode)


@contextlib.contextmanager
def _tmpfs(tmp_path: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted on a scratch dir (root only), unmounted on the way out."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "mnt"
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode(errors='replace').strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)


@pytest.mark.parametrize("strategy", ["pwrite", "mmap"])
def test_full_tmpfs_raises_no_space_and_leaves_nothing(tmp_path: Path, strategy: WriteStrategy) -> None:
    with _tmpfs(tmp_path, "size=1m") as d:
        small = write_segment(b"s" * 4096, shm_dir=str(d), strategy=strategy)
        assert _read(small.path) == b"s" * 4096  # the mount is real and writable
        os.unlink(small.path)
        need = 4 * 1024 * 1024
        with pytest.raises(NoSpaceError) as ei:
            write_segment(bytes(need), shm_dir=str(d), strategy=strategy)
        err = ei.value
        assert isinstance(err, HostError)
        assert err.kind == "no_space"
        assert err.fields["needed_bytes"] == need
        free = err.fields["free_bytes"]
        assert isinstance(free, int)
        assert 0 <= free <= 1024 * 1024 < need
        assert os.listdir(d) == []


@pytest.mark.parametrize("free", ["empty", "filled"])
def test_a_tmpfs_whose_total_is_below_the_segment_is_too_small_whatever_is_free(tmp_path: Path, free: str) -> None:
    """1 MiB never holds 2 MiB: too small (enlarge it; gc frees nothing), empty or not, never shm_full."""
    with _tmpfs(tmp_path, "size=1m") as d:
        if free == "filled":
            (d / "filler").write_bytes(bytes(512 * 1024))
        with pytest.raises(NoSpaceError) as ei:
            write_segment(bytes(2 << 20), shm_dir=str(d))
        err = ei.value
        assert (err.cause, err.what) == ("shm_too_small", "shm dir is too small")
        assert (err.fields["needed_bytes"], err.fields["total_bytes"]) == (2 << 20, 1 << 20)
        assert err.hint == CATALOGUE[Cause.SHM_TOO_SMALL].fix
        assert sorted(os.listdir(d)) == (["filler"] if free == "filled" else [])


def test_a_tmpfs_that_would_hold_the_segment_empty_is_full(tmp_path: Path) -> None:
    with _tmpfs(tmp_path, "size=1m") as d:
        (d / "filler").write_bytes(bytes(768 * 1024))
        with pytest.raises(NoSpaceError) as ei:
            write_segment(bytes(512 * 1024), shm_dir=str(d))
        assert (ei.value.cause, ei.value.what) == ("shm_full", "shm dir is full")
        assert ei.value.hint is not None
        assert f"gc --delete --shm-dir {d}" in ei.value.hint
        assert os.listdir(d) == ["filler"]


def test_no_inodes_left_is_no_space(tmp_path: Path) -> None:
    with _tmpfs(tmp_path, "size=1m,nr_inodes=1") as d:
        with pytest.raises(NoSpaceError) as ei:
            write_segment(b"abc", shm_dir=str(d))
        assert ei.value.fields["needed_bytes"] == 3
        assert os.listdir(d) == []


def test_read_only_tmpfs_is_a_host_error(tmp_path: Path) -> None:
    with _tmpfs(tmp_path, "ro,size=1m") as d:
        with pytest.raises(HostError) as ei:
            write_segment(b"abc", shm_dir=str(d))
        assert not isinstance(ei.value, NoSpaceError)
        assert ei.value.fields["errno"] == "EROFS"
        assert os.listdir(d) == []


@pytest.mark.slow
@pytest.mark.timeout(20)
def test_a_fifo_is_never_opened_so_a_waiting_writer_stays_blocked(scratch: list[str]) -> None:
    # Opening a FIFO for reading would release a writer blocked in open(O_WRONLY): the
    # writer still waiting afterwards proves the reader never opened it.
    name = _name()
    path = os.path.join(SHM, name)
    scratch.append(path)
    os.mkfifo(path, 0o600)
    writer = subprocess.Popen(["python3", "-c", f"open({path!r}, 'wb').close()"])
    try:
        for reader in ("view", "copy"):
            with pytest.raises(SegmentError) as ei:
                read_segment(name, 0, 4, mode=reader)  # type: ignore[arg-type]
            assert ei.value.fields["kind"] == "fifo"
        with contextlib.suppress(subprocess.TimeoutExpired):
            writer.wait(0.5)
        assert writer.poll() is None, "the FIFO was opened"
    finally:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # releases the writer
        writer.wait(10)
        os.close(fd)


# Reads a segment and a symlink with /proc hidden, printing what happened.
_NO_PROC = """
import os, sys
from smgshm.core.errors import SegmentError
from smgshm.core.segments.io import read_segment
assert not os.path.exists("/proc/self/fd")
seg = read_segment(sys.argv[1], 0, 5, mode="copy", unlink=False)
print(bytes(seg.data).decode())
try:
    read_segment(sys.argv[2], 0, 1, unlink=False)
except SegmentError as err:
    print(err.code)
"""


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_reads_work_and_links_are_refused_without_proc(scratch: list[str]) -> None:
    name = _make_file(scratch, b"hello world")
    link = _name()
    scratch.append(os.path.join(SHM, link))
    os.symlink(os.path.join(SHM, name), os.path.join(SHM, link))
    script = f"mount -t tmpfs none /proc && exec {sys.executable} -c '{_NO_PROC}' {name} {link}"
    out = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.split() == ["hello", "symlink"]
