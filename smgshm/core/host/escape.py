"""A stranger's string made safe to show, in one place (``ls -b`` style): names and paths read from the host's
filesystem, shown by the human views (cli/fmt.py) and in NPD's one line (core/node/npd.py), which the
exporter also writes to a file."""

from __future__ import annotations

import os
import unicodedata

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "\x1b": "\\x1b"}


def escape(value: str | bytes) -> str:
    """A stranger's string made safe to print: controls and undecodable bytes as escapes.

    ``str`` values are taken as ``os.fsdecode`` gives them (surrogateescape), so an
    invalid UTF-8 byte shows as ``\\xff`` whatever the locale. Control, format and
    line/paragraph separator characters (C0, DEL, C1, bidi overrides, U+2028) are
    escaped; a backslash is doubled so the escaped form is unambiguous.
    """
    raw = value if isinstance(value, bytes) else os.fsencode(value)
    text = raw.decode("utf-8", errors="surrogateescape")
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, carried by surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


__all__ = ["escape"]
