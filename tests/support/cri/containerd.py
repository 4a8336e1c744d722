"""A private containerd for the tests: Debian's containerd with its CRI plugin and runc, on a socket,
config, root and state dir of its own, torn down with everything it started.

Its state dir is ``<node root>/run/containerd``, where containerd keeps each sandbox's /dev/shm
(``io.containerd.grpc.v1.cri/sandboxes/<id>/shm``), so the node view given ``--node-root`` finds the
pods' tmpfs as it finds a real node's. What this machine wanted (docs/fleet notes, measured here):
snapshotter ``native`` (no overlay inside this VM's filesystem), cgroupfs (``SystemdCgroup = false``:
no systemd), ``disable_apparmor`` and ``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE),
no CNI at all (every sandbox uses the node's network namespace), and a ``sandbox_image`` that is
local: the busybox image of image.py, imported with ``ctr -n k8s.io images import``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import _unmount_under
from tests.support.cri.image import BUSYBOX, IMAGE, write_layout_tar

BINARIES = ("containerd", "ctr", "runc", "containerd-shim-runc-v2")
CRI_NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps its images and containers in

_CONFIG = """\
version = 2
root = "{root}"
state = "{state}"
# What this machine lacks or does not need: left out, so their start-up errors do not fill the log.
disabled_plugins = [
  "io.containerd.internal.v1.tracing",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{image}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{base}/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{base}/cni/bin"
    conf_dir = "{base}/cni/conf"
"""


def _static_elf(path: str) -> bool:
    """Whether ``path`` is a 64-bit little-endian ELF with no program interpreter (PT_INTERP): a static
    binary, which runs alone in an image of one file. Debian's plain ``busybox`` is dynamic."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:6] != b"\x7fELF\x02\x01":
                return False
            phoff = int.from_bytes(head[32:40], "little")
            phentsize, phnum = int.from_bytes(head[54:56], "little"), int.from_bytes(head[56:58], "little")
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return all(int.from_bytes(table[i : i + 4], "little") != 3 for i in range(0, len(table), phentsize))


def missing_binaries() -> list[str]:
    """What a private containerd and its image need that is not here (Debian: containerd, runc,
    busybox-static)."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    return missing + ([] if _static_elf(BUSYBOX) else ["a static /bin/busybox (busybox-static)"])


def containerd_marks(needs_root_for: str) -> list[pytest.MarkDecorator]:
    """A containerd test module's marks: containers, slow, trust (its verdicts need liveness trusted: never
    beside a test that makes pid namespaces), and skipped, saying why, without root (``needs_root_for``)
    or Debian's packages."""
    missing = missing_binaries()
    return [
        pytest.mark.containers,
        pytest.mark.slow,
        pytest.mark.trust,
        pytest.mark.skipif(os.geteuid() != 0, reason=f"needs root: {needs_root_for}"),
        pytest.mark.skipif(
            bool(missing),
            reason=f"no {', '.join(missing)} here: ./scripts/containers installs Debian's containerd, runc "
            "and busybox-static and runs these tests",
        ),
    ]


@dataclass
class Containerd:
    """A running private containerd: its socket, the node root its state dir lies under, its log."""

    base: Path
    node_root: Path
    sock: str
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def state(self) -> Path:
        return self.node_root / "run" / "containerd"

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", self.sock, "--namespace", CRI_NAMESPACE, *args]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120)

    def why(self) -> str:
        """The end of containerd's log, for a failure message."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        return ""


def _wait_ready(c: Containerd, timeout: float = 60.0) -> None:
    """Poll containerd's own client until it answers; fail with its log if it dies or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if c.proc.poll() is not None:
            raise RuntimeError(f"containerd exited with {c.proc.returncode}; log {c.log}:\n{c.why()}")
        probe = subprocess.run(
            ["ctr", "--address", c.sock, "--timeout", "2s", "version"], capture_output=True, timeout=30
        )
        if probe.returncode == 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"containerd did not answer on {c.sock} within {timeout:.0f} s; log {c.log}:\n{c.why()}")


def _descendants_by_address(sock: str) -> list[int]:
    """Shims started for this containerd (``containerd-shim-runc-v2 ... -address SOCK``): they are
    re-parented away from containerd, so they are found by the address in their argv."""
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if argv and os.path.basename(argv[0]).startswith(b"containerd-shim") and sock.encode() in argv:
                out.append(int(entry))
    return out


def _made_by_us(before: set[Path]) -> list[Path]:
    """Dirs outside ``base`` that a containerd run leaves behind (the shims' socket dir, which containerd
    1.6 keeps under /run/containerd/s whatever its state dir; the kubelet's cgroup parents), the ones
    absent before it started, deepest first: removed only when empty (another run may be using them)."""
    return sorted((p for p in _outside_dirs() if p not in before), key=lambda p: len(p.parts), reverse=True)


def _outside_dirs() -> set[Path]:
    found = {p for p in (Path("/run/containerd/s"), Path("/run/containerd")) if p.is_dir()}
    with contextlib.suppress(OSError):
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            found |= {p for p in (hierarchy / "kubepods", hierarchy / "kubepods/besteffort") if p.is_dir()}
    return found


@contextlib.contextmanager
def running_containerd(base: Path) -> Iterator[Containerd]:
    """containerd under ``base`` (config, socket, root, log; the node root at ``base/node``) with the
    busybox image imported; on exit every shim it started is gone, every mount below ``base`` is
    unmounted, and ``base`` is removed. Pods are the caller's to remove first (kubelet.py)."""
    before = _outside_dirs()
    base.mkdir(parents=True, exist_ok=True)
    node_root = base / "node"
    (node_root / "run" / "containerd").mkdir(parents=True, exist_ok=True)
    sock = str(base / "containerd.sock")
    config = base / "config.toml"
    config.write_text(
        _CONFIG.format(base=base, root=base / "root", state=node_root / "run" / "containerd", sock=sock, image=IMAGE)
    )
    log = base / "containerd.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            ["containerd", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=base,
        )
    c = Containerd(base, node_root, sock, log, proc)
    try:
        _wait_ready(c)
        image_tar = write_layout_tar(base / "busybox-oci.tar")
        c.ctr("images", "import", "--snapshotter", "native", str(image_tar))
        yield c
    finally:
        _stop(c, before)


def _stop(c: Containerd, before: set[Path]) -> None:
    if c.proc.poll() is None:
        c.proc.send_signal(signal.SIGTERM)
        try:
            c.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait(timeout=30)
    for pid in _descendants_by_address(c.sock):  # a shim whose sandbox was not removed: ours to end
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _unmount_under(str(c.base))
    shutil.rmtree(c.base, ignore_errors=True)
    for d in _made_by_us(before):
        with contextlib.suppress(OSError):
            d.rmdir()


__all__ = ["BINARIES", "CRI_NAMESPACE", "Containerd", "missing_binaries", "running_containerd"]
