"""The checked-in CRI gencode under tests/support/cri/rpc equals a fresh run of tests/support/cri/generate.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = Path("tests/support/cri/rpc")


def test_cri_gencode_is_fresh(tmp_path: Path) -> None:
    generator = ROOT / "tests" / "support" / "cri" / "generate.py"
    subprocess.run([sys.executable, str(generator), str(tmp_path)], check=True, timeout=120)
    fresh = sorted(p.relative_to(tmp_path) for p in (tmp_path / GENERATED).rglob("*") if p.is_file())
    checked_in = sorted(
        p.relative_to(ROOT) for p in (ROOT / GENERATED).rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh == checked_in, "generated file set differs: run python tests/support/cri/generate.py"
    for rel in fresh:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes(), (
            f"{rel} is stale: run python tests/support/cri/generate.py"
        )
    assert "do not edit" in (ROOT / GENERATED / "__init__.py").read_text()
