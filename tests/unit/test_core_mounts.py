r"""The one mount-table parser (core/host/mounts.py), on hand-written lines and on real hostile mounts.

The kernel octal-escapes a space, tab, newline and backslash in mountinfo paths and leaves every
other byte as it is (a carriage return, bytes that are not UTF-8). The real tests mount tmpfs
instances at directories so named, in a child's private mount namespace (``unshare --mount
--propagation private``): the mounts exist only there and go with the child, whatever happens
to the test. The directories live on a tmpfs of the test's own, unmounted on every path.
"""

from __future__ import annotations

import os
import random

import pytest

from smgshm.core.host.mounts import (
    Mount,
    mount_holding,
    mount_of,
    namespace_tables,
    nsfs_mounts,
    parse_mounts,
)
from smgshm.core.host.proc import mount_ns

# ---------------------------------------------------------------------------------------------
# hand-written lines

GOOD = b"36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue"


def _line(path: bytes, fstype: bytes = b"tmpfs", dev: bytes = b"0:27") -> bytes:
    return b"1 0 " + dev + b" " + path + b" " + path + b" rw - " + fstype + b" " + path + b" rw"


def test_a_line_reads_into_its_fields() -> None:
    assert parse_mounts(GOOD + b"\n") == [
        Mount(
            36,
            35,
            os.makedev(98, 0),
            "/mnt1",
            "/mnt/parent",
            "rw,noatime",
            ("master:1",),
            "ext3",
            "/dev/root",
            "rw,errors=continue",
        )
    ]
    none, two = b"1 0 0:27 / /x rw - tmpfs t rw", b"1 0 0:27 / /x rw shared:1 master:2 - tmpfs t rw"
    assert parse_mounts(none)[0].optional == ()
    assert parse_mounts(two)[0].optional == ("shared:1", "master:2")


@pytest.mark.parametrize(
    ("escaped", "raw"),
    [
        (rb"/a\040b", b"/a b"),
        (rb"/a\011b", b"/a\tb"),
        (rb"/a\012b", b"/a\nb"),
        (rb"/a\134b", b"/a\\b"),
        (rb"/a\134040", b"/a\\040"),  # an escaped backslash before digits: the digits stay digits
        (rb"/a\040-\040b", b"/a - b"),  # " - " inside a path is no field separator
        (b"/not\xff\xfeutf8", b"/not\xff\xfeutf8"),  # not UTF-8: the kernel leaves it as it is
        (b"/a\rb", b"/a\rb"),  # a carriage return is not escaped, nor a line break
        (rb"/a\777", rb"/a\777"),  # no byte: left as written
    ],
)
def test_paths_are_unescaped_from_bytes_and_round_trip(escaped: bytes, raw: bytes) -> None:
    [m] = parse_mounts(_line(escaped) + b"\n")
    assert (m.root_bytes, m.point_bytes, m.source_bytes) == (raw, raw, raw)
    assert m.point == os.fsdecode(raw)
    assert os.fsencode(m.point) == raw


def test_options_stay_as_the_kernel_wrote_them() -> None:
    [m] = parse_mounts(rb"1 0 0:27 / /x rw,nosuid - overlay o rw,lowerdir=/a\054b,upperdir=/u")
    assert m.super_options.split(",") == ["rw", r"lowerdir=/a\054b", "upperdir=/u"]
    assert m.options == "rw,nosuid"


@pytest.mark.parametrize(
    "bad",
    [
        b"garbage",
        b"1 0 0:27 / /x rw tmpfs tmpfs rw",  # no separator
        b"1 0 0:27 / /x rw - tmpfs tmpfs",  # no super options
        b"x 0 0:27 / /x rw - tmpfs t rw",  # no mount id
        b"1 0 027 / /x rw - tmpfs t rw",  # no major:minor
        b"1 0 0:2a / /x rw - tmpfs t rw",
        b"1 0 0:27 / x rw - tmpfs t rw",  # a mount point is absolute
        GOOD[:40],  # cut short
        b"\x00\xff - - - - - - -",
    ],
)
def test_a_malformed_line_is_skipped(bad: bytes) -> None:
    assert parse_mounts(GOOD + b"\n" + bad + b"\n\n" + GOOD) == parse_mounts(GOOD) * 2


