"""Shared by the tests of gc_trust (moved out of tests/test_gc_trust.py)."""

from __future__ import annotations

import os

from tests.conftest import run_cli
from tests.support.cli_gc import deletions, segs


def gc_keeps(d: str, name: str) -> None:
    """gc, as an operator runs it, leaves the live producer's segment ``name`` in ``d`` unknown,
    and ``--delete --min-age 0`` keeps it."""
    doc = run_cli("--json", "gc", "--shm-dir", d).json
    assert doc["result"]["liveness_trusted"] is False
    assert segs(doc)[name]["state"] == "unknown"
    doc = run_cli("--json", "gc", "--shm-dir", d, "--delete", "--min-age", "0", "--yes").json
    assert not deletions(doc).get(name, {}).get("deleted")
    assert os.path.exists(os.path.join(d, name)), "gc deleted a live producer's segment"
