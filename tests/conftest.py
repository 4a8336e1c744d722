"""Shared fixtures: a leak guard on the real /dev/shm, real receivers, real children."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

SHM = "/dev/shm"
IS_ROOT = os.geteuid() == 0
HAVE_SMG = (Path(sys.executable).parent / "smg").exists() or shutil.which("smg") is not None

# Everything the suite's processes put in the temp dir (the logs of the gateways they start,
# pytest's own tmp_path trees) goes under one private dir, removed when the session ends, so
# a run leaves nothing in /tmp and never touches another run's files.
# The machine's own temp dir, as the first process of a run found it (pytest-xdist's workers inherit
# the TMPDIR set below, so they read it from the environment): where other users may reach a dir,
# and where concurrent runs meet (the pid namespace lock below).
SYSTEM_TMP = os.environ.setdefault("SMGSHM_TESTS_SYSTEM_TMP", tempfile.gettempdir())
SESSION_TMP = tempfile.mkdtemp(prefix="smgshm-tests-")
os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = SESSION_TMP
# and what smgshm carries between runs (gc's sightings, /run/smgshm for root) goes there too: the
# suite's many throwaway shm dirs would leave a store each behind in the real one.
os.environ["SMGSHM_STATE_DIR"] = os.path.join(SESSION_TMP, "state")


# Tests stop children with SIGINT (Ctrl-C's signal). A run started as a background job of a
# script (`pytest ... &`, nohup, some CI launchers) inherits SIGINT ignored, and ignored it
# stays across exec: every child would then ignore the test's SIGINT and the test hang to its
# timeout. Handled here, it is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _stopped(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


# A run ended by SIGTERM or SIGHUP (a CI timeout, `kill`, a closed terminal) unwinds as Ctrl-C does:
# every fixture's teardown runs (its mounts unmounted, its children reaped) before the process ends.
for _sig in (signal.SIGTERM, signal.SIGHUP):
    with contextlib.suppress(ValueError):  # only the main thread may set a handler
        signal.signal(_sig, _stopped)


def _unmount_under(top: str) -> None:
    """Unmount whatever is still mounted at or below ``top`` (deepest and topmost first), lazily where
    busy: the net under every test's own cleanup, for a test whose teardown never ran (a worker
    killed outright) or failed. Only this session's dir is looked at."""
    from smgshm.core.host.mounts import read_mounts

    for _ in range(64):  # bounded: a mount that will not go is left to the lazy unmount
        try:
            points = [m.point for m in read_mounts() if m.point == top or m.point.startswith(top + "/")]
        except OSError:
            return
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):  # a point twice: stacked, the top goes first
            if subprocess.run(["umount", point], capture_output=True, timeout=30).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


def pytest_unconfigure(config: pytest.Config) -> None:
    if IS_ROOT:
        _unmount_under(SESSION_TMP)
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


