"""Hostile gateways (issue #21, findings 3, 8 and 9): a fake ``smg::router``'s logs, a lying
``/metrics``, and two pid-1 gateways over one shm dir.

Any local user can title a process ``smg::router``. Here a fake gateway is a Python child that does
just that (prctl PR_SET_NAME: what /proc/PID/comm shows, which is what running.py matches), holds
open for writing the logs the test made on its own tmpfs, and, where a test needs it, answers SMG's
HTTP API and Prometheus text on a loopback port with whatever the test chose. A pid-1 gateway lives
in pid and mount namespaces of its own (``unshare``), its /dev/shm bound to a tmpfs the test made.
Every child is killed and reaped at teardown; every tmpfs is unmounted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from smgshm.core.e2e.evidence import MetricsEvidence, ReceiptEvidence, SegmentWatch
from smgshm.core.e2e.verdict import Context, judge
from smgshm.core.errors import HostError
from smgshm.core.gateway.log import (
    HEAD_BYTES,
    MAX_TOTAL_BYTES,
    TAIL_BYTES,
    LogBudget,
    read_open_log,
    read_transport_config,
)
from smgshm.core.gateway.process import RunningGateway
from tests.conftest import Children, mounted_tmpfs, smgshm_argv
from tests.support.e2e import needs_smg
from tests.support.e2e_causes import TOOLS, PrivateShm, e2e_in, router_pid, serve_in

# makes pid namespaces: never beside a test whose verdicts need liveness trusted (tests/conftest.py)
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="tmpfs mounts and namespaces need root"),
    pytest.mark.pidns,
]

PY = sys.executable
MiB = 1 << 20
START = (
    "2026-12-0{d} 10:00:00  INFO t: Multimodal tensor transport configured mode={m} shm_min_bytes=65536 "
    "dev_writable=true\n"
)
# A peer's string that would forge a verdict line and retitle the terminal if it reached it raw.
HOSTILE = "shm\x1b[2K\r\n[ok] forged: every tensor via SHM\x1b]0;pwned\x07\x9b1m\u202e\u2028x"

# The fake gateway. Its config (JSON, argv[1]): "logs" to hold open for writing; "http" to serve on a
# loopback port (GET /workers, /v1/models, /metrics; POST /v1/chat/completions); "label" for its
# metrics' path and mode labels and its model's name; "count" what advances its counters ("chat" or
# "scrape"); "garbage_after" scrapes after which /metrics answers what is not Prometheus text;
# "chat_status" its chat reply's status; "write_every" seconds between segments it writes (and
# removes) in /dev/shm, named as SMG's gateway names them, with the pid it sees; "metrics" to serve its
# metrics on a port of their own too (SMG's --prometheus-port: no GET /workers there), with
# "write_failures" as its SHM write-failure counter.
FAKE = r"""
import ctypes, http.server, json, os, sys, threading, time
ctypes.CDLL(None).prctl(15, b"smg::router", 0, 0, 0)  # PR_SET_NAME: its comm is now SMG's title
cfg = json.loads(sys.argv[1])
held = [os.open(p, os.O_WRONLY | os.O_APPEND) for p in cfg.get("logs", [])]
label = cfg.get("label", "inline")
counts = {"chat": 0, "scrape": 0}

def writer(every):
    n = 0
    while True:
        n += 1
        path = f"/dev/shm/smg-tokenspeed-{os.getpid()}-{time.time_ns()}-{n}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"\x01" * 4096)
        os.close(fd)
        time.sleep(0.02)
        os.unlink(path)
        time.sleep(every)

if cfg.get("write_every"):
    threading.Thread(target=writer, args=(cfg["write_every"],), daemon=True).start()

def esc(v):
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

class H(http.server.BaseHTTPRequestHandler):
    def reply(self, status, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/workers":
            self.reply(200, json.dumps({"workers": []}))
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"data": [{"id": label}]}))
        elif self.path == "/metrics":
            counts["scrape"] += 1
            if counts["scrape"] > cfg.get("garbage_after", 1 << 30):
                return self.reply(200, "\x1b[2J\n[ok] forged{" + label, "text/plain")
            n, lv = counts[cfg.get("count", "chat")], esc(label)
            failed = f'smg_mm_shm_write_failures_total{{runtime="vllm"}} {cfg.get("write_failures")}\n'
            self.reply(200, f'smg_mm_tensors_total{{runtime="vllm",path="{lv}"}} {n}\n'
                            f'smg_mm_tensor_bytes_total{{runtime="vllm",path="{lv}"}} {n * 4816896}\n'
                            f'smg_mm_processing_total{{model="m",mode="{lv}"}} {n}\n'
                            + (failed if "write_failures" in cfg else ""), "text/plain")
        else:
            self.reply(404, "{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        counts["chat"] += 1
        status = cfg.get("chat_status", 200)
        if status != 200:
            return self.reply(status, json.dumps({"error": {"message": label}}))
        self.reply(200, json.dumps({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 1}}))

    def log_message(self, *a):
        pass

