"""Fixes that work when pasted (issue #29, item 3): a fix smgshm suggests, run as it stands, does what it
says to the object it names, at once, and nothing else.

Each test makes the trouble, runs the command that finds it, takes the fix it prints (its ``fix_cmd``,
or the command a hint shows) and runs that unchanged: no ``--min-age 0``, no ``--yes`` (a run with no
TTY never asks). gc's pid-namespace look is this test's process only (``trusting``): on a shared
machine another job's container can reach every filesystem at any moment, and gc then rightly trusts
no pid (tests/integration/test_gc_trust.py shows that).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import pytest

from tests.conftest import Children, make_file, run_cli
from tests.support.cli_gc import dead_pid, seg_name

pytestmark = pytest.mark.usefixtures("trusting")


def _checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["result"]["checks"]}


def _deleted(doc: dict[str, Any]) -> dict[str, bool]:
    return {d["name"]: d["deleted"] for d in doc["result"]["deleted"]}


def _why(doc: dict[str, Any]) -> object:
    """What gc judged, for a failure's message: trust and each segment's state and reason."""
    r = doc["result"]
    segs = [(s["name"], s["state"], s["reason"], s["seen_s"], s["proven_dead"]) for s in r["segments"]]
    return r["liveness_trusted"], r["liveness_note"], r.get("sightings_stored"), segs


@pytest.mark.slow
def test_doctors_leak_and_probe_file_fixes_reap_a_dead_producers_files_when_pasted(
    children: Children, tmpfs_dir: str
) -> None:
    """A producer that died a moment ago: its segment and a gateway's probe file, both far younger than
    gc's --min-age. doctor's fix for each is one ``smgshm gc --delete`` (the probe file's no longer waives
    the age with ``--min-age 0``, the leak's never did): pasted, it reaps both now."""
    segment = seg_name(dead_pid(children))
    probe = f"smg-tokenspeed-probe-{dead_pid(children)}"
    make_file(tmpfs_dir, segment)
    make_file(tmpfs_dir, probe, size=0)
    doc = run_cli("--json", "doctor", "--no-gateways", "--shm-dir", tmpfs_dir, exit=3).json
    c = _checks(doc)
    leaks, probes = c["leaks"], c["probe files"]
    assert leaks["fix_cmd"] == ["smgshm", "gc", "--delete", "--shm-dir", tmpfs_dir]
    assert leaks["fix"] == "reap them:"
    gc_fix = shlex.join(leaks["fix_cmd"])
    assert probes["fix"].startswith(gc_fix + ", or once no gateway has pid"), probes["fix"]
    assert "--min-age" not in probes["fix"]

    pasted = run_cli("--json", *leaks["fix_cmd"][1:]).json
    assert _deleted(pasted) == {segment: True, probe: True}, _why(pasted)
    assert not [n for n in os.listdir(tmpfs_dir) if n.startswith("smg-")]


@pytest.mark.slow
def test_watchs_leak_fix_is_said_once_and_reaps_when_pasted(children: Children, tmpfs_dir: str) -> None:
    """watch's fix for a leaked orphan names gc's command once (it was "remove them: smgshm gc --delete:
    smgshm gc --delete --shm-dir D", the catalogue's words and the command run together); pasted, the
    command reaps the orphan now: watch recorded it before that gc's look at the pid namespaces."""
    segment = seg_name(dead_pid(children))
    make_file(tmpfs_dir, segment)
    res = run_cli("--no-color", "watch", "--shm-dir", tmpfs_dir, "--orphan-after", "0s", "--duration", "2s")
    (fix,) = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("fix:")]
    assert fix.count("smgshm gc") == 1, fix
    assert fix.startswith("fix: remove them with gc: smgshm gc"), fix
    argv = shlex.split(fix.split(": ", 2)[2])
    assert argv == ["smgshm", "gc", "--delete", "--shm-dir", tmpfs_dir]
    pasted = run_cli("--json", *argv[1:]).json
    assert _deleted(pasted) == {segment: True}, (_why(pasted), res.stderr)
    assert not os.path.lexists(os.path.join(tmpfs_dir, segment))
