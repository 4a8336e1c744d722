"""What --delete unlinks is provably the inode judged, held files are found by inode, and it says what it did.

Scratch dirs are per-test (a tmp dir, or a tmpfs dir under /dev/shm that is not ``smg-*``), and
judgements pass --assume-dead (JUDGE) or ``assume_dead`` so that another process's pid
namespace on this shared machine cannot turn a verdict into "unknown".
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from smgshm.core.segments.judge import ScanOptions, State
from smgshm.core.segments.reaping import Choice, ReapRule, choose, reap, reap_choice
from smgshm.core.segments.scan import Scan
from tests.conftest import Children, make_file, mounted_tmpfs, proc_state, run_cli, smgshm_argv, wait_for
from tests.support.cli_gc import (
    HOLDER,
    dead_pid,
    deletions,
    first_line,
    gc,
    kill_and_reap,
    seg_name,
    segs,
    tmpfs_dir,  # noqa: F401 - a fixture
)

PY = sys.executable
ALWAYS = ("--assume-dead",)  # judge by this namespace whatever other namespaces exist (see the docstring)


# ---------------------------------------------------------------------------------------------
# holders by inode, and links


@pytest.mark.parametrize("how", ["fd", "map"])
def test_a_segment_held_through_another_name_is_held(children: Children, tmp_path: Path, how: str) -> None:
    d = str(tmp_path)
    name = seg_name(dead_pid(children))
    path = make_file(d, name)
    other = os.path.join(d, "model-cache.bin")  # a hard link outside SMG's names
    os.link(path, other)
    holder, _ = first_line(children, [PY, "-c", HOLDER, other, how])

    doc = gc(d, *ALWAYS, "--delete", "--min-age", "0", "--yes")
    s = segs(doc)[name]
    assert s["state"] == "held", s["reason"]
    assert holder.pid in {h["pid"] for h in s["holders"]}
    assert {h["how"] for h in s["holders"] if h["pid"] == holder.pid} == {how}
    assert name not in deletions(doc)
    assert os.path.exists(path)
    kill_and_reap(holder)


# A holder whose hold only a thread's /proc/P/task/T shows: a thread with its own fd table
# (unshare(CLONE_FILES)) holding it open, or a process whose leader thread exited (a zombie
# leader: /proc/P/fd and /proc/P/maps read empty) while another thread keeps it open or mapped.
THREAD_HOLDER = """
import ctypes, os, signal, sys, threading, time
path, how = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
ready = threading.Event()
def hold():
    if how == "own-fd-table":
        assert libc.unshare(0x400) == 0, ctypes.get_errno()  # CLONE_FILES
    fd = os.open(path, os.O_RDWR)
    if how == "zombie-leader-map":
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        assert libc.mmap(None, 4096, 1, 1, fd, 0) not in (None, ctypes.c_void_p(-1).value)
        os.close(fd)
    ready.set()
    while True:
        time.sleep(3600)
threading.Thread(target=hold, daemon=True).start()
ready.wait()
print("ready", flush=True)
if how.startswith("zombie-leader"):
    libc.pthread_exit(None)
