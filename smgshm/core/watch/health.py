"""``/healthz``: is the exporter's figure source alive? One verdict, one line, for probes.

The node view (``watch --node``, its verdict ``NodeWatch.verdict``) is healthy while its last full
scan succeeded and is recent; plain watch while its last interval is recent and its shm dir is watched.
Recent means within ``STALE_PERIODS`` periods (``--rescan-every``, ``--interval``) plus a slack for a
slow scan: a main loop stuck in a read of /proc, or gone, shows as stale while the server thread still
answers.

A reason is a fixed phrase and ages in seconds: never a path, a pod or an error's text, since the
endpoint may be served without credentials (README: Fleet says why that is safe).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smgshm.core.watch.session import WatchSession

STALE_PERIODS = 3
MIN_SLACK_S = 1.0  # and three times the last scan's own duration, if more


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # one line: "ok", "starting: ...", "stale: ...", "failing: ..."


def judge(age_s: float | None, period_s: float, scan_s: float = 0.0, failing: str | None = None) -> Verdict:
    """The verdict for a source whose last success is ``age_s`` old (None: none yet), due every ``period_s``."""
    if failing is not None:
        return Verdict(False, f"failing: {failing}")
    if age_s is None:
        return Verdict(False, "starting: no scan has finished yet")
    limit = STALE_PERIODS * period_s + max(MIN_SLACK_S, 3 * scan_s)
    if age_s > limit:
        return Verdict(False, f"stale: the last scan finished {age_s:.0f}s ago, one is due every {period_s:g}s")
    return Verdict(True, "ok")


def session_health(session: WatchSession) -> Verdict:
    """Plain watch's verdict, from its last interval (its wall time: the session keeps no other)."""
    with session.lock:
        last = session.last
    if last is None:
        return judge(None, session.opts.interval_s)
    failing = None if last.watching else "the shm dir is gone (watched again when it is back)"
    return judge(max(0.0, time.time() - last.t_unix_s), session.opts.interval_s, failing=failing)


__all__ = ["MIN_SLACK_S", "STALE_PERIODS", "Verdict", "judge", "session_health"]
