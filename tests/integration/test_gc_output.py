"""gc's output under hostile names, in every locale, and in the shapes people and scripts use.

The names are what any local user can create in /dev/shm: terminal escapes (clear screen, window
title), a newline that forges a row and a ``fix:`` line, invalid UTF-8, non-ASCII. The command
runs as a real child process under C.UTF-8 and under an ASCII (non-UTF-8) locale, in every output
form; nothing raw may reach the terminal, nothing may crash, and JSON must give the exact bytes back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Children, make_file, run_cli, smgshm_argv
from tests.support.cli_gc import dead_pid, seg_name

ALWAYS = ("--assume-dead",)  # judged by this namespace: other namespaces on this machine cannot interfere
HOSTILE: list[bytes] = [
    b"smg-tokenspeed-1-1-0\x1b[2J\x1b]0;pwned\x07",  # clear screen, set the window title
    b"smg-x\nfix: run rm -rf ~",  # a forged line
    b"smg-\xff\xfe-not-utf8",
    "smg-caf\u00e9-\u202ereversed".encode(),  # non-ASCII and a bidi override
    "smg-tokenspeed-\u0661\u0662\u0663-1-0".encode(),  # digits that are not a pid
]
LOCALES = {
    "C.UTF-8": {"LC_ALL": "C.UTF-8"},
    "ascii": {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""},
}


def _plant(d: str, children: Children) -> str:
    for raw in HOSTILE:
        fd = os.open(os.fsencode(d) + b"/" + raw, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    leak = seg_name(dead_pid(children))
    make_file(d, leak)
    return leak


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in {**os.environ, **env}.items() if v != ""}
    return subprocess.run(smgshm_argv(*args), capture_output=True, env=full, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("loc", sorted(LOCALES))
@pytest.mark.parametrize(
    "form", [[], ["--all"], ["--raw"], ["--delete", "--min-age", "0", "--yes"], ["--check"]], ids=" ".join
)
def test_hostile_names_never_reach_the_terminal_raw(
    children: Children, tmp_path: Path, loc: str, form: list[str]
) -> None:
    d = str(tmp_path / "shm")
    os.mkdir(d)
    leak = _plant(d, children)
    res = _run(["gc", "--shm-dir", d, *ALWAYS, *form], LOCALES[loc])
    out, err = res.stdout, res.stderr
    assert res.returncode == (3 if "--check" in form else 0), err.decode(errors="replace")
    assert b"Traceback" not in err
    for stream in (out, err):
        assert b"\x1b" not in stream, "an escape sequence reached the terminal"
        assert b"\x07" not in stream
        assert b"\xff" not in stream, "undecodable bytes are shown escaped"
        assert b"\xe2\x80\xae" not in stream, "a bidi override reached the terminal"
    lines = out.splitlines()
    assert not [ln for ln in lines if ln.startswith(b"fix:")], "a newline in a name forged a line"
    assert b"\\x1b[2J" in out or "--delete" in form, "the escape is shown, escaped"
    assert b"\\xff\\xfe" in out or "--delete" in form
    if "--delete" in form:
        assert not os.path.lexists(os.path.join(d, leak))
        assert len(os.listdir(d)) == len(HOSTILE), "names without a pid are never deleted"


@pytest.mark.slow
@pytest.mark.parametrize("loc", sorted(LOCALES))
def test_json_gives_the_exact_bytes_back_and_prometheus_is_safe(children: Children, tmp_path: Path, loc: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    d = os.fsdecode(os.fsencode(str(tmp_path)) + b"/shm-\xff\x1b[2J")  # a hostile shm dir path too
    os.mkdir(d)
    _plant(d, children)
    prom = str(tmp_path / "gc.prom")
    res = _run(["--json", "gc", "--shm-dir", d, *ALWAYS, "--prometheus", prom], LOCALES[loc])
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    assert b"\x1b" not in res.stdout
    doc = json.loads(res.stdout)
    segs = doc["result"]["segments"]
    assert sorted(bytes.fromhex(s["name_hex"]) for s in segs) == sorted(
        [
            *HOSTILE,
            os.fsencode(
                next(n for n in os.listdir(d) if n.startswith("smg-tokenspeed-") and n.endswith("-0") and n.isascii())
            ),
        ]
    )
    for s in segs:
        assert s["name"].isprintable(), s["name"]
        assert "\n" not in s["name"]
    assert doc["result"]["shm_dir"].isprintable()
    text = Path(prom).read_text(encoding="utf-8")
    assert "\x1b" not in text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    assert {s.labels["shm_dir"] for s in samples} == {doc["result"]["shm_dir"]}


def test_all_lists_every_row_whole_and_the_default_summarises(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    pid = dead_pid(children)
    long = f"smg-tokenspeed-{pid}-{'9' * 150}-0"  # far wider than 80 columns
    names = [long] + [seg_name(pid, seq=i) for i in range(40)]
    for i, n in enumerate(names):
        make_file(d, n, size=4096 * (i + 1))
    env = {"COLUMNS": "80"}
    summary = run_cli("gc", "--shm-dir", d, *ALWAYS, env=env).stdout.splitlines()
    head = summary[: next(i for i, ln in enumerate(summary) if ln.startswith("by state:"))]
    assert " ".join(ln.strip() for ln in head) == f"41 SMG segment(s) in {d}: 41 leaked", "wrapped, whole"
    rows = [ln for ln in summary if ln.startswith("leaked ")]
    assert len(rows) == 20, "the default shows the entries that matter most, not all"
    assert " 164.0 KiB " in rows[0], "the largest first"
    assert "entries that matter most (20 of 41; --all lists every entry):" in summary

    listing = run_cli("gc", "--shm-dir", d, *ALWAYS, "--all", env=env).stdout.splitlines()
    assert listing[: len(head)] == head, "the headline still comes first"
    rows = [ln for ln in listing if ln.startswith("leaked ")]
    assert len(rows) == 41, "every entry once: one listing, the reasons under the ones that matter most"
    assert sum(ln.endswith(f"  {long}") for ln in listing) >= 1, "a long name is never cut or wrapped"

    raw = run_cli("gc", "--shm-dir", d, *ALWAYS, "--raw", env=env).stdout.splitlines()
    assert len(raw) == 41, "no header, no summary: one line per entry"
    fields = [ln.split(" ") for ln in raw]
    assert all(len(f) == 6 for f in fields)
    assert {f[0] for f in fields} == {"leaked"}
    assert {f[5] for f in fields} == set(names)
    by_name = {f[5]: f for f in fields}
    assert int(by_name[long][2]) == 4096, "bytes, not humanised"
    assert by_name[long][4] == str(pid)


def test_all_with_delete_marks_the_deleted_rows(children: Children, tmp_path: Path) -> None:
    d = str(tmp_path)
    gone, young = seg_name(dead_pid(children), seq=1), seg_name(dead_pid(children), seq=2)
    make_file(d, gone, age_s=3600)
    make_file(d, young)
    lines = run_cli("gc", "--shm-dir", d, *ALWAYS, "--all", "--delete", "--yes").stdout.splitlines()
    assert lines[0].startswith("deleted 1, freed 4.0 KiB, kept 1; 1 SMG segment(s) left"), lines[0]
    rows = {ln.rsplit("  ", 1)[-1]: ln.split()[0] for ln in lines if ln.endswith((gone, young)) and "  " in ln}
    assert rows == {gone: "deleted", young: "leaked"}, lines
    assert not [ln for ln in lines if ln.startswith("leaked") and ln.endswith(gone)]


def test_raw_escapes_spaces_so_a_name_stays_one_field(tmp_path: Path) -> None:
    d = str(tmp_path)
    make_file(d, "smg-a name with spaces")
    (line,) = run_cli("gc", "--shm-dir", d, *ALWAYS, "--raw").stdout.splitlines()
    assert line.split(" ")[-1] == "smg-a\\x20name\\x20with\\x20spaces"
    assert len(line.split(" ")) == 6


def test_raw_and_json_do_not_combine(tmp_path: Path) -> None:
    res = run_cli("--json", "gc", "--shm-dir", str(tmp_path), "--raw", exit=2)
    assert json.loads(res.stdout)["error"]["kind"] == "usage"


@pytest.mark.slow
def test_no_progress_bar_for_a_handful_of_entries(children: Children, tmp_path: Path) -> None:
    """On a terminal, a run that takes less than half a second shows no bar at all."""
    d = str(tmp_path)
    for i in range(5):
        make_file(d, seg_name(dead_pid(children), seq=i))
    script = (
        "import os, pty, sys\n"
        "pid, fd = pty.fork()\n"
        "if pid == 0:\n"
        "    os.execv(sys.executable, [sys.executable, '-m', 'smgshm', 'gc', *sys.argv[1:]])\n"
        "out = b''\n"
        "while True:\n"
        "    try: chunk = os.read(fd, 65536)\n"
        "    except OSError: break\n"
        "    if not chunk: break\n"
        "    out += chunk\n"
        "os.waitpid(pid, 0)\n"
        "sys.stdout.write(out.decode(errors='replace'))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script, "--shm-dir", d, *ALWAYS], capture_output=True, text=True, timeout=60
    )
    assert "5 SMG segment(s)" in res.stdout, res.stdout
    assert "scanned" not in res.stdout
    assert "\x1b[?25l" not in res.stdout, "rich hides the cursor when a live bar starts"
