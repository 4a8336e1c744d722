"""Every documented example parses: each `smgshm ...` line of every --help text, man page and the README.

Examples are parsed by the real click definitions (make_context down the command
chain, so option types convert and root options after the subcommand are accepted)
without running anything: no servers, no waits. A usage error (exit 2) fails.
"""

from __future__ import annotations

import pytest

from tests.support.examples import _root_examples

# The root examples cheap and safe to run here (read-only, no server, no wait): run for real.
CHEAP = {"ns": 0, "gc": 0, "completion bash": 0, "ns compare ID_A ID_B": 6}


@pytest.mark.parametrize("argv", _root_examples(), ids=" ".join)
def test_cheap_root_examples_run(argv: list[str]) -> None:
    line = " ".join(argv)
    if line not in CHEAP:
        pytest.skip("needs a worker, a gateway or a long run: parsed above")
    from tests.conftest import run_cli

    res = run_cli(*argv, exit=CHEAP[line])
    assert res.stdout.strip()
