"""SMG gateways running on this host, found by their process title.

``smg launch`` renames itself ``smg::router`` (setproctitle), which overwrites its argv
*and* its environment in /proc (smg-facts §5.5): its flags and ``SMG_MM_*`` variables
cannot be read back. What /proc still tells is who it is (pid, uid, namespaces, start
time), which TCP ports it listens on (its socket inodes matched against the LISTEN rows
of its own network namespace's /proc/PID/net/tcp{,6}), and which regular files it
writes (its stdout, stderr or --log-dir file: the start-up log with the transport
line). Which port is which is decided by asking each one, never by number.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from smgshm.core.address import dial_host
from smgshm.core.closed import Closed
from smgshm.core.errors import SmgshmError
from smgshm.core.fanout import fan_out
from smgshm.core.host.proc import innermost_pid

GATEWAY_TITLE = "smg::router"
_TCP_LISTEN = "0A"
_MAX_FDS = 65536  # a process with more fds than this is not walked further (bounded work)


@dataclass(frozen=True)
class ListeningPort:
    address: str  # as bound: 127.0.0.1, 0.0.0.0, ::, ...
    port: int
    role: str  # http (GET /workers answers JSON) | metrics (GET /metrics is Prometheus) | other | unknown
    detail: str = ""


@dataclass(frozen=True, order=True)
class OpenLog:
    fd: int  # /proc/PID/fd/FD opens the very file, even from another mount namespace
    path: str  # as the gateway's mount namespace names it


@dataclass(frozen=True)
class GatewayProcess:
    """One ``smg::router`` process, as far as this process may look at it."""

    pid: int
    ns_pid: int | None  # its pid inside its own pid namespace: the pid in its segment names
    uid: int | None
    pid_namespace: str
    same_pid_namespace: bool | None
    net_namespace: str
    same_net_namespace: bool | None
    uptime_s: float | None
    ports: list[ListeningPort] = field(default_factory=list)
    http_url: str = ""
    metrics_url: str = ""
    logs: list[OpenLog] = field(default_factory=list)  # regular files it has open for writing
    inspect: str = "ok"  # how far it could be inspected (an Inspect)
    note: str = ""


class Inspect(Closed):
    """How far a gateway process could be inspected."""

    OK = "ok"
    PARTIAL = "partial"
    PERMISSION_DENIED = "permission_denied"
    GONE = "gone"


def _read(path: str, limit: int = 1 << 16) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def _is_gateway(proc: str, pid: int) -> bool:
    try:
        comm = _read(f"{proc}/{pid}/comm").strip()
        if comm == GATEWAY_TITLE:
            return True
        argv0 = _read(f"{proc}/{pid}/cmdline", 4096).split("\0", 1)[0]
    except OSError:
        return False
    return argv0.strip() == GATEWAY_TITLE


def _status(proc: str, pid: int) -> dict[str, str]:
    out = {}
    for line in _read(f"{proc}/{pid}/status").splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def _uptime_s(proc: str, pid: int) -> float | None:
    try:
        raw = _read(f"{proc}/{pid}/stat")
        # Field 22 (starttime, clock ticks after boot); the comm before it may hold spaces and ')'.
        start_ticks = int(raw.rpartition(")")[2].split()[19])
        since_boot = float(_read(f"{proc}/uptime").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, since_boot - start_ticks / os.sysconf("SC_CLK_TCK"))


def _ns(proc: str, pid: int | str, kind: str) -> str:
    try:
        return os.readlink(f"{proc}/{pid}/ns/{kind}")
    except OSError:
        return ""


def _fds(proc: str, pid: int) -> tuple[set[int], dict[int, str]]:
    """(socket inodes, {fd: path} of regular files open for writing) of ``pid``; OSError when not ours.

    One fd per file (its lowest), however many fds or hard links name it: each is read once."""
    sockets: set[int] = set()
    logs: dict[tuple[int, int], tuple[int, str]] = {}  # by (st_dev, st_ino)
    fd_dir = f"{proc}/{pid}/fd"
    for i, name in enumerate(os.listdir(fd_dir)):
        if i >= _MAX_FDS:
            break
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:[") and target.endswith("]"):
            with contextlib.suppress(ValueError):
                sockets.add(int(target[8:-1]))
        elif target.startswith("/") and name.isdigit():
            key = _written_file(proc, pid, name)
            if key is not None and (key not in logs or int(name) < logs[key][0]):
                logs[key] = (int(name), target)
    return sockets, dict(logs.values())


def _written_file(proc: str, pid: int, fd: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the regular file ``fd`` has open for writing; None when it is not one."""
    try:
        flags = _read(f"{proc}/{pid}/fdinfo/{fd}").split("flags:", 1)[1].split()[0]
        st = os.stat(f"{proc}/{pid}/fd/{fd}")  # the magic link: the open file itself
        writes = int(flags, 8) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    except (OSError, IndexError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) and writes else None


