"""Shared helpers for human output: escaped names, quoted commands, wrapped prose (numbers: core/units.py).

Names come from a world-writable directory and messages from peers: anything a
stranger controls is shown through ``escape`` (``ls -b`` style) and never as markup,
and every command smgshm suggests is built with ``quote_cmd`` so that pasting it
can only do what it says.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rich.text import Text

from smgshm.core.host.escape import escape as escape  # one rule, shared with NPD's line (core)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class Consoles(Protocol):
    """What the printing helpers need of the invocation (``cli.app.App`` is one): no import of it, no circle."""

    quiet: bool

    @property
    def console(self) -> Console: ...

    @property
    def err_console(self) -> Console: ...


def display(name: str) -> str:
    """``escape`` with the common case (a printable ASCII name) answered without a per-char walk."""
    return name if name.isascii() and name.isprintable() and "\\" not in name else escape(name)


def safe(value: str | bytes, style: str = "") -> Text:
    """``escape`` as a rich Text: never markup, never terminal control."""
    return Text(escape(value), style=style)


def quote_cmd(argv: Sequence[str]) -> str:
    """A command line to paste: every word shell-quoted (names may hold ``;``, ``$()``, newlines).

    A word with control characters or undecodable bytes is written in bash's ANSI-C form
    (``$'smg-\\x1b...'``) so the line stays one printable line and still names the exact
    bytes; every other word goes through ``shlex.quote``.
    """
    return " ".join(_quote_word(w) for w in argv)


def _quote_word(word: str) -> str:
    if escape(word) == word.replace("\\", "\\\\"):  # nothing to escape: POSIX quoting suffices
        return shlex.quote(word)
    out = []
    for b in os.fsencode(word):
        ch = chr(b)
        out.append(ch if 0x20 <= b < 0x7F and ch not in "'\\" else f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def width(console: Console) -> int:
    """The columns human output may use: the terminal's, or 80 when piped (rich reads COLUMNS, else 80)."""
    return max(40, console.width)


# A word, or a figure with its unit ("13.8 MiB);", "7.29 ms", "2 min"): a line never ends between the two.
_WORD = re.compile(r"[^\s\d]*\d[\d.,]*\s(?:B|KiB|MiB|GiB|TiB|ms|s|min|h|d)(?:/s)?(?!\w)\S*|\S+")


def _lines(plain: str, cols: int, indent: int) -> list[tuple[int, int, int]]:
    """Where a text breaks into lines of at most ``cols``: (start, end, indent) spans of ``plain``.

    Breaks only between words (a figure and its unit are one), so a number or a name is never split;
    a word longer than a line keeps a line of its own. The first line keeps what leads it (an indent);
    later lines start at their first word, after ``indent`` spaces. No line ends in a space.
    """
    out: list[tuple[int, int, int]] = []
    start = end = -1
    used = 0
    for m in _WORD.finditer(plain):
        if start < 0:  # the first word keeps whatever leads it
            start, end, used = 0, m.end(), m.end()
        elif used + (m.end() - end) > cols:
            out.append((start, end, 0 if not out else indent))
            start, end, used = m.start(), m.end(), indent + m.end() - m.start()
        else:  # the spaces between words are kept as they are ("[ok  ]")
            used += m.end() - end
            end = m.end()
    if start >= 0:
        out.append((start, end, 0 if not out else indent))
    return out


def fill(text: str, cols: int, indent: int = 0) -> str:
    """``prose`` for plain strings written without rich (gc's streamed rows): lines joined, no final newline."""
    return "\n".join(" " * ind + text[a:b] for a, b, ind in _lines(text, cols, indent))


def prose(console: Console, text: Text | str, indent: int = 0) -> None:
    """Print a sentence wrapped at the terminal's width (80 when piped), continuation lines indented.

    The App consoles never wrap (soft_wrap), so that tables and names are never cut;
    prose goes through here instead. Words are never split: an over-long one (a name,
    a URL) keeps its own line. A ``str`` is taken as already safe text, not markup.
    """
    text = Text(text) if isinstance(text, str) else text
    for a, b, ind in _lines(text.plain, width(console), indent):
        console.print(Text(" " * ind) + text[a:b], soft_wrap=True, end="\n")


def fit_table(console: Console, table: Table, indent: int = 2) -> None:
    """Print a table if it fits the width without cutting a cell; else each row as a record.

    A record is the row's first cell on its own line, then ``header value`` pairs wrapped as
    prose: a long name or a wide figure is never folded or cut with an ellipsis.
    """
    cols = width(console)
    if _fits(table, cols):
        print_trimmed(console, table)
        return
    if table.title:
        console.print(Text(str(table.title)), soft_wrap=True)
    heads = [str(c.header) for c in table.columns]
    cells = [list(c.cells) for c in table.columns]
    for i in range(table.row_count):
        row = [cell if isinstance(cell := c[i], Text) else Text(str(cell)) for c in cells]
        prose(console, row[0].copy(), indent)
        # "header value" pairs packed into lines: a pair is never split (a long one keeps a line of its own).
        line = Text()
        for h, v in zip(heads[1:], row[1:], strict=True):
            pair = Text(f"{h} ") + v if h else v
            if line.plain and line.cell_len + 2 + pair.cell_len > cols:
                console.print(line, soft_wrap=True)
                line = Text()
            line = line + Text("; ") + pair if line.plain else Text(" " * indent) + pair
        if line.plain:
            console.print(line, soft_wrap=True)


