"""The slim install for real: a throwaway venv, ``pip install <this checkout>`` with no extras, then the
installed ``smgshm`` run as a user runs it. The node commands work; the commands that need an extra
exit 2 naming it. tests/unit/test_slim_install.py is its in-process twin (a meta-path blocker).

pip fetches the base dependencies (and setuptools, for the build) from the machine's index: PyPI or
its configured mirror and wheel dirs. Where none answers, the test skips, saying so: an install that
cannot be made proves nothing either way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "grpc", "numpy", "tokenizers", "google.protobuf", "smg_grpc_proto", "xxhash", "PIL")
COMMANDS = ("doctor", "probe", "send", "gc", "watch", "bench", "serve", "e2e", "ns", "completion", "preflight")
# What pip says when no index or mirror answers (DNS, refused, proxy, timeout).
OFFLINE = re.compile(
    r"NewConnectionError|Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|Connection refused|ProxyError|ConnectTimeout|Read timed out|No matching distribution found for setuptools"
)


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding smgshm without extras (a wheel built from this checkout), made once per module."""
    base = tmp_path_factory.mktemp("slim")
    # What the build reads, copied: pip builds in the source tree, and this one is shared with other runs.
    src = base / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("smgshm", "schemas"):
        shutil.copytree(ROOT / part, src / part, ignore=skip)
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / part, src / part)
    where = base / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(where)
    py = where / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    got = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=base,
    )
    if got.returncode != 0:
        if OFFLINE.search(got.stderr + got.stdout):
            pytest.skip(f"no package index answers pip here, so no slim venv can be made: {got.stderr[-300:]}")
        raise AssertionError(f"pip install of the slim package failed:\n{got.stderr[-3000:]}")
    return where


def _run(venv_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Outside the checkout and without PYTHONPATH: the installed copy runs, as a user's would.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [str(venv_dir / "bin" / "smgshm"), *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def _ok(venv_dir: Path, *args: str, cwd: Path) -> str:
    res = _run(venv_dir, *args, cwd=cwd)
    assert res.returncode == 0, (args, res.returncode, res.stderr[-2000:])
    return res.stdout


@pytest.mark.slow
def test_a_slim_install_has_no_heavy_module_and_serves_the_node_commands(slim_venv: Path, tmp_path: Path) -> None:
    probe = "import importlib.util as u, sys; print(','.join(m for m in sys.argv[1:] if u.find_spec(m.split('.')[0])))"
    found = subprocess.run(
        [str(slim_venv / "bin" / "python"), "-c", probe, *HEAVY], capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "", f"the slim install carries {found.stdout.strip()}"

    assert "Commands:" in _ok(slim_venv, "--help", cwd=tmp_path)
    for name in COMMANDS:
        assert "Usage: " in _ok(slim_venv, name, "--help", cwd=tmp_path), name
    _ok(slim_venv, "gc", cwd=tmp_path)
    _ok(slim_venv, "gc", "--shm-dir", str(tmp_path), cwd=tmp_path)
    _ok(slim_venv, "ns", cwd=tmp_path)
    _ok(slim_venv, "watch", "--count", "1", "--interval", "0.2s", cwd=tmp_path)
    _ok(slim_venv, "preflight", "--shm-dir", str(tmp_path), cwd=tmp_path)
    root = tmp_path / "node"
    (root / "var/log/pods").mkdir(parents=True)
    assert "0 SMG segment(s)" in _ok(slim_venv, "gc", "--node", "--node-root", str(root), cwd=tmp_path)
    _ok(slim_venv, "--json", "doctor", "--node", "--node-root", str(root), cwd=tmp_path)


@pytest.mark.slow
def test_a_slim_install_names_the_extra_a_command_needs(slim_venv: Path, tmp_path: Path) -> None:
    for argv, extra in (
        (["send", "127.0.0.1:1"], "worker"),
        (["serve", "--listen", "127.0.0.1:0"], "worker"),
        (["probe", "127.0.0.1:1"], "worker"),
        (["bench"], "worker"),
        (["doctor"], "worker"),
        (["e2e"], "gateway"),
    ):
        res = _run(slim_venv, *argv, cwd=tmp_path)
        assert res.returncode == 2, (argv, res.returncode, res.stderr)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        want = f"Error: smgshm {argv[0]} needs the {extra} extra: pip install 'smgshm[{extra}]'"
        assert lines == [want], (argv, res.stderr)
        assert "Traceback" not in res.stderr
