"""The worker failure classes ``serve --fault`` injects (smg-facts §5.3).

Plain constants in a module of their own: ``serve``'s options need them at import, and
every command's start pays for what ``smgshm.cli`` imports (core.receiver pulls in the
wire and tensor code).
"""

from __future__ import annotations

# die-* kill the whole process with SIGKILL, as a crashed worker would die: never use them in-process.
FAULTS = ("die-before-read", "die-after-headers", "die-after-read", "slow-read")
MAX_FAULT_DELAY_S = 60.0
