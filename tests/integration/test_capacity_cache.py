"""The largest-tensor cache (doctor's capacity needs): per mount, never inherited by a new tmpfs that
takes an old one's numbers; per user; and a cache file that is not this user's own private regular
file, or not what smgshm writes, reads as empty (root: mount -t tmpfs, chown, setpriv)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from smgshm.core.host import capacity, place
from smgshm.core.host.capacity import MAX_SEEN, SEEN_FILE, mount_key, record_tensor_seen, recorded_needs
from smgshm.core.host.mounts import read_mounts, unique_mount_id
from tests.conftest import SYSTEM_TMP, mounted_tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount -t tmpfs, chown, setpriv)")
NOBODY = 65534
PROJECT = str(Path(capacity.__file__).resolve().parents[3])


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own cache dir (the file lands in <it>/smgshm)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "smgshm"


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A dir anyone may traverse (pytest's tmp dirs are root's 0700): uid 65534 must reach the tmpfs."""
    d = Path(tempfile.mkdtemp(prefix="smgshm-cap-cache-", dir=SYSTEM_TMP))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _nbytes(shm_dir: str) -> list[int]:
    return [n.nbytes for n in recorded_needs(shm_dir)]


def test_a_new_tmpfs_on_the_old_ones_numbers_does_not_inherit_its_need(tmp_path: Path, cache: Path) -> None:
    where = tmp_path / "shm"
    with mounted_tmpfs(where, "4m") as d:
        old = mount_key(d)
        record_tensor_seen("smgshm bench", 3 << 20, d)
        assert _nbytes(d) == [3 << 20]
    with mounted_tmpfs(where, "4m") as d:
        new = mount_key(d)
        assert old is not None
        assert new is not None
        if unique_mount_id(d) is None:
            pytest.skip("the kernel gives no unique mount id (before 6.8): a reused st_dev and mount id look alike")
        # What st_dev alone (the old key) could not tell apart: an anonymous device number, and most
        # often the mount-table id too, taken again by the next mount.
        print(f"st_dev reused: {old.dev == new.dev}; mount id reused: {old.mount_id == new.mount_id}")
        assert new != old
        assert _nbytes(d) == [], "a need belongs to the mount it was measured on"