def _hex_address(text: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian here) byte order."""
    raw = bytes.fromhex(text)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


def listening_ports(proc: str, pid: int, inodes: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket of ``pid`` in LISTEN, from its own netns's tables."""
    out: set[tuple[str, int]] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = _read(f"{proc}/{pid}/net/{table}", 1 << 24).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != _TCP_LISTEN:
                continue
            try:
                inode = int(f[9])
                addr, _, port = f[1].partition(":")
                if inode in inodes:
                    out.add((_hex_address(addr), int(port, 16)))
            except ValueError:
                continue
    return sorted(out, key=lambda a: (a[1], a[0]))


def classify_port(address: str, port: int, timeout_s: float = 2.0) -> ListeningPort:
    """Ask the port what it is: SMG's HTTP API answers GET /workers with JSON, its
    Prometheus listener answers GET /metrics with exposition text. No credential is sent."""
    from smgshm.core.gateway.http import PeerJsonError, loads_json, request
    from smgshm.core.gateway.metrics import parse_metrics

    base = f"http://{dial_host(address)}:{port}"
    try:
        r = request(
            "GET", base + "/workers", headers={"Accept": "application/json"}, deadline_s=timeout_s, max_bytes=4 << 20
        )
        if r.status in (401, 403):
            return ListeningPort(address, port, "http", "GET /workers needs the gateway's --api-key")
        if r.status == 200:
            with contextlib.suppress(PeerJsonError):
                doc = loads_json(r.body)
                if isinstance(doc, dict) and isinstance(doc.get("workers"), list):
                    return ListeningPort(address, port, "http", f"{len(doc['workers'])} worker(s) registered")
        r = request(
            "GET", base + "/metrics", headers={"Accept": "text/plain"}, deadline_s=timeout_s, max_bytes=16 << 20
        )
        if r.status == 200:
            snap = parse_metrics(r.text(), r.url)
            if any(n.startswith("smg_") for n, _ in snap.samples):
                return ListeningPort(address, port, "metrics", f"{len(snap.samples)} samples")
    except SmgshmError as err:
        return ListeningPort(address, port, "unknown", err.what)
    return ListeningPort(address, port, "other", "neither SMG's HTTP API nor its metrics")


def inspect_gateway(pid: int, proc: str = "/proc", timeout_s: float = 2.0, probe: bool = True) -> GatewayProcess:
    """Everything /proc lets this process learn about gateway ``pid``; never a guess."""
    try:
        st = _status(proc, pid)
        uid: int | None = int(st.get("Uid", "").split()[0])
    except (OSError, ValueError, IndexError):
        return GatewayProcess(pid, None, None, "", None, "", None, None, inspect="gone", note="exited while inspected")
    try:
        ns_pid = innermost_pid(pid, proc)
    except OSError:
        return GatewayProcess(pid, None, None, "", None, "", None, None, inspect="gone", note="exited while inspected")
    pid_ns, net_ns = _ns(proc, pid, "pid"), _ns(proc, pid, "net")
    my_pid_ns, my_net_ns = _ns(proc, "self", "pid"), _ns(proc, "self", "net")
    same_pid = (pid_ns == my_pid_ns) if pid_ns and my_pid_ns else None
    same_net = (net_ns == my_net_ns) if net_ns and my_net_ns else None
    base = GatewayProcess(pid, ns_pid, uid, pid_ns, same_pid, net_ns, same_net, _uptime_s(proc, pid))
    try:
        inodes, logs = _fds(proc, pid)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM):
            return replace(
                base,
                inspect="permission_denied",
                note=f"its fds are not readable by uid {os.getuid()}: ports and logs unknown "
                f"(run as root or as uid {uid})",
            )
        return replace(base, inspect="gone", note="exited while inspected")
    found = listening_ports(proc, pid, inodes)
    notes = []
    if same_pid is False:
        notes.append(f"in another pid namespace (pid {ns_pid} there)")
        if ns_pid == 1:
            # SMG's orphan sweep skips its own pid: as pid 1 it never sweeps an earlier pid 1's segments.
            notes.append("as pid 1 its orphan sweep never removes a previous pid-1 gateway's segments")
    if same_net is False or not probe:
        ports = [ListeningPort(a, p, "unknown") for a, p in found]
        if same_net is False:
            notes.append("in another network namespace: its ports are not reachable here as loopback")
    else:
        ports = fan_out(lambda ap: classify_port(ap[0], ap[1], timeout_s), found, 8, "smgshm-ports")
    http = next((p for p in ports if p.role == "http"), None)
    metrics = next((p for p in ports if p.role == "metrics"), None)
    return replace(
        base,
        ports=ports,
        http_url=f"http://{dial_host(http.address)}:{http.port}" if http else "",
        metrics_url=f"http://{dial_host(metrics.address)}:{metrics.port}/metrics" if metrics else "",
        # One fd per file, the lowest (stdout, stderr) first: the start-up line is in either.
        logs=sorted(OpenLog(fd, path) for path, fd in {p: f for f, p in sorted(logs.items(), reverse=True)}.items()),
        inspect="partial" if same_net is False else "ok",
        note="; ".join(notes),
    )