# What a test needs, said by its markers (registered in pyproject.toml): a `gateway` test is skipped
# where smg is not installed, a `root` test where this is not root (a skipif whose reason names root
# counts as the marker); `gateway` and `containers` tests are `slow` too, out of the fast lane.
_NEEDS_ROOT = re.compile(r"\broot\b")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reasons = [str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")]
        if item.get_closest_marker("root") is None and any(_NEEDS_ROOT.search(r) for r in reasons):
            item.add_marker(pytest.mark.root)
        if item.get_closest_marker("gateway") or item.get_closest_marker("containers"):
            item.add_marker(pytest.mark.slow)
        # A test that narrows gc's pid-namespace look to itself (the `trusting` fixture) still has gc's
        # holder walk read every process: a `pidns` test's process stalled on a dead FUSE mount
        # (test_stuck_reads.py) rightly makes that walk, so its verdicts, untrusted. It is a `trust` test.
        if "trusting" in getattr(item, "fixturenames", ()) and item.get_closest_marker("trust") is None:
            item.add_marker(pytest.mark.trust)
        if item.get_closest_marker("gateway") and not HAVE_SMG:
            item.add_marker(pytest.mark.skip(reason="SMG's gateway (smg) is not installed: pip install -e '.[test]'"))
        if item.get_closest_marker("root") and not IS_ROOT:
            item.add_marker(pytest.mark.skip(reason="needs root"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=40.0,
        help="how long tests/test_soak.py keeps its senders going (CI: the default; longer by hand)",
    )


# The pids whose segments a test answers for: this process, every child spawned since the
# test began (recorded by the Popen hook below) and the live descendants seen meanwhile. The
# machine is shared: another run's or another user's segments are never blamed nor removed,
# and pids wrap (pid_max is 32768 here): a pid the session spawned long ago may be another
# process's by now, so a test answers only for the children it spawned. The pattern is
# the guard's own, independent of smgshm's parser.
_SPAWNED: list[int] = []  # every child's pid, in the order spawned
_TEST_START = 0  # where in _SPAWNED the running test began
_PID_NAME = re.compile(r"smg-(?:tokenspeed|smgshm)-(?:probe-)?([0-9]+)(?:-|$)")
_popen_init = subprocess.Popen.__init__


_GATEWAYS_STARTED: list[int] = []  # pids of SMG gateways this process started (`smg` in the argv)


def _recording_init(self: subprocess.Popen[Any], *args: Any, **kw: Any) -> None:
    _popen_init(self, *args, **kw)
    _SPAWNED.append(self.pid)
    argv = args[0] if args else kw.get("args", ())
    if not isinstance(argv, str | bytes | os.PathLike) and any(os.path.basename(str(a)) == "smg" for a in argv):
        _GATEWAYS_STARTED.append(self.pid)


subprocess.Popen.__init__ = _recording_init  # type: ignore[method-assign]


def _own_pids() -> set[int]:
    import psutil

    pids = {os.getpid(), *_SPAWNED[_TEST_START:]}
    with contextlib.suppress(psutil.Error):
        kids = {c.pid for c in psutil.Process().children(recursive=True)}
        _SPAWNED.extend(kids - pids)  # a grandchild seen alive once stays this test's
        pids |= kids
    return pids


def _smg_entries() -> set[str]:
    try:
        return {n for n in os.listdir(SHM) if n.startswith("smg-")}
    except FileNotFoundError:
        return set()


def _ours(name: str, pids: set[int]) -> bool:
    m = _PID_NAME.match(name)
    return m is not None and int(m.group(1)) in pids


def own_smg_entries() -> set[str]:
    """The smg-* entries of /dev/shm made by this test's processes (never another run's)."""
    pids = _own_pids()
    return {n for n in _smg_entries() if _ours(n, pids)}


# A process in another pid namespace that reaches a tmpfs (or keeps the host's /proc under its own,
# as `unshare --pid --mount-proc` does) makes gc's liveness verdicts there rightly untrusted. So a
# `trust` test, whose verdicts need them trusted, never runs beside a `pidns` test, which makes such
# processes: one lock file for the machine, shared by `pidns` tests and held alone by `trust` tests,
# across this run's workers and any other run of the suite here.
PIDNS_LOCK = os.path.join(SYSTEM_TMP, "smgshm-tests-pidns.lock")


@pytest.fixture(autouse=True)
def pid_namespaces_apart(request: pytest.FixtureRequest) -> Iterator[None]:
    exclusive = request.node.get_closest_marker("trust") is not None
    if not exclusive and request.node.get_closest_marker("pidns") is None:
        yield
        return
    fd = os.open(PIDNS_LOCK, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(OSError):  # another user's lock file: theirs to keep
            os.fchmod(fd, 0o666)  # so another user's run can take it too
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)  # bounded by pytest-timeout
        yield
    finally:
        os.close(fd)


@pytest.fixture(autouse=True)
def marked_if_it_starts_a_gateway(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that starts SMG's gateway (from this process) without the `gateway` marker: the
    marker is how a contributor selects or skips them, and how the fast lane leaves them out."""
    before = len(_GATEWAYS_STARTED)
    yield
    if len(_GATEWAYS_STARTED) > before and request.node.get_closest_marker("gateway") is None:
        pytest.fail("this test starts SMG's gateway: mark it @pytest.mark.gateway (or needs_smg)")


@pytest.fixture(autouse=True)
def no_shm_leaks() -> Iterator[None]:
    """Fail any test that leaves a new smg-* entry made by its own processes (and remove it)."""
    global _TEST_START
    _TEST_START = len(_SPAWNED)
    before = _smg_entries()
    yield
    pids = _own_pids()
    leaked = {n for n in _smg_entries() - before if _ours(n, pids)}
    for name in leaked:
        with contextlib.suppress(OSError):  # e.g. a non-empty directory: report it, leave it
            remove_path(os.path.join(SHM, name))
    if leaked:
        pytest.fail(f"test leaked /dev/shm entries: {sorted(leaked)}")


def remove_path(path: str) -> None:
    """Remove a file, link, FIFO or empty directory a test made; gone already is fine."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


@pytest.fixture
def scratch() -> Iterator[list[str]]:
    """Paths a test creates in /dev/shm; every one is removed at teardown, pass or fail."""
    paths: list[str] = []
    try:
        yield paths
    finally:
        for p in paths:
            remove_path(p)


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str, options: str = "") -> Iterator[str]:
    """A fresh tmpfs of ``size`` (plus mount ``options``) at ``path`` (as root), unmounted whatever happens."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=1777" + (f",{options}" if options else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True, timeout=30)
    try:
        yield str(path)
    finally:
        if subprocess.run(["umount", str(path)], timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], timeout=30)


def proc_state(pid: int) -> str:
    """The state letter of ``pid`` in /proc/PID/stat (after its comm, which may hold ")"); "" when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return ""


def make_file(d: str, name: str, size: int = 4096, age_s: float | None = None) -> str:
    """A 0600 regular file of ``size`` bytes in ``d``, its times set ``age_s`` seconds back if given."""
    path = os.path.join(d, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"\x5a" * size)
    finally:
        os.close(fd)
    if age_s is not None:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


@pytest.fixture
def receiver() -> Iterator[Any]:
    """An in-process reference receiver (vLLM face) on a random loopback port."""
    from smgshm.core.receiver.reader import ReceiverConfig
    from smgshm.core.receiver.services import start_receiver

    r = start_receiver(ReceiverConfig(), "127.0.0.1:0")
    yield r
    r.stop(0)


class Children:
    """A registry of spawned children, all killed and reaped at teardown (psutil's pattern)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        p = subprocess.Popen(argv, text=True, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def reap(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
                p.communicate(timeout=10)


@pytest.fixture
def children() -> Iterator[Children]:
    reg = Children()
    yield reg
    reg.reap()


_HELD_PORTS: list[socket.socket] = []


def closed_port() -> int:
    """A loopback port that refuses connections for the rest of the session: bound and never
    listening. A port bound, read and released (a "free" port) is free only until another
    process on this shared machine takes it, and a test expecting a refusal would then talk to it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(s)  # closed with the process
    port: int = s.getsockname()[1]
    return port


def wait_for(pred: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns a truthy value; never a bare sleep in a test. The bound is
    generous: CI is a shared 2-core machine, where a child's start-up alone can take seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(*args: str, exit: int = 0, env: dict[str, str] | None = None) -> CliResult:
    """Invoke the real root group in-process; assert the exit code, show stderr if not."""
    from smgshm.cli import cli

    # Prose wraps at the terminal's width (80 when piped); tests match phrases, so they get a
    # wide one. The wrapping itself is tested with COLUMNS=80 (tests/test_cli_output.py).
    env = {"COLUMNS": "400", **(env or {})}
    res = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    out = CliResult(res.exit_code, res.stdout, res.stderr)
    assert res.exit_code == exit, f"exit {res.exit_code} != {exit}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    from tests.support.schema_check import check_output

    check_output(args, res.stdout)  # every --json document and --jsonl record matches schemas/
    return out


def smgshm_argv(*args: str) -> list[str]:
    """argv that runs the installed CLI in a child process."""
    return [sys.executable, "-m", "smgshm", *args]


def start_serve(children: Children, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A real ``smgshm serve`` child; returns it with its JSON ready document."""
    p = children.spawn(smgshm_argv("--json", "serve", "--listen", "127.0.0.1:0", *args))
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        raise AssertionError(f"serve exited early: {p.stderr.read() if p.stderr else ''}")
    doc = json.loads(line)
    from tests.support.schema_check import validate_document

    validate_document(doc)
    return p, doc


class LoopbackHttp:
    """A plain HTTP server on 127.0.0.1 for tests that play a peer (a gateway's /workers or /metrics):
    ``answer(path)`` gives the body of each GET (200, ``content_type``); every path asked is kept in
    ``paths``. Stopped by ``close`` (use it as a context manager, or close it in a fixture)."""

    def __init__(self, answer: Any, content_type: str = "text/plain; version=0.0.4", port: int = 0) -> None:
        import http.server
        import threading

        self.paths: list[str] = []
        paths = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                paths.append(self.path)
                body = answer(self.path)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LoopbackHttp:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# -- a real terminal ------------------------------------------------------------------------

_CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]")


@dataclass
class PtyResult:
    exit_code: int
    stdout: str  # as the terminal got it, escape sequences removed; "\r\n" made "\n"
    stderr: str
    raw_stdout: bytes


def _pty(cols: int, rows: int) -> tuple[int, int]:
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, slave


def _drain(fds: list[int], bufs: dict[int, bytearray]) -> None:
    """Read what is there on each of ``fds`` into its buffer, until it is quiet for 0.2 s or closed."""
    import select

    for fd in list(fds):
        while select.select([fd], [], [], 0.2)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            bufs[fd] += data


def run_pty(
    argv: list[str],
    cols: int = 80,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    stop_on: str | None = None,
) -> PtyResult:
    """Run a command with stdin and stdout on one real pty of ``cols`` columns and stderr on another
    (so each stream is a terminal, as at a person's shell, and each is read apart).

    No COLUMNS/LINES in the environment: the width comes from the terminal itself (TIOCSWINSZ).
    ``stop_on``: once stdout shows this text, the child gets SIGINT (Ctrl-C) and is read to its end (a
    server's banner). Killed (its group) on timeout.
    """
    import select

    out_m, out_s = _pty(cols, 50)
    err_m, err_s = _pty(cols, 50)
    child_env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    child_env.update({"TERM": "xterm-256color", **(env or {})})
    p = subprocess.Popen(argv, stdin=out_s, stdout=out_s, stderr=err_s, env=child_env, start_new_session=True)
    os.close(out_s)
    os.close(err_s)
    bufs: dict[int, bytearray] = {out_m: bytearray(), err_m: bytearray()}
    deadline = time.monotonic() + timeout
    try:
        open_fds = [out_m, err_m]
        stopped = stop_on is None
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{argv} did not finish in {timeout}s; output so far:\n{bufs[out_m].decode()}\n"
                    f"--- stderr:\n{bufs[err_m].decode()}"
                )
            ready, _, _ = select.select(open_fds, [], [], min(left, 0.5))
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the child side closed
                    data = b""
                if data:
                    bufs[fd] += data
                else:
                    open_fds.remove(fd)
            if not stopped and stop_on is not None and stop_on.encode() in bufs[out_m]:
                stopped = True
                os.killpg(p.pid, signal.SIGINT)
            if not ready and p.poll() is not None:
                # Exited; a grandchild may still hold the pty open: read what is there, then stop.
                _drain(open_fds, bufs)
                break
        code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        os.close(out_m)
        os.close(err_m)

    def text(b: bytes) -> str:
        # Colours go; a cursor move or an erase (a progress bar redrawn) becomes a "\r": what follows
        # it is drawn over the line, and is judged as a line of its own.
        plain = b.decode("utf-8", "replace").replace("\r\n", "\n")
        return _CSI.sub(lambda m: "" if m.group().endswith("m") else "\r", plain)

    return PtyResult(code, text(bufs[out_m]), text(bufs[err_m]), bytes(bufs[out_m]))


def assert_fits(text: str, cols: int = 80, what: str = "output") -> None:
    """Every line at most ``cols`` wide (unless it is one token longer than that), none ending in a space,
    no number cut across two lines. A line redrawn in place (a progress bar) is judged by each redraw."""
    for line in text.split("\n"):
        for seg in line.split("\r"):
            # Only a single token longer than the line may pass it (a long path): never two words.
            fits = len(seg) <= cols or len(seg.removesuffix(" \\").split()) == 1
            assert fits, f"{what}: {len(seg)} columns > {cols}:\n{seg!r}\n--- all:\n{text}"
        # A line drawn over (a live bar, padded by rich to its width) is judged by its width alone.
        assert "\r" in line or line == line.rstrip(), f"{what}: trailing space:\n{line!r}\n--- all:\n{text}"
    rows = text.split("\n")
    for a, b in itertools.pairwise(rows):
        # A wrap the program did starts its next line indented or at a word; a number cut in two
        # leaves a digit at the end of one line and the rest at column 0 of the next.
        cut = a[-1:].isdigit() and b[:1].isdigit() and len(a) >= cols - 1
        assert not cut, f"{what}: a number cut across lines:\n{a!r}\n{b!r}"


# Fixtures that tests in several modules use, defined beside their helpers in tests/support/ and
# registered here, where pytest finds them for every test (imported last: those modules import
# this one's helpers).
from tests.support.cli_doctor import shm_dir  # noqa: E402, F401
from tests.support.cli_gc import tmpfs_dir, trusting  # noqa: E402, F401
from tests.support.cli_send import address  # noqa: E402, F401
from tests.support.core_worker import model, vllm  # noqa: E402, F401
from tests.support.e2e import gateways, model_dir  # noqa: E402, F401
from tests.support.e2e_causes import private_shm  # noqa: E402, F401
from tests.support.interop_generate import stack  # noqa: E402, F401
from tests.support.watch_follow import prefix, tmpfs  # noqa: E402, F401
