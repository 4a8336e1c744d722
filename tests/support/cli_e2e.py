"""Shared by the tests of cli_e2e (moved out of tests/test_cli_e2e.py)."""

from __future__ import annotations

import pytest

from tests.support.e2e import needs_smg

pytestmark = [needs_smg, pytest.mark.timeout(180)]
