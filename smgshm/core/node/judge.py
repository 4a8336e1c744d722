"""Judge a tmpfs's SMG names in the pid namespaces of the processes that reach it (core/node/reach.py).

The rules are gc's (segments/judge.py): a producer lives when a process with its pid exists and
started before the segment was written. Only the lookup changes: the pid in a name is looked up
among the pids of each pid namespace that reaches the tmpfs, and the start time read is that of
the process which has it there. Where several namespaces reach one tmpfs (a pod's containers each
have their own unless they share one), the name may come from any of them, so each must agree:
dead in all of them is leaked; alive in all, by the start-time rule, is alive; anything else is
unknown and never reaped. A tmpfs no process reaches has no writer left: every name there is dead
(leaked; proven so, reapable at any age, when a sighting shows it there before the look that found
no process: a writer must reach it, so a name listed before a walk that finds none was written by
a process gone since). Seen from a pid namespace other than the host's initial one, nothing is
judged by pid: unknown. A namespace that reaches the tmpfs only through a view of the host's / (reach.py)
may not be a writer at all: a pid alive there and in no other namespace that reaches it is unknown, never
alive; a pid dead there counts as in any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from smgshm.core.host.clock import WallClock
from smgshm.core.host.holders import Holder
from smgshm.core.host.pidtrust import INIT_PID_NS, Trust, name_pids
from smgshm.core.names import PID_LIMIT
from smgshm.core.node.volumes import PidSpace, ShmUser
from smgshm.core.segments.judge import Bounds, Judge, ScanOptions, reuse_bounds
from smgshm.core.segments.sightings import Sightings

_NEVER = Bounds(math.inf, -math.inf, -1)  # reuse_bounds' shape for "cannot be told": neither alive nor dead


def weak_route(host_mnt: str) -> str:
    """How a weak namespace reaches a tmpfs (the module), and why that cannot be told apart from the host's."""
    said = (
        "by ways that may not reach it: a mount at its node path under another prefix, a view of the host's / "
        "(the host's own mount, or a way in: which cannot be told), or a dir on a detached mount"
    )
    return f"{said}; the host's mount namespace is not known ({host_mnt})" if host_mnt else said


def tmpfs_trust(
    users: Sequence[ShmUser],
    spaces: Sequence[PidSpace],
    mine: str,
    doubt: frozenset[int],
    since_ns: int = 0,
    unread_pids: Sequence[int] = (),
    weak: Sequence[str] = (),
    host_mnt: str = "",
) -> Trust:
    """Whether a tmpfs's names can be judged by pid at all, and in which namespaces (the note says).
    ``users``: the processes that reach it; ``doubt``: the uids of the unread processes that may.
    ``since_ns``: when the look at its users began (boot clock): a container started since may write here
    in a pid namespace not among ``spaces``, so only a name seen before it is judged for good. ``weak``: the
    namespaces that reach it only through a view of the host's / (the module); ``host_mnt``: what could not
    be read of the host's mount namespace, if anything."""
    if mine != INIT_PID_NS:
        return Trust(
            False,
            (
                "smgshm runs outside the host's pid namespace, so pods' processes are not all visible "
                "(a DaemonSet needs hostPID: true)"
            ),
        )
    if not users:
        note = (
            "no process reaches this tmpfs now: its names were written by processes that have all gone "
            "(a container between restarts, a pod being torn down)"
        )
    else:
        named = ", ".join(s.ns for s in spaces)
        note = f"judged in the pid namespace(s) of the {len(users)} process(es) that reach it: {named}"
    if weak:
        note += f"; {', '.join(weak)} only {weak_route(host_mnt)}, so a pid alive only there is unknown"
    if doubt:
        note += f"; uid(s) {', '.join(map(str, sorted(doubt)))}'s processes could not be read"
        note += f" ({name_pids(list(unread_pids))})" if unread_pids else ""
        note += ": in its pod (or of no pod known), they may reach it, so their names stay unknown"
    return Trust(True, note, doubt, since_ns)


