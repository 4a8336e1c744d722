"""gc and gc --node are one gc run (core/segments/gcrun.py): for the same tmpfs they give the same exit
code and counts, and a "no" at their one question deletes nothing and exits 0 (issue #29, item 4);
gc --watch ends on Ctrl-C or SIGTERM with its summary, as a watch does."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Children, make_file, mounted_tmpfs, run_cli, smgshm_argv
from tests.support.cli_gc import JUDGE, asked_on_a_terminal, dead_pid, first_line, seg_name
from tests.support.node import POD_A, dshm, laid_out, needs_root_and_unshare

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def _both(root: Path, shm: Path, *args: str, exit: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """gc on the tmpfs, then gc --node on the node whose host /dev/shm it is: the same flags, one exit code."""
    one = run_cli("--json", "gc", "--shm-dir", str(shm), *args, exit=exit).json["result"]
    node = run_cli("--json", "gc", "--node", "--node-root", str(root), *args, exit=exit).json["result"]
    return one, node


@needs_root
def test_gc_and_gc_node_agree_on_the_same_tmpfs(tmp_path: Path) -> None:
    root = tmp_path / "node"
    shm = root / "dev" / "shm"
    shm.mkdir(parents=True)
    (root / "var/lib/kubelet/pods").mkdir(parents=True)  # a node's root (with none, the view is unknown: exit 6)
    with mounted_tmpfs(shm, "4m"):
        one, node = _both(root, shm, "--check", exit=0)  # empty: judged, nothing leaked
        assert one["remaining_counts"] == node["remaining_counts"] == dict.fromkeys(one["counts"], 0)
        for npd in ("gc", "gc --node"):
            argv = ["gc", "--shm-dir", str(shm)] if npd == "gc" else ["gc", "--node", "--node-root", str(root)]
            assert run_cli(*argv, "--check", "--npd", exit=0).stdout.startswith("gc: ok"), npd
        # A hazard (a symlink named like a segment) is judged the same whoever judges liveness.
        os.symlink("/nonexistent", shm / seg_name(dead_pid_free()))
        for args in (["--check"], ["--check", "--delete", "--yes", "--min-age", "0"]):
            one, node = _both(root, shm, *args, exit=3)
            assert one["remaining_counts"] == node["remaining_counts"], args
            assert one["remaining_counts"]["hazard"] == 1, one
            assert [d for d in one["deleted"] if d["deleted"]] == [], "a hazard is never reaped"
            assert all(not d["deleted"] for t in node["tmpfs"] for d in t["deleted"])
        run_cli("gc", "--shm-dir", str(shm), "--check", "--npd", exit=1)
        run_cli("gc", "--node", "--node-root", str(root), "--check", "--npd", exit=1)


def dead_pid_free() -> int:
    """A pid for a name only (nothing is judged by it here)."""
    return 3_999_999_999


@pytest.mark.slow
@needs_root_and_unshare
def test_declining_gc_and_gc_node_alike_deletes_nothing_and_exits_0(children: Children, tmp_path: Path) -> None:
    """The one question, answered no, in both views: exit 0, nothing deleted, the leak still counted."""
    d = tmp_path / "dir"
    d.mkdir()
    path = make_file(str(d), seg_name(dead_pid(children)))
    root = tmp_path / "node"
    with laid_out(root, [(POD_A, "16m", "dead")]):
        pod = dshm(root, POD_A[2])
        before = sorted(os.listdir(pod))
        assert any(n.startswith("smg-") for n in before), before
        runs = {
            "gc": smgshm_argv("gc", "--shm-dir", str(d), *JUDGE, "--delete", "--min-age", "0"),
            "gc --node": smgshm_argv("gc", "--node", "--node-root", str(root), "--delete", "--min-age", "0"),
        }
        for what, argv in runs.items():
            p, master, said = asked_on_a_terminal(children, argv)
            try:
                assert "delete these 1 segment(s)?" in said, (what, said)
                os.write(master, b"n\n")
                out, err = p.communicate(timeout=60)
            finally:
                os.close(master)
            assert p.returncode == 0, (what, err)
            assert "nothing deleted: the answer was not yes" in err, what
            assert "Aborted" not in err, (what, err)
            assert "Traceback" not in err, (what, err)
            assert "1 leaked" in out.splitlines()[0], (what, out)
        assert os.path.exists(path)
        assert sorted(os.listdir(pod)) == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_gc_watch_ends_on_ctrl_c_or_sigterm_with_its_summary(
    children: Children, tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C (or SIGTERM) is how gc --watch ends without --watch-count: with its summary and 0, as watch does
    (README, exit codes), never a KeyboardInterrupt's 130 with nothing said, nor killed by SIGTERM."""
    d = tmp_path / "dir"
    d.mkdir()
    make_file(str(d), seg_name(dead_pid(children)))
    p, line = first_line(children, smgshm_argv("gc", "--shm-dir", str(d), *JUDGE, "--watch", "1h"))
    assert line.endswith("leaked 1, stale 0, hazard 0, unknown 0"), line  # the first scan is shown: it waits
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out == "", "each scan's line was the output; the summary goes to stderr"
    assert f"gc --watch: stopped by {sig.name} after 1 scan(s); growth since the first: none" in err, err
    assert "Traceback" not in err


@pytest.mark.slow
@needs_root_and_unshare
def test_gc_node_delete_puts_back_what_a_killed_gc_set_aside(children: Children, tmp_path: Path) -> None:
    """gc --node --delete, as gc --delete, first puts back under its name what a gc that is gone set aside in a
    pod's tmpfs (then judges it as any entry); the read-only view leaves it."""
    from smgshm.core.names import ASIDE_PREFIX, aside_name

    gone, _ = first_line(children, [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(600)"])
    with open(f"/proc/{gone.pid}/stat", "rb") as f:
        start = int(f.read().rpartition(b")")[2].split()[19])
    ns = os.stat(f"/proc/{gone.pid}/ns/pid").st_ino
    gone.kill()
    gone.wait(timeout=30)
    original = seg_name(dead_pid(children))
    root = tmp_path / "node"
    with laid_out(root, [(POD_A, "16m", "dead")]):
        pod = dshm(root, POD_A[2])
        aside = aside_name(original, gone.pid, start, ns)
        assert aside is not None
        make_file(str(pod), aside)
        run_cli("gc", "--node", "--node-root", str(root))
        assert os.path.exists(pod / aside), "a listing puts nothing back"
        run_cli("gc", "--node", "--node-root", str(root), "--delete", "--min-age", "0", "--yes")
        assert not [n for n in os.listdir(pod) if n.startswith(ASIDE_PREFIX)], "put back under its name"