def test_another_mount_id_on_the_same_st_dev_does_not_inherit(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same case through the seams, as a kernel without unique mount ids sees it: only the
    mount-table id tells the mounts apart."""
    monkeypatch.setattr(capacity, "unique_mount_id", lambda _path: None)
    with mounted_tmpfs(tmp_path / "shm", "4m") as d:
        record_tensor_seen("smgshm e2e", 1 << 20, d)
        assert _nbytes(d) == [1 << 20]
        dev = os.stat(d).st_dev
        renumbered = [m._replace(mount_id=m.mount_id + 1000) if m.dev == dev else m for m in read_mounts()]
        monkeypatch.setattr(place, "read_mounts", lambda *_path: renumbered)  # the table the key reads
        assert _nbytes(d) == []


def test_the_file_is_private_and_bounded(tmp_path: Path, cache: Path) -> None:
    with mounted_tmpfs(tmp_path / "shm", "4m") as d:
        record_tensor_seen("smgshm bench", 2048, d)
        record_tensor_seen("smgshm bench", 1024, d)  # a smaller one never lowers the figure
        record_tensor_seen("smgshm e2e", 4096, d)
        assert sorted(_nbytes(d)) == [2048, 4096]
        assert _nbytes("/dev/shm") == []
    assert cache.stat().st_mode & 0o777 == 0o700
    assert (cache / SEEN_FILE).stat().st_mode & 0o777 == 0o600
    for i in range(MAX_SEEN * 2):  # old entries go: at most MAX_SEEN are kept
        record_tensor_seen(f"source {i}", 1, "/dev/shm")
    doc = json.loads((cache / SEEN_FILE).read_bytes())
    assert len(doc["entries"]) == MAX_SEEN
    assert {e["source"] for e in doc["entries"]} == {f"source {i}" for i in range(MAX_SEEN, MAX_SEEN * 2)}


def _python_for_nobody() -> str | None:
    """An interpreter uid 65534 can run that imports this checkout's capacity module (this one may
    live under /root)."""
    env = dict(os.environ, PYTHONPATH=PROJECT)
    for py in dict.fromkeys([sys.executable, shutil.which(f"python3.{sys.version_info.minor}") or "", "python3"]):
        argv = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            py,
            "-c",
            "import smgshm.core.host.capacity",
        ]
        try:
            if py and subprocess.run(argv, env=env, cwd="/", capture_output=True, timeout=60).returncode == 0:
                return py
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def _as_nobody(py: str, home: Path, code: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=PROJECT, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", py, "-c", code, *args]
    out = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


_IMPORT = "import sys; from smgshm.core.host.capacity import mount_key, record_tensor_seen, recorded_needs; "
_KEY = _IMPORT + "print(mount_key(sys.argv[1]) is not None)"
_NEEDS = _IMPORT + "print([n.nbytes for n in recorded_needs(sys.argv[1])])"
_RECORD = _IMPORT + "record_tensor_seen('smgshm e2e', 7, sys.argv[1])"


@pytest.mark.slow
def test_another_user_neither_sees_nor_shares_the_entries(open_dir: Path, cache: Path) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv(1) is not installed")
    py = _python_for_nobody()
    if py is None:
        pytest.skip(f"no python that uid {NOBODY} can run with smgshm importable")
    home = open_dir / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    with mounted_tmpfs(open_dir / "shm", "4m") as d:
        record_tensor_seen("smgshm bench", 5 << 20, d)
        assert _nbytes(d) == [5 << 20]
        assert _as_nobody(py, home, _KEY, d) == "True", "uid 65534 reaches the mount"
        assert _as_nobody(py, home, _NEEDS, d) == "[]", "root's entries are root's"
        _as_nobody(py, home, _RECORD, d)
        assert _as_nobody(py, home, _NEEDS, d) == "[7]"
        assert (home / ".cache" / "smgshm" / SEEN_FILE).stat().st_uid == NOBODY
        assert _nbytes(d) == [5 << 20], "and theirs are theirs"
        # Even where the other's file could be read, it is not this user's: it reads as empty.
        assert recorded_needs(d, path=str(home / ".cache" / "smgshm" / SEEN_FILE)) == []


def _hostile(cache: Path, good: bytes, case: str) -> None:
    path = cache / SEEN_FILE
    path.unlink()
    if case == "symlink":
        (cache / "elsewhere.json").write_bytes(good)
        (cache / "elsewhere.json").chmod(0o600)
        path.symlink_to(cache / "elsewhere.json")
        return
    if case == "fifo":
        os.mkfifo(path, 0o600)  # no writer: a blocking open would hang
        return
    data = {
        "garbage": b"\x00\xff{not json",
        "deeply nested": b"[" * 200_000 + b"]" * 200_000,
        "deeply nested, small": b'{"format": "smgshm largest tensors 2", "entries": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}",
        "too big": good + b" " * (64 * 1024),
        "NaN": good.replace(b'"unix_s": ', b'"unix_s": NaN, "x": '),
        "true as a count": good.replace(b'"nbytes": ', b'"nbytes": true, "x": '),
        "old format": json.dumps({"boot_id": "x", "seen": {"smgshm bench@27": {"nbytes": 9, "unix_s": 0}}}).encode(),
        "a list": b"[1, 2, 3]",
    }.get(case, good)
    path.write_bytes(data)
    path.chmod(0o600)
    if case == "another owner's":
        os.chown(path, NOBODY, NOBODY)
    elif case == "world-writable":
        path.chmod(0o606)
    elif case == "group-writable":
        path.chmod(0o620)
    elif case == "dir world-writable":
        cache.chmod(0o777)
    elif case == "dir another owner's":
        os.chown(cache, NOBODY, NOBODY)


HOSTILE = [
    "symlink",
    "fifo",
    "garbage",
    "deeply nested",
    "deeply nested, small",
    "too big",
    "NaN",
    "true as a count",
    "old format",
    "a list",
    "another owner's",
    "world-writable",
    "group-writable",
    "dir world-writable",
    "dir another owner's",
]


@pytest.mark.parametrize("case", HOSTILE)
def test_a_cache_file_not_ours_or_not_ours_to_trust_reads_as_empty(tmp_path: Path, cache: Path, case: str) -> None:
    with mounted_tmpfs(tmp_path / "shm", "4m") as d:
        record_tensor_seen("smgshm bench", 3 << 20, d)
        good = (cache / SEEN_FILE).read_bytes()
        _hostile(cache, good, case)
        assert recorded_needs(d) == [], case
        record_tensor_seen("smgshm e2e", 1 << 20, d)  # never an error; never through a link
        if case == "symlink":
            assert (cache / "elsewhere.json").read_bytes() == good
        if case.startswith("dir another"):
            assert not (cache / SEEN_FILE).exists() or (cache / SEEN_FILE).stat().st_uid == 0
            assert _nbytes(d) == []
        elif case == "dir world-writable":  # refused, never chmod'ed: smgshm changes only the dirs it makes
            assert cache.stat().st_mode & 0o777 == 0o777
            assert _nbytes(d) == []
        else:
            assert _nbytes(d) == [1 << 20], "what is written next is read again"