class PodJudge(Judge):
    """gc's judge, with each name's pid looked up in the pid namespaces that reach the tmpfs; smgshm's own
    names (``smg-smgshm-*``, which smgshm writes wherever ``--shm-dir`` says, the host's processes too) in
    the host's pid namespace as well (``host``)."""

    own_kinds = frozenset({"smgshm", "smgshm_probe"})

    def __init__(
        self,
        opts: ScanOptions,
        trust: Trust,
        holders: dict[tuple[int, int], list[Holder]],
        dir_dev: int,
        spaces: Sequence[PidSpace],
        sightings: Sightings | None = None,
        mounted: dict[str, str] | None = None,
        wall: WallClock | None = None,
        host: PidSpace | None = None,
        weak: frozenset[str] = frozenset(),
        host_mnt: str = "",
    ) -> None:
        super().__init__(opts, trust, holders, dir_dev, sightings, mounted, wall)
        self.spaces = list(spaces)
        self.weak, self.host_mnt = weak, host_mnt  # namespaces that may not write here at all (the module)
        self.host = host  # the host's pid namespace: smgshm's own names may be written through --shm-dir
        self.split: dict[int, str] = {}  # pid -> why its namespaces cannot agree, for the verdict's sentence

    def bounds(self, pid: int) -> Bounds | None:
        """The start-time bounds of ``pid`` agreed by every namespace (see the module): alive from the
        latest start among them (never, when one has no such pid), dead before the earliest. A pid past
        PID_LIMIT is one of smgshm's own names (``own_kinds``), judged in the host's pid namespace too."""
        if pid >= PID_LIMIT:
            own = [*self.spaces, self.host] if self.host is not None else self.spaces
            return self._agreed(pid - PID_LIMIT, own, self.split.setdefault)
        return self._agreed(pid, self.spaces, self.split.__setitem__)

    def _agreed(self, pid: int, spaces: Sequence[PidSpace], say: Callable[[int, str], object]) -> Bounds | None:
        """``bounds`` over ``spaces``; ``say(pid, why)`` notes why they cannot agree (for the verdict's sentence)."""
        found: list[Bounds] = []
        absent: list[str] = []
        only_weak = True  # every namespace with that pid may be no writer here (the module)
        for space in spaces:
            if pid in space.unsure:
                say(
                    pid,
                    f"a process of a pid namespace nested in {space.ns} has pid {pid} there, "
                    "and which namespace it is in cannot be told",
                )
                return _NEVER
            host = space.host_pid.get(pid)
            b = reuse_bounds(host, self.wall) if host is not None else None
            if b is None:
                absent.append(space.ns)
            else:
                found.append(b)
                only_weak = only_weak and space is not self.host and space.ns in self.weak
        if not found:
            return None  # no process has that pid in any namespace that writes here
        if only_weak:
            say(
                pid,
                f"pid {pid} is a process only in {', '.join(s.ns for s in spaces if s.ns in self.weak)}, which "
                f"reaches this tmpfs only {weak_route(self.host_mnt)}",
            )
            return _NEVER
        if absent:
            say(
                pid,
                f"pid {pid} is a process in some pid namespace(s) that reach this tmpfs and in none of "
                f"{', '.join(absent)}: which one wrote the name cannot be told",
            )
            return Bounds(math.inf, min(b.reused_before for b in found), min(b.started_ns for b in found))
        # reuse is proven only if every namespace's process with that pid started after the sighting
        return Bounds(
            max(b.alive_from for b in found), min(b.reused_before for b in found), min(b.started_ns for b in found)
        )

    def _clock_reason(self, pid: int, bounds: Bounds, written: float) -> str:
        if pid in self.split:
            reason = self.said["clock", pid, ""] = f"producer pid {pid} lives or not: {self.split[pid]}"
            return reason
        return super()._clock_reason(pid, bounds, written)

    def _dead_reason(self, kind: str, pid: int) -> str:
        key = ("dead", pid, kind)
        if not self.spaces:
            reason = self.said[key] = (
                super()._dead_reason(kind, pid).replace("no process has that pid", "no process reaches this tmpfs", 1)
            )
            return reason
        where = "its pod's pid namespace" if len(self.spaces) == 1 else "any pid namespace that reaches this tmpfs"
        reason = self.said[key] = (
            super()._dead_reason(kind, pid).replace("no process has that pid", f"no process has that pid in {where}", 1)
        )
        return reason


__all__ = ["PodJudge", "tmpfs_trust", "weak_route"]
