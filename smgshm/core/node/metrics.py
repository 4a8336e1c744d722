"""A node's tmpfs as Prometheus metrics: one series set per tmpfs, the node's totals, the scans' health.

One builder for both packagings: ``watch --node --serve-metrics`` (core/node/follow.py, scraped)
and ``gc --node --prometheus FILE`` (node_exporter's textfile collector). Cardinality is bounded
by the node, never by its traffic: a tmpfs is one label set (``namespace``, ``pod``, ``uid``,
``volume``, ``kind``), states are gc's six, and nothing is labelled per segment or per family
name (names are strangers' strings; other families are counted together). ``uid`` is the pod's
uid, kube-state-metrics' name for it (``kube_pod_info``), so the series join with it, and two pods
whose log dirs are gone (no namespace, no name) still differ. A label value read from the node
(pod and volume names) is escaped once here: control characters and undecodable bytes as ``\\xNN``.
``METRICS`` is the catalogue; README's table is checked against it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smgshm.core.node.layout import TmpfsKind
from smgshm.core.node.scan import Others, ScanFailure, Tmpfs
from smgshm.core.node.sight import Blind
from smgshm.core.segments.judge import State, Tally

if TYPE_CHECKING:  # prometheus_client is imported where it is used
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "smgshm_node_"
VOLUME = ("namespace", "pod", "uid", "volume", "kind")  # one label set per tmpfs
# When a family is there: in both packagings, or only from the exporter (its counters run with it).
ALWAYS, EXPORTER = "always", "exporter"
MAX_LABEL_CHARS = 253  # a Kubernetes name's limit; a longer value (not Kubernetes' own) is cut, marked

# name after smgshm_node_ -> (type, labels, when, help)
METRICS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "size_bytes": ("gauge", VOLUME, ALWAYS, "Size of the tmpfs (statvfs)"),
    "used_bytes": ("gauge", VOLUME, ALWAYS, "Used bytes of the tmpfs (statvfs), hidden bytes included"),
    "free_bytes": ("gauge", VOLUME, ALWAYS, "Bytes still available in the tmpfs (statvfs)"),
    "hidden_bytes": (
        "gauge",
        VOLUME,
        ALWAYS,
        "Bytes of files unlinked but still mapped (no listing shows them; a lower bound)",
    ),
    "hidden_files": ("gauge", VOLUME, ALWAYS, "Files unlinked but still mapped"),
    "segments": ("gauge", (*VOLUME, "state"), ALWAYS, "SMG segments by gc's state, judged in the pod's pid namespaces"),
    "segment_bytes": ("gauge", (*VOLUME, "state"), ALWAYS, "Allocated bytes of the SMG segments by gc's state"),
    "reclaimable_bytes": (
        "gauge",
        VOLUME,
        ALWAYS,
        "Allocated bytes of the leaked segments that unlinking would free (single link)",
    ),
    "other_entries": ("gauge", VOLUME, ALWAYS, "Entries outside SMG's names (semaphores, NCCL, torch, ...)"),
    "other_bytes": ("gauge", VOLUME, ALWAYS, "Allocated bytes of the entries outside SMG's names"),
    "processes": ("gauge", VOLUME, ALWAYS, "Processes that reach the tmpfs (its /dev/shm, a mount, a cwd, fd or map)"),
    "liveness_trusted": (
        "gauge",
        VOLUME,
        ALWAYS,
        "1 when its segments can be judged by pid (a pid namespace uses it), else 0: all unknown",
    ),
    "volume_scanned": (
        "gauge",
        VOLUME,
        ALWAYS,
        "1 when the last scan listed and judged the tmpfs, 0 when it could not (volume_scan_failure says why; "
        "its other series but processes and hidden bytes are left out, zeros would lie)",
    ),
    "volume_scan_failure": (
        "gauge",
        (*VOLUME, "reason"),
        ALWAYS,
        "1 for a tmpfs still mounted that the last scan could not list, with why (permission: this process may "
        "not list its dir; changed: another mount or none at its path since the look; stalled: a read did not "
        "answer in time; error: any other); no "
        "series for one scanned",
    ),
    "volumes": ("gauge", ("kind",), ALWAYS, "tmpfs followed on the node, by kind"),
    "view_unknown": (
        "gauge",
        ("reason",),
        ALWAYS,
        "1 when the node view cannot see the whole node for this reason (node_root: no kubelet or runtime dir "
        "under the node root, a mount missing; runtime_state_dir: a --runtime-state-dir not there; host_pid: "
        "not in the host's pid namespace, hostPID missing; layout_read: a dir under the node root not read in time, "
        "a stalled mount; unreadable: a node dir that may not be listed, CAP_DAC_READ_SEARCH missing; host_mnt: the "
        "host's mount namespace, /proc/1/ns/mnt, cannot be read and a tmpfs's judges depend on it), else 0",
    ),
    "unfollowed_volumes": ("gauge", (), ALWAYS, "tmpfs found beyond the limit of tmpfs followed (not in the series)"),
    "all_segments": ("gauge", ("state",), ALWAYS, "SMG segments of every tmpfs followed, by state"),
    "all_segment_bytes": ("gauge", ("state",), ALWAYS, "Allocated bytes of the SMG segments of every tmpfs followed"),
    "all_hidden_bytes": ("gauge", (), ALWAYS, "Hidden bytes of every tmpfs followed"),
    "all_used_bytes": ("gauge", (), ALWAYS, "Used bytes of every tmpfs followed"),
    "last_scan_timestamp_seconds": (
        "gauge",
        (),
        ALWAYS,
        "When the last full scan (pods, processes, every tmpfs judged) ended, Unix time",
    ),
    "last_scan_duration_seconds": ("gauge", (), ALWAYS, "How long the last full scan took"),
    "last_scan_errors": (
        "gauge",
        (),
        ALWAYS,
        "tmpfs the last full scan could not judge (gone or changed mid-scan), 1 when the node root could not be read",
    ),
    "scans_total": ("counter", (), EXPORTER, "Full scans: pods, processes and every tmpfs judged"),
    "scan_errors_total": ("counter", (), EXPORTER, "tmpfs (or the node root) a full scan or an update could not read"),
    "updates_total": ("counter", (), EXPORTER, "Updates of one tmpfs between full scans, after inotify activity in it"),
    "events_total": ("counter", (), EXPORTER, "inotify events read from the tmpfs followed"),
    "overflows_total": ("counter", (), EXPORTER, "inotify queue overflows (every tmpfs is updated after one)"),
}


def label(value: str | None) -> str:
    """A label value from the node's own strings: printable text as is; control characters, a
    backslash and undecodable bytes (surrogateescape) as ``\\xNN``; cut at MAX_LABEL_CHARS."""
    if value is None:
        return ""
    if not (value.isascii() and value.isprintable() and "\\" not in value):
        out = []
        for ch in value:
            code = ord(ch)
            if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, carried by surrogateescape
                out.append(f"\\x{code - 0xDC00:02x}")
            elif ch == "\\" or not ch.isprintable():
                out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
            else:
                out.append(ch)
        value = "".join(out)
    return value if len(value) <= MAX_LABEL_CHARS else value[: MAX_LABEL_CHARS - 3] + "..."


def volume_labels(t: Tmpfs) -> tuple[str, str, str, str, str]:
    pod = t.pod
    return (
        label(pod.namespace if pod else None),
        label(pod.name if pod else None),
        label(t.pod_uid),
        label(t.place.volume),
        t.place.kind.value,
    )


@dataclass(frozen=True)
class VolumeFigures:
    """One tmpfs's figures, as last judged (a full scan, or an update after activity in it)."""

    labels: tuple[str, str, str, str, str]
    size_bytes: int
    used_bytes: int
    free_bytes: int
    hidden_bytes: int
    hidden_files: int
    counts: dict[str, int]
    bytes_by_state: dict[str, int]
    reclaimable_bytes: int
    other_entries: int
    other_bytes: int
    processes: int
    trusted: bool
    failure: ScanFailure | None = None  # why it could not be scanned (its figures but the look's are zeros)


