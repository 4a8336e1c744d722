"""Every remount, rm and gc fix_cmd doctor prints, run as it stands, changes the tmpfs it was printed for
and nothing else (issue #29, item 3: fixes that work when pasted).

The tmpfs is the test's own: 1 MiB at /dev/shm in a mount namespace of its own (a container's, as
tests/integration/test_host_place.py makes it), seen here at /proc/PID/root/dev/shm. Into it go every
kind of trouble doctor has a command for: a dead producer's segment that nearly fills it (leaks; the shm
dir nearly full), a gateway's probe file left by a dead pid (probe files), a FIFO named like a segment
(hazards), a live gateway's segment seen for longer than the stranded age (stranded: its sighting planted
as a scan 400 s ago would have stored it), an in-flight budget twice its size (capacity) and 4 KiB pages
(page size). doctor runs on it once; each command it prints then runs as printed: smgshm's in this process
(gc's pid-namespace look at this test's process only: ``trusting``), the others (rm, nsenter + mount) as
children. After each, the tmpfs shows that command's effect, and this host's /dev/shm is as it was: the
test's own names there (the same names as in the tmpfs, old enough for any gc to take), its size and its
mount options.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from smgshm.core.host import clock
from smgshm.core.host.mounts import mount_holding, read_mounts
from tests.conftest import Children, make_file, run_cli
from tests.support.cli_gc import dead_pid
from tests.support.gc_sightings import _forge, _plant, _store_path

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.usefixtures("trusting"),
    pytest.mark.skipif(
        os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")),
        reason="needs root, unshare and nsenter",
    ),
]

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
HOLDER = "mount -t tmpfs -o size=1m,mode=1777 smgshm-fixes /dev/shm && echo up && exec sleep 600"
HOST_SHM = "/dev/shm"


def _holder(children: Children) -> int:
    p = children.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", HOLDER])
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line == "up", p.stderr.read() if p.stderr else ""
    return p.pid  # unshare and sh exec: this pid is the holder's


def _mount(pid: int | None) -> tuple[int, str]:
    """(size, superblock options) of /dev/shm as process ``pid`` sees it (None: this process)."""
    path = HOST_SHM if pid is None else f"/proc/{pid}/root/dev/shm"
    table = read_mounts("/proc/self/mountinfo" if pid is None else f"/proc/{pid}/mountinfo")
    m = mount_holding(table, HOST_SHM, os.stat(path).st_dev)
    assert m is not None
    v = os.statvfs(path)
    return v.f_blocks * v.f_frsize, m.super_options


@pytest.fixture
def host_names() -> Iterator[list[str]]:
    """Names the test puts in this host's /dev/shm (removed at the end)."""
    made: list[str] = []
    yield made
    for n in made:
        with pytest.MonkeyPatch.context():
            if os.path.lexists(os.path.join(HOST_SHM, n)):
                os.unlink(os.path.join(HOST_SHM, n))


def _host(names: list[str]) -> tuple[list[str], tuple[int, str]]:
    return sorted(n for n in os.listdir(HOST_SHM) if n in names), _mount(None)


def _run(argv: list[str]) -> Any:
    """A fix as printed: smgshm's own in this process (as the CLI), anything else as a child."""
    if argv[0] == "smgshm":
        return run_cli("--json", *argv[1:]).json
    return subprocess.run(argv, check=True, timeout=60, capture_output=True, text=True)