signal.pause()
"""


@pytest.mark.parametrize("how", ["own-fd-table", "zombie-leader-fd", "zombie-leader-map"])
def test_a_segment_only_a_thread_holds_is_held(children: Children, tmp_path: Path, how: str) -> None:
    d = str(tmp_path)
    name = seg_name(dead_pid(children))
    path = make_file(d, name)
    holder, _ = first_line(children, [PY, "-c", THREAD_HOLDER, path, how])
    st = os.stat(path)
    if how.startswith("zombie-leader"):
        wait_for(lambda: proc_state(holder.pid) == "Z", what="the leader thread to exit")
        assert Path(f"/proc/{holder.pid}/maps").read_bytes() == b"", "a zombie leader's maps read empty"
    own = [os.stat(f"/proc/{holder.pid}/fd/{f}") for f in os.listdir(f"/proc/{holder.pid}/fd")]
    assert (st.st_dev, st.st_ino) not in {(o.st_dev, o.st_ino) for o in own}, "/proc/P/fd does not show it"

    doc = gc(d, *ALWAYS, "--delete", "--min-age", "0", "--yes")
    s = segs(doc)[name]
    assert s["state"] == "held", s["reason"]
    assert {h["how"] for h in s["holders"] if h["pid"] == holder.pid} == {"map" if how.endswith("map") else "fd"}
    assert name not in deletions(doc)
    assert os.path.exists(path)
    kill_and_reap(holder)


def test_a_segment_with_another_link_frees_nothing_and_says_so(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    name = seg_name(dead_pid(children))
    path = make_file(d, name, size=8192)
    other = os.path.join(d, "kept-elsewhere")
    os.link(path, other)

    doc = gc(d, *ALWAYS)
    s = segs(doc)[name]
    assert s["state"] == "leaked"
    assert s["nlink"] == 2
    assert "2 links: unlinking this name frees nothing" in s["reason"]
    assert doc["result"]["reclaimable_bytes"] == 0, "a name whose data another link keeps frees nothing"

    doc = gc(d, *ALWAYS, "--delete", "--min-age", "0", "--yes")
    dl = deletions(doc)[name]
    assert dl["deleted"] is True
    assert dl["freed_bytes"] == 0
    assert "freed nothing: 1 other link(s) keep its data" in dl["reason"]
    assert not os.path.lexists(path)
    assert Path(other).read_bytes() == b"\x5a" * 8192, "the other link still has the data"
    res = run_cli("gc", "--shm-dir", d, *ALWAYS)
    assert res.stdout.splitlines()[0] == f"0 SMG segment(s) in {d}: none"


def test_the_last_link_frees_its_bytes(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    a = seg_name(dead_pid(children), seq=1)
    b = seg_name(dead_pid(children), seq=2)
    os.link(make_file(d, a, size=8192), os.path.join(d, b))
    doc = gc(d, *ALWAYS, "--delete", "--min-age", "0", "--yes")
    freed = sorted(x["freed_bytes"] for x in doc["result"]["deleted"])
    assert [x["deleted"] for x in doc["result"]["deleted"]] == [True, True]
    assert freed[0] == 0
    assert freed[1] >= 8192, "the second unlink of the same inode freed it"
    assert os.listdir(d) == []


# ---------------------------------------------------------------------------------------------
# the judged inode and nothing else


# Swaps two entries of a dir with renameat2(RENAME_EXCHANGE) as fast as it can; a line on stdin
# names the pair ("-" to stop) and is answered "ok" once the new pair is in force.
SWAPPER = r"""
import ctypes, os, select, sys
libc = ctypes.CDLL(None, use_errno=True)
d, pair = sys.argv[1], None
while True:
    if select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        if not line:
            break
        pair = None if line.strip() == "-" else [os.path.join(d, w).encode() for w in line.split()]
        print("ok", flush=True)
    if pair:
        for _ in range(100):
            libc.renameat2(-100, pair[0], -100, pair[1], 2)  # AT_FDCWD, RENAME_EXCHANGE
