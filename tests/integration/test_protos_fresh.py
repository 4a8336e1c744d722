"""The checked-in gencode under smgshm/rpc equals a fresh run of protos/generate.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), str(tmp_path)], check=True, timeout=120)
    fresh = sorted(p.relative_to(tmp_path) for p in (tmp_path / "smgshm" / "rpc").rglob("*") if p.is_file())
    checked_in = sorted(
        p.relative_to(ROOT)
        for p in (ROOT / "smgshm" / "rpc").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh == checked_in, "generated file set differs: run python protos/generate.py"
    for rel in fresh:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes(), (
            f"{rel} is stale: run python protos/generate.py"
        )


def test_generated_marker_and_no_handwritten_files() -> None:
    for init in (ROOT / "smgshm" / "rpc").rglob("__init__.py"):
        assert "do not edit" in init.read_text()
    pb2 = (ROOT / "smgshm" / "rpc" / "v1" / "diag_pb2.py").read_text()
    assert "DO NOT EDIT" in pb2
