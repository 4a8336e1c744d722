r"""The one mount-table parser (core/host/mounts.py), on hand-written lines and on real hostile mounts.

The kernel octal-escapes a space, tab, newline and backslash in mountinfo paths and leaves every
other byte as it is (a carriage return, bytes that are not UTF-8). The real tests mount tmpfs
instances at directories so named, in a child's private mount namespace (``unshare --mount
--propagation private``): the mounts exist only there and go with the child, whatever happens
to the test. The directories live on a tmpfs of the test's own, unmounted on every path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from smgshm.core.host.holders import holder_index
from smgshm.core.host.identity import read_host_identity
from smgshm.core.host.mountpoints import mount_points
from smgshm.core.host.mounts import (
    mount_aliases,
    mount_of,
    parse_mounts,
    read_mounts,
)
from smgshm.core.host.pidtrust import judge_trust
from tests.conftest import Children, mounted_tmpfs

# ---------------------------------------------------------------------------------------------
# hand-written lines


# ---------------------------------------------------------------------------------------------
# real mounts at hostile names

HOSTILE = [
    b"a space",
    b"a\ttab",
    b"a\nnewline",
    b"a\\backslash",
    b"literal \\040",
    b"a - b",
    b"not utf-8 \xff\xfe",
    b"a\rreturn",
    b"all \t\n\\\r\xff",
]
HELD = b"held \t\n\\\r\xff"  # a file bind-mounted over this name, open through it
VICTIM = b"victim"

# In the private mount namespace: a tmpfs at each hostile dir, the victim file bind-mounted over
# HELD (held open through it), then what the in-namespace consumers read, as one JSON line.
MOUNTER = r"""
import ctypes, json, os, sys
from smgshm.core.client.whatif import _mount_options
from smgshm.core.host.identity import read_host_identity
from smgshm.core.host.mountpoints import mounted_names
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
d, held, victim = os.fsencode(sys.argv[1]), bytes.fromhex(sys.argv[3]), bytes.fromhex(sys.argv[4])
names = [bytes.fromhex(h) for h in sys.argv[2].split(",")]
def mount(src, at, fstype, flags, data):
    if libc.mount(src, at, fstype, flags, data) != 0:
        print(json.dumps({"refused": os.strerror(ctypes.get_errno())}), flush=True)
        sys.exit(0)
for n in names:
    mount(b"smgshm-hostile", d + b"/" + n, b"tmpfs", 0, b"size=1m")
mount(d + b"/" + victim, d + b"/" + held, None, 4096, None)  # MS_BIND
keep = os.open(d + b"/" + held, os.O_RDONLY)
ident = {n.hex(): read_host_identity(os.fsdecode(d + b"/" + n)) for n in names}
print(json.dumps({
    "identity": {h: [i.fstype, i.mount_options] for h, i in ident.items()},
    "whatif": {n.hex(): _mount_options(os.fsdecode(d + b"/" + n)) for n in names},
    "mounted": sorted(os.fsencode(x).hex() for x in mounted_names(os.fsdecode(d))),
}), flush=True)
sys.stdin.readline()  # the parent looks at this namespace from outside meanwhile
"""


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    """A tmpfs of the test's own for the hostile dirs, unmounted whatever happens; the test skips
    where it may not mount (a trial mount first, in a private namespace that goes with it)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount tmpfs instances")
    trial = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "smgshm-trial", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if trial.returncode != 0:
        pytest.skip(f"mount is not permitted here: {trial.stderr.strip()[:200]}")
    with mounted_tmpfs(tmp_path / "base", "4m") as d:
        yield d


