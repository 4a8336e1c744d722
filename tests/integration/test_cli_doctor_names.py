"""doctor under hostile names: escaped output, exact shell-quoted fixes, no crash in any locale.

Names in the shm dir are chosen by any local user: escape sequences, newlines that fake a
``fix:`` line, ``$(...)`` in a suggested command, bytes that are not UTF-8. doctor runs as a
real child process under LC_ALL=C and C.UTF-8 against a private shm dir.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from smgshm.cli.fmt import quote_cmd
from tests.conftest import smgshm_argv

pytestmark = pytest.mark.timeout(180)

EVIL = "smg-tokenspeed-probe-1\x1b[2J\x1b]0;pwned\x07\nfix: run $(touch PWNED)"
BAD_UTF8 = b"smg-tokenspeed-probe-2\xff\xfe"


@pytest.fixture
def hostile_dir(shm_dir: str) -> str:
    for name in (os.fsencode(EVIL), BAD_UTF8):
        fd = os.open(os.path.join(os.fsencode(shm_dir), name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    return shm_dir


def _doctor(shm: str, locale: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIO"))}
    env.update(LC_ALL=locale, COLUMNS="80")
    argv = smgshm_argv(*args, "doctor", "--no-gateways", "--shm-dir", shm)
    return subprocess.run(argv, env=env, capture_output=True, timeout=150)


@pytest.mark.slow
@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_doctor_shows_hostile_names_escaped_in_any_locale(hostile_dir: str, locale: str, tmp_path: Path) -> None:
    res = _doctor(hostile_dir, locale)
    out, err = res.stdout.decode("utf-8", "replace"), res.stderr.decode("utf-8", "replace")
    # Named like probe files but carrying no pid: no gateway's, so a warning, never a failure; never 70. Nothing
    # else is there: the leaks check judged nothing (look-alikes alone), so doctor is inconclusive, never a pass.
    assert res.returncode == 6, err
    assert "inconclusive" in out
    assert "Traceback" not in err
    assert "internal error" not in err
    for stream in (res.stdout, res.stderr):
        assert b"\x1b" not in stream
        assert b"\x07" not in stream
    assert not any(ln.lstrip().startswith("fix: run") for ln in out.splitlines()), "a name faked a fix line"
    assert "\\xff\\xfe" in out
    assert "a gateway with pid" not in out, "a name that does not parse names no gateway"
    assert not [ln for ln in out.splitlines() if ln.strip().startswith("rm -- ")], "no stranger's file to delete"
    assert not (tmp_path / "PWNED").exists()
    assert len(os.listdir(hostile_dir)) == 2, "doctor deleted nothing"


@pytest.mark.slow
@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_a_real_leftover_beside_hostile_names_fails_with_an_exact_rm(
    hostile_dir: str, locale: str, tmp_path: Path
) -> None:
    real = "smg-tokenspeed-probe-4194303"  # a pid no gateway has (above the kernel's largest pid_max)
    os.close(os.open(os.path.join(hostile_dir, real), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        res = _doctor(hostile_dir, locale)
    finally:
        os.unlink(os.path.join(hostile_dir, real))
    out = res.stdout.decode("utf-8", "replace")
    assert res.returncode == 3, res.stderr
    lines = [ln.strip() for ln in out.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("rm -- ")]
    assert len(starts) == 1, out
    cmd = lines[starts[0] : starts[0] + 1]
    while cmd[-1].endswith("\\"):  # wider than the terminal: continued, as a shell reads it when pasted
        cmd.append(lines[starts[0] + len(cmd)])
    printed = subprocess.run(
        ["bash", "-c", "printf %s " + "\n".join(cmd).removeprefix("rm -- ")],
        capture_output=True,
        cwd=tmp_path,
        timeout=10,
    )
    assert printed.stdout == os.fsencode(os.path.join(hostile_dir, real))


@pytest.mark.slow
def test_doctor_json_carries_the_exact_names(hostile_dir: str) -> None:
    res = _doctor(hostile_dir, "C.UTF-8", "--json")
    assert res.returncode == 6, res.stderr  # look-alikes alone: the leaks check judged nothing (inconclusive)
    doc = json.loads(res.stdout)
    assert [c["status"] for c in doc["result"]["checks"] if c["name"] == "leaks"] == ["unknown"]
    pf = [c for c in doc["result"]["checks"] if c["name"] == "probe files"]
    assert {bytes.fromhex(h) for c in pf for h in c["names_hex"]} == {os.fsencode(EVIL), BAD_UTF8}
    assert all(c["status"] == "warn" and not c["fix_cmd"] for c in pf)


def test_quote_cmd_round_trips_through_bash(tmp_path: Path) -> None:
    words = ["plain", "a b", "it's", "$(touch PWNED)", "x\x1b[2J\ny", os.fsdecode(b"\xff\xfe"), "é", "back\\slash"]
    printed = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + quote_cmd(words)], capture_output=True, cwd=tmp_path, timeout=10
    )
    assert printed.stdout.split(b"\0")[:-1] == [os.fsencode(w) for w in words]
    assert not (tmp_path / "PWNED").exists()
    assert "\n" not in quote_cmd(words)
    assert shlex.split(quote_cmd(["a b", "c"])) == ["a b", "c"]
