"""One look at a node: every tmpfs where a pod's /dev/shm lives, each tied to its pod and the pid
namespaces that use it, then each listed and judged as gc lists and judges a shm dir (segments/scan.py).

``look`` reads what is shared by every tmpfs once (the places, the pod names, each process's
/dev/shm, the pid namespaces, the hidden bytes); ``TmpfsScan`` is gc's ``Scan`` of one tmpfs with
the pod judge in place of the host's, so gc's listing, reaping and tallies apply unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from smgshm.core.closed import Closed
from smgshm.core.errors import HostError, SmgshmError
from smgshm.core.host import clock
from smgshm.core.host.bounded import StuckReadError, within
from smgshm.core.host.clock import WallClock
from smgshm.core.host.holders import Holder, holder_index, holder_index_devs
from smgshm.core.host.mountpoints import mount_points_of
from smgshm.core.host.mounts import Mount
from smgshm.core.host.pidtrust import INIT_PID_NS, Trust
from smgshm.core.host.proc import fd_mount_id, live_pids
from smgshm.core.names import SMG_FAMILY_PREFIX
from smgshm.core.node.judge import PodJudge, tmpfs_trust
from smgshm.core.node.layout import LAYOUT_S, NodeRoot, Place
from smgshm.core.node.pods import PodName, pod_names_at
from smgshm.core.node.reach import reachers
from smgshm.core.node.sight import Unseen, host_mnt_unseen, unseen
from smgshm.core.node.volumes import Hidden, PidSpace, ShmUser, hidden_bytes, pid_spaces, pidns_of_self
from smgshm.core.segments.judge import Judge, ListedEntry, ScanOptions, SegmentInfo, Tally
from smgshm.core.segments.scan import Scan
from smgshm.core.segments.sightings import Sightings

MAX_FAMILIES = 32  # other families kept by name; the rest are counted together
OTHER = "(other)"


@dataclass(frozen=True)
class Tmpfs:
    """One tmpfs of the node, with what ties it to a pod."""

    place: Place
    pod_uid: str | None  # the kubelet path's, else the one its processes' cgroups agree on
    pod: PodName | None
    users: tuple[ShmUser, ...]  # processes that reach it (reach.py)
    spaces: tuple[PidSpace, ...]  # their pid namespaces
    trust: Trust
    hidden: Hidden
    host: PidSpace | None = None  # the host's pid namespace: smgshm's own names are judged there too
    # Why it was not looked at (a dir above it not read in time, layout.py): found in the mount table only,
    # never opened (its path may stall); it is reported unknown for itself (``Unscanned``), never judged
    unread: str | None = None
    weak: frozenset[str] = frozenset()  # pid namespaces that reach it only through a view of the host's / (reach.py)
    host_mnt: str = ""  # what could not be read of the host's mount namespace, if anything


def pod_label(t: Tmpfs) -> str:
    """``namespace/name`` of the tmpfs's pod, its uid when its log dir is not there, or "-"."""
    return f"{t.pod.namespace}/{t.pod.name}" if t.pod is not None else t.pod_uid or "-"


@dataclass(frozen=True)
class NodeLook:
    root: str
    tmpfs: list[Tmpfs]
    pods_known: int  # pod log dirs read
    holders: dict[tuple[int, int], list[Holder]] | None = None  # every tmpfs's, from the look's one walk
    unseen: list[Unseen] = field(default_factory=list)  # what it could not see (sight.py): the node is unknown
    # The mount tables its walk read (namespace -> table): the scans' mount points need not read them again
    tables: dict[str, list[Mount]] = field(default_factory=dict)


LOOK_S = 30.0  # the reads of a look's walk of /proc that can stall, in all (host/bounded.py)


