"""The node_exporter textfile of a job that reclaims segments: checked writable first, written atomically.

What a run reclaimed and kept, when it ran and whether it succeeded (``RunRecord``): gc writes
one (``gc --prometheus``); preflight is meant to write its own through the same functions, with
``job="preflight"`` (its metrics then start ``smgshm_preflight_``, so the two files never collide).
A cron line runs ``gc --delete --prometheus FILE``: a FILE that cannot be written must stop
the run (exit 5, the local environment) *before* anything is deleted, not fail after it. The
check is the real thing, not os.access (which passes for root, even in /proc): a file is
created O_CREAT|O_EXCL beside FILE and removed. The file is replaced by a rename, and a
rename replaces whatever entry has the name: an existing FILE that is not a regular file (a
device node, a FIFO, a symlink, a directory) is refused, both up front and just before it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from smgshm.core.errors import HostError
from smgshm.core.segments.judge import State
from smgshm.core.segments.reaping import KEPT_REASONS, SET_ASIDE_FAILED, ReapReport

_TYPES = {
    stat.S_IFLNK: "a symlink",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _check_target(path: str, option: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise HostError(f"cannot inspect the {option} path: {err.strerror}", path=path) from err
    if not stat.S_ISREG(st.st_mode):
        what = _TYPES.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise HostError(f"the {option} path is {what}, not a regular file: it would be replaced", path=path)


def _create_beside(path: str, option: str) -> tuple[int, str]:
    """A new private file in ``path``'s directory (O_EXCL, never through a symlink): (fd, its path)."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(6)}.tmp"  # not *.prom: node_exporter skips it
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise HostError(
            f"the {option} file's directory does not take a new file: {err.strerror}",
            path=os.path.dirname(tmp) or ".",
            uid=os.getuid(),
        ) from err
    return fd, tmp


def check_writable(path: str, option: str = "--prometheus") -> None:
    """Raise HostError unless ``path`` can be (re)written atomically: its directory takes a new file
    and ``path`` is absent or a regular file."""
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    if not os.path.isdir(parent):
        raise HostError(f"the {option} file's directory does not exist", path=parent)
    _check_target(path, option)
    fd, tmp = _create_beside(path, option)
    os.close(fd)
    os.unlink(tmp)


# When a family is in the file: every run, or a run that got as far as its figures.
ALWAYS, FINISHED = "always", "after a run that finished"

# name after smgshm_<job>_ -> (type, labels besides shm_dir, when it is there, help). Per run, so
# gauges: each run replaces the file. README's metrics table is checked against this.
METRICS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "last_run_timestamp_seconds": ("gauge", (), ALWAYS, "When the last run ended, in seconds since the Unix epoch"),
    "last_run_duration_seconds": ("gauge", (), ALWAYS, "How long the last run took"),
    "last_run_success": (
        "gauge",
        (),
        ALWAYS,
        "1 when the last run finished and no segment it chose failed to be set aside; 0 when it failed",
    ),
    "segments": ("gauge", ("state",), FINISHED, "Segments in the shm dir after the last run, by state"),
    "segment_bytes": ("gauge", ("state",), FINISHED, "Allocated bytes of the segments after the last run, by state"),
    "reclaimed_segments": (
        "gauge",
        ("state",),
        FINISHED,
        "Segments the last run unlinked, by the state they were judged in",
    ),
    "reclaimed_bytes": (
        "gauge",
        ("state",),
        FINISHED,
        "Allocated bytes of the segments the last run unlinked, by the state they were judged in",
    ),
    "freed_bytes": (
        "gauge",
        (),
        FINISHED,
        "Bytes the filesystem got back from the last run (less than reclaimed when another link keeps a file's data)",
    ),
    "kept_segments": (
        "gauge",
        ("reason",),
        FINISHED,
        "Segments the last run chose to unlink by their state but kept, by why",
    ),
    "kept_bytes": (
        "gauge",
        ("reason",),
        FINISHED,
        "Allocated bytes of the segments the last run chose but kept, by why",
    ),
    "shm_free_bytes": ("gauge", (), FINISHED, "Free bytes in the shm dir after the last run"),
}


# preflight's own families (smgshm_preflight_), beside METRICS: (type, labels besides shm_dir, when, help).
PREFLIGHT_METRICS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "shm_degraded": (
        "gauge",
        ("cause",),
        ALWAYS,
        "1 for each cause that turns the gateway's SHM off (it falls back to inline) found by the last run, "
        "0 for the others",
    ),
}


