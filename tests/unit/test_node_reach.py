"""The node view's rule for who judges a tmpfs (core/node/reach.py), its pure parts: a sandbox's infra
container told by its cgroup leaf, and which unread processes put a tmpfs's names in doubt."""

from __future__ import annotations

from smgshm.core.node.reach import Reach, cgroup_leaves, sandbox_of
from smgshm.core.node.volumes import Unread

SID = "5f" * 32
POD = "aaaaaaaa-0000-4000-8000-00000000000a"
OTHER_POD = "bbbbbbbb-0000-4000-8000-00000000000b"


def _cgroup(leaf: str) -> bytes:
    """A hybrid host's /proc/P/cgroup (v1 controllers, the v2 line at the root), cgroupfs driver."""
    path = f"/kubepods/besteffort/pod{POD}/{leaf}".encode()
    return b"".join(f"{n}:{c}:".encode() + path + b"\n" for n, c in ((4, "memory"), (2, "cpuacct"))) + b"0::/\n"


def test_the_sandbox_whose_id_is_the_cgroup_leaf_is_the_infra_container() -> None:
    assert cgroup_leaves(_cgroup(SID)) == {SID}
    assert sandbox_of(_cgroup(SID), ["0" * 64, SID]) == SID
    systemd = f"0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{SID}.scope\n".encode()
    assert sandbox_of(systemd, [SID]) == SID


def test_a_container_of_the_sandbox_or_a_name_alone_is_no_proof() -> None:
    assert sandbox_of(_cgroup("c0" * 32), [SID]) is None  # a container of the pod: its own id
    assert sandbox_of(b"0::/\n1:cpu:/\n", [SID]) is None  # a host process: no leaf at all
    # one hierarchy names the sandbox, another does not: not proven
    mixed = f"4:memory:/kubepods/pod{POD}/{SID}\n2:cpuacct:/kubepods/pod{POD}/other\n".encode()
    assert sandbox_of(mixed, [SID]) is None
    assert sandbox_of(f"0::/x/{SID}-not\n".encode(), [SID]) is None


def test_an_unread_process_doubts_only_its_own_pods_tmpfs() -> None:
    reach = Reach(
        unread=[
            Unread(1, 0, "", "pid:[host]"),  # a process of no pod: the host's, or a container of another kind
            Unread(50, 1000, OTHER_POD, None),  # another pod's
            Unread(60, 2000, POD, None),  # this pod's
            Unread(70, 3000, None, None),  # its cgroup could not be read either: any pod's
        ]
    )
    assert [u.pid for u in reach.doubtful(POD, [])] == [1, 60, 70]  # never another pod's
    # a tmpfs whose pod is not known (a sandbox whose pause was not seen): every unread process
    assert [u.pid for u in reach.doubtful(None, [])] == [1, 50, 60, 70]
    # one whose pid namespace judges there already adds nothing: its pids are counted
    assert [u.pid for u in reach.doubtful(None, ["pid:[host]"])] == [50, 60, 70]
