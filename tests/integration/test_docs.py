"""Man pages match regeneration, pass mandoc's lint and read whole at 80 columns, and are
found after an install; every command has help with examples and a page."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.support.docs import MAN1, PAGES, ROOT, _page_command

# --- the pages as man(1) and mandoc show them -------------------------------------------------

MAN_ENV = {**os.environ, "MANPAGER": "cat", "PAGER": "cat", "LC_ALL": "C.UTF-8", "MANWIDTH": "80"}
_OVERSTRIKE = re.compile(r".\x08")  # bold and underline as a terminal renderer writes them


def _rendered(renderer: str, page: Path) -> str:
    if shutil.which(renderer) is None:
        pytest.skip(f"needs {renderer}")
    argv = ["mandoc", "-T", "utf8", "-O", "width=80", str(page)] if renderer == "mandoc" else ["man", "-l", str(page)]
    res = subprocess.run(argv, env=MAN_ENV, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
    return _OVERSTRIKE.sub("", res.stdout)


@pytest.mark.skipif(shutil.which("mandoc") is None, reason="needs mandoc")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_mandoc_lint_is_clean(page: Path) -> None:
    """Not even a style message: no 0x08 from click's \\b marker, no PP after SH, no line over 80 bytes."""
    res = subprocess.run(["mandoc", "-T", "lint", "-W", "style", str(page)], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    assert "\x08" not in page.read_text()


@pytest.mark.parametrize("renderer", ["mandoc", "man"])
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_read_whole_at_80_columns(renderer: str, page: Path) -> None:
    """Every line fits 80 columns, and every option name of the command appears unbroken (groff
    hyphenates at 80 columns unless told not to: `--met-rics`)."""
    text = _rendered(renderer, page)
    wide = [ln for ln in text.splitlines() if len(ln) > 80]
    assert not wide, wide
    cmd = _page_command(page)
    shown = [p for p in cmd.params if p.get_help_record(click.Context(cmd)) is not None]
    for opt in (o for p in shown for o in (*p.opts, *p.secondary_opts)):
        if opt.startswith("-"):
            assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), f"{opt} is not whole in {page.name}"
    broken = [ln for ln in text.splitlines() if re.search(r"\w-$", ln)]
    assert not broken, f"a word broken at a hyphen: {broken}"


def _man_path(env: dict[str, str], cwd: Path) -> Path:
    """``smgshm --man-path`` as the installed package answers it."""
    res = subprocess.run(
        [sys.executable, "-m", "smgshm", "--man-path"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    return Path(res.stdout.strip())


def _man_reads(man_path: Path, name: str) -> str:
    if shutil.which("man") is None:
        pytest.skip("needs man")
    res = subprocess.run(["man", "-M", str(man_path), name], env=MAN_ENV, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return _OVERSTRIKE.sub("", res.stdout)


def test_man_path_reads_the_pages_from_the_source_tree(tmp_path: Path) -> None:
    """As after the README's `pip install -e .`: the package is the source tree."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    man_path = _man_path(env, tmp_path)
    assert man_path == MAN1.parent
    text = _man_reads(man_path, "smgshm-gc")
    assert "smgshm-gc - List every smg-* entry" in text
    assert "SEE ALSO" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_wheel_install_carries_the_pages(tmp_path: Path) -> None:
    """A real wheel, built from a copy of the tree and installed into a venv of its own (never
    this one: pip would uninstall the smgshm it finds here): `--man-path` names the installed
    pages, and man(1) also finds them under <venv>/share/man for <venv>/bin on PATH."""
    import sysconfig

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "smgshm", src / "smgshm", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
        check=True,
        timeout=240,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("smgshm-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the new venv's smgshm, not a tree's
    install = [*pip, "--python", str(python), "install", "--no-deps", str(wheel)]
    subprocess.run(install, check=True, timeout=240, env=alone)
    (site,) = venv.glob("lib/python*/site-packages")
    # smgshm's dependencies from this environment, after the new venv's own packages
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    res = subprocess.run(
        [str(venv / "bin" / "smgshm"), "--man-path"], env=alone, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    man_path = Path(res.stdout.strip())
    assert man_path == site / "smgshm" / "man"
    assert {p.name for p in (man_path / "man1").glob("*.1")} == {p.name for p in PAGES}
    assert "smgshm-ns-compare - Say whether two namespace ids" in _man_reads(man_path, "smgshm-ns-compare")
    env = {k: v for k, v in MAN_ENV.items() if k != "MANPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run(["man", "-w", "smgshm-gc"], env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip() == str(venv / "share" / "man" / "man1" / "smgshm-gc.1"), where.stderr