@dataclass(frozen=True)
class RunRecord:
    """One run of a job that reclaims segments (gc --delete; preflight), for the textfile collector.

    ``report`` None: the run failed before it had figures; only its time and its failure are
    written (zeros would say the dir was empty and nothing was kept)."""

    job: str  # the metrics' prefix is smgshm_<job>_
    shm_dir: str  # the shm_dir label, already escaped for display
    started_unix_s: float
    finished_unix_s: float
    report: ReapReport | None
    # preflight: every cause its checks can find -> whether the last run found it (smgshm_preflight_shm_degraded)
    degraded: Mapping[str, bool] | None = None

    @property
    def success(self) -> bool:
        return self.report is not None and not any(d.kept == SET_ASIDE_FAILED for d in self.report.deleted)


class _Collector:
    def __init__(self, record: RunRecord) -> None:
        self.record = record

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        rec, report = self.record, self.record.report

        def gauge(name: str, values: Mapping[str, float] | float) -> Any:
            _, labels, _, doc = METRICS[name] if name in METRICS else PREFLIGHT_METRICS[name]
            fam = GaugeMetricFamily(f"smgshm_{rec.job}_{name}", doc, labels=("shm_dir", *labels))
            if isinstance(values, Mapping):
                for label, v in values.items():
                    fam.add_metric([rec.shm_dir, label], v)
            else:
                fam.add_metric([rec.shm_dir], values)
            return fam

        yield gauge("last_run_timestamp_seconds", rec.finished_unix_s)
        yield gauge("last_run_duration_seconds", max(0.0, rec.finished_unix_s - rec.started_unix_s))
        yield gauge("last_run_success", 1.0 if rec.success else 0.0)
        if rec.degraded is not None:  # a timeout has no figures, and is a cause all the same
            yield gauge("shm_degraded", {c: float(on) for c, on in rec.degraded.items()})
        if report is None:
            return
        states = [s.value for s in State]
        before, after = report.before, report.after
        yield gauge("segments", {s: after.counts[s] for s in states})
        yield gauge("segment_bytes", {s: after.bytes_by_state[s] for s in states})
        yield gauge("reclaimed_segments", {s: before.counts[s] - after.counts[s] for s in states})
        yield gauge("reclaimed_bytes", {s: before.bytes_by_state[s] - after.bytes_by_state[s] for s in states})
        yield gauge("freed_bytes", sum(d.freed_bytes for d in report.deleted if d.deleted))
        kept = {r: 0 for r in KEPT_REASONS}
        kept_bytes = dict(kept)
        for d in report.deleted:
            if not d.deleted:
                kept[d.kept] = kept.get(d.kept, 0) + 1
                kept_bytes[d.kept] = kept_bytes.get(d.kept, 0) + d.nbytes
        yield gauge("kept_segments", kept)
        yield gauge("kept_bytes", kept_bytes)
        yield gauge("shm_free_bytes", report.free_bytes)


def textfile_text(record: RunRecord) -> bytes:
    """The exposition of ``record`` (HELP and TYPE on every family)."""
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(record))
    return generate_latest(reg)


def write_textfile(path: str, record: RunRecord, option: str = "--prometheus") -> None:
    """Write ``record`` to ``path`` as the textfile collector needs: beside it, then renamed over it."""
    write_exposition(path, textfile_text(record), option)


def write_exposition(path: str, text: bytes, option: str = "--prometheus") -> None:
    """Write an exposition to ``path`` as the textfile collector needs (the node view's too)."""
    fd, tmp = _create_beside(path, option)
    try:
        try:
            os.fchmod(fd, 0o644)  # node_exporter often runs as another user
            data = memoryview(text)
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        _check_target(path, option)  # again, just before the rename: it may have been replaced since the start
        os.rename(tmp, path)
    except OSError as err:
        raise HostError(f"cannot write the {option} file: {err.strerror}", path=path, uid=os.getuid()) from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # gone after a rename; left only by a failure


__all__ = [
    "ALWAYS",
    "FINISHED",
    "METRICS",
    "PREFLIGHT_METRICS",
    "RunRecord",
    "check_writable",
    "textfile_text",
    "write_exposition",
    "write_textfile",
]