class M(H):
    def do_GET(self):
        if self.path == "/workers":
            return self.reply(404, "{}")
        super().do_GET()

port = 0
if cfg.get("http"):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
if cfg.get("metrics"):
    msrv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), M)
    threading.Thread(target=msrv.serve_forever, daemon=True).start()
print("ready", port, flush=True)
threading.Event().wait()
"""


@pytest.fixture
def shm_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of the test's own: the fake gateways' logs and shm dir (sparse files cost nothing)."""
    with mounted_tmpfs(tmp_path / "tmpfs", "2g") as path:
        yield Path(path)


def fake_gateway(children: Children, cfg: dict[str, Any], shm: Path | None = None) -> tuple[int, int]:
    """Start a fake gateway; (its pid here, its HTTP port or 0). With ``shm``: pid 1 of a pid namespace
    of its own, in a mount namespace of its own whose /dev/shm is ``shm``."""
    argv = [PY, "-c", FAKE, json.dumps(cfg)]
    if shm is not None:
        argv = [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            'mount --bind "$0" /dev/shm && exec "$@"',
            str(shm),
            *argv,
        ]
    p = children.spawn(argv)
    assert p.stdout is not None
    line = p.stdout.readline().split()
    assert line[:1] == ["ready"], p.stderr.read() if p.stderr else ""
    pid = p.pid
    if shm is not None:
        [pid] = [c.pid for c in psutil.Process(p.pid).children(recursive=True) if c.name() == "smg::router"]
    assert psutil.Process(pid).name() == "smg::router"
    return pid, int(line[1])


