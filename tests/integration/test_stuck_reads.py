"""Reads that block are bounded (core/host/bounded.py): a process holding a handle to a filesystem that no
longer answers (a real FUSE mount nobody serves: tests/support/stall.py) makes the host's trust walk
untrusted and a pod's tmpfs unknown, each said and naming it, instead of stalling gc, gc --node and the
exporter without bound; a blocked read (a FIFO with no writer) is cut at its bound and not waited for again."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import Children, make_file, mounted_tmpfs, smgshm_argv, wait_for
from tests.support.cli_gc import dead_pid, kill_and_reap, seg_name
from tests.support.node import POD_A, dshm, in_pod_cgroup, laid_out, needs_root_and_unshare
from tests.support.stall import keeper_argv, needs_fuse, stalled_fuse

pytestmark = [pytest.mark.timeout(180)]

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
CONTAINER = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private"]
OWN_PROC = "umount -l /proc && mount -t proc proc /proc"  # its own procfs, the host's gone
JUDGE = """
import sys
from smgshm.core.host.pidtrust import judge_trust
t = judge_trust(sys.argv[1], pids=[int(sys.argv[2])])
print(t.trusted)
print(t.note)
"""


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv`` in a child that must end by ``timeout``: a hang is the failure this file is about."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV, cwd="/")
    except subprocess.TimeoutExpired:
        pytest.fail(f"{shlex.join(argv[:6])} ... did not end within {timeout} s: a read blocked without bound")


@needs_fuse
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root and unshare(1)")
@pytest.mark.pidns
def test_a_stalled_handle_in_another_pid_namespace_makes_gc_untrusted_not_hung(
    children: Children, tmp_path: Path
) -> None:
    with stalled_fuse(tmp_path / "stall") as mnt:
        inner = f"{OWN_PROC} && exec {shlex.join(keeper_argv(mnt))}"
        p = children.spawn([*CONTAINER, "sh", "-c", inner], stdin=subprocess.PIPE)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr and p.poll() is not None else ""
        kids = psutil.Process(p.pid).children(recursive=True)
        keeper = next(k.pid for k in kids if k.name().startswith("python"))
        with mounted_tmpfs(tmp_path / "x", "4m") as d:  # after: nothing of it in the keeper's mounts
            _judged_untrusted_not_hung(children, d, keeper)
        kill_and_reap(p)


def _judged_untrusted_not_hung(children: Children, d: str, keeper: int) -> None:
    name = seg_name(dead_pid(children))
    make_file(d, name)

    r = _run([sys.executable, "-c", JUDGE, d, str(keeper)], timeout=60)
    assert r.returncode == 0, r.stderr
    trusted, note = r.stdout.split("\n", 1)
    assert trusted == "False", note
    assert f"pid {keeper}" in note
    assert "did not answer within" in note, note

    r = _run(smgshm_argv("--json", "gc", "--shm-dir", d, "--delete", "--min-age", "0", "--yes"), timeout=120)
    doc = json.loads(r.stdout)
    assert doc["result"]["liveness_trusted"] is False, doc["result"]["liveness_note"]
    assert os.path.exists(os.path.join(d, name)), "gc deleted a segment whose producer it could not rule out"


@needs_fuse
@pytest.mark.trust
def test_a_stalled_handle_in_this_pid_namespace_makes_gc_untrusted_not_hung(children: Children, tmp_path: Path) -> None:
    """The same kept in this pid namespace: the trust walk passes it by (its pids are gc's), but whether it holds
    a segment cannot be told in time: the run is untrusted, said with its pid, and deletes nothing."""
    with stalled_fuse(tmp_path / "stall") as mnt, mounted_tmpfs(tmp_path / "x", "4m") as d:
        keeper = children.spawn(keeper_argv(mnt), stdin=subprocess.PIPE)
        assert keeper.stdout is not None
        assert keeper.stdout.readline().strip() == "ready"
        name = seg_name(dead_pid(children))
        make_file(d, name)
        r = _run(smgshm_argv("--json", "gc", "--shm-dir", d, "--delete", "--min-age", "0", "--yes"), timeout=120)
        doc = json.loads(r.stdout)
        assert doc["result"]["liveness_trusted"] is False, doc["result"]["liveness_note"]
        assert (
            f"pid {keeper.pid}" in doc["result"]["liveness_note"]
            or f"pids {keeper.pid}" in doc["result"]["liveness_note"]
        )
        assert "did not answer within" in doc["result"]["liveness_note"]
        assert os.path.exists(os.path.join(d, name)), "gc deleted a segment a process it could not read may hold"
        kill_and_reap(keeper)


def _pod_a_gone_and_a_stalled_keeper(
    children: Children, pods: dict[str, subprocess.Popen[str]], mnt: str
) -> subprocess.Popen[str]:
    """Pod A's pid 1 stopped (its tmpfs reached by no one), then a process holding a handle on the stalled
    FUSE mount ``mnt``, ready (the caller puts it in pod A's cgroup)."""
    pod = pods[POD_A[2]]
    assert pod.stdin is not None
    pod.stdin.close()
    wait_for(lambda: pod.poll() is not None, what="pod A's pid 1 to exit")
    keeper = children.spawn(keeper_argv(mnt), stdin=subprocess.PIPE)
    assert keeper.stdout is not None
    assert keeper.stdout.readline().strip() == "ready"
    return keeper


@needs_fuse
@needs_root_and_unshare
@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/pids"), reason="needs the cgroup v1 pids hierarchy")
@pytest.mark.trust
def test_gc_node_with_a_stalled_process_in_a_pod_ends_and_keeps_that_pods_names_unknown(
    children: Children, tmp_path: Path
) -> None:
    """Pod A's container is gone: its segment would be leaked. A process of pod A (by its cgroup) whose fd
    is on a FUSE mount that stopped answering cannot be read in time: it may reach pod A's tmpfs, so its
    uid's names there are unknown, said with its pid, and gc --node ends."""
    root = tmp_path / "node"
    with laid_out(root, [(POD_A, "16m", "dead")]) as pods, stalled_fuse(tmp_path / "stall") as mnt:
        tmpfs = dshm(root, POD_A[2])
        (name,) = [n for n in os.listdir(tmpfs) if n.startswith("smg-")]
        keeper = _pod_a_gone_and_a_stalled_keeper(children, pods, mnt)
        with in_pod_cgroup(keeper.pid, POD_A[2], "smgshm-test-stuck-kubepods"):
            argv = smgshm_argv("--json", "gc", "--node", "--node-root", str(root), "--delete", "--min-age", "0")
            r = _run([*argv, "--yes"], timeout=120)
        assert (tmpfs / name).exists(), "gc --node deleted a name a process it could not read may have written"
        doc: dict[str, Any] = json.loads(r.stdout)
        (a,) = [t for t in doc["result"]["tmpfs"] if t["pod_uid"] == POD_A[2]]
        (seg,) = [s for s in a["segments"] if s["name"] == name]
        assert seg["state"] == "unknown", seg
        assert f"pid {keeper.pid}" in a["liveness_note"], a["liveness_note"]
        kill_and_reap(keeper)


@needs_fuse
@needs_root_and_unshare
@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/pids"), reason="needs the cgroup v1 pids hierarchy")
@pytest.mark.trust
def test_the_node_exporter_answers_with_a_stalled_process_in_a_pod_and_says_its_names_unknown(
    children: Children, tmp_path: Path
) -> None:
    """``watch --node --serve-metrics`` starts and answers its scrapes (within 10 s each) while a process of
    pod A holds an fd on a FUSE mount that stopped answering; pod A's dead producer's segment is unknown."""
    import select
    import urllib.request

    from tests.support.metrics_conventions import _values

    root = tmp_path / "node"
    with laid_out(root, [(POD_A, "16m", "dead")]) as pods, stalled_fuse(tmp_path / "stall") as mnt:
        keeper = _pod_a_gone_and_a_stalled_keeper(children, pods, mnt)
        with in_pod_cgroup(keeper.pid, POD_A[2], "smgshm-test-stuck-kubepods"):
            argv = smgshm_argv("watch", "--node", "--node-root", str(root), "--serve-metrics", "127.0.0.1:0")
            e = children.spawn([*argv, "--rescan-every", "60s", "--interval", "0.2"], env=ENV, cwd="/")
            assert e.stderr is not None
            ready, _, _ = select.select([e.stderr], [], [], 90)
            assert ready, "the exporter did not start within 90 s: a read blocked without bound"
            line = e.stderr.readline()
            assert "metrics at " in line, line
            url = line.split("metrics at ", 1)[1].strip()
            for _ in range(2):
                with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - our own loopback exporter
                    text = r.read().decode("utf-8")
                unknown = _values(text, "smgshm_node_segments")
                mine = {k: v for k, v in unknown.items() if ("uid", POD_A[2]) in k}
                assert mine.get(next(k for k in mine if ("state", "unknown") in k)) == 1, mine
                assert mine.get(next(k for k in mine if ("state", "leaked") in k)) == 0, mine
            kill_and_reap(e)
        kill_and_reap(keeper)


def test_a_read_that_blocks_is_cut_at_its_bound_and_not_waited_for_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real blocking call (opening a FIFO no one writes) ends in StuckReadError (an OSError: a walk counts
    the process unread) at the bound; the same read again fails at once, its worker still stuck."""
    from smgshm.core.host import bounded

    monkeypatch.setattr(bounded, "READ_S", 0.5)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    try:
        t0 = time.monotonic()
        with pytest.raises(bounded.StuckReadError) as err:
            bounded.bounded(str(fifo), open, str(fifo), "rb")
        assert isinstance(err.value, OSError)
        assert "did not answer within 0.5 s" in str(err.value)
        assert bounded.stuck_now() >= 1
        with pytest.raises(bounded.StuckReadError, match="stuck still"):
            bounded.bounded(str(fifo), open, str(fifo), "rb")
        assert bounded.bounded("/proc/self/status", os.stat, "/proc/self/status").st_size == 0  # others go on
        with bounded.within(0.0), pytest.raises(bounded.StuckReadError, match="time for reads was spent"):
            bounded.bounded("/proc/self/status", os.stat, "/proc/self/status")
        assert time.monotonic() - t0 < 60
    finally:
        w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the stuck open gets its writer and ends
        os.close(w)
    wait_for(lambda: bounded.stuck_now() == 0 or None, what="the stuck worker to end")
    assert not any(t.name == "smgshm-bounded-read" and not t.daemon for t in threading.enumerate())


def test_an_fd_opened_after_its_caller_left_is_closed_not_leaked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open that stalls, then answers after its caller left (a FIFO's writer comes late): the fd it gives
    is handed to ``late`` (os.close for the node layout's opens), never left open in a long-running exporter."""
    from smgshm.core.host import bounded

    monkeypatch.setattr(bounded, "READ_S", 0.3)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    given: list[int] = []

    def close(fd: int) -> None:
        given.append(fd)
        os.close(fd)

    with pytest.raises(bounded.StuckReadError):
        bounded.bounded(str(fifo), os.open, str(fifo), os.O_RDONLY | os.O_CLOEXEC, late=close)
    w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the stuck open gets its writer and answers, late
    try:
        wait_for(lambda: given or None, what="the late fd to be let go")
    finally:
        os.close(w)
    wait_for(lambda: bounded.stuck_now() == 0 or None, what="the stuck worker to end")
    assert len(given) == 1
    open_now = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            open_now.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert str(fifo) not in open_now  # the late fd was closed (and the writer's too)


def test_a_batch_of_reads_is_bounded_read_by_read_and_names_the_one_that_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One hand-off for a process's reads (bounded_calls): the answers in turn, an OSError as an answer; a read
    that blocks is cut at the bound on its own (not the batch's sum), named, and the reads after it are not made."""
    from functools import partial

    from smgshm.core.host import bounded

    monkeypatch.setattr(bounded, "READ_S", 0.5)
    fifo, made = tmp_path / "fifo", []
    os.mkfifo(fifo)
    got = bounded.bounded_calls([("status", partial(os.stat, "/proc/self/status")), ("gone", partial(os.stat, "/nx"))])
    assert got[0].st_size == 0
    assert isinstance(got[1], FileNotFoundError)
    try:
        slow = [(f"/proc/self/stat {i}", partial(time.sleep, 0.2)) for i in range(4)]  # 0.8 s in all, 0.2 s each
        assert bounded.bounded_calls(slow) == [None] * 4  # a bound on the batch's sum would have cut it
        calls = [*slow[:1], (str(fifo), partial(open, str(fifo), "rb")), ("after", partial(made.append, 1))]
        with pytest.raises(bounded.StuckReadError) as err:
            bounded.bounded_calls(calls)
        assert str(fifo) in str(err.value)
        assert "did not answer within 0.5 s" in str(err.value)
    finally:
        w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the stuck open gets its writer and ends
        os.close(w)
    wait_for(lambda: bounded.stuck_now() == 0 or None, what="the stuck worker to end")
    assert made == [], "a read after the one that stuck was made"


def test_a_read_of_several_steps_is_bounded_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of opens (a pod's volumes) is one read of several steps: each is bounded on its own (step), so a
    slow filesystem that answers each in time is read, and one step that blocks is still cut at the bound."""
    from smgshm.core.host import bounded

    monkeypatch.setattr(bounded, "READ_S", 0.5)

    def steps(each_s: float, n: int) -> int:
        for _ in range(n):
            bounded.step()
            time.sleep(each_s)
        return n

    assert bounded.bounded("four slow steps", steps, 0.2, 4) == 4  # 0.8 s in all: a bound on the sum would cut it
    assert bounded.bounded_groups([[("four slow steps", lambda: steps(0.2, 4))]]) == [[4]]
    t0 = time.monotonic()
    with pytest.raises(bounded.StuckReadError):
        bounded.bounded("a step that blocks", steps, 1.5, 1)
    assert time.monotonic() - t0 < 1.4
    wait_for(lambda: bounded.stuck_now() == 0 or None, what="the stuck worker to end")


def test_groups_share_a_hand_off_and_a_group_that_blocks_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bounded_groups: many processes' reads in one hand-off; a read that blocks fails its own group (its later
    reads not made), the groups before and after it are answered, and a group whose read is still stuck from
    before fails at once while the others are read."""
    from functools import partial

    from smgshm.core.host import bounded

    monkeypatch.setattr(bounded, "READ_S", 0.5)
    fifo, made = tmp_path / "fifo", []
    os.mkfifo(fifo)
    status = ("status", partial(os.stat, "/proc/self/status"))
    blocks = (str(fifo), partial(_fifo_opened, str(fifo)))
    groups = [[status], [status, blocks, ("after", partial(made.append, 1))], [("gone", partial(os.stat, "/nx"))], []]
    try:
        first, stuck, gone, empty = bounded.bounded_groups(groups)
        assert isinstance(first, list)
        assert first[0].st_size == 0
        assert isinstance(stuck, bounded.StuckReadError)
        assert str(fifo) in str(stuck)
        assert isinstance(gone, list)
        assert isinstance(gone[0], FileNotFoundError)  # an OSError is an answer, as bounded_calls gives it
        assert empty == []
        assert made == [], "a read after the one that stuck was made"
        # Its worker still stuck on the FIFO: a group that reads it again fails at once, the others are read.
        t0 = time.monotonic()
        again, other = bounded.bounded_groups([[blocks], [status]])
        assert isinstance(again, bounded.StuckReadError)
        assert "stuck still" in str(again)
        assert isinstance(other, list)
        assert time.monotonic() - t0 < bounded.READ_S
        with bounded.within(0.0):  # the run's time spent: every group refused, each naming its own read
            refused = bounded.bounded_groups([[status], [("gone", partial(os.stat, "/nx"))]])
        assert [e.what for e in refused if isinstance(e, bounded.StuckReadError)] == ["status", "gone"]
    finally:
        w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the stuck open gets its writer and answers, late
        os.close(w)
    wait_for(lambda: bounded.stuck_now() == 0 or None, what="the stuck worker to end")


def _fifo_opened(path: str) -> int:
    """Open ``path`` (a FIFO: blocks until a writer comes), and close it: a read that gives nothing to close."""
    os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    return 0


def test_a_stalled_process_with_many_threads_costs_one_stuck_read_and_others_are_read(
    children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node view reads many processes' routes in one hand-off, one group per process, all its threads'
    reads: a process whose every thread's /dev/shm does not answer (its root on a FUSE mount that stalled) is
    one stuck read and unread; the workers it leaves are one, not one a thread, so the next process is read."""
    from smgshm.core.host import bounded
    from smgshm.core.node import reach

    monkeypatch.setattr(bounded, "READ_S", 0.5)
    code = (
        "import threading, time\n"
        "for _ in range(12):\n"
        "    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)"
    )
    many = children.spawn([sys.executable, "-c", code])
    other = children.spawn(["sleep", "600"])
    assert many.stdout is not None
    assert many.stdout.readline().strip() == "ready"
    release = threading.Event()
    real = reach._shm_dev

    def stalls(base: str) -> int:
        if base.startswith(f"/proc/{many.pid}/"):
            release.wait(60)  # as an open through a root that stopped answering
        return real(base)

    monkeypatch.setattr(reach, "_shm_dev", stalls)
    before = bounded.stuck_now()
    try:
        with bounded.within(30):
            seen = reach.reachers([], "/", [many.pid, other.pid], {}, ())
        assert bounded.stuck_now() - before == 1, "a worker left per thread: the next processes would go unread"
        assert [u.pid for u in seen.unread] == [many.pid]
    finally:
        release.set()
    wait_for(lambda: bounded.stuck_now() == before or None, what="the stuck worker to end")


def test_a_forked_child_reads_with_workers_of_its_own() -> None:
    """Threads do not survive fork(2): a child whose parent had a worker (or one stuck) reads at once."""
    from smgshm.core.host import bounded

    assert bounded.bounded("/", os.stat, "/").st_ino == os.stat("/").st_ino  # this thread has a worker now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's outcome is its exit status
        code = 1
        try:
            t0 = time.monotonic()
            ok = bounded.bounded("/", os.stat, "/").st_ino == os.stat("/").st_ino and bounded.stuck_now() == 0
            code = 0 if ok and time.monotonic() - t0 < bounded.READ_S else 1
        finally:
            os._exit(code)  # never back into pytest
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
