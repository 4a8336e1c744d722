"""Running SMG's real gateway (``smg launch``) as a child: started, watched, always stopped.

The gateway is a separate process smgshm does not control, so everything about it is
bounded: it gets its own process group (a Ctrl-C at the terminal reaches smgshm, which
then stops it, never half of it), free loopback ports, readiness judged by its real
admin API (``GET /workers`` shows every worker healthy), a log file the caller can
name in a report, and a stop that escalates SIGTERM -> SIGKILL, reaps it, and removes
the segments it produced (its pid is in their names), since a dead gateway never will.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from smgshm.core.errors import HostError, ServerError, SmgshmError, TransportError
from smgshm.core.gateway.http import PeerJsonError, loads_json, request
from smgshm.core.gateway.setting import Mode
from smgshm.core.names import parse_name
from smgshm.core.paths import DEFAULT_SHM_DIR

PIP_HINT = "pip install 'smgshm[gateway]'"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BIND_FAILED = re.compile(r"address already in use|addrinuse|os error 98", re.I)
_MAX_LOG_TAIL = 64 * 1024

# Run between fork and exec of the gateway (through a fresh interpreter, since
# preexec_fn is unsafe once gRPC threads exist): ask the kernel to SIGTERM the gateway
# when smgshm dies, so even a SIGKILLed smgshm leaves no gateway behind.
_DEATH_SHIM = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG
    "os.getppid() == int(sys.argv[1]) or sys.exit(75)\n"  # the parent died before prctl
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def find_smg() -> str:
    """The ``smg`` executable beside this interpreter, else on PATH; HostError naming the pip command."""
    beside = os.path.join(os.path.dirname(sys.executable), "smg")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("smg")
    if found:
        return found
    raise HostError("SMG's gateway (the smg package) is not installed", hint=PIP_HINT)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (a race the caller retries on)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
    return port


@dataclass(frozen=True)
class GatewayConfig:
    """How to launch the gateway; ``None`` means the flag is not passed (the gateway's default)."""

    worker_urls: tuple[str, ...] = ()
    model_path: str | None = None
    transport: str | None = None  # inline | shm | auto | rdma
    shm_min_bytes: int | None = None
    disable_retries: bool = False
    log_mm_timing: bool = False
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: str | None = None  # None: a new file under the temp dir
    # Its --shutdown-grace-period-secs (SIGTERM waits this for requests in flight; None: SMG's 180 s, cut
    # to ``stop``'s grace). A gateway smgshm starts has none in flight when stopped: 1 s, not 5 s a stop.
    shutdown_grace_s: int | None = 1
    host: str = "127.0.0.1"
    shm_dir: str = DEFAULT_SHM_DIR  # where its segments appear (the gateway itself always uses /dev/shm)
    # Run it under this command, e.g. ``nsenter``/``unshare``/``setpriv`` for a private mount or pid
    # namespace or another uid (the command must exec it, or fork it and die with it). ``pid`` is then
    # the command's, and the gateway's own pid (the one in its names) may differ.
    argv_prefix: tuple[str, ...] = ()


@dataclass(frozen=True)
class TransportSetting:
    """The gateway's own start-up line: the one authoritative account of its setting (smg-facts §5.5)."""

    mode: Mode
    shm_min_bytes: int
    dev_writable: bool


def _grpc_url(url: str) -> str:
    return url if "://" in url else f"grpc://{url}"


def _argv(smg: str, cfg: GatewayConfig, port: int, prom: int) -> list[str]:
    argv = [smg, "launch", "--host", cfg.host, "--port", str(port)]
    argv += ["--prometheus-host", cfg.host, "--prometheus-port", str(prom)]
    if cfg.worker_urls:
        argv += ["--worker-urls", *(_grpc_url(u) for u in cfg.worker_urls)]
    if cfg.model_path is not None:
        argv += ["--model-path", cfg.model_path]
    else:
        # No model directory: never let it fetch a tokenizer for the worker's model name.
        argv.append("--disable-tokenizer-autoload")
    if cfg.transport is not None:
        argv += ["--multimodal-tensor-transport", cfg.transport]
    if cfg.shm_min_bytes is not None:
        argv += ["--multimodal-shm-min-bytes", str(cfg.shm_min_bytes)]
    if cfg.disable_retries:
        argv.append("--disable-retries")
    if cfg.log_mm_timing:
        argv.append("--log-mm-timing")
    if cfg.shutdown_grace_s is not None:
        argv += ["--shutdown-grace-period-secs", str(cfg.shutdown_grace_s)]
    return argv + list(cfg.extra_args)


class RunningGateway:
    """A started ``smg launch``; ``stop()`` (or leaving the ``with``) always ends it."""

    def __init__(self, proc: subprocess.Popen[bytes], cfg: GatewayConfig, port: int, prom: int, log_path: str) -> None:
        self.proc = proc
        self.cfg = cfg
        self.pid = proc.pid  # the producer pid in its segments' names (process title smg::router); with
        # cfg.argv_prefix, the prefix's process instead
        self.port = port
        self.http_url = f"http://{cfg.host}:{port}"
        self.metrics_url = f"http://{cfg.host}:{prom}/metrics"
        self.log_path = log_path
        self.removed_segments: list[str] = []
        self._stopped = False
        self._lock = threading.Lock()

    # -- what can be read about it -------------------------------------------------------

    def alive(self) -> bool:
        return self.proc.poll() is None

    def logs(self) -> str:
        """Its log so far (the last 64 KiB), ANSI colour codes stripped."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _MAX_LOG_TAIL))
                raw = f.read()
        except OSError:
            return ""
        return _ANSI.sub("", raw.decode("utf-8", errors="replace"))

    def log_lines(self, pattern: str) -> list[str]:
        """Log lines that contain ``pattern``, read from the whole file (bounded per line)."""
        out: list[str] = []
        try:
            with open(self.log_path, "rb") as f:
                for raw in f:
                    line = _ANSI.sub("", raw[:4096].decode("utf-8", errors="replace"))
                    if pattern in line:
                        out.append(line.rstrip("\n"))
        except OSError:
            pass
        return out

    def transport_setting(self) -> TransportSetting | None:
        """The mode the gateway says it runs with, from its start-up line; None before it logged it."""
        from smgshm.core.gateway.log import read_transport_config

        try:
            c = read_transport_config(self.log_path)  # the last start in the log: it is appended to
        except SmgshmError:
            return None
        if c is None or c.shm_min_bytes is None or c.dev_writable is None:
            return None
        return TransportSetting(c.mode, c.shm_min_bytes, c.dev_writable)

    def workers(self, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        """``GET /workers``'s entries; TransportError while it does not answer."""
        resp = request(
            "GET",
            f"{self.http_url}/workers",
            headers={"Accept": "application/json"},
            deadline_s=timeout_s,
            max_bytes=4 * 1024 * 1024,
        )
        if resp.status != 200:
            raise ServerError(f"gateway answered GET /workers with HTTP {resp.status}", endpoint=resp.url)
        try:
            doc = loads_json(resp.body)
        except PeerJsonError as err:
            raise ServerError("GET /workers is not JSON", endpoint=resp.url, reason=err.what) from None
        entries = doc.get("workers", []) if isinstance(doc, dict) else []
        return [w for w in entries if isinstance(w, dict)]

    def ready(self) -> bool:
        """Every configured worker is registered and healthy (and the admin API answers)."""
        try:
            entries = self.workers()
        except SmgshmError:
            return False
        healthy = {str(w.get("url", "")) for w in entries if w.get("is_healthy") is True}
        return all(_grpc_url(u) in healthy for u in self.cfg.worker_urls)

    # -- stopping --------------------------------------------------------------------------

    def terminate(self) -> None:
        """SIGTERM its group without waiting (``stop`` then waits): several stop in parallel."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the group and reap it, leaving its segments in place (fault tests: a crashed gateway)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def stop(self, grace_s: float = 5.0) -> list[str]:
        """SIGTERM to its group, wait ``grace_s``, SIGKILL, reap; then remove its segments.

        Runs to the end even if Ctrl-C comes meanwhile (the interrupt is raised after).
        Returns the names it removed. Idempotent.
        """
        with self._lock, _deferred_sigint() as interrupted:
            if not self._stopped:
                self._terminate(grace_s)
                self.removed_segments = remove_gateway_segments(self.pid, self.cfg.shm_dir)
                self._stopped = True
        if interrupted:
            raise KeyboardInterrupt
        return list(self.removed_segments)

    def _terminate(self, grace_s: float) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        # The group, not only the leader: anything it spawned goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def __enter__(self) -> RunningGateway:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def stop_gateways(gateways: list[RunningGateway], grace_s: float = 5.0) -> None:
    """Stop several at once: SIGTERM to all first, so their graceful shutdowns overlap."""
    with _deferred_sigint() as interrupted:
        for gw in gateways:
            gw.terminate()
        for gw in gateways:
            gw.stop(grace_s)
    if interrupted:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _deferred_sigint() -> Iterator[list[bool]]:
    """Hold a Ctrl-C until the block ends (main thread only; elsewhere signals never arrive)."""
    seen: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    old = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: seen.append(True))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, old)


def remove_gateway_segments(pid: int, shm_dir: str = DEFAULT_SHM_DIR) -> list[str]:
    """Unlink the regular files a (now dead) gateway ``pid`` produced: payloads and its probe file.

    Only names of SMG's gateway family whose producer field is ``pid``; never a symlink,
    FIFO or directory. Call it only once that gateway is reaped.
    """
    removed: list[str] = []
    try:
        dfd = os.open(shm_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        for name in os.listdir(dfd):
            kind, producer, _ = parse_name(name)
            if kind not in ("gateway", "gateway_probe") or producer != pid:
                continue
            try:
                if not stat.S_ISREG(os.lstat(name, dir_fd=dfd).st_mode):
                    continue
                os.unlink(name, dir_fd=dfd)
            except OSError:
                continue
            removed.append(name)
    finally:
        os.close(dfd)
    return removed


def launch_gateway(cfg: GatewayConfig) -> RunningGateway:
    """Spawn the gateway on free loopback ports and return at once (not yet ready).

    Call it from a thread that outlives the gateway (the main thread): the kernel's
    parent-death signal follows the thread that spawned it.
    """
    smg = find_smg()
    if cfg.log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="smgshm-gateway-", suffix=".log")
        os.close(fd)
    else:
        log_path = cfg.log_path
    env = {**os.environ, **cfg.env, "NO_COLOR": "1"}
    port, prom = free_port(cfg.host), free_port(cfg.host)
    while prom == port:
        prom = free_port(cfg.host)
    argv = _argv(smg, cfg, port, prom)
    if cfg.argv_prefix:  # execv does not search PATH
        argv = [shutil.which(cfg.argv_prefix[0]) or cfg.argv_prefix[0], *cfg.argv_prefix[1:], *argv]
    with open(log_path, "ab") as log:
        log.write(f"# smgshm: {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, "-c", _DEATH_SHIM, str(os.getpid()), *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return RunningGateway(proc, cfg, port, prom, log_path)


def start_gateway(cfg: GatewayConfig, ready_timeout_s: float = 60.0) -> RunningGateway:
    """Launch the gateway and return once every worker is healthy.

    HostError when smg is missing or the gateway exits at start; TransportError when it
    is not ready within ``ready_timeout_s``. Either way the process is gone by then.
    """
    for _attempt in range(3):  # a port taken between our probe and its bind: try new ones
        gw = launch_gateway(cfg)
        if wait_ready(gw, ready_timeout_s, retry_bind=True):
            return gw
    return gw  # not reached: the last attempt raises


def wait_ready(gw: RunningGateway, timeout_s: float = 60.0, retry_bind: bool = False) -> bool:
    """Return True once every worker is healthy; on any failure the gateway is stopped first.

    Raises HostError when it exited (unless ``retry_bind`` and it lost a port race, then
    False), TransportError when it is not ready within ``timeout_s``; Ctrl-C stops it too.
    """
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not gw.alive():
                gw.stop()
                if retry_bind and _BIND_FAILED.search(gw.logs()):
                    return False
                raise HostError(
                    "the gateway exited at start",
                    exit_code=gw.proc.returncode,
                    log=gw.log_path,
                    hint=f"see {gw.log_path}",
                )
            if gw.ready():
                return True
            time.sleep(0.1)
    except BaseException:
        gw.stop()
        raise
    gw.stop()
    raise TransportError(
        "the gateway did not report its workers healthy in time",
        endpoint=gw.http_url,
        timeout_s=timeout_s,
        log=gw.log_path,
        hint=f"see {gw.log_path}",
    )
