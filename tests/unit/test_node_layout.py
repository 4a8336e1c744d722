"""The node view's closed sets and the --runtime-state-dir spelling: pure, no mount or process."""

from __future__ import annotations

import pytest

from smgshm.cli.fmt import TMPFS_KINDS
from smgshm.core.node.layout import TmpfsKind, state_dir_parts
from smgshm.core.node.metrics import METRICS
from smgshm.core.node.sight import Blind


def test_every_tmpfs_kind_has_its_human_name() -> None:
    assert set(TMPFS_KINDS) == {k.value for k in TmpfsKind}


def test_the_view_unknown_metric_names_every_reason_in_its_help() -> None:
    help_text = METRICS["view_unknown"][3]
    assert all(r.value in help_text for r in Blind)


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
