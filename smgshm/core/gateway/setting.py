"""SMG's transport setting as the gateway parses it: its modes, and the size below which a tensor goes
inline (smg-facts §2.3). The one place these are written; the transport decision, the gateway's log
line and every finding about a gateway read them from here."""

from __future__ import annotations

from smgshm.core.closed import Closed

DEFAULT_SHM_MIN_BYTES = 64 * 1024  # SMG's built-in shm_min_bytes


class Mode(Closed):
    """``TransportMode``: ``--multimodal-tensor-transport`` (or ``SMG_MM_TENSOR_TRANSPORT``)."""

    INLINE = "inline"
    SHM = "shm"
    AUTO = "auto"
    RDMA = "rdma"


SHM_MODES = (Mode.AUTO, Mode.SHM)  # the modes under which the gateway writes segments


def parse_mode(text: str | None) -> Mode | None:
    """``TransportMode::parse``: trimmed and lowercased; ``None`` when unknown or empty."""
    if not text or not text.strip():
        return None
    try:
        return Mode(text.strip().lower())
    except ValueError:
        return None
