"""Shared by the tests of interop_gateway (moved out of tests/test_interop_gateway.py)."""

from __future__ import annotations

import sys
from pathlib import Path

SMG = Path(sys.executable).parent / "smg"


PINNED_ID = "00000000-0000-4000-8000-000000000000:1"
