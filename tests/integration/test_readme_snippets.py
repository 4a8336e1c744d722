"""The README's shell snippets run after its own install command, each in a real shell.

The rule: every line of every fenced ``sh``/``bash`` block of README.md is run, in order, by that
shell (``sh -c``), with the ``smgshm`` its install command put on PATH, and must exit as documented
(0 unless ``EXITS`` says otherwise) with what it prints fitting 80 columns (it is piped). Lines
that cannot run on a test machine are listed in ``NOT_RUN`` with the reason: root or a Kubernetes
node, a run of minutes (the whole suite, the embedded gateways), a server that serves until
stopped. A new snippet runs unless it is listed, and a listed line the README no longer has fails
the test, so the list stays true.

The install command (``pip install torch==2.13.0 -e '.[gateway]'``) runs as written, in a copy of the tree and
a fresh venv that sees the suite's own site-packages through a .pth file: torch 2.13.0, the extras and
the other dependencies are already satisfied there, so it installs smgshm itself, offline, in seconds;
nothing is written to the tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "pip install torch==2.13.0 -e '.[gateway]'"

NOT_RUN = {
    "./scripts/main": "installs .venv with SMG's gateway, then the embedded e2e: minutes (test_cli_e2e.py runs it)",
    "./scripts/test": "the whole suite, of which this test is a part",
    "sudo ./scripts/containers": "root: installs Debian's containerd and runs real pods (its own lane)",
    "smgshm gc --node": "needs a Kubernetes node's pod volumes (test_node_view.py builds one under a root)",
    "smgshm gc --node --node-root /host --delete --yes": "a DaemonSet's view of a node's / at /host; it deletes",
    "smgshm doctor --node --inflight-bytes 2GiB": "needs a Kubernetes node's pod volumes",
    "smgshm watch --node --node-root /host --serve-metrics 0.0.0.0:9464 -q": "an exporter: serves until stopped",
    "smgshm -q gc --node --node-root /host --prometheus /var/lib/node_exporter/smgshm_node.prom": (
        "a node's cron line: /host and node_exporter's directory"
    ),
}
EXITS: dict[str, int] = {}  # a documented exit other than 0, by command line


def snippets() -> list[tuple[str, str]]:
    """(shell, command line) of every line of every sh/bash block, continuation lines joined, comments kept
    out of the key (the shell reads them as comments anyway)."""
    out = []
    for shell, body in re.findall(r"```(sh|bash)\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                out.append((shell, command))
    return out


def test_every_line_not_run_is_in_the_readme_with_its_reason() -> None:
    commands = {c for _, c in snippets()}
    assert INSTALL in commands, "the README's install command is what this test installs with"
    for command, reason in NOT_RUN.items():
        assert command in commands, f"NOT_RUN lists {command!r}, which the README no longer has"
        assert reason


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A copy of the tree with smgshm installed by the README's own command; the env its snippets run in."""
    top = tmp_path_factory.mktemp("readme")
    tree, venv = top / "smgshm", top / "venv"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "_suite_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "COLUMNS")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PAGER="cat", MANPAGER="cat", MANWIDTH="80")
    env["PWD"] = str(tree)
    res = subprocess.run(["sh", "-c", INSTALL], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{INSTALL}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    found = subprocess.run(["sh", "-c", "command -v smgshm"], env=env, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == str(venv / "bin" / "smgshm"), "the install put its smgshm first on PATH"
    return {**env, "_TREE": str(tree)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shell", "command"), [s for s in snippets() if s[1] not in NOT_RUN and s[1] != INSTALL], ids=lambda v: v
)
def test_readme_snippet_runs_after_the_readme_install(installed: dict[str, str], shell: str, command: str) -> None:
    env = {k: v for k, v in installed.items() if k != "_TREE"}
    res = subprocess.run(
        [shell, "-c", command], cwd=installed["_TREE"], env=env, capture_output=True, text=True, timeout=120
    )
    want = EXITS.get(command, 0)
    assert res.returncode == want, f"{command}: exit {res.returncode}, documented {want}\n{res.stdout}\n{res.stderr}"
    assert res.stdout.strip(), f"{command}: said nothing"
    assert "Traceback" not in res.stderr, res.stderr
    wide = [ln for ln in res.stdout.splitlines() if len(ln) > 80]  # piped: 80 columns, as the README promises
    assert not wide, f"{command}: lines wider than 80 columns:\n" + "\n".join(wide)