def test_every_fix_doctor_prints_changes_its_tmpfs_and_nothing_else(children: Children, host_names: list[str]) -> None:
    pid = _holder(children)
    d = f"/proc/{pid}/root/dev/shm"
    leaked = f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0"
    probe = f"smg-tokenspeed-probe-{dead_pid(children)}"
    fifo = "smg-tokenspeed-2-1-0"
    # A live gateway's segment (pid 1: alive, and started long before the sighting planted below).
    stranded = f"smg-tokenspeed-1-{time.time_ns()}-0"
    make_file(d, leaked, size=950 * KIB)
    make_file(d, probe, size=0)
    os.mkfifo(os.path.join(d, fifo), 0o600)
    make_file(d, stranded, size=4 * KIB)
    if clock.boot_clock_ns() < 600 * 10**9:
        pytest.skip("this host booted less than 10 minutes ago: no sighting 400 s old can predate pid 1")
    _plant(_store_path(d), _forge(d, stranded, seen_ns=clock.boot_clock_ns() - 400 * 10**9))
    # Here, an hour old, what a fix aimed at the wrong tmpfs would take: the probe file by its very name, and
    # a leaked segment of a dead producer. Not a smg-tokenspeed-<dead pid>-* one: any real gateway of another
    # test sweeps those from this host's /dev/shm at its first SHM write (smg-facts 3.3); gc reaps this alike.
    host_leaked = f"smg-smgshm-{dead_pid(children)}-{time.time_ns()}-0"
    for n in (host_leaked, probe):
        make_file(HOST_SHM, n, size=0, age_s=3600)
        host_names.append(n)
    host = _host(host_names)
    assert host[0] == sorted([host_leaked, probe])

    # exit 5: its verified SHM send finds the dir full (the worst failure; no fix command of its own)
    doc = run_cli("--json", "doctor", "--no-gateways", "--no-e2e", "--shm-dir", d, "--inflight-bytes", "2MiB", exit=5)
    checks = {c["name"]: c for c in doc.json["result"]["checks"]}
    fixes = {name: c["fix_cmd"] for name, c in checks.items() if c.get("fix_cmd")}
    gc_delete = ["smgshm", "gc", "--delete", "--shm-dir", d]
    stale = [
        "smgshm",
        "gc",
        "--delete",
        "--include-stale",
        "--stale-after",
        "300s",
        "--min-age",
        "300s",
        "--shm-dir",
        d,
    ]
    nsenter = ["nsenter", "-t", str(pid), "-m", "-r", "--", "mount", "-o"]
    assert fixes == {
        "probe files": ["rm", "--", os.path.join(d, probe)],
        "leaks": gc_delete,
        "shm dir": gc_delete,  # nearly full: reap leaks (or enlarge)
        "stranded": stale,
        "hazards": ["smgshm", "gc", "--all", "--shm-dir", d],
        "capacity": [*nsenter, "remount,size=1G", HOST_SHM],
        "page size": [*nsenter, "remount,huge=within_size", HOST_SHM],
    }, {k: shlex.join(v) for k, v in fixes.items()}

    def there() -> list[str]:
        return sorted(n for n in os.listdir(d) if n.startswith("smg-"))

    _run(fixes["probe files"])
    assert there() == sorted([leaked, fifo, stranded])
    assert _host(host_names) == host

    out = _run(fixes["leaks"])  # (the shm dir's fix is the same command)
    assert {x["name"]: x["deleted"] for x in out["result"]["deleted"]} == {leaked: True}
    assert there() == sorted([fifo, stranded])
    assert _host(host_names) == host

    out = _run(fixes["stranded"])
    assert {x["name"]: x["deleted"] for x in out["result"]["deleted"]} == {stranded: True}
    assert there() == [fifo]
    assert _host(host_names) == host

    out = _run(fixes["hazards"])  # a listing: it names the FIFO, and touches nothing
    assert [s["name"] for s in out["result"]["segments"]] == [fifo]
    assert there() == [fifo]
    assert _host(host_names) == host

    size, options = _mount(pid)
    assert size == MIB
    _run(fixes["capacity"])
    assert _mount(pid)[0] == GIB
    assert _host(host_names) == host

    assert "huge=" not in options
    _run(fixes["page size"])
    assert "huge=within_size" in _mount(pid)[1].split(",")
    assert _host(host_names) == host


def test_a_bind_mount_over_a_name_in_the_tmpfs_namespace_is_a_hazard_gc_never_detaches(children: Children) -> None:
    """A regular file bind-mounted over an SMG name inside the tmpfs's own mount namespace, reached here
    through /proc/PID/root: that namespace's table shows the mount (this one's never does), so gc judges it
    a hazard and ``gc --delete --yes`` leaves the mount attached (a rename or unlink from here would detach it)."""
    pid = _holder(children)
    d = f"/proc/{pid}/root/dev/shm"
    name = f"smg-tokenspeed-{dead_pid(children)}-{time.time_ns()}-0"
    make_file(d, "src", size=4 * KIB)
    make_file(d, name, size=0, age_s=3600)  # a dead producer's, an hour old: leaked, were it not mounted on
    inner = f"{HOST_SHM}/{name}"
    subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "--", "mount", "--bind", f"{HOST_SHM}/src", inner],
        check=True,
        timeout=60,
        capture_output=True,
    )

    def attached() -> bool:
        return any(m.point == inner for m in read_mounts(f"/proc/{pid}/mountinfo"))

    assert attached()
    listed = run_cli("--json", "gc", "--shm-dir", d).json["result"]["segments"]
    assert {s["name"]: s["state"] for s in listed} == {name: "hazard"}
    out = run_cli("--json", "gc", "--delete", "--yes", "--min-age", "0", "--shm-dir", d).json["result"]
    assert [x for x in out["deleted"] if x["deleted"]] == []
    assert attached()
    assert os.path.lexists(os.path.join(d, name))
