"""Who may take another user's segment (``gc --delete --all-users`` off root): CAP_FOWNER unlinks it in a
sticky dir, but only CAP_SYS_PTRACE reads another uid's fds and maps, so FOWNER without SYS_PTRACE would
see a live holder's fd table empty and reap what it holds. Judged in real processes whose capabilities
setpriv(1) cut (as root: the bounding set is what the effective set can hold after exec)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv(1)"
)

_RULE = (
    "from smgshm.core.segments.judge import State; from smgshm.core.segments.reaping import ReapRule; "
    "print(ReapRule(frozenset({State.LEAKED}), 0.0, True).fowner)"
)


def _fowner_with(bounding: str) -> bool:
    out = subprocess.run(
        ["setpriv", f"--bounding-set={bounding}", sys.executable, "-c", _RULE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    return {"True": True, "False": False}[out.stdout.strip()]


@pytest.mark.parametrize(
    ("bounding", "takes_others"),
    [("+all", True), ("-sys_ptrace", False), ("-fowner", False), ("-fowner,-sys_ptrace", False)],
)
def test_other_users_segments_need_fowner_and_sys_ptrace_both(bounding: str, takes_others: bool) -> None:
    assert _fowner_with(bounding) is takes_others
