"""Why a tmpfs of the node view could not be scanned, as a closed cause code (the exporter's ``reason``)."""

from __future__ import annotations

import errno

import pytest

from smgshm.core.errors import HostError
from smgshm.core.host.bounded import StuckReadError
from smgshm.core.node.scan import ScanFailure, TmpfsChangedError, failure_of


def _raised_from(code: int) -> HostError:
    try:
        try:
            raise OSError(code, "x")
        except OSError as err:
            raise HostError("cannot list the shm dir", path="/x") from err
    except HostError as err:
        return err


@pytest.mark.parametrize(
    ("err", "want"),
    [
        (_raised_from(errno.EACCES), ScanFailure.PERMISSION),
        (_raised_from(errno.EPERM), ScanFailure.PERMISSION),
        (_raised_from(errno.ENOENT), ScanFailure.CHANGED),
        (OSError(errno.ESTALE, "the tmpfs changed since the full scan"), ScanFailure.CHANGED),
        (TmpfsChangedError("the tmpfs changed since the node was looked at", path="/x"), ScanFailure.CHANGED),
        (StuckReadError("/x", 2.0), ScanFailure.STALLED),
        (_raised_from(errno.EIO), ScanFailure.ERROR),
        (HostError("no cause"), ScanFailure.ERROR),
    ],
)
def test_each_error_has_one_cause_code_of_a_closed_set(err: BaseException, want: ScanFailure) -> None:
    assert failure_of(err) is want
    assert {f.value for f in ScanFailure} == {"permission", "changed", "stalled", "error"}