def newlines(path: Path, nbytes: int, head: str = "", tail: str = "") -> None:
    """A log of ``nbytes`` of empty lines (the slowest thing to read line by line), between ``head`` and ``tail``."""
    with open(path, "wb") as f:
        f.write(head.encode())
        block = b"\n" * MiB
        for _ in range(nbytes // MiB):
            f.write(block)
        f.write(tail.encode())


def links(path: Path, n: int) -> list[str]:
    """``path`` and ``n`` more hard links to it."""
    out = [str(path)]
    for i in range(n):
        os.link(path, f"{path}.{i}")
        out.append(f"{path}.{i}")
    return out


def run(*args: str, bound_s: float) -> subprocess.CompletedProcess[str]:
    """``smgshm ARGS`` as a child; it must finish within ``bound_s`` and never exit 70."""
    t0 = time.monotonic()
    res = subprocess.run(
        smgshm_argv(*args), capture_output=True, text=True, timeout=bound_s * 2, env={**os.environ, "COLUMNS": "400"}
    )
    took = time.monotonic() - t0
    assert res.returncode != 70, res.stderr
    assert took < bound_s, f"took {took:.1f} s (bound {bound_s} s)"
    return res


# -- 3: a fake gateway's logs ---------------------------------------------------------------------


@pytest.mark.slow
def test_doctor_reads_a_fake_gateways_huge_logs_within_its_bound(children: Children, shm_tmpfs: Path) -> None:
    """128 MiB of empty lines under four names, and sixteen 1 GiB sparse logs: read line by line, the
    links anew, that held doctor for minutes. Each file is read once (its inode), head and tail only,
    all of them within one budget: doctor finishes in seconds and says what it could not tell."""
    big = shm_tmpfs / "gw.log"
    newlines(big, 128 * MiB)
    names = links(big, 3)
    for i in range(16):
        sparse = shm_tmpfs / f"sparse-{i}.log"
        sparse.touch()
        os.truncate(sparse, 1 << 30)
        names.append(str(sparse))
    pid, _ = fake_gateway(children, {"logs": names})
    res = run(
        "--json",
        "doctor",
        "--no-e2e",
        "--gateway-pid",
        str(pid),
        "--shm-dir",
        str(shm_tmpfs),
        "--timeout",
        "2s",
        bound_s=60,
    )
    assert res.returncode in (0, 3, 4, 5, 6), res.stderr
    doc = json.loads(res.stdout)
    [entry] = [g for g in doc["result"]["host"]["gateways"] if g["gateway"] and g["gateway"]["pid"] == pid]
    # One entry per file, not per name: the four links are one log (its lowest fd names it).
    assert [log["path"] for log in entry["gateway"]["logs"]] == names[:1] + names[4:]
    assert entry["log"] is None
    assert entry["finding"]["verdict"] == "unknown"
    checks = {c["name"]: c for c in doc["result"]["checks"]}
    assert (checks[f"gateway {pid} transport"]["status"], checks[f"gateway {pid} transport"]["code"]) == ("unknown", 6)


@pytest.mark.slow
def test_doctor_quotes_a_gateways_write_errors_from_its_log_defused(children: Children, shm_tmpfs: Path) -> None:
    """A gateway whose SHM writes fail (its metrics count them): doctor's fix names its log and quotes the
    last write errors there (issue #29), never "read the gateway's log" of a log it read. The lines are a
    stranger's: each bounded, its control characters and colour codes gone, the forged line not quoted."""
    log = shm_tmpfs / "gw.log"
    error = "2026-12-04 10:00:0{n}  WARN t: Failed to write multimodal SHM tensor; falling back to inline error={e}\n"
    log.write_text(
        START.format(d=4, m="shm")
        + "".join(error.format(n=n, e="No space left on device (os error 28)") for n in range(3))
        + error.format(n=3, e=HOSTILE + "z" * 1000),
        encoding="utf-8",
    )
    pid, _ = fake_gateway(children, {"logs": [str(log)], "http": True, "metrics": True, "write_failures": 4})
    args = ("doctor", "--no-e2e", "--gateway-pid", str(pid), "--shm-dir", str(shm_tmpfs), "--timeout", "5s")
    res = run("--json", *args, bound_s=60)
    checks = {c["name"]: c for c in json.loads(res.stdout)["result"]["checks"]}
    t = checks[f"gateway {pid} transport"]
    assert (t["status"], t["cause"]) == ("fail", "shm_writes_failing"), t
    fix = t["fix"]
    assert f"the gateway's log {log} says why (its last 3 write error(s))" in fix, fix
    assert fix.count("No space left on device") == 2
    assert "\x1b" not in fix
    assert "\x07" not in fix
    assert "\u202e" not in fix
    assert "z" * 300 not in fix, "a quoted line is bounded"
    human = run("--no-color", *args, bound_s=60).stdout
    assert_clean(human, "doctor's human output")
    assert "says why (its last 3 write error(s))" in human


@pytest.mark.slow
def test_e2e_running_reads_the_start_line_of_a_huge_log_from_its_head_and_tail(
    children: Children, shm_tmpfs: Path
) -> None:
    """Another input of the class, through e2e --running: first (its lowest fds) 64 MiB of empty lines
    under four names, then its real log: the start line at the head, 64 MiB of empty lines, and the
    last start near the end. e2e finishes within its bound and reports the last start (from the
    tail: its line number is not known, so not given)."""
    junk = shm_tmpfs / "junk.log"
    newlines(junk, 64 * MiB)
    log = shm_tmpfs / "gw.log"
    newlines(log, 64 * MiB, head=START.format(d=1, m="inline"), tail=START.format(d=2, m="shm"))
    pid, port = fake_gateway(children, {"logs": [*links(junk, 3), str(log)], "http": True})
    base = f"http://127.0.0.1:{port}"
    res = run(
        "--json",
        "e2e",
        "--gateway-pid",
        str(pid),
        "--metrics",
        f"{base}/metrics",
        "-n",
        "1",
        "--warmup",
        "0",
        "--no-stream",
        "--timeout",
        "2s",
        "--shm-dir",
        str(shm_tmpfs),
        bound_s=60,
    )
    doc = json.loads(res.stdout)
    [r] = doc["result"]["runs"]
    assert (r["mode"], r["dev_writable"]) == ("shm", True)
    assert r["setting_source"] == f"log {log} (in its last {TAIL_BYTES // MiB} MiB)"


@pytest.mark.slow
def test_log_reads_are_bounded_in_bytes_and_each_file_is_read_once(shm_tmpfs: Path) -> None:
    """The budget itself: links cost nothing after the first; distinct files stop at the total; a log
    made of nothing but start lines is still read within the bound and gives its last line."""
    log = shm_tmpfs / "a.log"
    newlines(log, 32 * MiB, head=START.format(d=1, m="auto"))
    budget = LogBudget()
    for name in links(log, 5):
        c = read_transport_config(name, budget)
        assert c is not None
        assert (c.mode, c.line_no, c.truncated, c.path) == ("auto", 1, True, name)
    assert MAX_TOTAL_BYTES - budget.bytes_left <= HEAD_BYTES + TAIL_BYTES + 1

    many = []
    for i in range(40):
        p = shm_tmpfs / f"big-{i}.log"
        newlines(p, 8 * MiB)
        many.append(str(p))
    budget = LogBudget()
    read = 0
    while not budget.spent():  # 40 x (1 + 4) MiB is more than the budget
        assert read_transport_config(many[read], budget) is None
        read += 1
    assert 0 < read < len(many)
    assert budget.bytes_left == 0
    for p in many[read:]:  # the rest are not read at all
        with pytest.raises(HostError, match="budget for reading gateway logs is spent"):
            read_transport_config(p, budget)

    packed = shm_tmpfs / "starts.log"
    packed.write_text(START.format(d=1, m="inline") * 200_000 + START.format(d=2, m="shm"))
    t0 = time.monotonic()
    c = read_transport_config(str(packed))
    assert time.monotonic() - t0 < 10
    assert c is not None
    assert (c.mode, c.timestamp, c.truncated) == ("shm", "2026-12-02 10:00:00", True)
    # read_open_log stops once its budget is spent: nothing more is opened.
    spent = LogBudget(bytes_left=0)
    assert read_open_log(os.getpid(), [(0, "stdin")], spent) is None


# -- 8: peers' strings on the terminal -------------------------------------------------------------


def assert_clean(text: str, where: str) -> None:
    """No control, format or separator character but the line breaks the renderer writes; no line
    that a peer forged (every ``[ok]`` line is the renderer's own, naming the run)."""
    bad = sorted(
        {f"U+{ord(ch):04X}" for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")}
    )
    assert not bad, f"{where}: raw {bad} in {text!r}"
    forged = [line for line in text.splitlines() if line.lstrip().startswith("[ok] forged")]
    assert not forged, f"{where}: forged lines {forged}"


@pytest.mark.slow
def test_e2e_shows_a_peers_metric_labels_model_and_errors_escaped(children: Children, shm_tmpfs: Path) -> None:
    """Label values (path, mode), the model's name and an error body carrying escape sequences and
    newlines are shown escaped, once: no raw control byte, no forged ``[ok]`` line."""
    for status in (200, 500):
        pid, port = fake_gateway(children, {"http": True, "label": HOSTILE, "chat_status": status})
        base = f"http://127.0.0.1:{port}"
        res = run(
            "e2e",
            "--gateway",
            base,
            "--metrics",
            f"{base}/metrics",
            "-n",
            "1",
            "--warmup",
            "0",
            "--no-stream",
            "--timeout",
            "2s",
            "--shm-dir",
            str(shm_tmpfs),
            bound_s=60,
        )
        assert res.returncode in (0, 3, 6), res.stderr
        assert_clean(res.stdout, "stdout")
        assert_clean(res.stderr, "stderr")
        # The labels were shown, escaped exactly once (a backslash doubled twice would read \\\\x1b).
        assert "shm\\x1b[2K\\r\\n[ok] forged" in res.stdout
        assert "\\\\x1b" not in res.stdout
        psutil.Process(pid).kill()


@pytest.mark.slow
def test_watch_metrics_shows_a_peers_labels_and_scrape_errors_escaped(children: Children, shm_tmpfs: Path) -> None:
    """watch --metrics, piped: each interval's gateway figures and the summary's, with hostile path
    labels; then a peer whose /metrics turns to hostile garbage (its words in the scrape error)."""
    for cfg in ({"count": "scrape"}, {"count": "scrape", "garbage_after": 2}):
        _, port = fake_gateway(children, {"http": True, "label": HOSTILE, **cfg})
        res = run(
            "watch",
            "--metrics",
            f"http://127.0.0.1:{port}/metrics",
            "--count",
            "4",
            "--interval",
            "0.2s",
            "--shm-dir",
            str(shm_tmpfs),
            bound_s=60,
        )
        assert res.returncode == 0, res.stderr
        assert_clean(res.stdout, "stdout")
        assert_clean(res.stderr, "stderr")
        if "garbage_after" in cfg:
            assert "| gateway: scrape failed: not Prometheus text exposition" in res.stdout
        else:
            assert "gateway: shm\\x1b[2K\\r\\n[ok] forged" in res.stdout
            assert "\\\\x1b" not in res.stdout  # escaped once, in the lines and in the summary's table


# -- 9: two pid-1 gateways over one shm dir ---------------------------------------------------------


def watch_writes(shm: Path, pids: list[int], seconds: float = 0.6) -> dict[int, Any]:
    """Watch ``shm`` while the writers write; the shm-dir evidence of each gateway in ``pids``."""
    w = SegmentWatch(str(shm)).__enter__()
    try:
        time.sleep(seconds)
        w.settle()
    finally:
        w.__exit__(None, None, None)
    return {pid: w.evidence(pid) for pid in pids}


def _inline_metrics(n: int) -> MetricsEvidence:
    return MetricsEvidence("http://127.0.0.1:1/metrics", True, tensors={"inline": n}, nbytes={"inline": n * 4816896})


@pytest.mark.slow
def test_two_pid1_gateways_over_one_shm_dir_are_never_credited_with_each_others_segments(
    children: Children, shm_tmpfs: Path
) -> None:
    """A writes smg-tokenspeed-1-* names, B (honest, inline) writes none; both are pid 1 of their own
    pid namespace over one tmpfs. Neither can be told from the other by the names: the shm dir is no
    evidence for either, said plainly, and B's inline traffic is judged inline from its metrics."""
    a, _ = fake_gateway(children, {"write_every": 0.03}, shm=shm_tmpfs)
    b, _ = fake_gateway(children, {}, shm=shm_tmpfs)
    ev = watch_writes(shm_tmpfs, [a, b])
    for pid, other in ((a, b), (b, a)):
        d = ev[pid]
        assert (d.available, d.segments, d.name_pid) == (False, [], 1), d
        assert d.note.startswith(f"cannot tell its segments from those of gateway pid {other}"), d.note
    ctx = Context("inline", None, "vllm", "", "", True, 2, 0, True)
    v = judge(ctx, _inline_metrics(2), ev[b], ReceiptEvidence(False, "none"))
    assert (v.path, v.cause) == ("inline", "inline: mode is inline")


UNTITLED_WRITER = r"""
import os, sys, time
print("ready", flush=True)
n = 0
while True:  # SMG's names, by a process that never calls itself smg::router
    with open(f"/dev/shm/smg-tokenspeed-{os.getpid()}-{time.time_ns()}-{n}", "wb") as f:
        f.write(b"x" * 4096)
    n += 1
    time.sleep(0.03)
"""


@pytest.mark.slow
def test_an_untitled_pid1_writer_over_the_shm_dir_is_a_rival_too(children: Children, shm_tmpfs: Path) -> None:
    """Any process can write SMG's names: an untitled one that is pid 1 of its own pid namespace over the same
    tmpfs writes the very names a pid-1 gateway would. The gateway is never credited with them: the shm dir
    is no evidence, and the note names the writer (only smg::router processes counted before)."""
    gw, _ = fake_gateway(children, {}, shm=shm_tmpfs)
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c"]
    argv += ['mount --bind "$0" /dev/shm && exec "$@"', str(shm_tmpfs), PY, "-c", UNTITLED_WRITER]
    p = children.spawn(argv)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    [writer] = [c.pid for c in psutil.Process(p.pid).children(recursive=True) if c.name() != "sh"]
    d = watch_writes(shm_tmpfs, [gw])[gw]
    assert (d.available, d.segments, d.name_pid) == (False, [], 1), d
    assert d.note.startswith("cannot tell its segments from those of process(es) "), d.note
    assert f"{writer} (" in d.note


@pytest.mark.slow
def test_a_pid1_gateway_over_another_shm_dir_is_no_rival_and_never_credited(
    children: Children, shm_tmpfs: Path, tmp_path: Path
) -> None:
    """Another input of the class: B is pid 1 too, over a tmpfs of its own. A's segments are A's
    (nobody else could have written them); B, which writes elsewhere, is credited with none."""
    with mounted_tmpfs(tmp_path / "other", "16m") as other:
        a, _ = fake_gateway(children, {"write_every": 0.03}, shm=shm_tmpfs)
        b, _ = fake_gateway(children, {}, shm=Path(other))
        ev = watch_writes(shm_tmpfs, [a, b])
        assert ev[a].available, ev[a].note
        assert len(ev[a].segments) >= 3
        assert ev[b].available is False
        assert ev[b].segments == []
        assert ev[b].note.startswith(f"gateway pid {b} writes another /dev/shm"), ev[b].note
        children.reap()  # before the unmount: B holds its tmpfs


@pytest.mark.slow
def test_e2e_against_an_honest_inline_pid1_gateway_beside_a_writing_one(children: Children, shm_tmpfs: Path) -> None:
    """Through the real e2e: B, pid 1, logs mode=inline and counts its tensors inline; A, pid 1 over
    the same tmpfs, writes segments all along. e2e against B says inline (it said undetermined)."""
    log = shm_tmpfs / "b.log"
    log.write_text(START.format(d=1, m="inline"))
    fake_gateway(children, {"write_every": 0.01}, shm=shm_tmpfs)
    b, port = fake_gateway(children, {"http": True, "logs": [str(log)]}, shm=shm_tmpfs)
    base = f"http://127.0.0.1:{port}"
    res = run(
        "--json",
        "e2e",
        "--gateway",
        base,
        "--metrics",
        f"{base}/metrics",
        "-n",
        "2",
        "--warmup",
        "0",
        "--no-stream",
        "--timeout",
        "5s",
        "--shm-dir",
        str(shm_tmpfs),
        bound_s=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    [r] = json.loads(res.stdout)["result"]["runs"]
    assert (r["path"], r["cause"], r["mode"]) == ("inline", "inline: mode is inline", "inline")
    assert r["shm_dir"]["available"] is False
    assert r["shm_dir"]["gateway_pid"] == b
    assert "cannot tell its segments" in r["shm_dir"]["note"]


@needs_smg
@pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS), reason=f"needs {', '.join(TOOLS)}")
@pytest.mark.parametrize("private_shm", ["256m"], indirect=True)
def test_e2e_against_a_real_inline_pid1_gateway_beside_a_real_shm_one(
    private_shm: PrivateShm, children: Children, gateways: list[RunningGateway], tmp_path: Path, model_dir: str
) -> None:
    """The finding as it was seen, with real gateways: two containers' pid-1 gateways over one
    /dev/shm, A under shm with traffic all along, B under inline. e2e against B said undetermined
    (A's segments credited to it); now it says inline, and that the shm dir cannot tell them apart."""
    from smgshm.core.gateway.chat import first_model, make_png, send_chat
    from smgshm.core.gateway.process import GatewayConfig, start_gateway

    ns = private_shm
    started = []
    for mode in ("shm", "inline"):  # each its own worker: receipts stay each gateway's own
        worker = serve_in(ns, children, model_dir)
        prefix = ns.enter("unshare", "-p", "-f", "--mount-proc", "--kill-child")
        cfg = GatewayConfig(
            worker_urls=(worker,),
            model_path=model_dir,
            transport=mode,
            shm_dir=ns.shm,
            log_path=str(tmp_path / f"{mode}.log"),
            argv_prefix=tuple(prefix),
        )
        started.append(start_gateway(cfg, ready_timeout_s=90))
        gateways.append(started[-1])
    a, b = started
    model, png, stop = first_model(a.http_url), make_png(448), threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            send_chat(a.http_url, model, png, stream=False, timeout_s=30)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        doc = json.loads(e2e_in(ns, b, "--json", "-n", "3", "--no-stream", exit=0).stdout)
    finally:
        stop.set()
        t.join(60)
    [r] = doc["result"]["runs"]
    assert (r["path"], r["cause"], r["mode"]) == ("inline", "inline: mode is inline", "inline")
    assert r["shm_tensors_by_source"] == {"metrics": 0, "receipts": 0}
    d = r["shm_dir"]
    assert (d["available"], d["gateway_pid"], d["name_pid"]) == (False, router_pid(b), 1)
    assert d["note"] == (
        f"cannot tell its segments from those of gateway pid {router_pid(a)}: each is pid 1 in "
        "its own pid namespace and may write /dev/shm"
    )
