"""The optional extras, and the one usage error a command says when the one it needs is not installed.

``pip install smgshm`` is the slim install: gc, ns, preflight, watch (its exporter too) and the node
view (gc --node, doctor --node) need only the base dependencies. A command that speaks gRPC to a
worker, makes torch tensors or starts SMG's gateway needs an extra (pyproject.toml lists them). Without
it, the command stops before it does anything with exit 2 and one line naming the extra: the install
is what the user chose, so this is a usage error, never a bug (70) with a traceback.
"""

from __future__ import annotations

import enum
import importlib.util

import click


class Extra(str, enum.Enum):
    """An optional extra of the package, by its name in ``pip install 'smgshm[NAME]'``."""

    WORKER = "worker"  # probe, send, bench, serve, doctor's worker checks
    GATEWAY = "gateway"  # the worker extra, SMG's gateway and pillow: e2e


# The modules each extra installs that smgshm imports: one found means the extra's package is there.
_WORKER_MODULES = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "google.protobuf",
    "smg_grpc_proto",
    "torch",
    "numpy",
    "xxhash",
    "tokenizers",
)
MODULES: dict[Extra, tuple[str, ...]] = {
    Extra.WORKER: _WORKER_MODULES,
    Extra.GATEWAY: (*_WORKER_MODULES, "PIL"),
}


class MissingExtraError(click.UsageError):
    """A command whose extra is not installed: exit 2, one ``Error:`` line, no usage block above it."""

    def __init__(self, what: str, extra: Extra) -> None:
        super().__init__(f"{what} needs the {extra.value} extra: pip install 'smgshm[{extra.value}]'")
        self.extra = extra

    # click gives a usage error the context it rises through (augment_usage_errors), and one with a context
    # is said below the command's usage line and its --help hint. Nothing in that usage is wrong here: the
    # install is, so this one keeps no context and is said as its one Error: line.
    @property
    def ctx(self) -> click.Context | None:
        return None

    @ctx.setter
    def ctx(self, _ctx: click.Context | None) -> None:
        pass


def missing(extra: Extra) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them)."""
    return [m for m in MODULES[extra] if not _found(m)]


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing; a module without a spec
        return False


def require(extra: Extra, what: str) -> None:
    """Raise MissingExtraError when ``extra`` is not installed; ``what`` names the command ("smgshm send")."""
    if missing(extra):
        raise MissingExtraError(what, extra)


def extra_for(module: str | None) -> Extra | None:
    """The smallest extra that installs ``module`` (a ModuleNotFoundError's name), if any does."""
    if not module:
        return None
    for extra in (Extra.WORKER, Extra.GATEWAY):
        if any(module == m or module.startswith(m + ".") or m.startswith(module + ".") for m in MODULES[extra]):
            return extra
    return None