def look(root: str, pids: Iterable[int] | None = None, state_dirs: Sequence[tuple[str, ...]] = ()) -> NodeLook:
    """Find and tie every tmpfs under the node ``root`` (HostError when the root cannot be opened);
    ``state_dirs``: custom runtime state dirs under it (layout.NodeRoot)."""
    since = clock.boot_clock_ns()  # before the processes are read: each tmpfs's trust is of this look
    everyone = live_pids() if pids is None else list(pids)
    with NodeRoot(root, state_dirs) as node:
        with within(LAYOUT_S):  # one deadline for every open and listing under the root (layout.py)
            places, where = list(node.places()), node.path
        unread_places = node.unread_places()  # below a dir not read in time: unknown, each for itself
        blind = unseen(where, node.found, node.missing, pidns_of_self(), state_dirs, node.unreadable, node.unread)
        why_unread = {p.dev: _why_unread(p, node.unread, where) for p in unread_places}
    places, every = blocks(places, unread_places, why_unread)
    stuck: dict[int, str] = {}  # processes one of whose reads stuck (bounded.py): unread, so in doubt, never a hang
    maps: dict[int, bytes] = {}  # each process's maps as the holder walk read them: the hidden bytes' too
    with within(LOOK_S):
        holders = holder_index_devs([p.dev for p in places], everyone, stuck, maps)  # fds, maps: a route, gc's holders
        seen = reachers(every, where, everyone, holders, stuck)  # the one rule: who reaches each tmpfs (reach.py)
    # Pod names for the pods seen only (the log dirs are streamed, not kept): the places' and the reachers' uids.
    wanted = {p.pod_uid for p in places} | {u.pod_uid for us in seen.by_dev.values() for u in us}
    wanted |= {v for v in seen.sandbox_pod.values() if v}
    names, known = pod_names_at(where, {w for w in wanted if w})
    depth = {u.pidns: u.depth for p in places for u in seen.by_dev.get(p.dev, ())}
    spaces = pid_spaces(depth, everyone)
    with within(LOOK_S):
        hidden = hidden_bytes([p.dev for p in places], everyone, maps)
    del maps
    mine = pidns_of_self()
    host = PidSpace(mine, 1, {p: p for p in everyone}) if mine == INIT_PID_NS else None
    out: list[Tmpfs] = []
    for p in places:
        mine_users = tuple(seen.by_dev.get(p.dev, ()))
        used = tuple(spaces[ns] for ns in sorted({u.pidns for u in mine_users}))
        uid = p.pod_uid or (seen.sandbox_pod.get(p.volume) if p.kind == "sandbox_shm" and p.volume else None)
        if uid is None:  # a sandbox's whose pause was not seen: the pod its processes' cgroups agree on
            found = {u.pod_uid for u in mine_users}
            uid = found.pop() if len(found) == 1 else None
        # An unread process may reach its own pod's tmpfs: the pod the kubelet's path or the sandbox's pause proves.
        proven = p.pod_uid or (seen.sandbox_pod.get(p.volume) if p.volume else None)
        unread = seen.doubtful(proven, [s.ns for s in used])
        doubt = frozenset(u.uid for u in unread)
        weak = frozenset(s.ns for s in used if all(u.maybe_host for u in mine_users if u.pidns == s.ns))
        trust = tmpfs_trust(mine_users, used, mine, doubt, since, [u.pid for u in unread], sorted(weak), seen.host_mnt)
        if p.dev in why_unread:  # not looked at: nothing of it is judged, and no pid verdict is trusted
            trust = Trust(False, f"not read: {why_unread[p.dev]}")
        named = names.get(uid) if uid else None
        out.append(
            Tmpfs(
                p, uid, named, mine_users, used, trust, hidden[p.dev], host, why_unread.get(p.dev), weak, seen.host_mnt
            )
        )
    if seen.host_mnt:
        blind.append(host_mnt_unseen(seen.host_mnt))
    return NodeLook(where, out, known, holders, blind, seen.tables)


def blocks(
    places: Sequence[Place], unread_places: Sequence[Place], why_unread: dict[int, str]
) -> tuple[list[Place], list[Place]]:
    """(one place per tmpfs, the block it is reported as; every place of every tmpfs, for reach.py: a mount
    at any of them is the host's). A tmpfs read at some place is judged there, and ``why_unread`` (dev ->
    why) loses it; one only under dirs not read keeps its reason, however many unread places (mount ids:
    a mount propagated twice) it has."""
    by_dev: dict[int, Place] = {}
    for p in places:
        by_dev.setdefault(p.dev, p)  # one tmpfs, one block (its first place)
    read = set(by_dev)  # the tmpfs seen at a place that was read (an unread one's copies do not count)
    for p in unread_places:
        if p.dev in read:
            why_unread.pop(p.dev, None)  # read at another of its places: judged there
        else:
            by_dev.setdefault(p.dev, p)
    every = [*places, *(p for p in unread_places if p.dev in why_unread)]
    return list(by_dev.values()), every


