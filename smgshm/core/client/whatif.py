"""``bench --what-if huge-pages``: SMG's SHM path on a huge-page tmpfs beside the real shm dir.

The scratch tmpfs (``huge=within_size``) is mounted by a child running under
``unshare --mount --propagation private``: the mount exists only in the child's own
mount namespace, which the kernel tears down with the child's last process, so no
exit path (a crash, SIGKILL, a killed parent) can leave a mount behind on the host.
The child times, on the same payloads and alternating the two dirs on every iteration:
SMG's writer (fallocate + mmap), smgshm's (pwrite), SMG's reader (pread into a buffer),
the zero-copy reader (a private map, every page touched), the unlink, and SMG's whole
path (write, read, unlink). It writes one JSON document on stdout; the parent removes
any segment the child left in the real shm dir, whatever happened to it. A stopped run
(the caller's ``stop`` event: SIGTERM, SIGHUP, Ctrl-C) asks the child to end with SIGTERM,
and the child, which also gets SIGTERM when its parent dies (PR_SET_PDEATHSIG), removes
its own segments and the scratch dir itself before it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smgshm.core.errors import HostError, SmgshmError
from smgshm.core.host.mounts import mount_holding, read_mounts
from smgshm.core.host.pagesize import RECOMMENDED, SHMEM_ENABLED, PagePolicy, page_policy, save_last_what_if
from smgshm.core.names import payload_prefix
from smgshm.core.paths import BOOT_ID_PATH, DEFAULT_SHM_DIR
from smgshm.core.stats import median
from smgshm.core.units import gb_per_s

MIB = 1024 * 1024
DEFAULT_SIZES = (4_816_896, 16 * MIB, 64 * MIB)  # a 448x448 image's pixel_values, and two bench sizes
PAGE = 4096
# (key, label): the order of the table.
OPS = [
    ("write_mmap", "SMG write (fallocate+mmap)"),
    ("write_pwrite", "smgshm write (pwrite)"),
    ("read_pread", "SMG read (pread copy)"),
    ("read_view", "zero-copy read (map+touch)"),
    ("unlink", "unlink (frees pages)"),
    ("smg_path", "SMG path (write+read+unlink)"),
]


class WhatIfSkippedError(HostError):
    """The what-if cannot run here (not root, no unshare, no huge pages in this kernel)."""

    kind = "skipped"


@dataclass(frozen=True)
class OpPair:
    op: str
    label: str
    normal_ms: float  # medians, in the real shm dir
    huge_ms: float  # in the huge=within_size tmpfs
    normal_gb_per_s: float
    huge_gb_per_s: float
    speedup: float  # normal_ms / huge_ms: > 1 means huge pages are faster


@dataclass(frozen=True)
class WhatIfSize:
    nbytes: int
    pairs: list[OpPair]
    end_to_end_speedup: float  # SMG's whole path, normal / huge


@dataclass(frozen=True)
class WhatIfReport:
    what_if: str
    shm_dir: str
    policy: PagePolicy  # the real shm dir's
    scratch_mount_options: str  # as the child's mountinfo showed the scratch tmpfs
    huge_pages_used: bool  # the kernel did give the scratch files huge pages (ShmemHugePages grew)
    huge_bytes_seen: int
    iterations: int
    sizes: list[WhatIfSize] = field(default_factory=list)
    measured_unix_s: float = 0.0


def _skip_reason(shm_dir: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root: it mounts a private tmpfs (in a private mount namespace)"
    if shutil.which("unshare") is None:
        return "needs unshare(1) (util-linux) to mount in a private mount namespace"
    try:
        with open(SHMEM_ENABLED, encoding="ascii") as f:
            knob = f.read()
    except OSError:
        return f"this kernel has no transparent huge pages for tmpfs ({SHMEM_ENABLED} is missing)"
    if "[deny]" in knob:
        return "shmem_enabled=deny forbids huge pages on every tmpfs"
    if not os.path.isdir(shm_dir):
        return f"{shm_dir} does not exist"
    return None


def run_what_if(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    iterations: int = 5,
    shm_dir: str = DEFAULT_SHM_DIR,
    timeout_s: float = 600.0,
    on_child: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> WhatIfReport | None:
    """Measure the SHM path here and on a private huge-page tmpfs; WhatIfSkippedError when it cannot run.

    None when ``stop`` was set first: the child is ended and its segments and scratch dir removed.
    """
    why = _skip_reason(shm_dir)
    if why:
        raise WhatIfSkippedError(
            f"huge-page what-if skipped: {why}",
            hint="sudo smgshm bench --what-if huge-pages" if "root" in why else None,
        )
    policy = page_policy(shm_dir)
    biggest = max(sizes)
    free = os.statvfs(shm_dir)
    if free.f_bavail * free.f_frsize < 2 * biggest:
        raise HostError(
            "the shm dir cannot hold two segments of the largest size", path=shm_dir, needed_bytes=2 * biggest
        )
    mountpoint = tempfile.mkdtemp(prefix="smgshm-whatif-")
    spec = {
        "parent": os.getpid(),
        "sizes": list(sizes),
        "iterations": iterations,
        "shm_dir": shm_dir,
        "mountpoint": mountpoint,
        "mount_bytes": 3 * biggest + 16 * MIB,
    }
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", __name__, json.dumps(spec)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if on_child:
            on_child(proc.pid)
        out, err = _communicate(proc, timeout_s, stop)
    finally:
        _end_child(proc)
        _remove_own_segments(shm_dir, proc.pid)
        with contextlib.suppress(OSError):
            os.rmdir(mountpoint)  # never a mount here: it was mounted only in the child's namespace
    if stop is not None and stop.is_set():
        return None
    if proc.returncode != 0 and not out.strip():
        raise SmgshmError("the what-if child failed", code=proc.returncode, detail=err.strip()[-300:])
    try:
        doc = json.loads(out)
    except ValueError as exc:
        raise SmgshmError("the what-if child wrote no report", detail=(err or out).strip()[-300:]) from exc
    if "error" in doc:
        raise WhatIfSkippedError(f"huge-page what-if skipped: {doc['error']}")
    report = _report(doc, policy, shm_dir, iterations)
    save_last_what_if(_cache_doc(report))
    return report


def _communicate(proc: subprocess.Popen[str], timeout_s: float, stop: threading.Event | None) -> tuple[str, str]:
    """The child's output; ("", "") once ``stop`` is set. Polled, so a signal is seen within 0.2 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.communicate(timeout=0.2)  # safe to retry after TimeoutExpired: nothing is lost
        except subprocess.TimeoutExpired:
            if stop is not None and stop.is_set():
                return "", ""
            if time.monotonic() > deadline:
                raise SmgshmError("the what-if did not finish in time", timeout_s=timeout_s) from None


