"""``smgshm ns`` and ``smgshm ns compare``: namespace ids without gRPC."""

from __future__ import annotations

import os

import click

from smgshm.cli import ns_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.params import complete_pids, shm_dir_option


@click.group(invoke_without_command=True)
@click.option(
    "--pid", type=int, shell_complete=complete_pids, help="Report the identity as process PID sees it (/proc/PID/root)."
)
@shm_dir_option
@click.pass_context
def ns(ctx: click.Context, pid: int | None, shm_dir: str) -> None:
    """Show this host's shm_namespace_id (<boot_id>:<st_dev of /dev/shm>) and its parts.

    This is the id SMG's gateway compares with each worker's under `auto`. With
    --pid, the id, shm dir and pid namespace as another process (say, a container's
    init) sees them, to compare containers on one host from outside.

    Exit 0 with an id, 2 when --pid names no process, 5 when the shm dir is
    missing or unreadable, 6 when the id cannot be read.

    \b
    Examples:
      smgshm ns
      smgshm ns --pid "$(docker inspect -f '{{.State.Pid}}' worker)"
      smgshm --json ns | jq -r .result.namespace_id
    """
    if ctx.invoked_subcommand is not None:
        return
    from smgshm.core.host.identity import read_host_identity

    app: App = ctx.obj
    if pid is not None and not os.path.isdir(f"/proc/{pid}"):
        # An argument naming no process is a usage error (exit 2), not this host's environment.
        raise click.BadParameter(f"no process has pid {pid} (in this pid namespace)", param_hint="--pid")
    ident = read_host_identity(shm_dir, pid)
    code = ExitCode.OK if ident.namespace_id else ExitCode.UNDETERMINED
    ctx.exit(app.emit(ident, view.identity, code))


@ns.command()
@click.argument("id_a")
@click.argument("id_b", required=False)
@shm_dir_option
@click.pass_obj
def compare(app: App, id_a: str, id_b: str | None, shm_dir: str) -> None:
    """Say whether two namespace ids mean a shared /dev/shm, and if not, why.

    ID_B defaults to this host's id (and the reasons then say "here" for it).
    Exit 0 when shared, 3 when not (another host, or a private tmpfs on this
    host), 6 when either id is empty or malformed.

    \b
    Examples:
      ID=$(kubectl exec worker -- smgshm --json ns | jq -r .result.namespace_id)
      smgshm ns compare "$ID"
      smgshm ns compare 5ef74ec3-0000-4000-8000-000000000000:27 \\
          5ef74ec3-0000-4000-8000-000000000000:31
    """
    from smgshm.core.host.namespace import Sharing, compare_namespace_ids, read_namespace_id

    app.command = "ns compare"
    local = id_b if id_b is not None else read_namespace_id(shm_dir)
    cmp = compare_namespace_ids(local, id_a, two_ids=id_b is not None)
    code = {Sharing.SHARED: ExitCode.OK, Sharing.UNDETERMINED: ExitCode.UNDETERMINED}.get(
        cmp.sharing, ExitCode.CHECK_FAILED
    )
    click.get_current_context().exit(app.emit(cmp, view.comparison, code))