"""


def _inodes(d: str, names: list[str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for n in names:
        with contextlib.suppress(FileNotFoundError):
            out[os.lstat(os.path.join(d, n)).st_ino] = n
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)  # 28-59 s alone; a bound against a hang, not a speed claim
def test_reap_never_unlinks_what_was_swapped_in(children: Children, tmpfs_dir: str, tmp_path: Path) -> None:  # noqa: F811
    d = tmpfs_dir
    precious = tmp_path / "precious"
    precious.write_bytes(b"never deleted")
    swapper = children.spawn([PY, "-c", SWAPPER, d], stdin=subprocess.PIPE)
    assert swapper.stdin is not None
    assert swapper.stdout is not None
    gone = dead_pid(children)
    rounds, swapped, reaped = 200, 0, 0
    for r in range(rounds):
        seg = f"smg-smgshm-{gone}-{time.time_ns()}-{r}"
        decoy = f"decoy-{r}"
        make_file(d, seg, age_s=3600)
        if r % 2:
            os.symlink(precious, os.path.join(d, decoy))
        else:
            make_file(d, decoy, size=16)  # another regular file: deleting it is fine only if it was judged
        real = {os.lstat(os.path.join(d, seg)).st_ino: "segment", os.lstat(os.path.join(d, decoy)).st_ino: "decoy"}
        swapper.stdin.write(f"{seg} {decoy}\n")
        swapper.stdin.flush()
        assert swapper.stdout.readline().strip() == "ok"

        judged = [s for s in Scan(ScanOptions(d, assume_dead=True)) if s.state is State.LEAKED]
        done = reap(judged, d)

        swapper.stdin.write("-\n")
        swapper.stdin.flush()
        assert swapper.stdout.readline().strip() == "ok"
        judged_inos = {s.ino for s in judged}
        deleted = {x.ino for x in done if x.deleted}
        assert deleted <= judged_inos, f"round {r}: unlinked an inode that was never judged: {done}"
        present = _inodes(d, [seg, decoy])
        for ino, what in real.items():
            if ino in deleted:
                assert ino not in present, f"round {r}: reported deleted, still there"
            else:
                assert ino in present, f"round {r}: the {what} ({ino}) vanished though gc did not delete it: {done}"
        swapped += any(not x.deleted and "replaced since the scan" in x.reason for x in done)
        reaped += len(deleted)
        assert precious.read_bytes() == b"never deleted"
        for n in (seg, decoy):
            p = os.path.join(d, n)
            if os.path.lexists(p):
                os.unlink(p)
        assert [n for n in os.listdir(d) if n.startswith("smg-smgshm-gc-")] == [], "nothing left set aside"
    swapper.stdin.close()
    swapper.wait(timeout=10)
    assert reaped > rounds // 4, "gc should still reap while racing"
    print(f"\n{rounds} rounds: {reaped} judged inodes reaped, {swapped} swaps caught and put back")


def test_a_swapped_in_entry_is_put_back_under_its_name(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    name = seg_name(dead_pid(children))
    make_file(d, name)
    judged = [s for s in Scan(ScanOptions(d, assume_dead=True)) if s.name == name]
    os.unlink(os.path.join(d, name))
    os.symlink("/etc/hostname", os.path.join(d, name))  # the swap, between the scan and the unlink
    (dl,) = reap(judged, d)
    assert dl.deleted is False
    assert "replaced since the scan" in dl.reason
    assert stat.S_ISLNK(os.lstat(os.path.join(d, name)).st_mode), "put back where it was"
    assert os.listdir(d) == [name], "no private name left behind"
    os.unlink(os.path.join(d, name))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount)")
def test_reap_never_unlinks_an_inode_of_another_tmpfs_mounted_over_the_dir(children: Children, tmp_path: Path) -> None:
    """Two fresh tmpfs number their inodes alike: the first file of each is inode 2. A tmpfs mounted over
    the shm dir between the scan and the reap holds, under the judged name, an inode with the judged
    number on another device, which was never judged: it must be kept."""
    d = tmp_path / "shm"
    name = seg_name(dead_pid(children))
    with mounted_tmpfs(d, "1m") as under:
        make_file(under, name)
        judged = [s for s in Scan(ScanOptions(under, assume_dead=True)) if s.name == name]
        assert [s.state for s in judged] == [State.LEAKED]
        with mounted_tmpfs(d, "1m") as over:
            make_file(over, name)  # another file, never judged
            assert os.lstat(os.path.join(over, name)).st_ino == judged[0].ino, "the premise: alike numbers"
            assert os.lstat(over).st_dev != judged[0].dev
            (dl,) = reap(judged, over)
            assert dl.deleted is False, dl
            assert "replaced since the scan" in dl.reason
            assert os.listdir(over) == [name], "kept under its name, nothing set aside"


# ---------------------------------------------------------------------------------------------
# --prometheus before --delete; --delete shows, then does; headlines agree with exit codes


# /proc/x.prom: os.access says yes to root there; only creating a file finds out it cannot.
@pytest.mark.parametrize("where", ["missing-dir/gc.prom", "a-file/gc.prom", "/proc/x.prom"])
def test_an_unwritable_prometheus_path_is_exit_5_before_any_delete(
    children: Children, tmp_path: Path, where: str
) -> None:
    d = tmp_path / "shm"
    d.mkdir()
    (tmp_path / "a-file").write_text("not a dir")
    name = seg_name(dead_pid(children))
    path = make_file(str(d), name)
    prom = str(tmp_path / where)
    res = run_cli(
        "gc", "--shm-dir", str(d), *ALWAYS, "--delete", "--min-age", "0", "--yes", "--prometheus", prom, exit=5
    )
    assert "--prometheus" in res.stderr
    assert os.path.exists(path), "checked before anything was deleted"
    doc = run_cli(
        "--json",
        "gc",
        "--shm-dir",
        str(d),
        *ALWAYS,
        "--delete",
        "--min-age",
        "0",
        "--yes",
        "--prometheus",
        prom,
        exit=5,
    ).json
    assert doc["ok"] is False
    assert doc["error"]["kind"] == "host"
    assert os.path.exists(path)
    assert not os.path.exists("/proc/x.prom")


# prometheus_client-style writing renames over the path: a device node or FIFO there would be
# replaced by a regular file (it once replaced /dev/full). Refused, exit 5, before any delete.
# (A directory is click's usage error, exit 2: click.Path(dir_okay=False).)
@pytest.mark.parametrize("kind", ["char_device", "fifo", "symlink"])
def test_a_prometheus_path_that_is_not_a_regular_file_is_refused(children: Children, tmp_path: Path, kind: str) -> None:
    d = tmp_path / "shm"
    d.mkdir()
    path = make_file(str(d), seg_name(dead_pid(children)))
    prom = tmp_path / "gc.prom"
    if kind == "char_device":
        if os.geteuid() != 0:
            pytest.skip("mknod needs root")
        os.mknod(prom, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "fifo":
        os.mkfifo(prom)
    else:
        (tmp_path / "real.prom").write_text("")
        prom.symlink_to(tmp_path / "real.prom")
    fmt = stat.S_IFMT(os.lstat(prom).st_mode)
    for json_ in ([], ["--json"]):
        res = run_cli(
            *json_,
            "-q",
            "gc",
            "--shm-dir",
            str(d),
            *ALWAYS,
            "--delete",
            "--min-age",
            "0",
            "--yes",
            "--prometheus",
            str(prom),
            exit=5,
        )
        assert "--prometheus" in (res.stdout + res.stderr)
        assert os.path.exists(path), "refused before anything was deleted"
        assert stat.S_IFMT(os.lstat(prom).st_mode) == fmt, f"the {kind} was replaced"
    assert sorted(os.listdir(tmp_path)) == sorted(["shm", "gc.prom"] + (["real.prom"] if kind == "symlink" else []))


def test_the_prometheus_file_is_written_and_rewritten_readable(children: Children, tmp_path: Path) -> None:
    d = tmp_path / "shm"
    d.mkdir()
    make_file(str(d), seg_name(dead_pid(children)))
    prom = tmp_path / "gc.prom"
    for _ in range(2):  # created, then replaced over the regular file
        run_cli("-q", "gc", "--shm-dir", str(d), *ALWAYS, "--prometheus", str(prom))
        assert "smgshm_gc_segments{shm_dir=" in prom.read_text()
        assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["gc.prom", "shm"], "no temp file left beside it"


def test_headline_agrees_with_the_exit_code(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    young = seg_name(dead_pid(children), seq=1)
    old = seg_name(dead_pid(children), seq=2)
    make_file(d, young)
    make_file(d, old, age_s=3600)

    res = run_cli("gc", "--shm-dir", d, *ALWAYS, "--check", exit=3)
    assert res.stdout.splitlines()[0].startswith("check failed: 2 SMG segment(s)")
    # --delete reaps the old one only (the young one is under --min-age): still a failed check.
    res = run_cli("gc", "--shm-dir", d, *ALWAYS, "--check", "--delete", "--yes", exit=3)
    first = res.stdout.splitlines()[0]
    assert first.startswith("check failed: deleted 1, freed 4.0 KiB, kept 1; 1 SMG segment(s) left"), first
    assert f"kept {young}: younger than --min-age" in res.stdout
    assert res.stdout.count(old) == 1, "each reaped segment is listed once: its row, marked deleted"
    assert [ln.split()[0] for ln in res.stdout.splitlines() if ln.endswith(f"  {old}")] == ["deleted"]
    res = run_cli("gc", "--shm-dir", d, *ALWAYS, "--check", "--delete", "--yes", "--min-age", "0")
    assert res.stdout.splitlines()[0].startswith("check passed: deleted 1, freed 4.0 KiB; 0 SMG segment(s) left")
    assert run_cli("gc", "--shm-dir", d, *ALWAYS, "--check").stdout.startswith("check passed: 0 SMG segment(s)")


def test_the_confirmation_lists_what_it_will_delete(children: Children, tmp_path: Path) -> None:
    """On a TTY gc asks; the question comes after the list of what it would delete. No: keeps all, exit 0."""
    d = str(tmp_path)
    names = [seg_name(dead_pid(children), seq=i) for i in range(3)]
    for n in names:
        make_file(d, n)
    script = (
        "import os, pty, sys\n"
        "pid, fd = pty.fork()\n"
        "if pid == 0:\n"
        "    os.execv(sys.executable, [sys.executable, '-m', 'smgshm', 'gc', *sys.argv[1:]])\n"
        "out = b''\n"
        "while b'[y/N]' not in out:\n"
        "    chunk = os.read(fd, 4096)\n"
        "    if not chunk: break\n"
        "    out += chunk\n"
        "os.write(fd, b'n\\n')\n"
        "while True:\n"
        "    try: chunk = os.read(fd, 4096)\n"
        "    except OSError: break\n"
        "    if not chunk: break\n"
        "    out += chunk\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.stdout.write(out.decode(errors='replace'))\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    res = subprocess.run(
        [PY, "-c", script, "--shm-dir", d, *ALWAYS, "--delete", "--min-age", "0", "--no-color"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = res.stdout
    assert "will delete 3 segment(s), 12.0 KiB:" in out, out
    ask = out.index("delete these 3 segment(s)? [y/N]")
    for n in names:
        assert 0 <= out.index(n) < ask, "every name is listed before the question"
    assert res.returncode == 0, "answering no is no error"
    assert "nothing deleted" in out[ask:]
    assert sorted(os.listdir(d)) == sorted(names), "nothing deleted after a no"


@pytest.mark.parametrize("how", ["fd", "map"])
def test_a_holder_that_opened_it_after_the_scan_keeps_it(children: Children, tmp_path: Path, how: str) -> None:
    """The holder walk runs after the rename aside: the holder's fd shows the private name, and is found."""
    d = str(tmp_path)
    name = seg_name(dead_pid(children))
    path = make_file(d, name)
    judged = [s for s in Scan(ScanOptions(d, assume_dead=True)) if s.name == name]
    assert judged[0].state is State.LEAKED
    holder, _ = first_line(children, [PY, "-c", HOLDER, path, how])
    (dl,) = reap(judged, d)
    assert dl.deleted is False
    assert dl.reason == "opened or mapped since the scan"
    assert os.listdir(d) == [name], "put back under its own name"
    kill_and_reap(holder)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount --bind)")
