"""Shared option types: byte sizes (``64MiB``), durations (``250ms``), http(s) URLs; renamed options."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from smgshm.core.units import parse_duration, parse_size

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from smgshm.core.watch.webconfig import WebConfig

    # ParamType is generic from click 8.4 on; the floor is 8.1, so it is subscripted for mypy only.
    _IntParam = click.ParamType[int]
    _FloatParam = click.ParamType[float]
    _StrParam = click.ParamType[str]
else:
    _IntParam = _FloatParam = _StrParam = click.ParamType


class BytesType(_IntParam):
    """Bytes, or ``64KiB``/``16MiB``/``1GB`` (``units.parse_size``)."""

    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class DurationType(_FloatParam):
    """Seconds, or Go-style ``250ms``/``2s``/``1m`` (``units.parse_duration``)."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class HttpUrlType(_StrParam):
    """An http(s) URL (``host:port`` means http), checked before anything is dialled: a malformed
    one is a usage error (exit 2), never a crash deep in a request. The value passes on as typed."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from smgshm.core.address import UrlError, parse_url

        try:
            parse_url(str(value))
        except UrlError as err:
            self.fail(str(err), param, ctx)
        return str(value)


class RenamedOption(click.Option):
    """An option that still parses its former long names (``former=("--count",)``), shown nowhere:
    not in help, man pages or completion, so nothing teaches them; scripts written before go on working."""

    def __init__(self, *args: Any, former: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.former = former

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        parser.add_option(obj=self, opts=self.former, dest=self.name, action="store", nargs=self.nargs)


BYTES = BytesType()
DURATION = DurationType()
HTTP_URL = HttpUrlType()

# --- shell completion of values (smgshm completion SHELL) ---------------------------------------
# A path option that is not a click.Path (whose checks would change its errors) still completes
# paths: the "dir"/"file" items hand the work to the shell's own path completion.

# The node view's rule (core/node/reach.py) and its one assumption, in every --node option's help.
NODE_RULE = (
    " Each tmpfs's SMG names are judged in the pid namespaces of the processes that reach it (its /dev/shm, a"
    " mount of it anywhere, a cwd, root, open fd or mapping there; a sandbox's pause container, told by its"
    " cgroup, is none); with no process reaching it, its names are leaked. The one assumption: SMG writes"
    " only through its own /dev/shm, so the host's own mounts (the kubelet's path, the runtime's) are not"
    " asked; smgshm's own names (--shm-dir) are judged in the host's pid namespace too. A process that cannot"
    " be read keeps its own pod's names unknown."
)

MAX_PID_COMPLETIONS = 5000  # a host's pids are read one /proc file each: bounded


def complete_dirs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    return [CompletionItem(incomplete, type="dir")]


def complete_files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    return [CompletionItem(incomplete, type="file")]


def complete_pids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """This pid namespace's live pids starting with ``incomplete``, each described by its process
    name (escaped: a process names itself); a pid gone since the scan is left out."""
    from click.shell_completion import CompletionItem

    from smgshm.cli.fmt import escape
    from smgshm.core.host.proc import comm, live_pids

    out: list[CompletionItem] = []
    for pid in sorted(p for p in live_pids() if str(p).startswith(incomplete)):
        name = comm(pid)
        if name:
            out.append(CompletionItem(str(pid), help=escape(name)))
        if len(out) >= MAX_PID_COMPLETIONS:
            break
    return out


shm_dir_option = click.option(
    "--shm-dir",
    default="/dev/shm",  # noqa: S108 - SMG's own directory, not a scratch path
    show_default=True,
    envvar="SMGSHM_SHM_DIR",
    shell_complete=complete_dirs,
    help="The shm directory (a container's is /proc/<pid>/root/dev/shm).",
)


def _state_dirs(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    if not value:
        return ()  # (the node layout's module loads only when a state dir is given)
    from smgshm.core.node.layout import state_dir_parts

    try:
        return tuple(state_dir_parts(v) for v in value)
    except ValueError as err:
        raise click.BadParameter(str(err), ctx, param) from err


runtime_state_dir_option = click.option(
    "--runtime-state-dir",
    "state_dirs",
    multiple=True,
    metavar="DIR",
    callback=_state_dirs,
    shell_complete=complete_dirs,
    help="With --node: a container runtime's state dir besides the known ones, under the node root "
    "(repeatable): read as containerd's `state` (DIR/io.containerd.grpc.v1.cri/sandboxes/ID/shm) and as "
    "CRI-O's storage runroot (DIR/DRIVER-containers/ID/userdata/shm). Known without it: run/containerd, "
    "run/k3s/containerd (k3s, RKE2), run/k0s/containerd, run/containers/storage (CRI-O).",
)


def listen_address(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An option's address to listen on: host:port ([v6]:port; port 0 picks one) or unix:PATH."""
    from smgshm.core.address import grpc_host_port

    try:
        grpc_host_port(value, listen=True)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    return value


def worker_addresses(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A worker's address to dial (or several): a port given is 1..65535; unix:PATH and gRPC's own forms pass."""
    from smgshm.core.address import grpc_host_port, grpc_target

    for address in (value,) if isinstance(value, str) else value or ():
        try:
            grpc_host_port(grpc_target(address))
        except ValueError as err:
            raise click.BadParameter(str(err)) from None
    return value


def metrics_listen(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, int] | None:
    """``[HOST:]PORT`` to serve metrics on -> (host, port); HOST defaults to 127.0.0.1, port 0 picks one."""
    from smgshm.core.address import parse_listen

    if value is None:
        return None
    try:
        return parse_listen(value)
    except ValueError as err:
        raise click.BadParameter(f"{value!r} is not [HOST:]PORT: {err}") from None


def web_config(value: str | None) -> WebConfig | None:
    """``--web-config FILE`` -> the checked web config (TLS, basic auth); what it says wrongly is a usage
    error in one line, naming no secret; a file that cannot be read is the host's (exit 5). Called by
    the command, not as the option's callback: parsing a command line reads no file."""
    from smgshm.cli.fmt import escape
    from smgshm.core.watch.webconfig import WebConfigError, load_web_config

    if value is None:
        return None
    try:
        return load_web_config(value)
    except WebConfigError as err:
        raise click.BadParameter(escape(str(err)), param_hint="--web-config") from None


def require_gateways(pids: Iterable[int]) -> None:
    """``--gateway-pid`` names SMG gateways running here: a pid of no process, or of another
    program, is a usage error (exit 2) naming it, not an unreachable endpoint (4)."""
    from smgshm.cli.fmt import escape
    from smgshm.core.gateway.running import not_a_gateway

    for pid in pids:
        why = not_a_gateway(pid)
        if why is not None:
            raise click.BadParameter(escape(why), param_hint="--gateway-pid")