class Trimmed:
    """A rich renderable (a table) drawn with no trailing spaces: rich pads every cell to its column,
    and a line that ends in blanks is noise in a diff, a log or a copy (and on a live display)."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: Any) -> Any:
        from rich.segment import Segment

        for line in console.render_lines(self.renderable, options, pad=False):
            while line and not line[-1].text.rstrip():
                line.pop()  # a segment of blanks only (a padded cell)
            if line:
                last = line[-1]
                line[-1] = Segment(last.text.rstrip(), last.style, last.control)
            yield from line
            yield Segment.line()


def _fits(table: Table, cols: int) -> bool:
    """Whether rich draws ``table`` in ``cols`` with every word of every cell whole: rich's own measure
    lets a no_wrap cell be cut with an ellipsis, so the table is drawn once, plain, and its words checked."""
    import io

    from rich.console import Console as Plain

    out = io.StringIO()
    Plain(width=cols, file=out, color_system=None, highlight=False).print(table)
    drawn = set(out.getvalue().split())
    for column in table.columns:
        for cell in [column.header, *column.cells]:
            text = cell.plain if isinstance(cell, Text) else str(cell)
            if any(word not in drawn for word in text.split()):
                return False
    return True


def print_trimmed(console: Console, renderable: Any) -> None:
    """Print a renderable at ``width``, with no trailing spaces (``Trimmed``)."""
    console.print(Trimmed(renderable), width=width(console), soft_wrap=True)


def command(console: Console, argv: Sequence[str], indent: int) -> None:
    """A command to paste, on lines of its own: words quoted as ``quote_cmd`` does, and where it is wider
    than the terminal, continued with `` \\`` at the end of a line (a shell reads it as one line)."""
    words = [_quote_word(w) for w in argv]
    cols = width(console)
    lines: list[str] = []
    line = " " * indent + (words[0] if words else "")
    for w in words[1:]:
        if len(line) + 1 + len(w) + 2 > cols:  # room for " \\"
            lines.append(line + " \\")
            line = " " * (indent + 2) + w
        else:
            line += " " + w
    lines.append(line)
    for ln in lines:
        console.print(Text(ln), soft_wrap=True)


def hint(app: Consoles, message: str) -> None:
    """A ``hint:`` line on stderr, unless --quiet; the message is shown escaped and wrapped."""
    if not app.quiet:
        prose(app.err_console, Text("hint: ", style="cyan") + safe(message), indent=6)


def fix_line(app: Consoles, message: str | Text, indent: int = 7) -> None:
    """A doctor-style ``fix:`` line on stdout, wrapped with a hanging indent under it."""
    body = message if isinstance(message, Text) else safe(message)
    prose(app.console, Text(" " * indent) + Text("fix: ", style="cyan") + body, indent=indent + 5)


def cause_fix(cause: Any) -> Text:
    """A catalogue cause's fix in words, then the command that applies, shell-quoted (it names a peer's address
    or a dir)."""
    out = safe(cause.fix)
    if cause.fix_cmd:
        out += Text(": ") + safe(quote_cmd(cause.fix_cmd))
    return out


def sharing_fix(sharing: str) -> str:
    """The fix an operator can paste for a shm-sharing verdict (ns compare's, probe's): the cause catalogue's."""
    from smgshm.core.causes import CATALOGUE, for_sharing

    cause = for_sharing(sharing) if sharing in ("other_host", "private_tmpfs", "spelling", "undetermined") else None
    return CATALOGUE[cause].fix + "." if cause is not None else ""


# A node's tmpfs kinds (core/node/layout.py's Place.kind) as gc --node and doctor --node name them.
TMPFS_KINDS = {"empty_dir": "emptyDir", "sandbox_shm": "sandbox shm", "host": "host /dev/shm"}


def lossless(value: str | bytes) -> str:
    """The exact bytes of a name as lowercase hex: the JSON field beside a display name.

    JSON cannot carry invalid UTF-8 (a lone surrogate becomes U+FFFD in jq), so a name
    read from the filesystem is given both ways: ``escape``'d for display and this.
    """
    return (value if isinstance(value, bytes) else os.fsencode(value)).hex()


def kv_table(rows: list[tuple[str, Any]]) -> Table:
    from rich.table import Table  # here: gc's start-up (every run) never draws a table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # wrapped at spaces; a path longer than the line folds, never cut
    for k, v in rows:
        # Values are read from the host or a peer: escaped; a Text was built escaped already (once is enough).
        table.add_row(k, v if isinstance(v, Text) else safe(str(v)))
    return table


def tmpfs_fields(t: Any) -> dict[str, Any]:
    """A node tmpfs's identity in --json (gc --node's and doctor --node's blocks alike): its kind, path (shown
    and lossless), volume, pod uid, namespace and pod name; strangers' strings, escaped."""
    pod = t.pod
    return {
        "kind": t.place.kind,
        "path": display(t.place.path),
        "path_hex": lossless(t.place.path),
        "volume": None if t.place.volume is None else display(t.place.volume),
        "pod_uid": None if t.pod_uid is None else display(t.pod_uid),
        "namespace": None if pod is None else display(pod.namespace),
        "pod": None if pod is None else display(pod.name),
    }
