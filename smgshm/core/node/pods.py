"""Which pod a tmpfs or a process belongs to, without the API server.

The kubelet names each pod's log dir ``var/log/pods/<namespace>_<pod-name>_<pod-uid>/`` (a namespace
and a pod name are DNS names: no "_" in them), so a pod uid maps to its namespace and name from
the node's filesystem alone. A process carries its pod's uid in its cgroup path: the systemd
driver's ``kubepods-besteffort-pod<uid, "-" as "_">.slice``, the cgroupfs driver's
``/kubepods/besteffort/pod<uid>/<container>``. Both are read as hostile: bounded, parsed strictly.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Collection
from typing import NamedTuple

from smgshm.core.node.layout import POD_LOGS, each_dir, open_dir

MAX_CGROUP_BYTES = 64 * 1024  # a process's cgroup file: one line per hierarchy (a dozen on cgroup v1)
# A pod uid: a UUID (the API server's), or 32 hex digits (a static pod's: a hash of its manifest).
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_CGROUP_POD = re.compile(rb"(?:^|[/-])pod(" + _UID.encode() + rb")(?:\.slice)?(?:/|$)", re.MULTILINE)
# A log dir's name: a namespace (DNS-1123 label), a pod name (DNS-1123 subdomain), a pod uid.
_LOG_DIR = re.compile(r"([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)_([a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?)_(" + _UID + ")")


class PodName(NamedTuple):
    namespace: str
    name: str


def pod_names(root_fd: int, wanted: Collection[str]) -> tuple[dict[str, PodName], int]:
    """Pod uid -> (namespace, name) for the uids ``wanted``, from the kubelet's pod log dirs under the node
    root open at ``root_fd``, and how many log dirs were read. Every dir is read (streamed: a node with
    thousands of stale ones is read whole) and only the wanted are kept. A dir name that cannot be the
    kubelet's is skipped, and a uid two dirs name differently is left out: which is right cannot be told."""
    try:
        fd = open_dir(root_fd, POD_LOGS)
    except OSError:
        return {}, 0
    out: dict[str, PodName | None] = {}
    read = 0
    try:
        for entry in each_dir(fd):
            if (m := _LOG_DIR.fullmatch(entry)) is not None:
                read += 1
                if m[3] in wanted:
                    name = PodName(m[1], m[2])
                    out[m[3]] = name if out.get(m[3], name) == name else None
    except OSError:
        pass  # a listing that stuck (bounded.py): names are only shown, those read so far are kept
    finally:
        os.close(fd)
    return {uid: name for uid, name in out.items() if name is not None}, read


def pod_names_at(root: str, wanted: Collection[str]) -> tuple[dict[str, PodName], int]:
    """``pod_names`` under the node root at the path ``root`` (opened as NodeRoot opens it); ({}, 0) when it
    cannot be opened now. Names are only shown, never acted on: read after the processes, by path."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return {}, 0
    try:
        return pod_names(fd, wanted)
    finally:
        os.close(fd)


def pod_uid_in(cgroup: bytes) -> str | None:
    """The pod uid a /proc/P/cgroup text names (the same on every line of a pod's process), in the
    API's form (dashes); None when it names none, or names more than one (then it cannot be told)."""
    found = {m.group(1).replace(b"_", b"-").decode() for m in _CGROUP_POD.finditer(cgroup)}
    return found.pop() if len(found) == 1 else None


def pod_uid_of(pid: int) -> str | None:
    """The pod uid of process ``pid`` from its cgroup path; None when gone, unreadable or no pod's."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup", "rb") as f:
        return pod_uid_in(f.read(MAX_CGROUP_BYTES))
    return None


__all__ = ["PodName", "pod_names", "pod_names_at", "pod_uid_in", "pod_uid_of"]
