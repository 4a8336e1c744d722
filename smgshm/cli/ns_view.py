"""Human output of ``smgshm ns`` and ``ns compare``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from smgshm.cli.fmt import fit_table, hint, kv_table, prose, safe, sharing_fix
from smgshm.core.units import human_size

if TYPE_CHECKING:
    from smgshm.cli.app import App
    from smgshm.core.host.identity import HostIdentity
    from smgshm.core.host.namespace import NamespaceComparison


def identity(app: App, ident: HostIdentity) -> None:
    verdict = ident.namespace_id or "(unreadable: auto will stay inline)"
    prose(app.console, Text("shm_namespace_id: ", style="bold") + safe(verdict), 2)
    used = ident.shm_total_bytes - ident.shm_free_bytes
    fit_table(
        app.console,
        kv_table(
            [
                ("boot_id", ident.boot_id),
                ("shm dir", f"{ident.shm_dir} (st_dev {ident.shm_dev}, {ident.fstype or '?'})"),
                (
                    "size",
                    f"{human_size(ident.shm_total_bytes)}, {human_size(used)} used, "
                    f"{human_size(ident.shm_free_bytes)} free",
                ),
                ("mount options", ident.mount_options or "?"),
                ("pid", f"{ident.pid} ({ident.pid_namespace or 'pid namespace unknown'})"),
                ("uid/gid", f"{ident.uid}/{ident.gid}"),
                ("hostname", ident.hostname),
            ]
        ),
    )


def comparison(app: App, cmp: NamespaceComparison) -> None:
    style = "green" if cmp.shared else "red"
    head = "shared" if cmp.shared else f"not shared ({cmp.sharing.value})"
    if cmp.sharing.value == "undetermined":
        head, style = "undetermined", "yellow"
    prose(app.console, Text(f"/dev/shm {head}: ", style=f"bold {style}") + safe(cmp.reason), 2)  # noqa: S108 - prose
    fit_table(app.console, kv_table([("a", cmp.peer or "(empty)"), ("b", cmp.local or "(empty)")]))
    fix = sharing_fix(cmp.sharing.value)
    if fix:
        hint(app, fix)
