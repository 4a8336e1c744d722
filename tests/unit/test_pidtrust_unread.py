"""A message about processes whose namespaces could not be read names them (pids), not only their uid."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smgshm.core.host import pidtrust


def test_processes_whose_namespaces_cannot_be_read_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getpid()

    def unreadable(pid: int) -> bool:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pidtrust, "in_nested_pid_ns", unreadable)
    monkeypatch.setattr(pidtrust, "uid_of", lambda _pid: 1234)
    trust = pidtrust.judge_visible_trust(str(tmp_path), [me])
    assert trust.doubt_uids == frozenset({1234})
    assert f"uid(s) 1234's processes could not be read (pid {me})" in trust.note, trust.note


def test_many_unread_processes_are_named_up_to_five() -> None:
    assert pidtrust.name_pids([1, 2, 3, 4, 5, 6, 7]) == "pids 1, 2, 3, 4, 5 and 2 more"
    assert pidtrust.name_pids([9]) == "pid 9"


def test_a_node_tmpfs_note_names_the_unread_processes() -> None:
    from smgshm.core.node.judge import tmpfs_trust
    from smgshm.core.node.volumes import PidSpace, ShmUser

    user = ShmUser(pid=1, pidns="pid:[1]", depth=2, uid=0, pod_uid="")
    spaces = [PidSpace("pid:[1]", 1)]
    trust = tmpfs_trust([user], spaces, "pid:[4026531836]", frozenset({1234}), unread_pids=(77, 78))
    assert "uid(s) 1234's processes could not be read (pids 77, 78)" in trust.note, trust.note
