"""Shared by the tests of fuzz_receiver (moved out of tests/test_fuzz_receiver.py)."""

from __future__ import annotations

from hypothesis import HealthCheck
from hypothesis import strategies as st

# No deadline and no too_slow health check: both judge wall time, which a loaded CI machine stretches.
SLOW_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


names = st.one_of(st.text(max_size=40), st.just("../etc/passwd"), st.just("/"), st.just("a\x00b"), st.just("x" * 300))


dims = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=5)
