"""Namespace identity: SMG's ``shm_namespace_id`` and what two of them mean together."""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass

from smgshm.core.paths import BOOT_ID_PATH, DEFAULT_SHM_DIR

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class NamespaceId:
    """A parsed ``<boot_id>:<st_dev>`` token."""

    boot_id: str
    shm_dev: int

    def __str__(self) -> str:
        return f"{self.boot_id}:{self.shm_dev}"


def parse_namespace_id(text: str | None) -> NamespaceId | None:
    """Parse a peer's id; ``None`` for empty or malformed (SMG then stays inline)."""
    if not text:
        return None
    boot_id, sep, dev = text.strip().rpartition(":")
    # fullmatch and ASCII digits only: "\n" before "$", or "²" (isdigit but not int()), are not ids.
    if not sep or not _UUID.fullmatch(boot_id) or not (dev.isascii() and dev.isdigit()):
        return None
    return NamespaceId(boot_id.lower(), int(dev))


def read_namespace_id(shm_dir: str = DEFAULT_SHM_DIR, proc_root: str = "/") -> str:
    """This host's id computed exactly as SMG does, or ``""`` when a part is unreadable.

    ``proc_root`` lets a caller look through another process's root
    (``/proc/<pid>/root``): boot_id is kernel-wide, but st_dev is what that mount
    namespace sees at its ``shm_dir``.
    """
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            boot_id = f.read().strip()
        path = os.path.join(proc_root, shm_dir.lstrip("/")) if proc_root != "/" else shm_dir
        # os.stat follows links, as SMG's gateway (metadata) and servicer (os.stat) do.
        dev = os.stat(path).st_dev
    except OSError:
        return ""
    return namespace_id(boot_id, dev)


def namespace_id(boot_id: str, dev: int) -> str:
    """SMG's spelling of the id, ``<boot_id>:<st_dev>``; ``""`` when the boot id is unknown."""
    return f"{boot_id}:{dev}" if boot_id else ""


class Sharing(enum.Enum):
    """What two ids say about /dev/shm."""

    SHARED = "shared"
    OTHER_HOST = "other_host"
    PRIVATE_TMPFS = "private_tmpfs"
    UNDETERMINED = "undetermined"
    SPELLING = "spelling"  # same tmpfs, but the strings differ: the gateway compares strings


@dataclass(frozen=True)
class NamespaceComparison:
    """A verdict on two ids, with the reason in words."""

    local: str
    peer: str
    sharing: Sharing
    reason: str

    @property
    def shared(self) -> bool:
        return self.sharing is Sharing.SHARED


def compare_namespace_ids(local: str | None, peer: str | None, *, two_ids: bool = False) -> NamespaceComparison:
    """Say whether two ids mean a shared /dev/shm, and if not, why not.

    The reason quotes a malformed id raw (not ``repr``: a display escapes it once, and JSON
    carries it exactly); whoever prints it escapes it (``cli.fmt.escape``).

    ``two_ids``: neither is this host's (``ns compare A B``), so the reasons speak of
    "id A" (``peer``) and "id B" (``local``) instead of "the peer" and "this host".
    """
    lo, pe = parse_namespace_id(local), parse_namespace_id(peer)
    local_s, peer_s = local or "", peer or ""
    here, there = ("in B", "in A") if two_ids else ("here", "there")
    if pe is None:
        if two_ids:
            why = "id A is empty" if not peer_s else f'id A "{peer_s}" is malformed'
        else:
            why = "the peer advertises no namespace id" if not peer_s else f'the peer\'s id "{peer_s}" is malformed'
        return NamespaceComparison(local_s, peer_s, Sharing.UNDETERMINED, why)
    if lo is None:
        if two_ids:
            why = "id B is empty" if not local_s else f'id B "{local_s}" is malformed'
        else:
            why = "this host's id is unreadable" if not local_s else f'this host\'s id "{local_s}" is malformed'
        return NamespaceComparison(local_s, peer_s, Sharing.UNDETERMINED, why)
    if lo.boot_id != pe.boot_id:
        why = (
            "boot ids differ: the two run on different hosts or VMs"
            if two_ids
            else "boot ids differ: the peer runs on another host or VM"
        )
        return NamespaceComparison(local_s, peer_s, Sharing.OTHER_HOST, why)
    if lo.shm_dev != pe.shm_dev:
        return NamespaceComparison(
            local_s,
            peer_s,
            Sharing.PRIVATE_TMPFS,
            f"same host, but /dev/shm is a different tmpfs (st_dev {lo.shm_dev} {here}, {pe.shm_dev} {there})",
        )
    if local_s != peer_s:
        return NamespaceComparison(
            local_s,
            peer_s,
            Sharing.SPELLING,
            "the ids name the same tmpfs but are spelled differently; the gateway compares them as strings "
            "and will stay inline",
        )
    return NamespaceComparison(local_s, peer_s, Sharing.SHARED, "namespace ids match")
