"""A pod's emptyDir volumes are read as one bounded read (core/node/layout.py): a pod with more volume dirs
than the bound is reported not read (the view unknown for it), never silently cut."""

from __future__ import annotations

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