def _why_unread(p: Place, unread: Sequence[tuple[tuple[str, ...], str]], root: str) -> str:
    """Why the tmpfs at ``p`` was not looked at: the dir above it not read in time, and the bound it hit."""
    for names, why in unread:
        top = os.path.join(root, *names)
        if p.path == top or p.path.startswith(top + "/"):
            return f"{top} was not read in time ({why})"
    return "a dir above it was not read in time"


@dataclass
class Others:
    """Entries outside SMG's names, by family (the leading letters of a name: ``sem``, ``nccl``, ``torch``)."""

    counts: dict[str, int] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, nbytes: int) -> None:
        fam = _family(name)
        if fam not in self.counts and len(self.counts) >= MAX_FAMILIES:
            fam = OTHER
        self.counts[fam] = self.counts.get(fam, 0) + 1
        self.nbytes[fam] = self.nbytes.get(fam, 0) + nbytes


def _family(name: str) -> str:
    n = 0
    while n < len(name) and n < 32 and name[n].isascii() and name[n].isalpha():
        n += 1
    return name[:n].lower() or OTHER


class TmpfsScan(Scan):
    """gc's scan of one tmpfs, judged by its pod's pid namespaces; other families counted as it lists."""

    def __init__(
        self,
        tmpfs: Tmpfs,
        opts: ScanOptions,
        progress: Callable[[int], None] | None = None,
        holders: dict[tuple[int, int], list[Holder]] | None = None,
        mounted: dict[str, str] | None = None,
    ) -> None:
        """``holders``: every tmpfs's, from one walk of /proc (``holder_index_devs``); ``mounted``: its
        mount points, from one read of every namespace's table (``mount_points_of``); else its own reads."""
        self.tmpfs = tmpfs
        self.others = Others()
        self.error: str | None = None  # why it could not be scanned (Unscanned's)
        self.failure: ScanFailure | None = None  # and its cause code (Unscanned's)
        self.gone = False  # not mounted there any more (Unscanned's)
        self._holders, self._mounted = holders, mounted
        if tmpfs.unread is not None:  # its path may stall: never opened (HostError, so Unscanned, unknown)
            raise HostError(f"not scanned: {tmpfs.unread}", path=tmpfs.place.path)
        super().__init__(replace(opts, shm_dir=tmpfs.place.path), progress)

    def make_judge(self) -> tuple[Trust, Judge]:
        place = self.tmpfs.place
        try:
            same = self.dev == place.dev and fd_mount_id(self._fd) == place.mount_id
        except OSError:
            same = False
        if not same:  # the path was opened again by name: it must still be the very mount looked at
            self.close()
            raise TmpfsChangedError("the tmpfs changed since the node was looked at", path=place.path)
        trust = self.tmpfs.trust
        held = self._holders if self._holders is not None else holder_index(self.dev)
        # The clocks without a read of the mount table per tmpfs (read_wall_clock's, to learn the
        # filesystem): the node view found it mounted as a tmpfs, made after boot.
        offset = clock.boot_offset()
        wall = WallClock(offset, clock.step_shown(clock.birth_time(place.path), 0.0, offset))
        t = self.tmpfs
        judge = PodJudge(
            self.opts, trust, held, self.dev, t.spaces, self.sightings, self._mounted, wall, t.host, t.weak, t.host_mnt
        )
        return trust, judge

    def _other(self, entry: ListedEntry) -> None:
        """Count an entry outside SMG's names by its family."""
        with contextlib.suppress(OSError):  # gone since the listing
            self.others.add(entry.name, entry.stat(follow_symlinks=False).st_blocks * 512)

    def __iter__(self) -> Iterator[SegmentInfo]:
        # As gc's Scan: the judge's generator itself, closing the dir and storing a whole listing's sightings.
        return self.judge.each(self._dir, self.tally, self.progress, SMG_FAMILY_PREFIX, self._other, self._ended)


class TmpfsChangedError(HostError):
    """The path of a tmpfs of the look holds another mount (or none) when it is scanned."""