def gateway_pids(proc: str = "/proc") -> list[int]:
    """The pids of every live ``smg::router`` process visible in ``proc`` (zombies skipped), in order."""
    out = []
    for entry in os.listdir(proc):
        if not (entry.isascii() and entry.isdigit()):
            continue
        pid = int(entry)
        if not _is_gateway(proc, pid):
            continue
        try:
            state = _status(proc, pid).get("State", "")
        except OSError:
            continue
        if state[:1] in ("Z", "X"):
            continue  # exited, waiting for its parent: no gateway any more
        out.append(pid)
    return sorted(out)


def not_a_gateway(pid: int, proc: str = "/proc") -> str | None:
    """Why ``pid`` names no SMG gateway here, in a sentence that names it; None when it is one.

    For an argument a person typed (``--gateway-pid``): the caller makes it a usage error. The
    process's name is a stranger's string (anyone may title a process): the caller escapes it.
    """
    if not os.path.isdir(f"{proc}/{pid}"):
        return f"no process has pid {pid} (in this pid namespace)"
    if not _is_gateway(proc, pid):
        try:
            comm = _read(f"{proc}/{pid}/comm").strip()
        except OSError:
            return f"no process has pid {pid} (in this pid namespace)"  # it ended just now
        return f"pid {pid} ({comm}) is not an SMG gateway (process title {GATEWAY_TITLE})"
    try:
        state = _status(proc, pid).get("State", "")
    except OSError:
        state = "X"
    if state[:1] in ("Z", "X"):
        return f"SMG gateway pid {pid} has exited"
    return None


def find_gateways(
    proc: str = "/proc", timeout_s: float = 2.0, probe: bool = True, pids: Iterable[int] | None = None
) -> list[GatewayProcess]:
    """Every live ``smg::router`` process visible in ``proc`` (only those of ``pids`` when given), each
    inspected (zombies skipped). Anyone can title a process so: the ones not asked for are not looked
    at, and the rest are inspected side by side, so that each one's ports cost their own timeout only."""
    want = None if pids is None else set(pids)
    chosen = [pid for pid in gateway_pids(proc) if want is None or pid in want]
    return fan_out(lambda pid: inspect_gateway(pid, proc, timeout_s, probe), chosen, 8, "smgshm-gateways")


class GatewayChoiceError(SmgshmError):
    """Several gateways run here and the caller did not say which: a usage problem, never a guess."""

    kind = "ambiguous_gateway"


def choose_running(found: list[GatewayProcess], pid: int | None = None) -> GatewayProcess:
    """The one gateway on this host that can be tested by URL (``pid`` picks among several).

    TransportError when none can (none runs, or none has an HTTP port reachable from here);
    GatewayChoiceError when several can and ``pid`` is not given.
    """
    from smgshm.core.errors import TransportError

    if pid is not None:
        g = next((g for g in found if g.pid == pid), None)
        if g is None:
            raise TransportError("no SMG gateway (smg::router) runs here with that pid", pid=pid)
        if not g.http_url:
            raise TransportError(
                f"gateway pid {pid} has no HTTP port reachable from here",
                pid=pid,
                hint=g.note or "its ports were not recognised as SMG's",
            )
        return g
    usable = [g for g in found if g.http_url]
    if len(usable) == 1:
        return usable[0]
    if usable:
        pids = ", ".join(str(g.pid) for g in usable)
        raise GatewayChoiceError(
            f"{len(usable)} SMG gateways run here (pids {pids}): say which",
            pids=pids,
            hint="pass --gateway-pid PID, or --gateway URL",
        )
    unusable = "; ".join(f"pid {g.pid}: {g.note or g.inspect}" for g in found)
    raise TransportError(
        "no SMG gateway (smg::router) with an HTTP port reachable from here runs on this host"
        + (f" ({unusable})" if unusable else ""),
        hint="smgshm e2e (without --running) starts the embedded default",
    )
