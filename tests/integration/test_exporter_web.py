"""The exporter's ``--web-config`` (TLS, client certificates, basic auth) and ``/healthz``, against real
servers on loopback: certificates made here by the ``openssl`` CLI (a CA, the server's, a client's), real
bcrypt hashes, real TLS clients from Python's ssl. Every server, child and file is gone at the end."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from smgshm.core.watch.httpserver import CLIENT_TIMEOUT_S, MAX_CLIENTS, MetricsServer
from smgshm.core.watch.webconfig import load_web_config
from tests.conftest import Children, run_cli, smgshm_argv, wait_for
from tests.support.cli_watch import drain, spawn_watch

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")

PASSWORD = "s3cret-pw"  # noqa: S105 - a test password, hashed by the test itself


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d,
        )  # fmt: skip
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


def _tls_yaml(pki: Path, *, client_certs: bool = False) -> str:
    text = f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {pki / 'server.key'}\n"
    if client_certs:
        text += f"  client_ca_file: {pki / 'ca.crt'}\n  client_auth_type: RequireAndVerifyClientCert\n"
    return text


def _users_yaml() -> str:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    return f"basic_auth_users:\n  alice: {hashed.replace('$2b$', '$2y$', 1)}\n"  # htpasswd's prefix


class _Idle:
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily("smgshm_test_up", "a test series", value=1)


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start a MetricsServer on loopback with a web config file (and a health verdict); all stopped at the end."""
    servers: list[MetricsServer] = []

    def start(config: str | None, health: Any = None) -> MetricsServer:
        web = load_web_config(config) if config is not None else None
        s = MetricsServer(_Idle(), "127.0.0.1", 0, web, health)  # type: ignore[arg-type]
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def _client_ctx(pki: Path, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return ctx


def _get(
    port: int, path: str = "/metrics", ctx: ssl.SSLContext | None = None, auth: str | None = None
) -> tuple[int, dict[str, str], str]:
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
    try:
        headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        conn.close()


def test_tls_serves_the_exposition_and_refuses_plain_http(serve: Any, pki: Path, tmp_path: Path) -> None:
    s = serve(_config(tmp_path, _tls_yaml(pki)))
    assert s.url.startswith("https://")
    status, _, body = _get(s.port, ctx=_client_ctx(pki))
    assert status == 200
    assert "smgshm_test_up 1.0" in body
    with pytest.raises((http.client.HTTPException, ConnectionError)):  # no HTTP answer on a TLS port
        _get(s.port)


def test_a_client_certificate_is_required_when_the_config_says_so(serve: Any, pki: Path, tmp_path: Path) -> None:
    s = serve(_config(tmp_path, _tls_yaml(pki, client_certs=True)))
    with pytest.raises((ssl.SSLError, ConnectionError)):  # TLS 1.3 says so at the first read
        _get(s.port, ctx=_client_ctx(pki))
    status, _, body = _get(s.port, ctx=_client_ctx(pki, cert=True))
    assert status == 200
    assert "smgshm_test_up" in body


def test_basic_auth_refuses_wrong_or_missing_credentials_and_admits_the_right_ones(
    serve: Any, pki: Path, tmp_path: Path
) -> None:
    s = serve(_config(tmp_path, _tls_yaml(pki) + _users_yaml()))
    ctx = _client_ctx(pki)
    for auth in (None, f"alice:{PASSWORD}x", f"bob:{PASSWORD}", "alice", f"alice:{'p' * 100}"):
        status, headers, body = _get(s.port, ctx=ctx, auth=auth)
        assert status == 401, auth
        assert headers["WWW-Authenticate"].startswith('Basic realm="smgshm"')
        assert "smgshm_test_up" not in body
    status, _, body = _get(s.port, ctx=ctx, auth=f"alice:{PASSWORD}")
    assert status == 200
    assert "smgshm_test_up" in body


def test_a_stalled_tls_handshake_does_not_block_another_client(serve: Any, pki: Path, tmp_path: Path) -> None:
    s = serve(_config(tmp_path, _tls_yaml(pki)))
    # More than it serves at once, each sending the first bytes of a ClientHello, then nothing.
    stalled = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(3 * MAX_CLIENTS)]
    try:
        for c in stalled:
            c.sendall(b"\x16\x03\x01\x00")
        t0 = time.monotonic()
        status, _, _ = _get(s.port, ctx=_client_ctx(pki))  # evicts the oldest still handshaking
        assert status == 200
        assert time.monotonic() - t0 < CLIENT_TIMEOUT_S, "answered while the others stall, not after them"
        # Each stalled client is dropped within its bound: the server closes it (EOF or a reset).
        stalled[-1].settimeout(CLIENT_TIMEOUT_S + 5)
        t0 = time.monotonic()
        try:
            end = stalled[-1].recv(4096)
        except ConnectionResetError:
            end = b""
        assert end == b"", "no answer to half a ClientHello"
        assert time.monotonic() - t0 < CLIENT_TIMEOUT_S + 3
    finally:
        for c in stalled:
            c.close()


