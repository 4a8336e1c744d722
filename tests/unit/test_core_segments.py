"""Segments on /dev/shm, in-process: the writer, the reader, and the hostile entries they refuse."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest

from smgshm.core.errors import HandleError, HostError, NoSpaceError, SegmentError
from smgshm.core.names import NAME_MAX, new_segment_name
from smgshm.core.segments.io import WriteStrategy, read_segment, unlink_segment, write_segment
from tests.support.core_segments import SHM, _make_file, _name, _read, needs_root

PAGE = os.sysconf("SC_PAGE_SIZE")
BAD_NAMES = ["", "/", "//", ".", "..", "/..", "a/b", "x\x00y", "../etc/passwd", "n" * 300]


def _identity(path: str) -> tuple[int, int, int, int]:
    st = os.lstat(path)
    return st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns


def test_write_creates_0600_regular_file_of_exact_size(scratch: list[str]) -> None:
    data = os.urandom(10_001)
    ref = write_segment(data)
    scratch.append(ref.path)
    st = os.lstat(ref.path)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_size == len(data)
    assert st.st_uid == os.getuid()
    assert ref.name.startswith(f"smg-smgshm-{os.getpid()}-")
    assert ref.path == os.path.join(SHM, ref.name)
    assert (ref.offset, ref.nbytes, ref.owner_id) == (0, len(data), f"smg:{os.getpid()}")
    assert _read(ref.path) == data


def test_write_mode_is_0600_under_a_permissive_umask_and_names_are_unique(scratch: list[str]) -> None:
    old = os.umask(0)
    try:
        ref = write_segment(b"abc")
    finally:
        os.umask(old)
    scratch.append(ref.path)
    assert stat.S_IMODE(os.stat(ref.path).st_mode) == 0o600
    a, b = new_segment_name(), new_segment_name()
    assert ref.name != a != b
    pid, nanos, seq = a.removeprefix("smg-smgshm-").split("-")
    assert int(pid) == os.getpid()
    assert len(nanos) >= 19
    assert int(seq) >= 0


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_write_refuses_an_existing_name_without_touching_it(scratch: list[str], tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"keep me")
    if kind == "file":
        name = _make_file(scratch, b"original")
    else:
        name = _name()
        scratch.append(os.path.join(SHM, name))
        os.symlink(target, os.path.join(SHM, name))
    path = os.path.join(SHM, name)
    before = _identity(path)
    with pytest.raises(SegmentError) as ei:
        write_segment(b"replacement bytes", name=name)
    assert ei.value.code == "exists"
    assert _identity(path) == before
    assert _read(path) == (b"original" if kind == "file" else b"keep me")
    assert target.read_bytes() == b"keep me"


def test_zero_byte_tensor_gives_an_empty_file(scratch: list[str]) -> None:
    ref = write_segment(b"")
    scratch.append(ref.path)
    assert (os.stat(ref.path).st_size, ref.nbytes) == (0, 0)
    seg = read_segment(ref.name, 0, 0)
    assert (bytes(seg.data), seg.unlinked) == (b"", True)
    seg.release()


@pytest.mark.parametrize("size", [1, PAGE - 1, PAGE, PAGE + 1, 3 * 1024 * 1024 + 7])
def test_both_strategies_write_identical_bytes(scratch: list[str], size: int) -> None:
    data = os.urandom(size)
    strategies: tuple[WriteStrategy, ...] = ("pwrite", "mmap")
    got = []
    for strategy in strategies:
        ref = write_segment(memoryview(data), strategy=strategy)
        scratch.append(ref.path)
        assert os.stat(ref.path).st_size == size
        got.append(_read(ref.path))
    assert got[0] == got[1] == data


@pytest.mark.parametrize("mode", ["view", "copy"])
@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [(0, 100), (1, 100), (PAGE - 3, 10), (PAGE, PAGE), (PAGE + 17, 2 * PAGE + 5), (5000, 0), (5 * PAGE + 300, 33)],
)
def test_read_exact_bytes_at_any_offset(scratch: list[str], mode: str, offset: int, nbytes: int) -> None:
    blob = os.urandom(5 * PAGE + 333)
    name = _make_file(scratch, blob)
    seg = read_segment(name, offset, nbytes, mode=mode, unlink=False)  # type: ignore[arg-type]
    try:
        assert bytes(seg.data) == blob[offset : offset + nbytes]
        assert seg.data.nbytes == nbytes
        assert (seg.name, seg.nbytes, seg.mode, seg.unlinked) == (name, nbytes, mode, False)
        assert seg.read_ns >= 0
    finally:
        seg.release()
    assert _read(os.path.join(SHM, name)) == blob


def test_view_writes_never_reach_the_file(scratch: list[str]) -> None:
    blob = bytes(range(256)) * 64
    name = _make_file(scratch, blob)
    seg = read_segment(name, 7, 1000, mode="view", unlink=False)
    try:
        assert not seg.data.readonly
        seg.data[0] ^= 0xFF
        assert seg.data[0] == blob[7] ^ 0xFF
    finally:
        seg.release()
    assert _read(os.path.join(SHM, name)) == blob


@pytest.mark.parametrize("mode", ["view", "copy"])
def test_read_unlinks_only_when_asked(scratch: list[str], mode: str) -> None:
    blob = os.urandom(3 * PAGE)
    name = _make_file(scratch, blob)
    path = os.path.join(SHM, name)
    kept = read_segment(name, 10, 20, mode=mode, unlink=False)  # type: ignore[arg-type]
    assert not kept.unlinked
    kept.release()
    assert os.path.exists(path)
    gone = read_segment(name, PAGE + 1, PAGE, mode=mode, unlink=True)  # type: ignore[arg-type]
    try:
        assert gone.unlinked
        assert not os.path.exists(path)
        # A view survives the unlink: tmpfs keeps the pages until the mapping goes.
        assert bytes(gone.data) == blob[PAGE + 1 : 2 * PAGE + 1]
    finally:
        gone.release()


def test_leading_slashes_are_stripped_like_smg_and_unlink_segment(scratch: list[str]) -> None:
    name = _make_file(scratch, b"0123456789")
    seg = read_segment("//" + name, 2, 3, unlink=False)
    assert (bytes(seg.data), seg.name) == (b"234", name)
    seg.release()
    assert unlink_segment("/" + name) is True
    assert not os.path.exists(os.path.join(SHM, name))
    assert unlink_segment(name) is False


def test_symlink_is_refused_and_both_ends_untouched(scratch: list[str], tmp_path: Path) -> None:
    target_name = _make_file(scratch, b"secret segment")
    outside = tmp_path / "outside"
    outside.write_bytes(b"outside file")
    for target in (os.path.join(SHM, target_name), str(outside)):
        name = _name()
        link = os.path.join(SHM, name)
        scratch.append(link)
        os.symlink(target, link)
        with pytest.raises(SegmentError) as ei:
            read_segment(name, 0, 4, unlink=True)
        assert ei.value.code == "symlink"
        assert os.path.islink(link)
        assert os.readlink(link) == target
    assert _read(os.path.join(SHM, target_name)) == b"secret segment"
    assert outside.read_bytes() == b"outside file"


def test_missing_segment() -> None:
    with pytest.raises(SegmentError) as ei:
        read_segment(_name(), 0, 4)
    assert ei.value.code == "missing"
    assert ei.value.kind == "bad_segment"


@pytest.mark.parametrize("mode", ["view", "copy"])
@pytest.mark.parametrize(("offset", "nbytes"), [(0, 101), (50, 51), (100, 1), (4096, 1), (2**40, 0)])
def test_short_file_is_refused_and_kept(scratch: list[str], mode: str, offset: int, nbytes: int) -> None:
    blob = os.urandom(100)
    name = _make_file(scratch, blob)
    with pytest.raises(SegmentError) as ei:
        read_segment(name, offset, nbytes, mode=mode, unlink=True)  # type: ignore[arg-type]
    assert ei.value.code == "short"
    assert ei.value.fields["size"] == 100
    assert _read(os.path.join(SHM, name)) == blob


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_names_are_refused_everywhere(bad: str) -> None:
    with pytest.raises(HandleError) as ei:
        read_segment(bad, 0, 1)
    assert ei.value.kind == "invalid_handle"
    if bad:  # write_segment(name="") means "pick a fresh name"
        with pytest.raises(HandleError):
            write_segment(b"x", name=bad)
    with pytest.raises(HandleError):
        unlink_segment(bad)


def test_name_max_boundary(scratch: list[str]) -> None:
    ok = ("smg-smgshm-test-" + uuid.uuid4().hex).ljust(NAME_MAX, "z")
    ref = write_segment(b"edge", name=ok)
    scratch.append(ref.path)
    assert len(ref.name) == NAME_MAX
    with pytest.raises(HandleError):
        write_segment(b"edge", name=ok + "z")


@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [(-1, 10), (0, -1), (-(2**63), 0), (2**63, 0), (0, 2**63), (2**62, 2**62), (1, 2**63 - 1), (2**64, 1)],
)
def test_impossible_offsets_and_sizes(scratch: list[str], offset: int, nbytes: int) -> None:
    name = _make_file(scratch, b"payload")
    with pytest.raises(HandleError):
        read_segment(name, offset, nbytes, unlink=True)
    assert _read(os.path.join(SHM, name)) == b"payload"


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_missing_shm_dir_is_a_host_error(tmp_path: Path, kind: str) -> None:
    shm_dir = tmp_path / "nope"
    if kind == "file":
        shm_dir.write_bytes(b"")
    with pytest.raises(HostError) as ei:
        write_segment(b"x", shm_dir=str(shm_dir))
    assert not isinstance(ei.value, NoSpaceError)
    assert ei.value.kind == "host"
    assert "does not exist" in ei.value.what
    assert ei.value.fields["path"] == str(shm_dir)
    assert shm_dir.exists() is (kind == "file")


@needs_root
@pytest.mark.parametrize(
    ("kind", "mode", "dev"), [("char_device", stat.S_IFCHR, (1, 3)), ("block_device", stat.S_IFBLK, (7, 0))]
)
def test_device_nodes_named_like_segments_are_refused_unopened(
    scratch: list[str], kind: str, mode: int, dev: tuple[int, int]
) -> None:
    name = _name()
    path = os.path.join(SHM, name)
    scratch.append(path)
    os.mknod(path, mode | 0o600, os.makedev(*dev))
    for reader in ("view", "copy"):
        with pytest.raises(SegmentError) as ei:
            read_segment(name, 0, 4, mode=reader, unlink=True)  # type: ignore[arg-type]
        assert (ei.value.code, ei.value.fields["kind"]) == ("not_regular", kind)
        assert os.lstat(path).st_rdev == os.makedev(*dev)  # refused and kept
