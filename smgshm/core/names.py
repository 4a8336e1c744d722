"""SMG's segment-name grammar: every prefix, the kinds, building, validating and parsing a name.

SMG's gateway names a payload ``smg-tokenspeed-<pid>-<nanos>-<seq>`` and its writability probe
``smg-tokenspeed-probe-<pid>`` (smg-facts §3.1; vLLM reuses the TokenSpeed prefix). smgshm writes
the same shapes under ``smg-smgshm-``: in SMG's family, but never matched by the gateway's sweep
(which only looks at ``smg-tokenspeed-``), so gc can tell the two apart.

Two questions, each answered here only:
- is a name in SMG's *family* (``in_family``: under ``smg-``)? Then gc lists it and the receiver
  reads it;
- does it *parse* (``parse_name``: one of the four forms above, ASCII digits, a full match, a pid
  below 2**32)? Only then does it carry a producer pid and a time. A name of the family that does
  not parse is not SMG's writing: kind ``other`` (or ``gc_aside``), no pid, no time, so nothing
  is judged or reaped by a pid it only seems to hold (``smg-tokenspeed-probe-1;touch x``).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from typing import Literal, NamedTuple, get_args

from smgshm.core.errors import HandleError

NAME_MAX = 255  # bytes of one name (Linux NAME_MAX)

SMG_FAMILY_PREFIX = "smg-"
GATEWAY_PREFIX = "smg-tokenspeed-"
GATEWAY_PROBE_PREFIX = "smg-tokenspeed-probe-"
SMGSHM_PREFIX = "smg-smgshm-"
SMGSHM_PROBE_PREFIX = "smg-smgshm-probe-"
# Where gc --delete sets an entry aside before it unlinks it (segments/reaping.py): SMG's family, so
# gc lists one left by a gc that died mid-way, but no producer's pid pattern, so it is never reaped by
# one. ``smg-smgshm-gc-<gc pid>-<its start, clock ticks since boot>-<its pid namespace's inode>-<the
# name it stood for>``: the gc that set it aside, told apart from a later process reusing its pid, and
# the way back (segments/asides.py). Older gcs wrote ``smg-smgshm-gc-<pid>-<16 hex>``: no way back.
ASIDE_PREFIX = "smg-smgshm-gc-"
# bench's floor measurement (one bare file per sample): SMG's family, no pid pattern either.
FLOOR_PREFIX = "smg-smgshm-floor-"

Kind = Literal["gateway", "gateway_probe", "smgshm", "smgshm_probe", "gc_aside", "other"]
KINDS: tuple[Kind, ...] = get_args(Kind)


class ParsedName(NamedTuple):
    """What a name says: its kind, its producer pid and its creation time in ns (None: it says none)."""

    kind: Kind
    pid: int | None
    nanos: int | None


# ASCII digits only and a full match: \d would take any Unicode digit (smg-tokenspeed-١٢٣-1-0)
# and `$` matches before a trailing newline; either would hand gc a pid the name never meant.
_D = "([0-9]+)"
# One pattern for all four forms (one regex call per entry, not four); which group matched
# says the kind. The payload forms first: "probe" is no number, so they never take a probe.
_NAME = re.compile(
    re.escape(GATEWAY_PREFIX)
    + f"(?:{_D}-{_D}-{_D}|probe-{_D})|"
    + re.escape(SMGSHM_PREFIX)
    + f"(?:{_D}-{_D}-{_D}|probe-{_D}-{_D})"
)

# The grammar's fast form, for a loop over a million names (segments/judge.py's Judge.each), and
# what parse_name itself is made of: the full match (None: the name does not parse; its kind is then
# unmatched_kind's), and by the match's lastindex (kind, group of the pid, group of the nanos or 0;
# keyed as ``Match.lastindex`` is typed, int | None, though a full match always has one).
# A pid of PID_LIMIT or more is no pid.
match_name = _NAME.fullmatch
MATCH_GROUPS: dict[int | None, tuple[Kind, int, int]] = {
    3: ("gateway", 1, 2),
    4: ("gateway_probe", 4, 0),
    7: ("smgshm", 5, 6),
    9: ("smgshm_probe", 8, 9),
}
PID_LIMIT = 2**32

_ASIDE = re.compile(re.escape(ASIDE_PREFIX) + f"{_D}-{_D}-{_D}-(.+)", re.DOTALL)


class AsideName(NamedTuple):
    """What a set-aside name says: the gc that set it aside (its pid, its start time in clock ticks since boot,
    its pid namespace's inode) and the name it stood for."""

    gc_pid: int
    gc_start: int
    gc_pidns: int
    original: str


def unmatched_kind(name: str) -> Kind:
    """The kind of a name ``match_name`` does not match."""
    return "gc_aside" if name.startswith(ASIDE_PREFIX) else "other"


def parse_name(name: str) -> ParsedName:
    """(kind, producer pid, creation time in ns) of a name; a name that does not parse has neither."""
    m = match_name(name)
    if m is None:
        return ParsedName(unmatched_kind(name), None, None)
    kind, p, t = MATCH_GROUPS[m.lastindex]
    pid = int(m[p])
    return ParsedName(kind, pid if pid < PID_LIMIT else None, int(m[t]) if t else None)


def in_family(name: str) -> bool:
    """Whether a name (one entry of a dir: no ``/``) is in SMG's family."""
    return name.startswith(SMG_FAMILY_PREFIX) and "/" not in name


def probe_file_pid(name: str) -> int | None:
    """The pid a gateway probe file's name carries; ``None`` for a name under the probe prefix that
    does not parse as one (``smg-tokenspeed-probe-1;touch x``): the gateway creates exactly
    ``<prefix><its pid>``, so such a file is no gateway's and blocks none."""
    parsed = parse_name(name)
    return parsed.pid if parsed.kind == "gateway_probe" else None


def payload_prefix(pid: int, prefix: str = SMGSHM_PREFIX) -> str:
    """What every payload name of producer ``pid`` under ``prefix`` starts with."""
    return f"{prefix}{pid}-"


def payload_name(pid: int, nanos: int, seq: int, prefix: str = SMGSHM_PREFIX) -> str:
    """``<prefix><pid>-<nanos>-<seq>``: the gateway's payload shape."""
    return f"{payload_prefix(pid, prefix)}{nanos}-{seq}"


_seq = itertools.count()
_seq_lock = threading.Lock()


def new_segment_name(prefix: str = SMGSHM_PREFIX) -> str:
    """A fresh payload name of this process (under smgshm's prefix unless told): unique in it."""
    with _seq_lock:
        seq = next(_seq)
    return payload_name(os.getpid(), time.time_ns(), seq, prefix)


def gateway_probe_name(pid: int | str) -> str:
    """The gateway's writability probe file of ``pid`` (its pid in its own pid namespace); a str
    pid stands for one not known (``"<pid>"`` in a message)."""
    return f"{GATEWAY_PROBE_PREFIX}{pid}"


def probe_file_name() -> str:
    """smgshm's own writability probe file: the gateway's shape plus nanoseconds, so it can never
    collide with a leftover (the flaw in SMG's)."""
    return f"{SMGSHM_PROBE_PREFIX}{os.getpid()}-{time.time_ns()}"


def aside_name(original: str, gc_pid: int, gc_start: int, gc_pidns: int) -> str | None:
    """The private name to set ``original`` aside under, for the gc (pid, start ticks, pid namespace inode) that
    does it; None when it would pass NAME_MAX (a name of SMG's grammar that long is no gateway's writing)."""
    name = f"{ASIDE_PREFIX}{gc_pid}-{gc_start}-{gc_pidns}-{original}"
    return name if len(name.encode("utf-8", "surrogateescape")) <= NAME_MAX else None


def parse_aside(name: str) -> AsideName | None:
    """The gc and the original name a set-aside name carries; None for one that carries no way back (an older
    gc's, or a name whose original does not parse as SMG's: a set-aside is only ever of an SMG name)."""
    m = _ASIDE.fullmatch(name)
    if m is None or match_name(m[4]) is None:
        return None
    pid, start, ns = int(m[1]), int(m[2]), int(m[3])
    if not 0 < pid < PID_LIMIT:
        return None
    return AsideName(pid, start, ns, m[4])


def floor_name() -> str:
    """A scratch file name for bench's floor measurement."""
    return f"{FLOOR_PREFIX}{os.getpid()}-{time.time_ns()}"


def validated_name(name: str) -> str:
    """Validate a handle's name the way SMG's reader does, plus NAME_MAX.

    SMG strips every leading ``/`` and then refuses empty, ``.``, ``..`` and any
    name with ``/`` or NUL; it has no prefix allowlist, and neither does this.
    """
    stripped = name.lstrip("/")
    if not stripped or "/" in stripped or stripped in (".", "..") or "\x00" in stripped:
        raise HandleError("invalid segment name", name=name)
    if len(stripped.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise HandleError("segment name longer than NAME_MAX", name=name[:40] + "...", limit=NAME_MAX)
    return stripped