def test_healthz_asks_no_credentials_and_says_ok_or_why_not(serve: Any, pki: Path, tmp_path: Path) -> None:
    from smgshm.core.watch.health import Verdict

    verdicts = [Verdict(True, "ok")]
    s = serve(_config(tmp_path, _tls_yaml(pki) + _users_yaml()), lambda: verdicts[-1])
    assert _get(s.port, "/healthz", ctx=_client_ctx(pki))[::2] == (200, "ok\n")
    verdicts.append(Verdict(False, "stale: the last scan finished 99s ago, one is due every 30s"))
    status, _, body = _get(s.port, "/healthz", ctx=_client_ctx(pki))
    assert (status, body.count("\n")) == (503, 1)
    assert body.startswith("stale: ")
    assert _get(s.port, "/metrics", ctx=_client_ctx(pki))[0] == 401  # only /healthz is exempt


def test_node_healthz_200_after_a_scan_then_503_stale_then_failing(serve: Any, tmp_path: Path) -> None:
    """A real node view on an empty node root, rescanning every 0.1 s: healthy right after its scan;
    stale when its loop stops stepping (as a main thread stuck in /proc would); failing when the node
    root cannot be read; healthy again after the next good scan."""
    from smgshm.core.node.follow import NodeWatch, NodeWatchOptions
    from smgshm.core.node.metrics import collector

    root = tmp_path / "node"
    root.mkdir()
    with NodeWatch(NodeWatchOptions(root=str(root), rescan_every_s=0.1)) as nw:
        s = MetricsServer(collector(nw.figures), "127.0.0.1", 0, health=nw.verdict)
        try:
            assert _get(s.port, "/healthz")[::2] == (200, "ok\n")
            stale = wait_for(lambda: (r := _get(s.port, "/healthz"))[0] == 503 and r, 30, "/healthz stale")
            assert stale[2].startswith("stale: "), stale
            wait_for(lambda: nw.step(0.1) is not None, 10, "a full scan")
            assert _get(s.port, "/healthz")[::2] == (200, "ok\n")
            root.rmdir()
            wait_for(lambda: nw.step(0.1) is not None, 10, "a failed full scan")
            assert _get(s.port, "/healthz")[::2] == (503, "failing: the last full scan could not look at the node\n")
            root.mkdir()
            wait_for(lambda: nw.step(0.1) is not None, 10, "a full scan")
            assert _get(s.port, "/healthz")[::2] == (200, "ok\n")
        finally:
            s.stop()


def test_watch_serves_healthz_over_tls_with_its_web_config(children: Children, pki: Path, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    config = _config(tmp_path, _tls_yaml(pki) + _users_yaml())
    w, _ = spawn_watch(
        children, "--shm-dir", str(shm), "--interval", "0.2", "--serve-metrics", "127.0.0.1:0", "--web-config", config
    )
    assert w.stdout is not None
    url = json.loads(w.stdout.readline())["url"]
    assert url.startswith("https://127.0.0.1:")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    ctx = _client_ctx(pki)
    ok = wait_for(lambda: _get(port, "/healthz", ctx=ctx)[0] == 200, 30, "watch's first interval")
    assert ok
    assert _get(port, "/metrics", ctx=ctx)[0] == 401
    status, _, body = _get(port, "/metrics", ctx=ctx, auth=f"alice:{PASSWORD}")
    assert status == 200
    assert "smgshm_watch_overflows_total" in body
    w.send_signal(signal.SIGTERM)
    _, err = drain(w)
    assert w.returncode == 0
    assert PASSWORD not in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n", "not supported by smgshm"),
        ("basic_auth_user:\n  alice: x\n", "basic_auth_user: unknown key"),
        ("basic_auth_users:\n  alice: $2y$10$notahash\n", "basic_auth_users.alice: not a bcrypt hash"),
        ("tls_server_config:\n  cert_file: a\n", "needs both cert_file and key_file"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
            "is not served",
        ),
        ("basic_auth_users: [\n  $2y$10$secretsecret\n", "not valid YAML (line"),
    ],
)
def test_a_bad_web_config_is_a_usage_error_in_one_line(text: str, says: str, tmp_path: Path) -> None:
    config = _config(tmp_path, text)
    res = run_cli("watch", "--serve-metrics", "127.0.0.1:0", "--web-config", config, "--count", "1", exit=2)
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, res.stderr
    assert says in errors[0]
    assert "secretsecret" not in res.stderr
    assert "notahash" not in res.stderr