def test_no_line_makes_the_parser_raise() -> None:
    rng = random.Random(20)  # noqa: S311 - a fixed seed: the same lines every run
    alphabet = b" -0123456789:/\\\t\r\xffabmnt[]"
    lines = [bytes(rng.choice(alphabet) for _ in range(rng.randrange(40))) for _ in range(3000)]
    lines += [GOOD.replace(b" ", b" " * rng.randrange(1, 3), rng.randrange(12)) for _ in range(100)]
    for m in parse_mounts(b"\n".join(lines)):
        assert m.point.startswith("/")


def test_the_queries_on_a_table() -> None:
    table = parse_mounts(
        b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        b"2 1 0:2 / /dev/shm rw - tmpfs shm rw\n"
        b"3 1 0:3 / /dev/shm rw - tmpfs over rw\n"  # mounted on top of 2
        b"4 1 0:2 /sub /mnt/sub rw - tmpfs shm rw\n"
        b"5 1 0:4 mnt:[4026532000] /run/ns rw - nsfs nsfs rw\n"
        b"6 1 0:4 pid:[4026532001] /run/pidns rw - nsfs nsfs rw\n"
    )
    holding = {
        p: m and m.mount_id
        for p in ("/dev/shm/x", "/dev/shm", "/dev/shmx", "/", "dev/shm")
        for m in [mount_holding(table, p)]
    }
    assert holding == {"/dev/shm/x": 3, "/dev/shm": 3, "/dev/shmx": 1, "/": 1, "dev/shm": None}
    assert getattr(mount_holding(table, "/dev/shm/x", os.makedev(0, 2)), "mount_id", None) == 2
    assert getattr(mount_holding(table, "/mnt/sub/y", os.makedev(0, 2)), "mount_id", None) == 4
    assert getattr(mount_of(table, os.makedev(0, 2)), "point", None) == "/dev/shm"
    assert mount_of(table, os.makedev(0, 9)) is None
    assert [(m.root, m.point) for m in nsfs_mounts(table)] == [("mnt:[4026532000]", "/run/ns")]


# ---------------------------------------------------------------------------------------------
# real mounts at hostile names


def test_a_table_without_escapes_reads_as_each_line_alone() -> None:
    """A table with no escape is decoded whole and split (the fast form): it must read as each line read alone
    does, whatever bytes its fields hold (not UTF-8, a carriage return, another script's digits, a stray "-")."""
    from smgshm.core.host import mounts

    rng = random.Random(7)  # noqa: S311 - a fixed seed: the same tables every run
    pieces = [b"1", b"0", b" ", b"-", b"/", b":", b"\xc3", b"\xa9", b"\xff", b"\r", b"\n", b"\xd9\xa3", b"tmpfs"]
    lines = [GOOD, b"1 0 0:27 / /x rw shared:1 master:2 - tmpfs t rw", b"", b"junk"]
    for _ in range(3000):
        table = bytearray(b"\n".join(rng.sample(lines, 2)))
        for _ in range(rng.randint(0, 8)):
            at = rng.randint(0, len(table))
            table[at:at] = rng.choice(pieces)
        one_by_one = [m for ln in bytes(table).split(b"\n") if ln and (m := mounts._parse_line(ln)) is not None]
        assert parse_mounts(bytes(table)) == one_by_one, bytes(table)


def test_a_table_read_already_is_taken_as_it_is() -> None:
    # The node view's look read every namespace's table; its scans' mount points take those, not a second read.
    ns = mount_ns(os.getpid())
    assert ns is not None
    given = parse_mounts(b"40 1 0:50 / /somewhere rw - tmpfs tmpfs rw\n")
    ((got_ns, pid, table),) = namespace_tables([os.getpid()], set(), {ns[0]: given})
    assert (got_ns, pid, table) == (ns[0], os.getpid(), given)
    ((_, _, own),) = namespace_tables([os.getpid()], set())  # not given: read from /proc
    assert own
    assert own != given
