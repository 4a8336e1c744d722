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


def test_a_tmpfs_seen_only_under_unread_dirs_keeps_its_reason_however_many_places() -> None:
    """A mount propagated twice below a stalled dir (two mount ids, one device) is one unread block, its
    reason kept, every place given to reach.py; a tmpfs also read elsewhere is judged there."""
    from smgshm.core.node.layout import Place, TmpfsKind
    from smgshm.core.node.scan import blocks

    def at(path: str, dev: int, mid: int) -> Place:
        return Place(TmpfsKind.EMPTY_DIR, path, "u", "dshm", dev, mid)

    unread = [at("/n/a", 7, 50), at("/n/b", 7, 51), at("/n/c", 7, 52), at("/n/d", 8, 60)]
    read = [at("/n/e", 8, 61)]
    why = {7: "a dir above it was not read in time", 8: "a dir above it was not read in time"}
    places, every = blocks(read, unread, why)
    assert why == {7: "a dir above it was not read in time"}  # 8 was read at /n/e: judged there
    assert sorted(p.path for p in places) == ["/n/a", "/n/e"]
    assert [p.path for p in every] == ["/n/e", "/n/a", "/n/b", "/n/c"]