@dataclass(frozen=True)
class Health:
    """The scans' health. The counters are the exporter's (None in a textfile: one run, no history)."""

    last_scan_unix_s: float | None = None  # None: no full scan finished yet
    last_scan_duration_s: float = 0.0
    last_scan_errors: int = 0
    unfollowed: int = 0
    counters: dict[str, int] | None = field(default=None)  # scans, scan_errors, updates, events, overflows
    unseen: tuple[Blind, ...] = ()  # why the last full scan could not see the whole node (sight.py)


def volume_figures(t: Tmpfs, tally: Tally, others: Others, usage: tuple[int, int, int]) -> VolumeFigures:
    """A tmpfs's figures from its judgement (``tally``, ``others``) and its (size, used, free) bytes."""
    return VolumeFigures(
        volume_labels(t),
        usage[0],
        usage[1],
        usage[2],
        t.hidden.nbytes,
        t.hidden.files,
        dict(tally.counts),
        dict(tally.bytes_by_state),
        tally.reclaimable_bytes,
        sum(others.counts.values()),
        sum(others.nbytes.values()),
        len(t.users),
        t.trust.trusted,
    )


def unscanned_figures(t: Tmpfs, failure: ScanFailure) -> VolumeFigures:
    """A tmpfs that could not be scanned: what the look read of it (processes, hidden bytes), and why."""
    return VolumeFigures(
        volume_labels(t), 0, 0, 0, t.hidden.nbytes, t.hidden.files, {}, {}, 0, 0, 0, len(t.users), False, failure
    )


def write_textfile(path: str, volumes: Iterable[VolumeFigures], health: Health) -> None:
    """The exposition as node_exporter's textfile collector needs it: written beside, renamed over."""
    from smgshm.core.segments.textfile import write_exposition

    write_exposition(path, exposition(volumes, health))


FiguresSource = Callable[[], tuple[Iterable[VolumeFigures], Health]]  # () -> (volumes, health), at each scrape


