"""The private cache files' read (core/host/usercache.py): whole, bounded, and never a buffer of the bound."""

from __future__ import annotations

import os
from pathlib import Path

from smgshm.core.host import usercache


def _private_dir(tmp_path: Path) -> str:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    return str(d)


def test_a_file_is_read_whole_up_to_its_bound_and_refused_past_it(tmp_path: Path) -> None:
    d = _private_dir(tmp_path)
    data = os.urandom(3 * (1 << 16) + 5)  # more than one chunk past what fstat says
    fd = os.open(os.path.join(d, "store"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
    assert usercache.read_private("store", len(data), d) == data
    assert usercache.read_private("store", 1 << 30, d) == data  # a bound far above the file reads it all the same
    assert usercache.read_private("store", len(data) - 1, d) is None
    assert usercache.read_private("absent", 100, d) is None


def test_an_empty_file_reads_as_empty(tmp_path: Path) -> None:
    d = _private_dir(tmp_path)
    os.close(os.open(os.path.join(d, "empty"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    assert usercache.read_private("empty", 10, d) == b""