class ScanFailure(Closed):
    """Why a tmpfs of the look could not be scanned: a closed set (the exporter's ``reason`` label)."""

    PERMISSION = "permission"  # its dir cannot be listed by this process (its mode or owner; no DAC capability)
    CHANGED = "changed"  # its path holds another mount, or nothing, since the look
    STALLED = "stalled"  # a read of it (or of a dir above it) did not answer in time (host/bounded.py)
    ERROR = "error"  # any other error of the kernel's (EIO, ENOMEM, ...)


def failure_of(err: BaseException) -> ScanFailure:
    """The cause code of an error scanning a tmpfs (``err`` or the OSError it was raised from)."""
    if isinstance(err, TmpfsChangedError):
        return ScanFailure.CHANGED
    if isinstance(err, StuckReadError) or isinstance(err.__cause__, StuckReadError):
        return ScanFailure.STALLED
    os_err = err if isinstance(err, OSError) else err.__cause__
    code = os_err.errno if isinstance(os_err, OSError) else None
    if code in (errno.EACCES, errno.EPERM):
        return ScanFailure.PERMISSION
    if code in (errno.ENOENT, errno.ENOTDIR, errno.ESTALE):
        return ScanFailure.CHANGED
    return ScanFailure.ERROR


class Unscanned(TmpfsScan):
    """A tmpfs of the look that could not be scanned: gone since (its pod deleted: unmounted), or unreadable.
    It lists nothing and reaps nothing; it is reported for itself (``error``), and the run goes on."""

    def __init__(self, tmpfs: Tmpfs, opts: ScanOptions, error: SmgshmError) -> None:
        # Not Scan's constructor: there is no dir to open. What gc's run reads of a scan is set here.
        self.tmpfs, self.others, self._holders, self._mounted = tmpfs, Others(), None, {}
        self.t0, self.opts, self.progress, self._fd = (
            time.monotonic(),
            replace(opts, shm_dir=tmpfs.place.path),
            None,
            -1,
        )
        self.dev, self.shm_total_bytes, self.shm_free_bytes = tmpfs.place.dev, 0, 0
        self.tally = Tally()
        self.error = str(error)
        # Not read at the look (a dir above it stalled, or the run's time for reads was spent): stalled.
        self.failure: ScanFailure = ScanFailure.STALLED if tmpfs.unread is not None else failure_of(error)
        self.gone = tmpfs.unread is None and gone(tmpfs.place)  # an unread one's path is not touched
        self.trust = Trust(False, f"not scanned: {self.error}")
        self.sightings = Sightings(tmpfs.place.path, None)  # nothing read or stored (no dir identified)

    def usage_now(self) -> tuple[int, int]:
        return 0, 0

    def __iter__(self) -> Iterator[SegmentInfo]:
        return iter(())


def gone(place: Place) -> bool:
    """Whether the tmpfs is no longer mounted at its place (its pod deleted since the look)."""
    try:
        fd = os.open(place.path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # there, but not ours to look at
    try:
        return os.fstat(fd).st_dev != place.dev or fd_mount_id(fd) != place.mount_id
    finally:
        os.close(fd)


def tmpfs_scans(node: NodeLook, opts: ScanOptions) -> Iterator[TmpfsScan]:
    """gc's scan of each tmpfs of ``node`` in turn, each judged in its pod's pid namespaces (gc --node). One
    that cannot be scanned (gone since the look, unreadable) is an ``Unscanned``: the others are judged."""
    # One walk of /proc and one read of every mount namespace's table (the look's), for every tmpfs at once.
    holders = node.holders if node.holders is not None else holder_index_devs(t.place.dev for t in node.tmpfs)
    readable = (t.place.path for t in node.tmpfs if t.unread is None)  # an unread path may stall
    mounted = mount_points_of(readable, read=node.tables)
    for tmpfs in node.tmpfs:
        try:
            scan: TmpfsScan = TmpfsScan(tmpfs, opts, holders=holders, mounted=mounted.get(tmpfs.place.path, {}))
        except SmgshmError as err:
            scan = Unscanned(tmpfs, opts, err)
        yield scan


__all__ = [
    "OTHER",
    "NodeLook",
    "Others",
    "ScanFailure",
    "Tmpfs",
    "TmpfsChangedError",
    "TmpfsScan",
    "Unscanned",
    "failure_of",
    "gone",
    "look",
    "pod_label",
    "tmpfs_scans",
]