class _Collector:
    def __init__(self, source: FiguresSource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        volumes, health = self.source()
        yield from families(volumes, health)


def families(volumes: Iterable[VolumeFigures], health: Health) -> Iterator[Metric]:
    """The exposition's families (prometheus_client's), from the figures of every tmpfs followed."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    def family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
        kind, labels, _, doc = METRICS[name]
        if kind == "counter":  # prometheus_client adds the _total back
            return CounterMetricFamily(PREFIX + name.removesuffix("_total"), doc, labels=labels)
        return GaugeMetricFamily(PREFIX + name, doc, labels=labels)

    by_labels: dict[tuple[str, ...], VolumeFigures] = {}
    for v in volumes:
        by_labels.setdefault(v.labels, v)  # a label set once, whatever (the first)
    vols = list(by_labels.values())
    states = [s.value for s in State]
    per_volume = {n: family(n) for n, (_, labels, _, _) in METRICS.items() if labels[: len(VOLUME)] == VOLUME}
    for v in vols:
        _add_volume(per_volume, v, states)
    yield from per_volume.values()
    kinds = family("volumes")
    for k in TmpfsKind:
        kinds.add_metric([k.value], sum(1 for v in vols if v.labels[4] == k))
    yield kinds
    blind = family("view_unknown")
    for reason in Blind:
        blind.add_metric([reason.value], 1 if reason in health.unseen else 0)
    yield blind
    yield _one(family("unfollowed_volumes"), health.unfollowed)
    for name, attr in (("all_segments", "counts"), ("all_segment_bytes", "bytes_by_state")):
        fam = family(name)
        for s in states:
            fam.add_metric([s], sum(getattr(v, attr).get(s, 0) for v in vols))
        yield fam
    yield _one(family("all_hidden_bytes"), sum(v.hidden_bytes for v in vols))
    yield _one(family("all_used_bytes"), sum(v.used_bytes for v in vols))
    if health.last_scan_unix_s is not None:
        yield _one(family("last_scan_timestamp_seconds"), health.last_scan_unix_s)
        yield _one(family("last_scan_duration_seconds"), health.last_scan_duration_s)
    yield _one(family("last_scan_errors"), health.last_scan_errors)
    if health.counters is not None:
        for name in ("scans_total", "scan_errors_total", "updates_total", "events_total", "overflows_total"):
            yield _one(family(name), health.counters.get(name.removesuffix("_total"), 0))


def _add_volume(
    per_volume: dict[str, CounterMetricFamily | GaugeMetricFamily], v: VolumeFigures, states: list[str]
) -> None:
    """One tmpfs's samples in each per-volume family."""
    labels = list(v.labels)
    per_volume["volume_scanned"].add_metric(labels, 0 if v.failure else 1)
    one: dict[str, float] = {"processes": v.processes, "hidden_bytes": v.hidden_bytes, "hidden_files": v.hidden_files}
    if v.failure is not None:  # only what the look read: the rest is not known (zeros would lie)
        per_volume["volume_scan_failure"].add_metric([*labels, v.failure.value], 1)
    else:
        one |= {
            "size_bytes": v.size_bytes,
            "used_bytes": v.used_bytes,
            "free_bytes": v.free_bytes,
            "reclaimable_bytes": v.reclaimable_bytes,
            "other_entries": v.other_entries,
            "other_bytes": v.other_bytes,
            "liveness_trusted": 1 if v.trusted else 0,
        }
        for s in states:
            per_volume["segments"].add_metric([*labels, s], v.counts.get(s, 0))
            per_volume["segment_bytes"].add_metric([*labels, s], v.bytes_by_state.get(s, 0))
    for name, value in one.items():
        per_volume[name].add_metric(labels, value)


def _one(fam: CounterMetricFamily | GaugeMetricFamily, value: float) -> Metric:
    fam.add_metric([], value)
    return fam


def exposition(volumes: Iterable[VolumeFigures], health: Health) -> bytes:
    """The text exposition (HELP and TYPE on every family): the textfile's content."""
    from prometheus_client import CollectorRegistry, generate_latest

    figures = list(volumes)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(lambda: (figures, health)))
    return generate_latest(reg)


def collector(source: FiguresSource) -> _Collector:
    """A prometheus_client collector that asks ``source()`` for (volumes, health) at each scrape."""
    return _Collector(source)


def statvfs_bytes(fd_or_path: int | str) -> tuple[int, int, int]:
    """(size, used, free) bytes of a filesystem; free as an unprivileged writer sees it (f_bavail)."""
    vfs = os.fstatvfs(fd_or_path) if isinstance(fd_or_path, int) else os.statvfs(fd_or_path)
    size, free = vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize
    return size, size - vfs.f_bfree * vfs.f_frsize, free


__all__ = [
    "ALWAYS",
    "EXPORTER",
    "METRICS",
    "PREFIX",
    "VOLUME",
    "Health",
    "VolumeFigures",
    "collector",
    "exposition",
    "families",
    "label",
    "statvfs_bytes",
    "unscanned_figures",
    "volume_figures",
    "volume_labels",
    "write_textfile",
]
