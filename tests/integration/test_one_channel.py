"""One output channel (issue #31, item 6): each mode writes exactly its own contract, whatever fails and
wherever, usage errors included: under --json one JSON document (the whole of stdout parses as one), under
--npd one NPD line (at most 80 characters, exit 0/1/2); --json with --npd is a usage error said as the plugin's
one line. Run through the real entry point (``python -m smgshm``), as NPD and a script run it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_file, run_cli, smgshm_argv
from tests.support.schema_check import validate, validate_document


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(smgshm_argv(*args), capture_output=True, text=True, timeout=120, check=False)


def _one_document(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert p.stdout.endswith("\n"), (p.stdout, p.stderr)
    assert p.stdout.count("\n") == 1, p.stdout  # one document: one line
    doc: dict[str, Any] = json.loads(p.stdout)  # the whole of stdout is that one document
    if doc.get("ok") is False and "error" in doc:
        validate(doc, "error.schema.json")
    else:
        validate_document(doc)
    return doc


def _one_line(p: subprocess.CompletedProcess[str]) -> str:
    assert p.stdout.endswith("\n"), (p.stdout, p.stderr)
    assert p.stdout.count("\n") == 1, p.stdout
    line = p.stdout[:-1]
    assert len(line) <= 80, line
    assert line.isascii(), line
    assert p.returncode in (0, 1, 2), p.returncode
    return line


@pytest.fixture
def shm(tmp_path: Path) -> str:
    d = tmp_path / "shm"
    d.mkdir()
    return str(d)


@pytest.mark.parametrize(
    "args",
    [
        ["--json", "gc", "--check", "--npd"],
        ["gc", "--check", "--npd", "--json"],
        ["--json", "preflight", "--npd"],
        ["preflight", "--npd", "--json"],
    ],
    ids=["json-gc-npd", "gc-npd-json", "json-preflight-npd", "preflight-npd-json"],
)
def test_json_with_npd_is_one_npd_line(shm: str, args: list[str]) -> None:
    p = _run(*args, "--shm-dir", shm)
    line = _one_line(p)
    assert p.returncode == 2
    assert line.startswith("usage error: --npd")
    assert "Error: --npd" in p.stderr  # people still get click's usage message, on stderr


@pytest.mark.parametrize(
    "args",
    [
        ["preflight", "--npd", "--min-age", "xyz"],
        ["gc", "--check", "--npd", "--min-age", "xyz"],
        ["gc", "--check", "--npd", "--bogus"],
        ["preflight", "--npd", "--timeout"],
    ],
    ids=["preflight-min-age", "gc-min-age", "gc-no-such-option", "preflight-missing-value"],
)
def test_an_npd_run_whose_options_fail_to_parse_says_one_line(shm: str, args: list[str]) -> None:
    p = _run(*args[:-1], "--shm-dir", shm, args[-1])
    assert p.returncode == 2  # NPD's Unknown
    assert _one_line(p).startswith("usage error: ")


@pytest.mark.parametrize(
    "args",
    [
        ["--json", "bogus"],
        ["--json", "--bogus"],
        ["gc", "--bogus", "--json"],
        ["--json", "gc", "--min-age", "xyz"],
        ["--json", "ns", "compare"],
        ["--json", "preflight", "--timeout"],
    ],
    ids=["no-such-command", "no-such-root-option", "late-json", "bad-value", "missing-argument", "missing-value"],
)
def test_a_json_usage_error_is_one_document(args: list[str]) -> None:
    p = _run(*args)
    assert p.returncode == 2, p.stderr
    doc = _one_document(p)
    assert doc["ok"] is False
    assert doc["error"]["kind"] == "usage"


def test_a_wrapper_whose_command_is_no_executable_is_one_document(tmp_path: Path, shm: str) -> None:
    """ENOEXEC: refused before anything is reclaimed, as a command not found is (exit 2), in one document."""
    if _binfmt_misc_in_use():
        pytest.skip("binfmt_misc has formats registered here: exec, not preflight, decides (core/host/runnable.py)")
    exe = tmp_path / "not-an-executable"
    exe.write_bytes(b"\x00\x01 no ELF, no #!\n")
    exe.chmod(0o755)
    p = _run("--json", "preflight", "--shm-dir", shm, "--", str(exe))
    doc = _one_document(p)
    assert p.returncode == 2
    assert doc["ok"] is False
    assert "no executable format" in doc["error"]["message"]


def _binfmt_misc_in_use() -> bool:
    try:
        return any(n not in ("register", "status") for n in os.listdir("/proc/sys/fs/binfmt_misc"))
    except OSError:
        return False


def test_an_exec_that_fails_after_the_verdict_adds_no_second_document(tmp_path: Path, shm: str) -> None:
    """The verdict is written before the exec; an exec the checks could not foresee (an interpreter that is
    itself no executable) fails after it: said on stderr, exit 5, and stdout still holds the one document."""
    interp = tmp_path / "interp"
    interp.write_bytes(b"\x00\x01 not a program\n")
    interp.chmod(0o755)
    script = tmp_path / "gateway"
    script.write_text(f"#!{interp}\n")
    script.chmod(0o755)
    p = _run("--json", "preflight", "--shm-dir", shm, "--", str(script))
    doc = _one_document(p)
    assert doc["ok"] is True  # the verdict: the gateway may start
    assert p.returncode == 5
    assert "cannot exec the command" in p.stderr


def test_a_gc_listing_that_fails_midway_is_one_whole_document(
    tmp_path: Path, shm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc --json streams its document as the scan goes: an error after it began closes that document (ok
    false, what was judged by then, a warning why) instead of leaving it cut and adding an error document."""
    from smgshm.core.errors import HostError
    from smgshm.core.segments import gcrun

    for i in range(5):
        make_file(shm, f"smg-tokenspeed-1-{i}-0")
    real = gcrun.run

    def failing(scans: Any, rule: Any, listing: Any, *rest: Any) -> Any:
        def each(scan: Any) -> Any:
            add, seen = listing(scan), []

            def on_entry(seg: Any, row: int) -> None:
                if len(seen) == 3:  # the scan fails midway, its document begun
                    raise HostError("the shm dir cannot be read any more", path=shm)
                seen.append(seg)
                add(seg, row)

            return on_entry

        return real(scans, rule, each, *rest)

    monkeypatch.setattr(gcrun, "run", failing)
    res = run_cli("--json", "gc", "--shm-dir", shm, exit=5)
    assert res.stdout.count("\n") == 1, res.stdout
    doc = json.loads(res.stdout)  # the whole of stdout: one document, whole
    assert doc["ok"] is False
    assert len(doc["result"]["segments"]) == 3
    assert any("stopped before its end (host: the shm dir cannot be read any more" in w for w in doc["warnings"])
    assert "Error: the shm dir cannot be read any more" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_read_only_json_listing_stopped_by_a_signal_is_one_whole_document(tmp_path: Path, sig: str) -> None:
    """SIGTERM or SIGHUP mid-stream: the read-only listing closes its one document (ok false) and exits 143 or
    129, as Ctrl-C does; it was killed mid-document (invalid JSON)."""
    import signal
    import time

    d = tmp_path / "shm"
    d.mkdir()
    for i in range(20_000):  # a producer pid no process has: leaked, listed at length
        os.close(os.open(d / f"smg-tokenspeed-4194303-{time.time_ns()}-{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    p = subprocess.Popen(smgshm_argv("--json", "gc", "--check", "--shm-dir", str(d)), stdout=subprocess.PIPE)
    assert p.stdout is not None
    head = p.stdout.read(200_000)  # well into the segments
    p.send_signal(getattr(signal, sig))
    rest = p.stdout.read()
    p.wait(timeout=60)
    assert p.returncode == {"SIGTERM": 143, "SIGHUP": 129}[sig]
    doc = json.loads(head + rest)
    assert doc["ok"] is False
    validate_document(doc)
