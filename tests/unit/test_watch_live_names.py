"""A name in watch's live view keeps a line of its own: never folded across the columns of a table."""

from __future__ import annotations

import io

from rich.console import Console

from smgshm.cli.watch_view import OrphanRows
from smgshm.core.watch.figures import Orphan


def test_a_long_orphan_name_is_whole_on_a_line_of_its_own_at_80_columns() -> None:
    name = "smg-tokenspeed-4242-1796413666434681787-" + "7" * 30  # fits 80 alone, not after the columns
    orphan = Orphan(name, "gateway", 4242, False, "leaked", "dead", 8192, 42.0, 0)
    out = io.StringIO()
    Console(file=out, width=80, no_color=True).print(OrphanRows([orphan]))
    lines = out.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 80, lines
    assert f"  {name}" in lines, lines
    assert lines[2].startswith("gateway "), lines


def test_an_orphan_with_no_pid_in_its_name_says_so_not_a_dash() -> None:
    from smgshm.cli.watch_view import orphan_row

    orphan = Orphan("smg-x", "other", None, None, "unknown", "no pid", None, 3.0, 0)
    (row,) = orphan_row(orphan)
    assert "none in name" in row.plain, row.plain
    assert " - " not in row.plain, row.plain