def _end_child(proc: subprocess.Popen[str]) -> None:
    """SIGTERM first (the child cleans up after itself), SIGKILL after 5 s; always reaped."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 30.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
            proc.communicate(timeout=grace)  # drains the pipes, so a child mid-write cannot block on them
    proc.wait()


def _remove_own_segments(shm_dir: str, pid: int) -> None:
    prefix = payload_prefix(pid)
    with contextlib.suppress(OSError), os.scandir(shm_dir) as it:
        for e in it:
            if e.name.startswith(prefix) and e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(e.path)


def _report(doc: dict[str, Any], policy: PagePolicy, shm_dir: str, iterations: int) -> WhatIfReport:
    labels = dict(OPS)
    sizes = []
    for s in doc["sizes"]:
        n = int(s["nbytes"])
        pairs = []
        for op, _ in OPS:
            a, b = median(s["ops"][op]["normal"]), median(s["ops"][op]["huge"])
            pairs.append(OpPair(op, labels[op], a / 1e6, b / 1e6, gb_per_s(n, a), gb_per_s(n, b), a / b if b else 0.0))
        e2e = next(p for p in pairs if p.op == "smg_path")
        sizes.append(WhatIfSize(n, pairs, e2e.speedup))
    seen = int(doc.get("huge_bytes_seen", 0))
    return WhatIfReport(
        "huge-pages", shm_dir, policy, str(doc.get("mount_options", "")), seen > 0, seen, iterations, sizes, time.time()
    )


def _cache_doc(r: WhatIfReport) -> dict[str, Any]:
    big = max(r.sizes, key=lambda s: s.nbytes)
    by = {p.op: p for p in big.pairs}
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return {
        "boot_id": boot,
        "hostname": socket.gethostname(),
        "measured_unix_s": r.measured_unix_s,
        "nbytes": big.nbytes,
        "huge_pages_used": r.huge_pages_used,
        "smg_writer_gb_per_s": [by["write_mmap"].normal_gb_per_s, by["write_mmap"].huge_gb_per_s],
        "pwrite_writer_gb_per_s": [by["write_pwrite"].normal_gb_per_s, by["write_pwrite"].huge_gb_per_s],
        "end_to_end_speedup": big.end_to_end_speedup,
    }


# ---------------------------------------------------------------------------------------------
# the child, in its private mount namespace


def _shmem_huge_bytes() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("ShmemHugePages:"):
                return int(line.split()[1]) * 1024
    return 0


def _mount_options(mountpoint: str) -> str:
    """The super options of the mount at ``mountpoint`` (as the kernel names it: a symlinked TMPDIR resolved)."""
    at = os.path.realpath(mountpoint)
    m = mount_holding(read_mounts(), at)
    return m.super_options if m is not None and m.point == at else ""


def _timed(fn: Callable[[], Any]) -> tuple[int, Any]:
    t0 = time.perf_counter_ns()
    v = fn()
    return time.perf_counter_ns() - t0, v


def _one_round(payload: memoryview, d: str, samples: dict[str, list[int]]) -> None:
    from smgshm.core.segments.io import read_segment, unlink_segment, write_segment

    n = payload.nbytes
    t, ref = _timed(lambda: write_segment(payload, shm_dir=d, strategy="mmap"))
    samples["write_mmap"].append(t)
    unlink_segment(ref.name, d)
    t, ref = _timed(lambda: write_segment(payload, shm_dir=d, strategy="pwrite"))
    samples["write_pwrite"].append(t)
    try:
        t, r = _timed(lambda: read_segment(ref.name, 0, n, shm_dir=d, mode="copy", unlink=False))
        r.release()
        samples["read_pread"].append(t)

        def view() -> None:
            v = read_segment(ref.name, 0, n, shm_dir=d, mode="view", unlink=False)
            bytes(v.data[::PAGE])  # one byte of every page: what a consumer's first pass pays
            v.release()

        samples["read_view"].append(_timed(view)[0])
    finally:
        samples["unlink"].append(_timed(lambda: unlink_segment(ref.name, d))[0])

    def smg_path() -> None:
        w = write_segment(payload, shm_dir=d, strategy="mmap")
        read_segment(w.name, 0, n, shm_dir=d, mode="copy", unlink=True).release()

    samples["smg_path"].append(_timed(smg_path)[0])


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    mnt = spec["mountpoint"]
    mount_bytes = -(-int(spec["mount_bytes"]) // (2 * MIB)) * 2 * MIB
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mount_bytes},huge={RECOMMENDED},mode=0700", "smgshm-whatif", mnt],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if res.returncode != 0:
        return {"error": f"cannot mount a huge={RECOMMENDED} tmpfs: {res.stderr.strip()[:200]}"}
    dirs = {"normal": spec["shm_dir"], "huge": mnt}
    # Did the kernel really give huge pages? ShmemHugePages grows while a scratch file lives.
    from smgshm.core.segments.io import unlink_segment, write_segment

    probe = memoryview(bytes(8 * MIB))
    before = _shmem_huge_bytes()
    ref = write_segment(probe, shm_dir=mnt)
    seen = max(0, _shmem_huge_bytes() - before)
    unlink_segment(ref.name, mnt)
    out: dict[str, Any] = {"mount_options": _mount_options(mnt), "huge_bytes_seen": seen, "sizes": []}
    for n in spec["sizes"]:
        payload = memoryview(os.urandom(1024) * (n // 1024) + os.urandom(n % 1024))
        samples: dict[str, dict[str, list[int]]] = {k: {op: [] for op, _ in OPS} for k in dirs}
        for i in range(1 + int(spec["iterations"])):  # one warm-up round
            order = ("normal", "huge") if i % 2 else ("huge", "normal")
            for which in order:
                got: dict[str, list[int]] = {op: [] for op, _ in OPS}
                _one_round(payload, dirs[which], got)
                if i:
                    for op in got:
                        samples[which][op] += got[op]
        out["sizes"].append({"nbytes": n, "ops": {op: {k: samples[k][op] for k in dirs} for op, _ in OPS}})
    return out


def _die_with_parent(parent: int) -> bool:
    """SIGTERM this child when the measuring parent dies (a killed smgshm leaves no child running):
    the child then cleans up what the parent would have (see main)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    return os.getppid() == parent  # else the parent died before prctl took effect


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _cleanup(spec: dict[str, Any]) -> None:
    """What a dead parent cannot do: the scratch mount (gone with this namespace anyway, but the
    mount point on the host is only removable once unmounted here) and this child's segments."""
    mnt = str(spec.get("mountpoint", ""))
    if mnt:
        subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=30, check=False)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)
    _remove_own_segments(str(spec.get("shm_dir", DEFAULT_SHM_DIR)), os.getpid())


def main() -> None:
    """The child's entry point: one JSON document on stdout, whatever happens."""
    spec: dict[str, Any] = {}
    signal.signal(signal.SIGTERM, _terminated)
    try:
        spec = json.loads(sys.argv[1])
        if not _die_with_parent(int(spec["parent"])):
            _cleanup(spec)
            return
        doc = _child(spec)
    except (OSError, SmgshmError, ValueError, KeyError) as err:
        doc = {"error": f"{type(err).__name__}: {err}"}
    except SystemExit:
        _cleanup(spec)  # the parent died (or we were told to stop): leave nothing behind
        raise
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
