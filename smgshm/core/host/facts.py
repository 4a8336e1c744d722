"""This host's facts as one run needs them: read once, then handed to every check.

doctor used to read its identity, namespace id and writability in each check (up to seven
boot_id reads and two writability probes per run). A run now reads them once with
``read_host_facts`` and passes the value down; the library functions that also serve other
commands take it as an option and read for themselves when they are given none.
"""

from __future__ import annotations

from dataclasses import dataclass

from smgshm.core.errors import HostError
from smgshm.core.host.identity import HostIdentity, probe_writable, read_host_identity
from smgshm.core.host.namespace import read_namespace_id
from smgshm.core.paths import same_dir


@dataclass(frozen=True)
class HostFacts:
    """This process's identity as seen from ``shm_dir``, and the gateway's writability probe there."""

    shm_dir: str
    identity: HostIdentity | None  # None: the shm dir cannot be read (identity_error says why)
    identity_error: HostError | None
    writable_error: str | None  # None when a 0600 segment can be created and removed

    @property
    def namespace_id(self) -> str:
        """SMG's ``shm_namespace_id`` for this host, ``""`` when unreadable."""
        return self.identity.namespace_id if self.identity is not None else ""

    @property
    def boot_id(self) -> str:
        return self.identity.boot_id if self.identity is not None else ""

    def about(self, shm_dir: str) -> bool:
        """Do these facts describe ``shm_dir`` (the same directory, however it is spelled: by device and inode,
        as ``same_dir`` tells, never by the path resolved as text)?"""
        return same_dir(self.shm_dir, shm_dir)


def read_host_facts(shm_dir: str) -> HostFacts:
    """Read this host's facts once: identity (with the namespace id), then the writability probe."""
    try:
        identity, error = read_host_identity(shm_dir), None
    except HostError as err:
        identity, error = None, err
    return HostFacts(shm_dir, identity, error, probe_writable(shm_dir))


def namespace_id(shm_dir: str, facts: HostFacts | None = None) -> str:
    """This host's namespace id for ``shm_dir``: from ``facts`` when they describe it, else read now."""
    return facts.namespace_id if facts is not None and facts.about(shm_dir) else read_namespace_id(shm_dir)


def writable_error(shm_dir: str, facts: HostFacts | None = None) -> str | None:
    """The writability probe of ``shm_dir`` (None: it passes): from ``facts`` when they describe it, else run now."""
    return facts.writable_error if facts is not None and facts.about(shm_dir) else probe_writable(shm_dir)
