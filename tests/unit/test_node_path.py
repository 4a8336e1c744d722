"""``node_path``: a path under a node root, as the node itself names it (what a pasted fix must name)."""

from __future__ import annotations

import pytest

from smgshm.core.paths import node_path


@pytest.mark.parametrize(
    ("path", "root", "expected"),
    [
        ("/var/lib/kubelet/pods/u/x", "/", "/var/lib/kubelet/pods/u/x"),
        ("/host/var/lib/kubelet/pods/u/x", "/host", "/var/lib/kubelet/pods/u/x"),
        ("/host/var/lib/kubelet/pods/u/x", "/host/", "/var/lib/kubelet/pods/u/x"),
        ("/host", "/host", "/"),
        # Lexical: /proc/1/root is kept as given (realpath would read it as "/" and keep the prefix).
        ("/proc/1/root/dev/shm/smg-x", "/proc/1/root", "/dev/shm/smg-x"),
        ("/proc/1/root/run/containerd/s/shm", "/proc/1/root/", "/run/containerd/s/shm"),
        # Not below the root: no path on the node names it.
        ("/hostile/x", "/host", None),
        ("/other", "/host", None),
        ("/host/../etc/x", "/host", None),
    ],
)
def test_node_path(path: str, root: str, expected: str | None) -> None:
    assert node_path(path, root) == expected
