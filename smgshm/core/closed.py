"""A closed set of strings as an enum: each member is its value (a ``str``), shown and compared as such.

The JSON schemas read the members (schemas/generate.py), so a set is written once, where it is set.
(``enum.StrEnum`` is Python 3.11's; this is its equivalent for 3.10.)"""

from __future__ import annotations

import enum


class Closed(str, enum.Enum):
    """A member equals, hashes, prints and formats as its value."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return format(str.__str__(self), spec)
