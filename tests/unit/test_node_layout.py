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


def test_a_view_that_could_not_read_a_layout_dir_is_an_npd_unknown_said_in_one_line() -> None:
    """Issue #31 item 7: gc --node --check --npd over a look some dir of which stalled (sight.py's layout_read)."""
    from smgshm.core.node.npd import NpdStatus, node_verdict
    from smgshm.core.node.sight import Blind

    counts = {"leaked": 0, "hazard": 0}
    v = node_verdict(counts, {}, deleted=0, tmpfs=2, untrusted=0, unread=1, blind=[Blind.LAYOUT_READ])
    assert v.status == NpdStatus.UNKNOWN
    assert "a dir under --node-root stalled" in v.line
    assert len(v.line) <= 80


def test_an_unreadable_node_dir_is_said_with_the_privilege_it_lacks() -> None:
    from smgshm.core.host.pidtrust import INIT_PID_NS
    from smgshm.core.node.npd import NpdStatus, node_verdict
    from smgshm.core.node.sight import unseen

    got = unseen("/host", [], [], INIT_PID_NS, (), ["var/lib/kubelet/pods/a", "var/lib/kubelet/pods/b"])
    # found nothing because it may list nothing: one blindness, the privilege's, not "a mount missing"
    assert [u.reason for u in got] == [Blind.UNREADABLE]
    assert got[0].message.startswith("var/lib/kubelet/pods/a and 1 more under node root /host may not be listed")
    assert "CAP_DAC_READ_SEARCH" in got[0].hint
    assert unseen("/host", ["var/lib/kubelet/pods"], [], INIT_PID_NS) == []
    zero = {"leaked": 0, "hazard": 0}
    v = node_verdict(zero, {}, deleted=0, tmpfs=0, untrusted=0, unread=0, blind=[Blind.UNREADABLE])
    assert v.status == NpdStatus.UNKNOWN
    assert "a node dir may not be listed" in v.line


def test_an_unknown_host_mount_namespace_is_said_with_what_could_not_be_read() -> None:
    from smgshm.core.node.npd import NpdStatus, node_verdict
    from smgshm.core.node.sight import host_mnt_unseen

    u = host_mnt_unseen("/proc/1/ns/mnt: Permission denied")
    assert u.reason == Blind.HOST_MNT
    assert "/proc/1/ns/mnt: Permission denied" in u.message
    zero = {"leaked": 0, "hazard": 0}
    v = node_verdict(zero, {}, deleted=0, tmpfs=1, untrusted=0, unread=0, blind=[u.reason])
    assert v.status == NpdStatus.UNKNOWN
    assert "host mount namespace unknown" in v.line
    # a leak found anyway is a problem, blind or not
    leak = node_verdict(
        {"leaked": 1, "hazard": 0}, {"leaked": 4096}, deleted=0, tmpfs=1, untrusted=0, unread=0, blind=[u.reason]
    )
    assert leak.status == NpdStatus.PROBLEM
