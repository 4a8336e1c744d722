"""``-q`` prints nothing unless something failed: the README's cron lines (``smgshm -q gc --delete
--check --prometheus ...``) stay quiet on a clean run, and a failure is still said."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Children, make_file, run_cli
from tests.support.cli_doctor import trusted
from tests.support.cli_gc import dead_pid, seg_name, tmpfs_dir  # noqa: F401  (a fixture)


@pytest.mark.slow
def test_quiet_says_nothing_on_a_clean_run(tmpfs_dir: str, tmp_path: Path) -> None:  # noqa: F811
    prom = str(tmp_path / "gc.prom")
    runs = [
        ("-q", "gc", "--shm-dir", tmpfs_dir),
        ("-q", "gc", "--shm-dir", tmpfs_dir, "--delete", "--check", "--prometheus", prom),
        ("gc", "--shm-dir", tmpfs_dir, "--delete", "--yes", "-q"),
        ("-q", "watch", "--shm-dir", tmpfs_dir, "--count", "1", "--interval", "0.1", "--check"),
    ]
    for argv in runs:
        res = run_cli(*argv)
        assert (res.stdout, res.stderr) == ("", ""), argv
    res = trusted(tmpfs_dir, lambda: run_cli("-q", "doctor", "--no-gateways", "--shm-dir", tmpfs_dir))
    assert (res.stdout, res.stderr) == ("", "")


@pytest.mark.slow
def test_quiet_still_says_a_failure(children: Children, tmpfs_dir: str) -> None:  # noqa: F811
    make_file(tmpfs_dir, seg_name(dead_pid(children)))
    res = run_cli("-q", "gc", "--shm-dir", tmpfs_dir, "--assume-dead", "--check", exit=3)
    assert res.stdout.startswith("check failed: 1 SMG segment(s)"), res.stdout
    res = trusted(tmpfs_dir, lambda: run_cli("-q", "doctor", "--no-gateways", "--shm-dir", tmpfs_dir, exit=3))
    assert res.stdout.startswith("doctor: 1 check(s) failed: leaks"), res.stdout
