"""Shared option types: byte sizes (``64MiB``), durations (``250ms``) and http(s) URLs."""

from __future__ import annotations

import math
import re
from typing import Any

import click

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}  # fmt: skip
_DUR = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
MAX_DURATION_S = 30 * 86400.0  # a timeout or a soak longer than this is a typo, and gRPC cannot take inf


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (examples: 4096, 64KiB, 16MiB, 1GB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value >= 2**63:  # "9" * 400 is a float overflow, not a size
        raise ValueError(f"{text!r} is too large a size")
    return int(value)


class BytesType(click.ParamType):
    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class DurationType(click.ParamType):
    """Seconds, or Go-style ``250ms``/``2s``/``1m``."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*", str(value))
        if not m:
            self.fail(f"{value!r} is not a duration (examples: 250ms, 2s, 1.5)", param, ctx)
        seconds = float(m.group(1)) * _DUR[m.group(2)]
        if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
            self.fail(f"{value!r} is longer than the longest duration accepted (30 days)", param, ctx)
        return seconds


class HttpUrlType(click.ParamType):
    """An http(s) URL (``host:port`` means http), checked before anything is dialled: a malformed
    one is a usage error (exit 2), never a crash deep in a request. The value passes on as typed."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from smgshm.core.gateway.http import UrlError, parse_url

        try:
            parse_url(str(value))
        except UrlError as err:
            self.fail(str(err), param, ctx)
        return str(value)


BYTES = BytesType()
DURATION = DurationType()
HTTP_URL = HttpUrlType()

shm_dir_option = click.option(
    "--shm-dir",
    default="/dev/shm",  # noqa: S108 - SMG's own directory, not a scratch path
    show_default=True,
    envvar="SMGSHM_SHM_DIR",
    help="The shm directory (a container's is /proc/<pid>/root/dev/shm).",
)
