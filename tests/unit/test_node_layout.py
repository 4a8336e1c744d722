"""The node view's tmpfs kinds and the --runtime-state-dir spelling: pure, no mount or process."""

from __future__ import annotations

import pytest

from smgshm.cli.fmt import TMPFS_KINDS
from smgshm.core.node.layout import TmpfsKind, state_dir_parts


def test_every_tmpfs_kind_has_its_human_name() -> None:
    assert set(TMPFS_KINDS) == {k.value for k in TmpfsKind}


@pytest.mark.parametrize(
    ("given", "parts"),
    [
        ("/run/k3s/containerd", ("run", "k3s", "containerd")),
        ("run/k3s/containerd/", ("run", "k3s", "containerd")),
        ("//var/./crio//run", ("var", "crio", "run")),
    ],
)
def test_a_state_dir_is_components_under_the_node_root(given: str, parts: tuple[str, ...]) -> None:
    assert state_dir_parts(given) == parts


@pytest.mark.parametrize("given", ["", "/", ".", "../etc", "run/../../etc"])
def test_a_state_dir_that_climbs_or_is_empty_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match="under the node root"):
        state_dir_parts(given)