def _spawn(children: Children, argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    p = children.spawn(argv, stdin=subprocess.PIPE)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        p.wait(timeout=10)
        raise AssertionError(f"the mounter exited {p.returncode}: {p.stderr.read() if p.stderr else ''}")
    if '"refused"' in line:
        pytest.skip(f"mount(2) refused in a private mount namespace: {line.strip()}")
    return p, line


@pytest.mark.timeout(60)
def test_hostile_mount_points_read_back_exactly_in_every_consumer(children: Children, base: str) -> None:
    d = os.fsencode(base)
    for n in HOSTILE:
        os.mkdir(d + b"/" + n)
    for n in (VICTIM, HELD):
        with open(d + b"/" + n, "wb") as f:
            f.write(b"v" * 4096)
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        "-c",
        MOUNTER,
        base,
        ",".join(n.hex() for n in HOSTILE),
        HELD.hex(),
        VICTIM.hex(),
    ]
    p, line = _spawn(children, argv)
    inside = json.loads(line)
    try:
        # The parser, on the namespace's real table: every mount point is the very path's bytes.
        table = read_mounts(f"/proc/{p.pid}/mountinfo")
        points = {m.point_bytes: m for m in table}
        for n in [*HOSTILE, HELD]:
            assert d + b"/" + n in points, (n, sorted(points))
            st = os.stat(b"/proc/%d/root%s/%s" % (p.pid, d, n))
            assert points[d + b"/" + n].dev == st.st_dev, n
        assert sum(m.fstype == "tmpfs" and m.source == "smgshm-hostile" for m in table) == len(HOSTILE)
        # A malformed line among the real ones changes nothing.
        with open(f"/proc/{p.pid}/mountinfo", "rb") as f:
            raw = f.read()
        lines = raw.split(b"\n")
        sep = lines[1].index(b" - ")
        cut = [lines[1][:sep], lines[1][: lines[1].index(b" ", sep + 3)]]  # before " - ", after the fs type
        torn = [lines[0], b"garbage", cut[0], *lines[1:], cut[1], b"1 2 3 - x"]
        assert parse_mounts(b"\n".join(torn)) == table

        # In the namespace: identity's fs type and options, the what-if's options, mounted_names.
        for n in HOSTILE:
            fstype, opts = inside["identity"][n.hex()]
            assert (fstype, "size=1024k" in opts.split(",")) == ("tmpfs", True), (n, opts)
            assert "size=1024k" in inside["whatif"][n.hex()].split(","), n
        assert inside["mounted"] == sorted(n.hex() for n in [*HOSTILE, HELD])

        # From outside: identity through /proc/P, the names mounted on in another namespace, the
        # bind mount's alias and the holder found through it.
        for n in HOSTILE:
            ident = read_host_identity(os.fsdecode(d + b"/" + n), pid=p.pid)
            assert (ident.fstype, "size=1024k" in ident.mount_options.split(",")) == ("tmpfs", True), n
        elsewhere = mount_points(base, pids=[p.pid])
        assert sorted(os.fsencode(x) for x in elsewhere) == sorted([*HOSTILE, HELD])
        assert all(where.startswith("mount namespace mnt:[") for where in elsewhere.values()), elsewhere
        dev = os.stat(base).st_dev
        assert os.fsdecode(HELD) in mount_aliases(dev, pids=[p.pid])
        victim = os.stat(d + b"/" + VICTIM)
        held = holder_index(dev, pids=[p.pid], names=[os.fsdecode(VICTIM)])
        assert [(h.pid, h.how) for h in held.get((dev, victim.st_ino), [])] == [(p.pid, "fd")], held
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=30)


# In a new pid and mount namespace: the base tmpfs bind-mounted at a hostile path, its own mount
# there detached, so its table shows the filesystem only at the hostile path.
SEER = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
d, at = os.fsencode(sys.argv[1]), bytes.fromhex(sys.argv[2])
if libc.mount(d, at, None, 4096, None) != 0 or libc.umount2(d, 2) != 0:  # MS_BIND; MNT_DETACH
    print('{"refused": "%s"}' % os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(0)
print("ready", flush=True)
signal.pause()
"""


@pytest.mark.trust
@pytest.mark.timeout(60)
def test_pidtrust_names_the_hostile_path_another_pid_namespace_sees_the_filesystem_at(
    children: Children, base: str, tmp_path: Path
) -> None:
    at = os.fsencode(tmp_path) + b"/seen at \t\n\\\r\xff"
    os.mkdir(at)
    argv = [
        "unshare",
        "--pid",
        "--fork",
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        "-c",
        SEER,
        base,
        at.hex(),
    ]
    p, _ = _spawn(children, argv)
    kids = psutil.Process(p.pid).children(recursive=True)
    inner = next(k.pid for k in [psutil.Process(p.pid), *kids] if k.name().startswith("python"))
    dev = os.stat(base).st_dev
    seen = mount_of(read_mounts(f"/proc/{inner}/mountinfo"), dev)
    assert seen is not None
    assert seen.point_bytes == at
    trust = judge_trust(base, pids=[inner])
    assert trust.trusted is False
    assert f" at {os.fsdecode(at)}: " in trust.note, trust.note
