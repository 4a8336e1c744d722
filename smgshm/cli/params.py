"""Shared option types: byte sizes (``64MiB``), durations (``250ms``) and http(s) URLs."""

from __future__ import annotations

from typing import Any

import click

from smgshm.core.units import parse_duration, parse_size


class BytesType(click.ParamType):
    """Bytes, or ``64KiB``/``16MiB``/``1GB`` (``units.parse_size``)."""

    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class DurationType(click.ParamType):
    """Seconds, or Go-style ``250ms``/``2s``/``1m`` (``units.parse_duration``)."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


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
