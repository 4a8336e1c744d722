"""Shared by the tests of cli_ns (moved out of tests/test_cli_ns.py)."""

from __future__ import annotations

A = "5ef74ec3-1111-4000-8000-000000000000"