def test_a_holder_through_a_bind_mount_of_the_file_keeps_it(children: Children, tmp_path: Path) -> None:
    """An fd opened through a file's bind mount shows the mount point's name, not the segment's:
    the holder walk at delete time matches by inode there too, so the segment is kept."""
    d = str(tmp_path / "shm")
    os.mkdir(d)
    name = seg_name(dead_pid(children))
    path = make_file(d, name)
    alias = tmp_path / "alias"
    alias.touch()
    subprocess.run(["mount", "--bind", path, str(alias)], check=True)
    try:
        judged = [s for s in Scan(ScanOptions(d, assume_dead=True)) if s.name == name]
        assert judged[0].state is State.LEAKED
        holder, _ = first_line(children, [PY, "-c", HOLDER, str(alias), "fd"])
        (dl,) = reap(judged, d)
        assert dl.deleted is False, dl
        assert dl.reason == "opened or mapped since the scan"
        assert os.listdir(d) == [name], "put back under its own name"
        kill_and_reap(holder)
    finally:
        subprocess.run(["umount", "-l", str(alias)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root and unshare(1)")
def test_a_name_mounted_on_in_another_mount_namespace_after_the_scan_is_put_back(
    children: Children, tmp_path: Path
) -> None:
    """A mount over the name made after the scan, in another mount namespace only: the rename
    aside goes through (only this namespace's mounts make it EBUSY) and the mount moves with the
    dentry; unlinking it would detach that namespace's mount. The check after the rename sees it."""
    d = str(tmp_path)
    name = seg_name(dead_pid(children))
    path = make_file(d, name)
    victim = tmp_path / "victim.dat"
    victim.write_bytes(b"v" * 8192)
    judged = [s for s in Scan(ScanOptions(d, assume_dead=True)) if s.name == name]
    assert judged[0].state is State.LEAKED
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f"mount --bind {victim} {path} && echo ready && exec sleep 600",
    ]
    other, _ = first_line(children, argv)
    (dl,) = reap(judged, d)
    assert dl.deleted is False
    assert dl.reason.startswith("mounted on since the scan in another mount namespace (mount namespace mnt:["), dl
    assert sorted(os.listdir(d)) == [name, "victim.dat"], "put back under its own name"
    assert Path(f"/proc/{other.pid}/root{path}").read_bytes() == b"v" * 8192, "that namespace's mount is intact"
    kill_and_reap(other)


def test_a_shm_dir_that_is_a_file_is_exit_5(tmp_path: Path) -> None:
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    res = run_cli("gc", "--shm-dir", str(f), exit=5)
    assert "not a directory" in res.stderr
    assert run_cli("--json", "gc", "--shm-dir", str(f), exit=5).json["error"]["kind"] == "host"


@pytest.mark.slow
def test_choose_streams_every_entry_and_reap_choice_counts_what_remains(children: Children, tmp_path: Path) -> None:
    d, pid = str(tmp_path), dead_pid(children)
    old, young = seg_name(pid, seq=0), seg_name(pid, seq=1)
    make_file(d, old, age_s=3600)
    make_file(d, young)
    opts = ScanOptions(shm_dir=d, assume_dead=True)
    seen: list[tuple[str, int]] = []
    assert choose(Scan(opts), None, lambda seg, row: seen.append((seg.name, row))) == Choice([], [], {})
    assert sorted(n for n, _ in seen) == sorted([old, young])
    assert sorted(r for _, r in seen) == [0, 1]
    scan = Scan(opts)
    rule = ReapRule.of(include_stale=False, min_age_s=600, all_users=False, assume_dead=True)  # as the scan
    choice = choose(scan, rule, lambda seg, row: None)
    assert [seg.name for seg in choice.chosen] == [old]
    assert [(x.name, x.deleted) for x in choice.refused] == [(young, False)]
    assert "younger than --min-age" in choice.refused[0].reason
    done = reap_choice(scan, choice)
    assert [(x.name, x.deleted) for x in done.deleted] == [(young, False), (old, True)]
    assert (done.before.counts["leaked"], done.after.counts["leaked"], done.leaked_or_hazard) == (2, 1, 1)
    assert done.done_rows == set(choice.rows.values())
    assert os.listdir(d) == [young]


REAPER = r"""
import sys
from smgshm.core.segments.judge import ScanOptions, State
from smgshm.core.segments.scan import Scan
from smgshm.core.segments.reaping import reap
d = sys.argv[1]
judged = [s for s in Scan(ScanOptions(d, assume_dead=True)) if s.state is State.LEAKED]
print(len(judged), flush=True)
reap(judged, d)
"""


@pytest.mark.slow
def test_ctrl_c_mid_delete_leaves_nothing_set_aside(children: Children, tmpfs_dir: str) -> None:  # noqa: F811
    import signal

    from tests.conftest import wait_for

    d, n = tmpfs_dir, 6000
    gone = dead_pid(children)
    names = {f"smg-smgshm-{gone}-{time.time_ns()}-{i}" for i in range(n)}
    for name in names:
        make_file(d, name, size=0)
    p, count = first_line(children, [PY, "-c", REAPER, d])
    assert int(count) == n
    wait_for(lambda: len(os.listdir(d)) < n - 100, what="the reaper to be deleting")
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    left = set(os.listdir(d))
    assert not [x for x in left if x.startswith("smg-smgshm-gc-")], "an entry was left under its private name"
    assert left <= names, "everything left is under its own name"
    assert p.returncode != 0 or not left, "interrupted, or it had finished"


def _gc_delete(d: str) -> list[str]:
    return smgshm_argv("-q", "gc", "--shm-dir", d, *ALWAYS, "--delete", "--min-age", "0", "--yes")


def _preflight_in_a_pod(d: str) -> list[str]:
    """preflight as an init container: pid 1 of a new pid and mount namespace with ``d`` at /dev/shm, so its
    proof holds (nobody else uses the tmpfs) and every SMG name there goes."""
    pod = ["unshare", "--pid", "--fork", "--mount-proc", "--ipc", "--propagation", "private", "sh", "-c"]
    inner = smgshm_argv("-q", "preflight", "--init-container", "--timeout", "60s")
    return [*pod, 'mount --bind "$0" /dev/shm && exec "$@"', d, *inner]


def _smgshm_pid(p: subprocess.Popen[str]) -> int:
    """The smgshm process of child ``p``: ``p`` itself, or under unshare its forked child (the pod's pid 1)."""
    with open(f"/proc/{p.pid}/comm") as f:
        if f.read().strip() != "unshare":
            return p.pid

    def child() -> int | None:
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            pids = f.read().split()
        return int(pids[0]) if pids else None

    pid: int = wait_for(child, what="unshare's child")
    return pid


def _delete_until_a_batch_is_aside(
    children: Children, d: str, n: int, argv: list[str]
) -> tuple[subprocess.Popen[str], set[str]]:
    """``n`` leaked segments in ``d`` and a real ``smgshm gc --delete`` (or preflight: ``argv``) child, returned
    once a batch of them sits under gc's private names (mid-batch)."""
    from smgshm.core.names import ASIDE_PREFIX

    gone = dead_pid(children)
    names = {f"smg-smgshm-{gone}-{time.time_ns()}-{i}" for i in range(n)}
    for name in names:
        make_file(d, name, size=0)
    p = children.spawn(argv, stdout=subprocess.DEVNULL)
    wait_for(lambda: any(x.startswith(ASIDE_PREFIX) for x in os.listdir(d)), what="a batch set aside")
    return p, names


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
@pytest.mark.parametrize(
    "command", [_gc_delete, pytest.param(_preflight_in_a_pod, marks=pytest.mark.pidns)], ids=["gc", "preflight"]
)
def test_sigterm_or_sighup_mid_delete_leaves_nothing_set_aside(
    children: Children,
    tmpfs_dir: str,  # noqa: F811
    sig: str,
    code: int,
    command: Callable[[str], list[str]],
) -> None:
    """A pod's grace period (SIGTERM) or a closed terminal (SIGHUP) stops gc --delete and preflight as Ctrl-C
    does: the batch set aside goes back under its names, and the exit code says which signal."""
    import signal

    d = tmpfs_dir
    p, names = _delete_until_a_batch_is_aside(children, d, 12000, command(d))
    os.kill(_smgshm_pid(p), getattr(signal, sig))
    assert p.wait(timeout=60) == code, p.stderr.read() if p.stderr else ""
    left = set(os.listdir(d))
    assert not [x for x in left if x.startswith("smg-smgshm-gc-")], "an entry was left under its private name"
    assert left <= names, "everything left is under its own name"
    assert left, "it was stopped mid-way"


@pytest.mark.slow
def test_a_batch_left_aside_by_a_killed_gc_is_put_back_and_reaped_by_the_next(
    children: Children,
    tmpfs_dir: str,  # noqa: F811
) -> None:
    """SIGKILL (a grace period run out, the OOM killer) leaves a batch under gc's private names: the listing says
    whose and that its gc is dead, and the next gc --delete puts each back under its name and reaps it."""
    import signal

    from smgshm.core.names import ASIDE_PREFIX, parse_aside

    d = tmpfs_dir
    p, names = _delete_until_a_batch_is_aside(children, d, 12000, _gc_delete(d))
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    stranded = [x for x in os.listdir(d) if x.startswith(ASIDE_PREFIX)]
    assert stranded, "SIGKILL mid-batch leaves the batch aside"
    assert {parse_aside(x).original for x in stranded} <= names  # type: ignore[union-attr]
    listed = segs(gc(d))
    s = listed[stranded[0]]
    assert s["state"] == "unknown", s
    assert f"gc pid {p.pid} is dead" in s["reason"], s["reason"]
    assert "gc --delete puts it back" in s["reason"], s["reason"]
    gc(d, "--delete", "--min-age", "0", "--yes")
    assert os.listdir(d) == [], "every entry put back, judged leaked and reaped; none left aside"


def test_a_set_aside_entry_is_judged_by_its_gcs_life(children: Children, tmpfs_dir: str) -> None:  # noqa: F811
    """An entry set aside by a gc that runs is in flight and never touched; once that gc is gone it goes back
    under its name, unless the name is taken again (then left, said); an older gc's name stays unknown."""
    from smgshm.core.names import ASIDE_PREFIX, aside_name

    d = tmpfs_dir
    gc_proc, _ = first_line(children, [PY, "-c", "import time; print('up', flush=True); time.sleep(600)"])
    with open(f"/proc/{gc_proc.pid}/stat", "rb") as f:
        start = int(f.read().rpartition(b")")[2].split()[19])
    ns = os.stat(f"/proc/{gc_proc.pid}/ns/pid").st_ino
    producer = dead_pid(children)
    back, taken = seg_name(producer, seq=1), seg_name(producer, seq=2)
    asides = [aside_name(n, gc_proc.pid, start, ns) for n in (back, taken)]
    assert None not in asides
    for a in asides:
        make_file(d, str(a), age_s=3600)
    old = make_file(d, f"{ASIDE_PREFIX}{producer}-{os.urandom(8).hex()}")

    listed = segs(gc(d, "--delete", "--min-age", "0", "--yes"))
    assert [listed[str(a)]["state"] for a in asides] == ["in_flight", "in_flight"]
    assert f"gc pid {gc_proc.pid} runs" in listed[str(asides[0])]["reason"]
    assert listed[os.path.basename(old)]["state"] == "unknown"
    assert sorted(os.listdir(d)) == sorted([*map(str, asides), os.path.basename(old)]), "nothing touched"

    kill_and_reap(gc_proc)
    make_file(d, taken)  # its name is someone's again
    listed = segs(gc(d))
    assert "gc --delete puts it back" in listed[str(asides[0])]["reason"]
    assert "taken again" in listed[str(asides[1])]["reason"]
    gc(d, "--delete", "--min-age", "0", "--yes")
    left = sorted(os.listdir(d))
    assert back not in left, "put back, judged leaked (its producer is dead) and reaped"
    # the one whose name was taken stays aside (the new file under that name, leaked too, is reaped)
    assert left == sorted([str(asides[1]), os.path.basename(old)]), left


@pytest.mark.slow
@pytest.mark.pidns
def test_a_batch_left_aside_by_a_killed_preflight_is_reclaimed_by_the_next_init_container(
    children: Children,
    tmpfs_dir: str,  # noqa: F811
) -> None:
    """An init container's preflight SIGKILLed mid-batch leaves its batch aside, marked with its pod's pid
    namespace: the host's gc (which sees every pid namespace) calls that preflight dead; the next init container,
    which cannot see the old pod's namespace, relies on its proof (nothing else uses the tmpfs): put back, then
    reclaimed."""
    import signal

    from smgshm.core.names import ASIDE_PREFIX

    d = tmpfs_dir
    p, _names = _delete_until_a_batch_is_aside(children, d, 12000, _preflight_in_a_pod(d))
    os.kill(_smgshm_pid(p), signal.SIGKILL)
    p.wait(timeout=30)
    stranded = [x for x in os.listdir(d) if x.startswith(ASIDE_PREFIX)]
    assert stranded, "SIGKILL mid-batch leaves the batch aside"
    reason = segs(gc(d))[stranded[0]]["reason"]  # seen from the host's pid namespace: that namespace is gone
    assert "is dead (no process of pid namespace" in reason, reason
    again = subprocess.run(_preflight_in_a_pod(d), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert os.listdir(d) == [], "every entry put back and reclaimed; none left aside"


IN_A_TIME_NAMESPACE = r"""
import os, sys, time
from smgshm.core.segments.asides import this_gc_aside
name = this_gc_aside(sys.argv[2])
open(os.path.join(sys.argv[1], name), "w").close()
print(name, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/proc/self/ns/time"), reason="needs root and time namespaces"
)
@pytest.mark.parametrize(
    "where",
    [
        pytest.param(["--time", "--boottime", "100000"], id="time"),
        pytest.param(["--pid", "--mount-proc"], id="pid", marks=pytest.mark.pidns),
    ],
)
def test_a_gc_in_a_time_namespace_is_seen_alive_from_outside_it(
    children: Children,
    tmpfs_dir: str,  # noqa: F811
    where: list[str],
) -> None:
    """A time namespace shifts the boot clock /proc shows start times on: the start time a gc records and the
    one another reader sees are both taken back to the initial namespace's clock, so a running gc is never
    called dead (and its batch put back under it) for its clock's offset. A gc of another pid namespace (pid 1
    there) is found from the host's by its namespace, its pid there and its start time."""
    d = tmpfs_dir
    inner = [PY, "-c", IN_A_TIME_NAMESPACE, d, seg_name(dead_pid(children))]
    p, name = first_line(children, ["unshare", *where, "--fork", *inner])
    s = segs(gc(d, "--delete", "--min-age", "0", "--yes"))[name]
    assert s["state"] == "in_flight", s["reason"]
    assert os.listdir(d) == [name], "never touched"
    kill_and_reap(p)