def test_an_unreadable_web_config_is_the_hosts_exit_5(tmp_path: Path) -> None:
    res = run_cli("watch", "--serve-metrics", "0", "--web-config", str(tmp_path / "absent.yml"), "--count", "1", exit=5)
    assert "cannot read --web-config" in res.stderr


def test_web_config_without_serve_metrics_is_a_usage_error(tmp_path: Path) -> None:
    res = run_cli("watch", "--web-config", _config(tmp_path, "{}\n"), "--count", "1", exit=2)
    assert "--web-config configures --serve-metrics" in res.stderr


def test_node_exporter_serves_tls_and_auth_and_no_longer_warns_when_guarded(
    children: Children, pki: Path, tmp_path: Path
) -> None:
    """``watch --node`` on all addresses with TLS and users: no "NOT loopback" warning (a reader must
    prove who it is), /healthz 200 without credentials, /metrics only with them."""
    root = tmp_path / "host"
    (root / "var" / "log" / "pods").mkdir(parents=True)
    config = _config(tmp_path, _tls_yaml(pki) + _users_yaml())
    p = children.spawn(
        smgshm_argv("watch", "--node", "--node-root", str(root), "--serve-metrics", "0.0.0.0:0", "--web-config", config)
    )
    assert p.stderr is not None
    said = []
    while not said or "metrics at " not in said[-1]:
        line = p.stderr.readline()
        assert line, ("exited", said, p.poll())
        said.append(line)
    assert not any("NOT loopback" in line for line in said), said
    port = int(said[-1].rsplit(":", 1)[1].split("/")[0])
    ctx = _client_ctx(pki)
    assert _get(port, "/healthz", ctx=ctx)[::2] == (200, "ok\n")
    assert _get(port, "/metrics", ctx=ctx)[0] == 401
    status, _, body = _get(port, "/metrics", ctx=ctx, auth=f"alice:{PASSWORD}")
    assert status == 200
    assert "smgshm_node_last_scan_timestamp_seconds" in body
    p.send_signal(signal.SIGTERM)
    _, err = drain(p)
    assert p.returncode == 0
    assert "Traceback" not in err


def test_watch_healthz_is_starting_then_ok_then_stale_when_intervals_stop(tmp_path: Path) -> None:
    """Plain watch's /healthz, in-process: 503 before its first interval (what readiness waits for), 200
    after one, 503 stale when no interval follows for three --interval (0.1 s) plus the slack."""
    from smgshm.core.watch.export import WatchExporter
    from smgshm.core.watch.figures import WatchOptions
    from smgshm.core.watch.session import WatchSession

    shm = tmp_path / "shm"
    shm.mkdir()
    with WatchSession(WatchOptions(shm_dir=str(shm), interval_s=0.1)) as session:
        exporter = WatchExporter(session, "127.0.0.1", 0)
        try:
            assert _get(exporter.port, "/healthz")[::2] == (503, "starting: no scan has finished yet\n")
            session.step()
            assert _get(exporter.port, "/healthz")[::2] == (200, "ok\n")
            stale = wait_for(lambda: (r := _get(exporter.port, "/healthz"))[0] == 503 and r, 30, "/healthz stale")
            assert stale[2].startswith("stale: the last scan finished "), stale
            assert stale[2].endswith("one is due every 0.1s\n"), stale
            session.step()
            assert _get(exporter.port, "/healthz")[::2] == (200, "ok\n")
        finally:
            exporter.stop()


def test_a_key_under_a_passphrase_is_refused_without_a_prompt(pki: Path, tmp_path: Path) -> None:
    _openssl("pkey", "-in", str(pki / "server.key"), "-aes256", "-passout", "pass:abc", "-out", "enc.key", cwd=tmp_path)
    text = f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {tmp_path / 'enc.key'}\n"
    res = run_cli("watch", "--serve-metrics", "127.0.0.1:0", "--web-config", _config(tmp_path, text), exit=2)
    assert "the key is under a passphrase" in res.stderr
