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


def test_an_interpreter_that_is_no_executable_is_foreseen_in_one_document(tmp_path: Path, shm: str) -> None:
    """A #! naming a file in no executable format fails at exec (ENOEXEC): foreseen, as deep as the kernel
    follows interpreters, before anything is reclaimed: one usage document, exit 2."""
    if _binfmt_misc_in_use():
        pytest.skip("binfmt_misc has formats registered here: exec, not preflight, decides (core/host/runnable.py)")
    interp = tmp_path / "interp"
    interp.write_bytes(b"\x00\x01 not a program\n")
    interp.chmod(0o755)
    script = tmp_path / "gateway"
    script.write_text(f"#!{interp}\n")
    script.chmod(0o755)
    p = _run("--json", "preflight", "--shm-dir", shm, "--", str(script))
    doc = _one_document(p)
    assert (p.returncode, doc["ok"], doc["error"]["kind"]) == (2, False, "usage")
    assert f"names an interpreter in no executable format ({interp})" in doc["error"]["message"]


def test_a_shebang_naming_a_missing_interpreter_is_foreseen_at_any_depth(tmp_path: Path, shm: str) -> None:
    """A script whose #! names a script whose #! names a missing interpreter: execve would say ENOENT after
    the verdict; foreseen instead (one usage document, exit 2, nothing reclaimed)."""
    inner = tmp_path / "interp"
    inner.write_text(f"#!{tmp_path / 'no-such-interpreter'}\n")
    inner.chmod(0o755)
    script = tmp_path / "gateway"
    script.write_text(f"#!{inner}\n")
    script.chmod(0o755)
    leaked = make_file(shm, "smg-tokenspeed-4194303-1-0")  # a pid no process has: reclaimed were it run
    p = _run("--json", "preflight", "--shm-dir", shm, "--", str(script))
    doc = _one_document(p)
    assert (p.returncode, doc["error"]["kind"]) == (2, "usage")
    assert "names an interpreter that cannot be run" in doc["error"]["message"]
    assert os.path.exists(leaked)


def _wrapper_exec_failing(argv: list[str], between: Any = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (a wrapper) with stdout a pipe of one page; ``between`` is called once its document has
    begun (its checks, exec_refusal's included, are done) and before it can be written whole."""
    import fcntl

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)  # read(1): one byte
    assert p.stdout is not None
    assert p.stderr is not None
    fcntl.fcntl(p.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # a document longer than this blocks its writer
    head = p.stdout.read(1) if between is not None else b""
    if between is not None:
        between()
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, p.returncode, (head + out).decode(), err.decode())


def _exec_failed_after(p: subprocess.CompletedProcess[str], script: Path, code: int, errname: str) -> None:
    doc = _one_document(p)  # one document, the verdict's, valid against preflight's schema
    assert doc["ok"] is True
    assert doc["command"] == "preflight"
    assert doc["result"]["exec_next"] == str(script)  # it says the command is exec'd next, not that it ran
    assert p.returncode == code, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr  # one line
    assert p.stderr.startswith(f"smgshm preflight: cannot exec '{script}'")
    assert f"({errname})" in p.stderr


def test_an_exec_that_fails_after_the_verdict_text_file_busy_exits_126(tmp_path: Path, shm: str) -> None:
    """ETXTBSY: the command is open for writing (by this test) when preflight execs it, which nothing before
    the exec can see; the one document stands, the failure is one line on stderr and the shell's 126."""
    script = tmp_path / "gateway"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    writer = os.open(script, os.O_WRONLY)
    try:
        p = _wrapper_exec_failing(smgshm_argv("--json", "preflight", "--shm-dir", shm, "--", str(script)))
    finally:
        os.close(writer)
    _exec_failed_after(p, script, 126, "ETXTBSY")


def test_an_interpreter_removed_after_the_checks_exits_127_with_one_document(tmp_path: Path, shm: str) -> None:
    """The script's #! interpreter is there when preflight checks it and gone when it execs: execve says
    ENOENT after the verdict was written. A pipe of one page holds the wrapper mid-document (a long kept
    list) while the interpreter is removed, so the race is made, not hoped for."""
    interp = tmp_path / "interp"
    interp.write_text("#!/bin/sh\nexit 0\n")
    interp.chmod(0o755)
    script = tmp_path / "gateway"
    script.write_text(f"#!{interp}\n")
    script.chmod(0o755)
    for i in range(40):  # alive (this test's pid): kept and listed, a document longer than the pipe
        make_file(shm, f"smg-tokenspeed-{os.getpid()}-{i}-{'0' * 150}")
    p = _wrapper_exec_failing(
        smgshm_argv("--json", "preflight", "--shm-dir", shm, "--", str(script)), between=interp.unlink
    )
    assert len(p.stdout) > 4096
    _exec_failed_after(p, script, 127, "ENOENT")


def test_npd_with_a_command_is_one_npd_line(shm: str) -> None:
    """The --npd form never wraps: a command given is a usage error said as the plugin's one line."""
    p = _run("preflight", "--npd", "--shm-dir", shm, "--", "true")
    assert p.returncode == 2
    assert _one_line(p).startswith("usage error: --npd")


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
