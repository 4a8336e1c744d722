"""`smgshm --help` must start fast: no torch, no grpc, no generated code at import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# core.receiver too: it pulls in the wire and tensor code, and serve's options once imported
# it at module level for two constants, so every command paid for it at start.
HEAVY = ("torch", "grpc", "smgshm.rpc", "smg_grpc_proto", "smgshm.core.receiver.reader")


def probe_for(heavy: tuple[str, ...]) -> str:
    """A script that runs smgshm with its argv and reports on stderr which of ``heavy`` it imported."""
    return f"HEAVY = {heavy!r}\n" + _RUN


_RUN = (
    "import sys\n"
    "from smgshm.cli import main\n"
    "sys.argv = ['smgshm', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    "heavy = sorted(m for m in HEAVY if m in sys.modules)\n"
    "sys.stderr.write('HEAVY=' + ','.join(heavy) + '\\n')\n"
)
PROBE = probe_for(HEAVY)


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["serve", "--help"], ["ns", "--help"], ["ns"], ["gc", "--help"], ["gc"], ["watch", "--help"]],
)
def test_no_heavy_imports(argv: list[str]) -> None:
    res = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60)
    assert "HEAVY=\n" in res.stderr, res.stderr
    assert res.stdout.strip(), "the command printed nothing"


def test_python_dash_m_runs() -> None:
    res = subprocess.run([sys.executable, "-m", "smgshm", "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert res.stdout.startswith("smgshm, version ")


def test_gc_loads_only_gc(tmp_path: Path) -> None:
    # Start-up is part of every gc run's time: the other commands (and rich's tables) load on use.
    probe = probe_for(
        (
            "smgshm.cli.bench",
            "smgshm.cli.e2e",
            "smgshm.cli.probe",
            "smgshm.cli.watch",
            "rich.table",
            "tempfile",
            "psutil",
        )
    )
    (tmp_path / f"smg-tokenspeed-{2**32 - 1}-1-0").touch()  # a pid gc looks up (no process has it)
    res = subprocess.run(
        [sys.executable, "-c", probe, "gc", "--shm-dir", str(tmp_path), "--assume-dead"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "HEAVY=\n" in res.stderr, res.stderr
    assert "1 SMG segment(s)" in res.stdout, res.stdout
    assert "1 leaked" in " ".join(res.stdout.split()), res.stdout  # wrapped at 80 columns
