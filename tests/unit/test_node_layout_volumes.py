"""A pod's emptyDir volumes are read as one bounded read (core/node/layout.py): a pod with more volume dirs
than the bound is reported not read (the view unknown for it), never silently cut."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from smgshm.core.node import layout
from smgshm.core.node.layout import EMPTY_DIRS, KUBELET_PODS, NodeRoot


def test_a_pod_with_more_volume_dirs_than_the_bound_is_not_read_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "_MAX_VOLUMES", 3)
    pods = tmp_path.joinpath(*KUBELET_PODS)
    for uid, volumes in (("pod-few", 3), ("pod-many", 4)):
        for i in range(volumes):
            pods.joinpath(uid, *EMPTY_DIRS, f"vol-{i}").mkdir(parents=True)
    with NodeRoot(str(tmp_path)) as node:
        assert list(node.places()) == []  # no tmpfs mounted here: nothing found, nothing wrongly found
        unread = {"/".join(names): why for names, why in node.unread}
    assert unread == {"/".join((*KUBELET_PODS, "pod-many", *EMPTY_DIRS)): "more than 3 dirs: not read"}


def _limit_leaving(free: int) -> int:
    """An fd limit under which exactly ``free`` more fds can be opened now: the limit bounds fd numbers, and an
    open takes the lowest free number, which may lie in a hole below the count of those open."""
    taken = {int(fd) for fd in os.listdir("/proc/self/fd")}
    numbers = (n for n in range(1 << 20) if n not in taken)
    below = [next(numbers) for _ in range(free + 1)]  # the first free+1 free numbers
    return below[-1]  # the last of them is not below it: exactly ``free`` are


def test_many_pods_volumes_are_read_within_a_tight_fd_limit_and_a_failed_read_is_said(tmp_path: Path) -> None:
    """64 pods' volumes in one hand-off hold no fd: read whole within a limit of a few fds more than open now;
    with no fd left at all, each pod's read fails and is said (not read), never taken for a pod without volumes."""
    pods = tmp_path.joinpath(*KUBELET_PODS)
    for p in range(64):
        for v in range(20):
            pods.joinpath(f"pod-{p}", *EMPTY_DIRS, f"vol-{v}").mkdir(parents=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for extra, failing in ((12, False), (0, True)):
        with NodeRoot(str(tmp_path)) as node:
            resource.setrlimit(resource.RLIMIT_NOFILE, (_limit_leaving(extra), hard))
            try:
                assert list(node.places()) == []  # no tmpfs here: nothing found
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            unread = [("/".join(names), why) for names, why in node.unread]
        if not failing:
            assert unread == []
            assert node.unreadable == []
        else:
            assert unread, "pods whose read failed were taken for pods without volumes"
            assert all("Too many open files" in why for _, why in unread), unread


def test_a_pod_whose_mounts_cannot_be_told_is_said_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """procfs failing to say an fd's mount (fdinfo unreadable) is no pod without volumes: it is said, not read."""

    def fails(_fd: int) -> int:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(layout, "fd_mount_id", fails)
    tmp_path.joinpath(*KUBELET_PODS, "pod-a", *EMPTY_DIRS, "vol").mkdir(parents=True)
    with NodeRoot(str(tmp_path)) as node:
        assert list(node.places()) == []
        unread = {"/".join(names): why for names, why in node.unread}
    assert list(unread) == ["/".join((*KUBELET_PODS, "pod-a"))], unread
    assert "fdinfo" in unread["/".join((*KUBELET_PODS, "pod-a"))]
