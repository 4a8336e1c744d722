"""``smgshm completion SHELL``: the shell completion script, from click's own machinery."""

from __future__ import annotations

import click
from click.shell_completion import FishComplete, get_completion_class


class _FishComplete(FishComplete):
    """click's fish script split each "type,value<TAB>description" line at every comma, so a
    description (or a path) was cut at its first comma: split once."""

    source_template = FishComplete.source_template.replace(
        '(string split "," $completion)', '(string split -m 1 "," $completion)'
    )


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    \b
    Examples:
      eval "$(smgshm completion bash)"               # in ~/.bashrc
      smgshm completion zsh > "${fpath[1]}/_smgshm"
      smgshm completion fish > ~/.config/fish/completions/smgshm.fish
    """
    cls = _FishComplete if shell == "fish" else get_completion_class(shell)
    if cls is None:  # the Choice above only admits shells click supports
        raise click.UsageError(f"no completion for {shell}")
    root = ctx.find_root().command
    comp = cls(root, {}, "smgshm", "_SMGSHM_COMPLETE")
    click.echo(comp.source())
