"""What the node view cannot see, said for the whole node: never a quiet "0 tmpfs, none".

A look that finds nothing to judge may be right (a node with no pod) or blind. Two blindnesses are
told apart from the inside, and each makes the node's verdict ``unknown`` (gc --node --check exit 6,
NPD 2, a doctor --node warning, the exporter's ``smgshm_node_view_unknown`` and a log line):

- **a mount missing**: under the node root there is neither the kubelet's pods dir nor any runtime's
  sandboxes dir (an empty or wrong ``--node-root``, a DaemonSet whose hostPath is not the host's /);
  a ``--runtime-state-dir`` given that is not there is said on its own;
- **a read that did not answer**: a dir of the layout (a pod dir, a runtime's) whose open or listing
  did not answer within its bound, or came after the run's time for layout reads was spent
  (layout.py): what is under it is not seen (each tmpfs the mount table shows there is ``unknown``
  for itself);
- **a privilege missing**: smgshm's pid namespace is not the host's initial one (a DaemonSet without
  ``hostPID: true``): pods' processes are not all visible, so no tmpfs can be tied to its pods' pid
  namespaces, and a tmpfs no visible process uses would look unused; or a layout dir is there but may
  not be listed (EACCES: the kubelet's pods dir and each pod's dir are 0750 root, so a non-root smgshm
  without CAP_DAC_READ_SEARCH finds no emptyDir at all); or the host's mount namespace cannot be read
  (/proc/1/ns/mnt) while processes of another reach a tmpfs through a mount that may be the host's own
  (reach.py): a pid alive only in their pid namespaces is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from smgshm.core.closed import Closed
from smgshm.core.host.pidtrust import INIT_PID_NS
from smgshm.core.node.layout import KUBELET_PODS, runtime_layouts


class Blind(Closed):
    """Why the node view cannot see the whole node (the exporter's ``reason`` label)."""

    NODE_ROOT = "node_root"  # no kubelet pods dir and no runtime sandboxes dir under the root
    STATE_DIR = "runtime_state_dir"  # a --runtime-state-dir that is not there
    HOST_PID = "host_pid"  # not in the host's pid namespace
    LAYOUT_READ = "layout_read"  # a dir under the root not read in time (a stalled mount; layout.py's LAYOUT_S)
    UNREADABLE = "unreadable"  # a layout dir there that may not be listed (EACCES)
    HOST_MNT = "host_mnt"  # the host's mount namespace not known, and a tmpfs's judges depend on it


@dataclass(frozen=True)
class Unseen:
    """One thing the node view cannot see, with the mount or privilege it lacks."""

    reason: Blind
    message: str
    hint: str


def unseen(
    root: str,
    found: Sequence[str],
    missing_state_dirs: Sequence[str],
    pidns: str,
    state_dirs: Sequence[tuple[str, ...]] = (),
    unreadable: Sequence[str] = (),
    unread: Sequence[tuple[tuple[str, ...], str]] = (),
) -> list[Unseen]:
    """What a look at ``root`` could not see: ``found`` the layout dirs that were there, ``missing_state_dirs``
    the custom ones that were not, ``pidns`` this process's pid namespace (``pid:[...]``; "" unreadable),
    ``unreadable`` the dirs there that may not be listed, ``unread`` the dirs not read in time (layout.py's
    ``NodeRoot.unread``: components, the bound hit)."""
    out: list[Unseen] = []
    if unreadable:
        more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
        out.append(
            Unseen(
                Blind.UNREADABLE,
                f"{unreadable[0]}{more} under node root {root} may not be listed (permission denied): "
                "the pods' /dev/shm below cannot be seen",
                "run as root, or give the uid CAP_DAC_READ_SEARCH (the node image's exporter entrypoint, "
                "/opt/smgshm/bin/smgshm-node, raises it and CAP_SYS_PTRACE by file capabilities)",
            )
        )
    if not found and not unreadable:  # a dir there but not listable is no missing mount
        looked = ", ".join(["/".join(KUBELET_PODS), *runtime_layouts(state_dirs)])
        out.append(
            Unseen(
                Blind.NODE_ROOT,
                f"node root {root} has no kubelet pods dir and no container runtime's sandboxes dir "
                f"(looked for {looked}): a mount is missing, so no pod's /dev/shm can be seen",
                "mount the host's / there (a DaemonSet's hostPath /, with mountPropagation: HostToContainer) "
                "and pass it as --node-root; for a runtime elsewhere, --runtime-state-dir",
            )
        )
    for d in missing_state_dirs:
        out.append(
            Unseen(
                Blind.STATE_DIR,
                f"runtime state dir {d} is not under node root {root}: its sandboxes' /dev/shm cannot be seen",
                "give the runtime's state dir (containerd's `state`, CRI-O's storage `runroot`) as mounted "
                "under the node root",
            )
        )
    if unread:
        named = ", ".join("/".join(names) for names, _why in unread[:3])
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        out.append(
            Unseen(
                Blind.LAYOUT_READ,
                f"{len(unread)} dir(s) under node root {root} not read: {named}{more} ({unread[0][1]}); what is "
                "below cannot be seen (each tmpfs the mount table shows there is unknown)",
                "find the mount that does not answer there (a stalled FUSE or NFS mount: `ls` it with a timeout) "
                "and unmount or repair it",
            )
        )
    if pidns != INIT_PID_NS:
        out.append(
            Unseen(
                Blind.HOST_PID,
                f"smgshm runs outside the host's pid namespace ({pidns or 'unreadable'}): pods' processes are "
                "not all visible, so no tmpfs can be judged by pid",
                "run it in the host's pid namespace (a DaemonSet needs hostPID: true)",
            )
        )
    return out


def host_mnt_unseen(why: str) -> Unseen:
    """The host's mount namespace not known (``why``: what could not be read), when some tmpfs's judges
    depend on it (reach.py)."""
    return Unseen(
        Blind.HOST_MNT,
        f"the host's mount namespace cannot be identified ({why}): processes of another mount namespace reach "
        "pods' tmpfs through mounts that may be the host's own, so a producer's pid alive only in their pid "
        "namespaces is unknown",
        "run in the host's pid namespace with CAP_SYS_PTRACE (hostPID: true), so that /proc/1/ns/mnt can be "
        "read, and mount the host's / as the node root",
    )


__all__ = ["Blind", "Unseen", "host_mnt_unseen", "unseen"]
