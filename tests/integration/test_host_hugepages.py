"""The page-size policy and the huge-page what-if, on real mounts (root): and never a mount left behind."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smgshm.core.client.whatif import OPS, run_what_if
from smgshm.core.errors import SmgshmError
from smgshm.core.host.pagesize import SHMEM_ENABLED, load_last_what_if, page_policy
from smgshm.core.names import SMGSHM_PREFIX
from smgshm.core.paths import DEFAULT_SHM_DIR
from tests.conftest import Children, mounted_tmpfs, own_smg_entries, run_cli, wait_for

IS_ROOT = os.geteuid() == 0
HAVE_THP = os.path.exists(SHMEM_ENABLED)
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mount -t tmpfs)")
needs_thp = pytest.mark.skipif(not (IS_ROOT and HAVE_THP), reason="needs root and transparent huge pages for tmpfs")
MIB = 1024 * 1024

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if keeps its last figures in the user's cache: keep the test's to itself."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def scratch_mounts() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [ln for ln in f if "smgshm-whatif" in ln]


def dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (an orphan's new parent may be slow to)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def own_segments(pid: int) -> list[str]:
    return [n for n in os.listdir(DEFAULT_SHM_DIR) if n.startswith(f"{SMGSHM_PREFIX}{pid}-")]


@pytest.fixture
def huge_dir(tmp_path: Path) -> Iterator[str]:
    if not (IS_ROOT and HAVE_THP):
        pytest.skip("needs root and transparent huge pages for tmpfs")
    with mounted_tmpfs(tmp_path / "huge dir", "16m", "huge=within_size") as d:
        yield d


@pytest.mark.slow
@needs_thp
def test_policy_of_a_huge_tmpfs(huge_dir: str) -> None:
    p = page_policy(huge_dir)
    assert p.mount_huge == "within_size"
    if p.shmem_enabled == "deny":
        assert p.huge_pages is False
    else:
        assert p.huge_pages is True
        assert p.reason == "mounted huge=within_size" or "force" in p.reason
    doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", huge_dir, exit=0).json
    c = {x["name"]: x for x in doc["result"]["checks"]}["page size"]
    assert c["status"] == "ok"


@pytest.mark.slow
@needs_root
def test_a_4k_tmpfs_gets_the_remount_command_shell_quoted(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "plain; rm -rf x", "16m") as d:
        p = page_policy(d)
        assert p.mount_huge == "never"
        doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", d, exit=0).json
        c = {x["name"]: x for x in doc["result"]["checks"]}["page size"]
        if not HAVE_THP or p.shmem_enabled in ("deny", "force"):
            assert c["status"] == "ok"
            return
        assert c["status"] == "info", "advice, not a warning"
        assert "4 KiB pages" in c["summary"]
        assert "measured elsewhere" in c["summary"], "no what-if ran here: the figure is labelled"
        assert c["fix_cmd"] == ["mount", "-o", "remount,huge=within_size", d]
        out = run_cli("--no-color", "doctor", "--no-gateways", "--shm-dir", d, exit=0).stdout
        cmd = shlex.join(c["fix_cmd"])
        assert any(ln.strip() == cmd for ln in out.splitlines()), out
        assert shlex.split(cmd)[-1] == d, "pasting it names this very directory (quoted: ';' and spaces)"
        # At most two lines (the advice and its command); the caveats are in doctor --help.
        i = next(i for i, ln in enumerate(out.splitlines()) if ln.startswith("[info] page size: "))
        assert out.splitlines()[i + 1].strip() == cmd, out
        help_text = run_cli("doctor", "--help", exit=0).stdout
        assert "Kubernetes" in help_text
        assert "2 MiB" in help_text


def _check_report(r: Any, sizes: tuple[int, ...]) -> None:
    assert r.what_if == "huge-pages"
    assert "huge=within_size" in r.scratch_mount_options
    assert [s.nbytes for s in r.sizes] == list(sizes)
    for s in r.sizes:
        assert [p.op for p in s.pairs] == [op for op, _ in OPS]
        for p in s.pairs:
            assert p.normal_ms > 0
            assert p.huge_ms > 0
            assert p.speedup == pytest.approx(p.normal_ms / p.huge_ms)
        assert s.end_to_end_speedup > 0


@needs_thp
def test_what_if_measures_both_dirs_and_leaves_no_mount() -> None:
    before = own_smg_entries()
    r = run_what_if((1 * MIB, 4 * MIB), iterations=2)
    _check_report(r, (1 * MIB, 4 * MIB))
    assert scratch_mounts() == []
    # Only this test's processes' segments count: other tests here write to /dev/shm meanwhile.
    assert not [n for n in own_smg_entries() - before if n.startswith(SMGSHM_PREFIX)]
    # doctor quotes this run from now on, labelled as measured here.
    last = load_last_what_if()
    assert last is not None
    assert last["nbytes"] == 4 * MIB


@needs_thp
def test_killing_the_child_mid_run_leaves_no_mount_no_dir_and_no_segment() -> None:
    seen: dict[str, Any] = {}

    def kill_once_mounted(pid: int) -> None:
        seen["pid"] = pid

        def mounted() -> list[str]:
            # The scratch mount is visible only in the child's own mount namespace.
            try:
                with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
                    return [ln.split()[4] for ln in f if "smgshm-whatif" in ln]
            except OSError:
                return []

        seen["mountpoint"] = wait_for(mounted, 60, "the child to mount its scratch tmpfs")[0]
        assert scratch_mounts() == [], "the mount never shows in our namespace"
        wait_for(lambda: own_segments(pid), 60, "the child to be mid-run (a segment in the real shm dir)")
        os.kill(pid, signal.SIGKILL)

    with pytest.raises(SmgshmError):
        run_what_if((64 * MIB,), iterations=1000, on_child=kill_once_mounted)
    assert scratch_mounts() == []
    assert not os.path.exists(seen["mountpoint"]), "the scratch mount point is removed"
    assert own_segments(seen["pid"]) == [], "the child's segments in the real shm dir are removed"


@needs_thp
def test_a_killed_parent_takes_the_child_and_its_mount_with_it(children: Children) -> None:
    code = "from smgshm.core.client.whatif import run_what_if\nrun_what_if((64 * 1024 * 1024,), iterations=1000)\n"
    parent = children.spawn([sys.executable, "-c", code], cwd=str(Path(__file__).resolve().parents[2]))

    child = _measuring_child(parent.pid)
    mnt = _child_mountpoint(child)
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        wait_for(lambda: dead(child), 30, "the orphaned child to die with its parent")
        assert scratch_mounts() == []
        # The dead parent can clean nothing: the child (SIGTERM by PR_SET_PDEATHSIG) did it itself.
        assert own_segments(child) == [], "the orphaned child removes its own segments"
        assert not os.path.exists(mnt), "the orphaned child removes the scratch dir"
    finally:
        for name in own_segments(child):
            os.unlink(os.path.join(DEFAULT_SHM_DIR, name))
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


def _measuring_child(parent: int) -> int:
    """The what-if child of ``parent`` once it has segments of its own (it is mid-run)."""

    def measuring() -> int | None:
        import psutil

        for c in psutil.Process(parent).children(recursive=True):
            if own_segments(c.pid):
                return c.pid
        return None

    return int(wait_for(measuring, 60, "the what-if child to be mid-run"))


def _child_mountpoint(pid: int) -> str:
    def mounted() -> list[str]:
        try:
            with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
                return [ln.split()[4] for ln in f if "smgshm-whatif" in ln]
        except OSError:
            return []

    return str(wait_for(mounted, 60, "the child to mount its scratch tmpfs")[0])


@needs_thp
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_cli_what_if_stopped_by_sigterm_or_sighup_unwinds_like_ctrl_c(
    children: Children, sig: signal.Signals, code: int
) -> None:
    argv = [sys.executable, "-m", "smgshm", "bench", "--what-if", "huge-pages", "--sizes", "16MiB", "-n", "1000"]
    parent = children.spawn(argv, cwd=str(Path(__file__).resolve().parents[2]))

    child = _measuring_child(parent.pid)
    mnt = _child_mountpoint(child)
    try:
        os.kill(parent.pid, sig)
        _out, err = parent.communicate(timeout=30)
        assert parent.returncode == code, err
        assert f"stopped by {sig.name}" in err
        assert dead(child), "the child is stopped and reaped"
        assert own_segments(child) == [], "the child's segments are removed"
        assert not os.path.exists(mnt), "the scratch dir is removed"
        assert scratch_mounts() == []
    finally:
        for name in own_segments(child):
            os.unlink(os.path.join(DEFAULT_SHM_DIR, name))
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


@needs_thp
def test_cli_what_if_json_and_human(tmp_path: Path) -> None:
    doc = run_cli("--json", "bench", "--what-if", "huge-pages", "--sizes", "1MiB", "-n", "1").json
    r = doc["result"]
    assert set(r) == {
        "what_if",
        "shm_dir",
        "policy",
        "scratch_mount_options",
        "huge_pages_used",
        "huge_bytes_seen",
        "iterations",
        "sizes",
        "measured_unix_s",
    }
    assert set(r["sizes"][0]["pairs"][0]) == {
        "op",
        "label",
        "normal_ms",
        "huge_ms",
        "normal_gb_per_s",
        "huge_gb_per_s",
        "speedup",
    }
    out = run_cli("--no-color", "bench", "--what-if", "huge-pages", "--sizes", "1MiB", "-n", "1").stdout
    assert "SMG write (fallocate+mmap)" in out
    assert "end to end (SMG's path) at 1.0 MiB" in out
    assert scratch_mounts() == []


def test_what_if_as_another_user_exits_5_with_the_reason(children: Children) -> None:
    code = (
        "import os, sys\n"
        "from smgshm.cli import main\n"
        "import smgshm.cli.bench, smgshm.core.client.whatif, smgshm.core.host.pagesize, shutil\n"
        "if os.geteuid() == 0:\n    os.setgid(65534); os.setuid(65534)\n"
        "sys.argv = ['smgshm', 'bench', '--what-if', 'huge-pages']\n"
        "main()\n"
    )
    p = children.spawn([sys.executable, "-c", code], cwd=str(Path(__file__).resolve().parents[2]))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 5, err
    assert "huge-page what-if skipped: needs root" in err


@pytest.mark.parametrize(
    "content", [b"[" * 100_000 + b"]" * 100_000, b"{not json", b'{"boot_id": NaN}', b"\xff\xfe", b"[]"]
)
def test_a_hostile_what_if_cache_reads_as_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    """The cache is the user's own file, read as untrusted: garbage or JSON nested past Python's
    recursion limit is no what-if (doctor quotes nothing), never an exception (exit 70)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    d = tmp_path / "smgshm"
    d.mkdir(mode=0o700)
    (d / "what-if-huge-pages.json").write_bytes(content)
    assert load_last_what_if() is None


def test_a_what_if_cache_writable_by_others_or_linked_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from smgshm.core.host.pagesize import save_last_what_if

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    save_last_what_if({"boot_id": boot, "x": 1})
    cached = tmp_path / "smgshm" / "what-if-huge-pages.json"
    assert load_last_what_if() == {"boot_id": boot, "x": 1}, "the control: the user's own file is read"
    cached.chmod(0o666)
    assert load_last_what_if() is None
    cached.chmod(0o600)
    other = tmp_path / "elsewhere.json"
    other.write_bytes(cached.read_bytes())
    cached.unlink()
    cached.symlink_to(other)
    assert load_last_what_if() is None
