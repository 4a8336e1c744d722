"""The exporter's least-privilege form, proven in a real containerd over CRI (Debian's containerd 1.6 with
runc, the harness of tests/support/cri): uid 65532, capabilities dropped but SYS_PTRACE and
DAC_READ_SEARCH, file capabilities on the interpreter the entrypoint names, a read-only root
filesystem, seccomp RuntimeDefault, hostPID, and the node root mounted as
deploy/k8s/exporter-daemonset.yaml mounts it (read-only hostPaths, HostToContainer on the kubelet's
pods dir and containerd's sandboxes dir).

No image is built: the container is the harness's busybox image with the host's Python bound in
read-only (/usr, the interpreter's prefix, the venv's site-packages, this checkout), and a copy of the
interpreter carrying file capabilities (``security.capability``) as the image's /opt/smgshm/bin/python3
does (deploy/Containerfile).

What containerd 1.6.20 + runc 1.1.5 did here (test_capability_matrix asserts each row): the added
capabilities go into the bounding, permitted, effective and inheritable sets of the spec, never the
ambient one. uid 0 keeps them across the entrypoint's exec; a non-root uid runs its entrypoint with
none effective unless that binary carries file capabilities, and then it gets exactly them, with
``allowPrivilegeEscalation: false`` (no_new_privs) as well as without: runc hands the container's
first process the added capabilities in its permitted set before it execs, so under no_new_privs the
file's capabilities are not a gain (the kernel intersects them with that permitted set) and survive.
The DaemonSet therefore keeps ``allowPrivilegeEscalation: false``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import run_cli
from tests.support.cri.containerd import Containerd, containerd_marks, running_containerd
from tests.support.cri.image import IMAGE
from tests.support.cri.kubelet import Container, HostMount, Kubelet, Pod, Security
from tests.support.node import PID1_UNREADABLE

pytestmark = [
    pytest.mark.root,
    *containerd_marks("runs containerd, mounts tmpfs, sets file capabilities"),
]


NONROOT = 65532  # the image's smgshm user (deploy/Containerfile)
PRODUCER = 1000  # the pods' engines: another uid, 0600 segments
CAPS = ("SYS_PTRACE", "DAC_READ_SEARCH")  # what the node view needs, as measured below
_CAP_BIT = {"DAC_READ_SEARCH": 2, "FOWNER": 3, "SYS_PTRACE": 19}
RECLAIM_CAPS = (*CAPS, "FOWNER")  # the reclaim CronJob's: FOWNER unlinks another uid's file in a sticky dir
SANDBOXES = "run/containerd/io.containerd.grpc.v1.cri/sandboxes"

# busybox sh: w DIR PID SEQ writes one 4 KiB segment named as SMG's gateway names it (see
# test_node_containerd.py); umask 077 makes it 0600, the producer's own.
W = (
    "umask 077; "
    'w() { dd if=/dev/zero of="$1/smg-tokenspeed-$2-$(date +%s)000000000-$3" bs=4096 count=1 2>/dev/null; }; '
)
# The dead child's pid, after pids burnt: past the host's kernel threads (pids 1 to about 90 here), so
# it names no live host process (see _comparable).
DEAD_CHILD = "for i in $(seq 120); do /bin/true; done; sh -c '" + W + "w /dev/shm $$ 0'; "
FOREVER = "exec sleep 2000000000"

# Run by the capped interpreter in the container: its own capability sets and flags, and what it may do
# to a host dir through /proc/<pid>/root.
_PROBE = """
import json, os, sys
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
out = {k: status[k].strip() for k in ("Uid", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")}
for arg in sys.argv[1:]:  # create:PATH makes a new file (then removes it); append:PATH opens one to write
    how, _, target = arg.partition(":")  # unlink:PATH removes one
    try:
        if how == "unlink":
            os.unlink(target)
            out[arg] = "unlinked"
            continue
        flags = os.O_WRONLY | (os.O_CREAT | os.O_EXCL if how == "create" else os.O_APPEND)
        os.close(os.open(target, flags, 0o644))
        if how == "create":
            os.unlink(target)
        out[arg] = "written"
    except OSError as e:
        out[arg] = os.strerror(e.errno)
print(json.dumps(out))
"""


def _file_caps(caps: Sequence[str]) -> bytes:
    """``security.capability`` v2 (what ``setcap CAPS+ep`` writes): the effective bit, permitted ``caps``."""
    mask = sum(1 << _CAP_BIT[c] for c in caps)
    return struct.pack("<IIIII", 0x02000000 | 1, mask & 0xFFFFFFFF, 0, mask >> 32, 0)


@dataclass
class Node:
    containerd: Containerd
    kubelet: Kubelet
    root: Path  # the node root: containerd's state dir and the kubelet's dirs are below it
    bin: Path  # interpreter copies (plain and capped) and the entrypoint, bound at /opt/smgshm/bin
    scratch: Path


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """A private containerd, the kubelet stand-in and the exporter's bin dir, for the module."""
    base = Path(tempfile.mkdtemp(prefix="cri-lp-"))
    with running_containerd(base) as ctd:
        kubelet = Kubelet(ctd.sock, ctd.node_root)
        try:
            bindir = base / "bin"  # on /'s filesystem: not nosuid, so file capabilities apply
            bindir.mkdir()
            real = os.path.realpath(sys.executable)
            for name, caps in (
                ("python3-plain", ()),
                ("python3", CAPS),
                ("python3-ptrace", CAPS[:1]),
                ("python3-dac", CAPS[1:]),
                ("python3-reclaim", RECLAIM_CAPS),
            ):
                shutil.copy2(real, bindir / name)
                if caps:
                    os.setxattr(bindir / name, "security.capability", _file_caps(caps))
            # the image's entrypoint: a console script whose shebang names the capped interpreter
            for name, interp in (
                ("smgshm", "python3"),
                ("smgshm-ptrace", "python3-ptrace"),
                ("smgshm-dac", "python3-dac"),
                ("smgshm-plain", "python3-plain"),
                ("smgshm-reclaim", "python3-reclaim"),
            ):
                (bindir / name).write_text(
                    f"#!/opt/smgshm/bin/{interp}\nimport sys\nfrom smgshm.cli import main\nsys.exit(main())\n"
                )
                (bindir / name).chmod(0o755)
            (bindir / "probe.py").write_text(_PROBE)
            # The kubelet keeps its pods dir and each pod's dir 0750 root: no other uid may list them.
            kubelet.pods_dir.chmod(0o750)
            # A HostToContainer mount needs a shared source, as a real node's / is (systemd's); this
            # VM's / is private, so the sandboxes dir is made a shared mount of its own (bound on itself).
            sandboxes = ctd.node_root / SANDBOXES
            sandboxes.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(sandboxes), str(sandboxes)], check=True, timeout=30)
            subprocess.run(["mount", "--make-shared", str(sandboxes)], check=True, timeout=30)
            scratch = base / "scratch"
            scratch.mkdir()
            yield Node(ctd, kubelet, ctd.node_root, bindir, scratch)
        finally:
            kubelet.close()


# -- the exporter's container ---------------------------------------------------------------------------


def security(uid: int, add: Sequence[str] = CAPS, *, no_new_privs: bool = True) -> Security:
    """The DaemonSet's securityContext: drop ALL, add ``add``, allowPrivilegeEscalation false (no_new_privs),
    readOnlyRootFilesystem, seccomp RuntimeDefault; runAsUser/runAsGroup ``uid``."""
    return Security(
        run_as_user=uid,
        run_as_group=uid,
        add=tuple(add),
        drop=("ALL",),
        no_new_privs=no_new_privs,
        readonly_rootfs=True,
        seccomp_runtime_default=True,
    )


ROOT_FORM = security(0, ("SYS_PTRACE",))  # the DaemonSet before: uid 0, SYS_PTRACE only
LEAST = security(NONROOT)  # the DaemonSet now


def _mounts(node: Node, state: Path, extra: Sequence[HostMount] = (), *, python: bool = True) -> list[HostMount]:
    """The host's Python, read-only (unless the image has its own); the node root as the DaemonSet (and
    its containerd overlay) mounts it under /host; the state volume (an emptyDir's 0777 dir)."""
    r = node.root
    py = [
        HostMount("/usr", Path("/usr")),
        HostMount("/lib", Path("/usr/lib")),  # bookworm's merged /usr: /lib and /lib64 are links there
        HostMount("/lib64", Path("/usr/lib64")),
        HostMount(sys.base_prefix, Path(sys.base_prefix)),  # the interpreter's stdlib and libpython
        HostMount("/opt/site", Path(sysconfig.get_paths()["purelib"])),
        HostMount("/opt/src", Path(__file__).resolve().parents[2]),
        HostMount("/opt/smgshm/bin", node.bin),
    ]
    host = [
        HostMount("/host/var/lib/kubelet/pods", r / "var/lib/kubelet/pods", host_to_container=True),
        HostMount("/host/var/log/pods", r / "var/log/pods"),
        HostMount("/host/dev/shm", r / "dev/shm"),
        HostMount(f"/host/{SANDBOXES}", r / SANDBOXES, host_to_container=True),
    ]
    return [*(py if python else []), *host, HostMount("/var/lib/smgshm", state, readonly=False), *extra]


_runs = iter(range(1_000_000))


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str
    container: Container

    def json(self) -> Any:
        assert self.stdout.strip(), f"exit {self.exit_code}, no output; stderr:\n{self.stderr}"
        return json.loads(self.stdout)


def run(
    node: Node, pod: Pod, sec: Security, command: Sequence[str], extra: Sequence[HostMount] = (), image: str = ""
) -> Run:
    """``command`` in a container of the exporter's pod with ``sec``, to its end; its stdout and stderr
    from the CRI log. ``image``: the node image imported (its own Python), else busybox with the host's."""
    k = node.kubelet
    n = next(_runs)
    state = node.scratch / f"state-{n}"
    state.mkdir()
    state.chmod(0o777)  # as the kubelet makes an emptyDir
    env = {
        "PATH": "/opt/smgshm/bin:/bin",
        "PYTHONPATH": "/opt/src:/opt/site",
        "PYTHONDONTWRITEBYTECODE": "1",
        "SMGSHM_STATE_DIR": "/var/lib/smgshm/state",
        "COLUMNS": "400",
    }
    mounts = _mounts(node, state, extra, python=not image)
    if image:  # the image's own PATH and Python
        env = {"SMGSHM_STATE_DIR": env["SMGSHM_STATE_DIR"], "COLUMNS": "400"}
    c = k.start_container(
        pod,
        f"exporter-{n}",
        "",
        command=command,
        envs=env,
        host_mounts=mounts,
        security=sec,
        image=image or IMAGE,
    )
    status = k.wait_exited(c, timeout=120)
    streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
    if c.log.exists():
        for line in c.log.read_text().splitlines():
            _ts, stream, tag, text = [*line.split(" ", 3), ""][:4]
            streams[stream].append(text + ("\n" if tag == "F" else ""))
    return Run(status.exit_code, "".join(streams["stdout"]), "".join(streams["stderr"]), c)


def gc_node_in(node: Node, pod: Pod, sec: Security, entry: str = "smgshm") -> Run:
    return run(node, pod, sec, [f"/opt/smgshm/bin/{entry}", "--json", "gc", "--node", "--node-root", "/host"])


def probe(
    node: Node, pod: Pod, sec: Security, interp: str = "python3", *targets: str, extra: Sequence[HostMount] = ()
) -> dict[str, Any]:
    got = run(node, pod, sec, [f"/opt/smgshm/bin/{interp}", "/opt/smgshm/bin/probe.py", *targets], extra)
    assert got.exit_code == 0, got.stderr
    doc: dict[str, Any] = got.json()
    return doc


def verdicts(doc: dict[str, Any], pods: Sequence[Pod]) -> dict[tuple[str, str, str], str]:
    """(pod uid, tmpfs kind, segment name) -> state, for the test's own pods."""
    uids = {p.uid for p in pods}
    return {
        (t["pod_uid"], t["kind"], s["name"]): s["state"]
        for t in doc["result"]["tmpfs"]
        if t["pod_uid"] in uids
        for s in t["segments"]
    }


@pytest.fixture(scope="module")
def exporter_pod(node: Node) -> Pod:
    """The exporter's pod: hostPID, as the DaemonSet's. Its containers run one command each."""
    return node.kubelet.run_pod("smgshm", "smgshm-exporter-lp", host_pid=True)


@dataclass
class Workload:
    pods: list[Pod]
    truth: dict[tuple[str, str, str], str]  # gc --node's verdicts run as root on the host itself


def _private(pod: Pod) -> None:
    """The kubelet's modes: a pod's dir and its volumes dir 0750 root."""
    pod.kubelet_dir.chmod(0o750)
    if (pod.kubelet_dir / "volumes").is_dir():
        (pod.kubelet_dir / "volumes").chmod(0o750)


@pytest.fixture(scope="module")
def workload(node: Node) -> Workload:
    """Pods whose engines run as uid 1000 with 0600 segments: a gateway that wrote a segment and died
    (pid 1 of its container gone: leaked), an engine alive on its memory emptyDir with a dead child's
    segment beside its own, and one on containerd's sandbox shm likewise."""
    k = node.kubelet
    (node.root / "dev/shm").mkdir(parents=True, exist_ok=True)
    producer = Security(run_as_user=PRODUCER, run_as_group=PRODUCER)
    dead = k.run_pod("team-a", "gateway-lp-0")
    dshm = k.empty_dir(dead, "dshm", "16m")
    _private(dead)
    c = k.start_container(dead, "gateway", W + "w /dev/shm $$ 0; exit 1", mounts={"/dev/shm": dshm}, security=producer)
    k.wait_exited(c)
    live = k.run_pod("team-b", "engine-lp-0")
    dshm = k.empty_dir(live, "dshm", "16m")
    _private(live)
    c = k.start_container(
        live,
        "engine",
        W + "w /dev/shm $$ 0; " + DEAD_CHILD + "echo ready; " + FOREVER,
        mounts={"/dev/shm": dshm},
        security=producer,
    )
    k.wait_logged(c, "ready")
    sandbox = k.run_pod("team-c", "sidecar-lp-0")
    _private(sandbox)
    c = k.start_container(
        sandbox, "engine", W + "w /dev/shm $$ 0; " + DEAD_CHILD + "echo ready; " + FOREVER, security=producer
    )
    k.wait_logged(c, "ready")
    pods = [dead, live, sandbox]
    doc: dict[str, Any] = run_cli("--json", "gc", "--node", "--node-root", str(node.root)).json
    return Workload(pods, verdicts(doc, pods))


# -- what containerd does with each combination ------------------------------------------------------------


def _mask(caps: Sequence[str]) -> int:
    return sum(1 << _CAP_BIT[c] for c in caps)


def _caps(status: dict[str, Any]) -> dict[str, int]:
    return {k: int(status[k], 16) for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")}


@pytest.mark.parametrize("no_new_privs", [False, True], ids=["escalation-allowed", "no-new-privs"])
@pytest.mark.parametrize("uid", [0, NONROOT], ids=["uid0", "nonroot"])
def test_capability_matrix(node: Node, exporter_pod: Pod, uid: int, no_new_privs: bool) -> None:
    """What containerd 1.6 over CRI (and runc) gives the entrypoint for each combination of uid,
    capabilities add and allowPrivilegeEscalation, with and without file capabilities on it."""
    want = _mask(CAPS)
    sec = security(uid, no_new_privs=no_new_privs)
    plain = probe(node, exporter_pod, sec, "python3-plain")
    capped = probe(node, exporter_pod, sec, "python3")
    for got in (plain, capped):
        assert got["Uid"].split() == [str(uid)] * 4
        assert (got["NoNewPrivs"], got["Seccomp"]) == (str(int(no_new_privs)), "2")  # 2: a filter
        assert _caps(got)["CapBnd"] == want  # drop ALL, add CAPS: the bounding set is exactly them
        assert _caps(got)["CapAmb"] == 0  # CRI's add never reaches the ambient set
    # uid 0 keeps the added capabilities across exec, file capabilities or not.
    # A non-root uid keeps none without file capabilities (no ambient set), and with them gets exactly
    # them, under no_new_privs too: runc's init holds the added ones in its permitted set at exec, so
    # the file's are no gain and the kernel lets them through.
    assert _caps(plain)["CapEff"] == _caps(plain)["CapPrm"] == (want if uid == 0 else 0)
    assert _caps(capped)["CapEff"] == _caps(capped)["CapPrm"] == want


@pytest.mark.parametrize("no_new_privs", [False, True], ids=["escalation-allowed", "no-new-privs"])
@pytest.mark.parametrize("uid", [0, NONROOT], ids=["uid0", "nonroot"])
def test_file_capabilities_beyond_the_bounding_set_fail_the_exec(
    node: Node, exporter_pod: Pod, uid: int, no_new_privs: bool
) -> None:
    """An exec of a binary whose file capabilities (effective bit set) the bounding set cuts is refused
    with EPERM (capabilities(7): the check for capability-dumb binaries), for uid 0 too: the image's
    file capabilities and a pod's add list must agree, or the container does not start. So the image
    keeps them off its default entrypoint (preflight and the others drop ALL) and on the exporter's own."""
    got = run(
        node,
        exporter_pod,
        security(uid, CAPS[:1], no_new_privs=no_new_privs),
        ["/opt/smgshm/bin/python3", "-c", "pass"],
    )
    assert got.exit_code != 0
    assert "operation not permitted" in got.stderr.lower(), got.stderr
    # the uncapped copy runs in the same container settings
    assert (
        probe(node, exporter_pod, security(uid, CAPS[:1], no_new_privs=no_new_privs), "python3-plain")["Seccomp"] == "2"
    )


def _comparable(key: tuple[str, str, str], w: Workload) -> bool:
    """Whether a container's verdict on this segment can equal the host's here. On this VM (pid 1
    unreadable) a container cannot tell the host's mount namespace, so the host's processes may reach
    every tmpfs and a dead producer's pid that is alive in the host's pid namespace reads unknown (never
    alive): the dead gateway's pid 1 always (test_in_a_container_the_dead_pid1_gateway_is_never_called_alive),
    a dead child's pid when the host has one so numbered. Elsewhere, every segment."""
    if not PID1_UNREADABLE or w.truth[key] != "leaked":
        return True
    pid = key[2].split("-")[2]
    return key[0] != w.pods[0].uid and not os.path.exists(f"/proc/{pid}")


def _assert_truth(w: Workload) -> None:
    """The host's own root run judged the test's pods as they are (each verdict could fail)."""
    dead, live, sandbox = w.pods
    assert sorted(v for k, v in w.truth.items() if k[0] == dead.uid) == ["leaked"]
    assert sorted(v for k, v in w.truth.items() if k[0] == live.uid) == ["in_flight", "leaked"]
    assert {k[1] for k in w.truth if k[0] == live.uid} == {"empty_dir"}
    assert sorted(v for k, v in w.truth.items() if k[0] == sandbox.uid) == ["in_flight", "leaked"]


def test_least_privilege_exporter_judges_every_pod_as_root_does(
    node: Node, exporter_pod: Pod, workload: Workload
) -> None:
    """uid 65532, SYS_PTRACE and DAC_READ_SEARCH by file capabilities, no_new_privs, in the DaemonSet's
    mounts: the verdict root gives on the host itself for every segment of every pod (but the case
    below, which root in a container misjudges alike). The DaemonSet's former form, uid 0 with SYS_PTRACE
    alone, judged less: uid 1000's live producers could not be read (no DAC_READ_SEARCH: /proc/PID/fd is
    0500 its owner's), so their pods' segments were all unknown."""
    _assert_truth(workload)
    least = gc_node_in(node, exporter_pod, LEAST)
    assert least.exit_code == 0, least.stderr
    seen = verdicts(least.json(), workload.pods)
    assert seen.keys() == workload.truth.keys()
    dead, live, sandbox = workload.pods
    compared = [key for key in workload.truth if _comparable(key, workload)]
    assert len(compared) >= 3, compared  # both live producers' and a dead child's at least
    for key in compared:
        assert seen[key] == workload.truth[key], (key, seen)
    for key in workload.truth.keys() - set(compared):
        assert seen[key] == "unknown", (key, seen)  # leaked on the host; never alive from here
    former = gc_node_in(node, exporter_pod, ROOT_FORM, "smgshm-plain")  # the former image: no file caps
    assert former.exit_code == 0, former.stderr
    judged = verdicts(former.json(), workload.pods)
    assert {v for k, v in judged.items() if k[0] in (live.uid, sandbox.uid)} == {"unknown"}, judged
    assert judged[next(k for k in judged if k[0] == dead.uid)] == seen[next(k for k in seen if k[0] == dead.uid)]


def test_in_a_container_the_dead_pid1_gateway_is_never_called_alive(
    node: Node, exporter_pod: Pod, workload: Workload
) -> None:
    """The dead gateway's segment (its pid 1 gone) is leaked where the host's mount namespace can be read
    (pid 1's, with SYS_PTRACE and hostPID: a real node). On this VM pid 1 cannot be read, and the host's
    processes, whose / is not the node root here, reach each pod's tmpfs through a mount at
    ``<prefix>/var/lib/kubelet/pods/...``: whether that is the host's own mount or a way in cannot be told,
    so pid 1, alive in the host's pid namespace, leaves the segment unknown (it was in_flight, producer
    alive), said with what could not be read, and the node view says it is blind there (``unseen``)."""
    dead = workload.pods[0]
    got = gc_node_in(node, exporter_pod, LEAST)
    doc = got.json()
    seen = verdicts(doc, [dead])
    if not PID1_UNREADABLE:
        assert list(seen.values()) == ["leaked"]
        return
    assert list(seen.values()) == ["unknown"], seen
    seg = next(s for t in doc["result"]["tmpfs"] if t["pod_uid"] == dead.uid for s in t["segments"])
    assert seg["producer_alive"] is None, seg
    assert "/proc/1/ns/mnt" in seg["reason"], seg
    assert "host's mount namespace is not known" in seg["reason"], seg
    blind = doc["result"]["unseen"]
    assert [u["reason"] for u in blind] == ["host_mnt"], blind
    assert "/proc/1/ns/mnt" in blind[0]["message"]
    # The dead children's segments beside live producers are leaked in any case: the blindness hides no leak.
    check = run(
        node, exporter_pod, LEAST, ["/opt/smgshm/bin/smgshm", "gc", "--node", "--node-root", "/host", "--check"]
    )
    assert check.exit_code == 3, check.stderr


def test_a_view_of_the_hosts_root_in_another_container_never_makes_a_dead_producer_alive(
    node: Node, exporter_pod: Pod, workload: Workload
) -> None:
    """A hostPID container with the DaemonSet's mounts under /rootfs (a view of the host's /, as a node
    agent mounts it) reaches every pod's tmpfs as the host does, and could write through it. gc --node
    on the host while it runs: pid 1, alive in its pid namespace (the host's), leaves the dead gateway's
    segment unknown, the view named (it read in_flight before); the live producers stay in_flight, the
    dead children leaked."""
    _assert_truth(workload)
    k = node.kubelet
    state = node.scratch / f"state-agent-{next(_runs)}"
    state.mkdir()
    view = [
        HostMount("/rootfs" + m.container_path.removeprefix("/host"), m.host_path, True, m.host_to_container)
        for m in _mounts(node, state, python=False)
        if m.container_path.startswith("/host/")
    ]
    c = k.start_container(exporter_pod, f"agent-{state.name}", "echo ready; " + FOREVER, host_mounts=view)
    try:
        k.wait_logged(c, "ready")
        doc = run_cli("--json", "gc", "--node", "--node-root", str(node.root)).json
    finally:
        k.stop_container(c)
    seen = verdicts(doc, workload.pods)
    dead = workload.pods[0]
    for key, truth in workload.truth.items():
        assert seen[key] == ("unknown" if key[0] == dead.uid else truth), (key, seen)
    seg = next(s for t in doc["result"]["tmpfs"] if t["pod_uid"] == dead.uid for s in t["segments"])
    assert "a view of the host's /" in seg["reason"], seg


@pytest.mark.parametrize(
    ("without", "entry"),
    [("SYS_PTRACE", "smgshm-dac"), ("DAC_READ_SEARCH", "smgshm-ptrace"), ("file capabilities", "smgshm-plain")],
)
def test_each_capability_is_needed(node: Node, exporter_pod: Pod, workload: Workload, without: str, entry: str) -> None:
    """Drop one (from the add list and the entrypoint's file capabilities alike, or the file
    capabilities themselves): the live producers' segments are no longer judged."""
    add = tuple(c for c in CAPS if c != without)
    got = gc_node_in(node, exporter_pod, security(NONROOT, add), entry)
    assert got.exit_code == 0, got.stderr
    doc = got.json()
    seen = verdicts(doc, workload.pods)
    _dead, live, sandbox = workload.pods
    # Without SYS_PTRACE no uid 1000 process can be read (/proc/PID/ns, root, maps); without
    # DAC_READ_SEARCH neither (/proc/PID/fd is 0500 its owner's) and the kubelet's pods dir (0750 root)
    # cannot be listed, so the pods' emptyDirs are not found at all: the node view says it is blind.
    assert "in_flight" not in seen.values()
    assert {v for k, v in seen.items() if k[0] == sandbox.uid} == {"unknown"}
    blind = [u["reason"] for u in doc["result"]["unseen"]]
    if without == "SYS_PTRACE":
        assert {v for k, v in seen.items() if k[0] == live.uid} == {"unknown"}
        assert blind == []
    else:
        assert not [t for t in doc["result"]["tmpfs"] if t["kind"] == "empty_dir"]
        assert blind == ["unreadable"]
        assert doc["result"]["unseen"][0]["message"].startswith("var/lib/kubelet/pods under node root /host")
    check = run(
        node,
        exporter_pod,
        security(NONROOT, add),
        [f"/opt/smgshm/bin/{entry}", "-q", "gc", "--node", "--node-root", "/host", "--check"],
    )
    assert check.exit_code == 6 if blind else check.exit_code in (3, 6), check.exit_code  # unknown; or the leak


def test_least_privilege_exporter_cannot_write_the_host_through_proc_root(node: Node, exporter_pod: Pod) -> None:
    """Through /proc/<pid>/root (hostPID) a process of the host's is a way to the host's /: uid 0 with
    only SYS_PTRACE wrote a root-owned 0755 dir there (the owner's write bit); uid 65532 with SYS_PTRACE
    and DAC_READ_SEARCH reaches it and cannot write (EACCES), and nothing is left behind."""
    target = node.scratch / "host-dir"
    target.mkdir(mode=0o755, exist_ok=True)
    os.chown(target, 0, 0)
    through = f"/proc/{os.getpid()}/root{target}"
    pwned = f"{through}/written-by-the-exporter"
    least = probe(node, exporter_pod, LEAST, "python3", f"create:{pwned}")
    assert least[f"create:{pwned}"] == os.strerror(errno.EACCES), least
    assert not (target / "written-by-the-exporter").exists()
    # the way is real: the former root form wrote there (its probe removed the file at once)
    root = probe(node, exporter_pod, ROOT_FORM, "python3-plain", f"create:{pwned}")
    assert root[f"create:{pwned}"] == "written", root
    assert os.listdir(target) == []


def test_what_the_least_privilege_exporter_can_still_write(node: Node, exporter_pod: Pod, workload: Workload) -> None:
    """Read-only is not recursive: a pod's emptyDir, mounted after the exporter started below its
    read-only HostToContainer mount of the kubelet's pods dir, is writable there. uid 65532 can make a
    file in it (the tmpfs is world-writable, as for any uid on the node) but cannot write a producer's
    0600 segment (no DAC_OVERRIDE, no FOWNER); the read-only mounts themselves refuse (EROFS)."""
    live = workload.pods[1]
    (segment,) = (k[2] for k in workload.truth if k[0] == live.uid and workload.truth[k] == "in_flight")
    dshm = f"/host/var/lib/kubelet/pods/{live.uid}/volumes/kubernetes.io~empty-dir/dshm"
    args = [
        f"create:{dshm}/made-by-the-exporter",
        f"append:{dshm}/{segment}",
        "create:/host/var/log/pods/x",
        "create:/x",
    ]
    got = probe(node, exporter_pod, LEAST, "python3", *args)
    assert [got[a] for a in args] == [
        "written",
        os.strerror(errno.EACCES),
        os.strerror(errno.EROFS),
        os.strerror(errno.EROFS),  # readOnlyRootFilesystem
    ], got
    assert sorted(os.listdir(live.empty_dirs["dshm"])) == sorted(k[2] for k in workload.truth if k[0] == live.uid)


def test_the_npd_dir_is_handed_to_the_exporter_by_an_init_container_with_chown_alone(
    node: Node, exporter_pod: Pod
) -> None:
    """The NPD verdict dir is a hostPath the kubelet makes root-owned 0755 (DirectoryOrCreate): the
    DaemonSet's init container, uid 0 with every capability dropped but CHOWN, gives it to uid 65532,
    which then writes there; without CHOWN uid 0 cannot (EPERM), and before it uid 65532 cannot."""
    npd = node.scratch / "run-smgshm-npd"
    npd.mkdir(mode=0o755)
    os.chown(npd, 0, 0)
    mount = [HostMount("/run/smgshm-npd", npd, readonly=False)]
    verdict = "create:/run/smgshm-npd/gc"
    assert probe(node, exporter_pod, LEAST, "python3", verdict, extra=mount)[verdict] == os.strerror(errno.EACCES)
    chown = ["/bin/chown", f"{NONROOT}:{NONROOT}", "/run/smgshm-npd"]
    without = run(node, exporter_pod, security(0, ()), chown, mount)
    assert without.exit_code != 0
    assert "not permitted" in without.stderr, without.stderr
    assert (npd.stat().st_uid, npd.stat().st_gid) == (0, 0)
    init = run(node, exporter_pod, security(0, ("CHOWN",)), chown, mount)
    assert init.exit_code == 0, init.stderr
    assert (npd.stat().st_uid, npd.stat().st_gid) == (NONROOT, NONROOT)
    assert probe(node, exporter_pod, LEAST, "python3", verdict, extra=mount)[verdict] == "written"


NODE_IMAGE_OCI = os.environ.get("SMGSHM_NODE_IMAGE_OCI", "")


@pytest.mark.skipif(
    not NODE_IMAGE_OCI,
    reason="SMGSHM_NODE_IMAGE_OCI names no OCI archive of the built node image (deploy/build-and-check.sh "
    "builds it; `podman save --format oci-archive` writes one)",
)
def test_the_built_node_image_runs_the_exporter_so(node: Node, exporter_pod: Pod, workload: Workload) -> None:
    """The real image (deploy/Containerfile), imported into containerd: its smgshm-node entrypoint under
    the DaemonSet's securityContext judges as the host's root does; its default entrypoint runs with
    every capability dropped (the file capabilities are on the exporter's interpreter only)."""
    node.containerd.ctr("images", "import", "--snapshotter", "native", NODE_IMAGE_OCI)
    listed = node.containerd.ctr("images", "ls", "-q").stdout.split()
    (image,) = [i for i in listed if "smgshm-node" in i]
    got = run(
        node,
        exporter_pod,
        LEAST,
        ["/opt/smgshm/bin/smgshm-node", "--json", "gc", "--node", "--node-root", "/host"],
        image=image,
    )
    assert got.exit_code == 0, got.stderr
    seen = verdicts(got.json(), workload.pods)
    assert seen.keys() == workload.truth.keys()
    compared = [key for key in workload.truth if _comparable(key, workload)]
    assert len(compared) >= 3, compared  # both live producers' and a dead child's at least
    for key in compared:
        assert seen[key] == workload.truth[key], (key, seen)
    plain = run(node, exporter_pod, security(NONROOT, ()), ["smgshm", "--version"], image=image)
    assert plain.exit_code == 0, plain.stderr
    # the reclaim CronJob's entrypoint starts under its securityContext (its file capabilities within it)
    argv = ["/opt/smgshm/bin/smgshm-reclaim", "--version"]
    reclaim = run(node, exporter_pod, security(NONROOT, RECLAIM_CAPS), argv, image=image)
    assert reclaim.exit_code == 0, reclaim.stderr


# -- the reclaim CronJob (deploy/components/reclaim-cronjob) ----------------------------------------------

RECLAIM = security(NONROOT, RECLAIM_CAPS)  # the CronJob now: uid 65532, smgshm-reclaim
CRONJOB = Path(__file__).resolve().parents[2] / "deploy/components/reclaim-cronjob/cronjob.yaml"
FORMER_RECLAIM = security(0, ("SYS_PTRACE", "FOWNER"))  # the CronJob before: uid 0


def _reclaim(node: Node, pod: Pod, sec: Security, entry: str) -> Run:
    """The CronJob's args (--min-age 0: the leaks here are seconds old, and each run's state dir is new)."""
    argv = ["--json", "gc", "--node", "--node-root", "/host", "--delete", "--yes", "--all-users", "--min-age", "0"]
    return run(node, pod, sec, [f"/opt/smgshm/bin/{entry}", *argv])


def _tmpfs_dirs(node: Node, w: Workload) -> list[Path]:
    live = w.pods[1]
    return [live.kubelet_dir / "volumes/kubernetes.io~empty-dir/dshm", *(node.root / SANDBOXES).glob("*/shm")]


def test_the_reclaim_cronjobs_form_deletes_dead_producers_segments_of_another_uid_and_keeps_live_ones(
    node: Node, exporter_pod: Pod, workload: Workload
) -> None:
    """uid 65532 with SYS_PTRACE, DAC_READ_SEARCH and FOWNER by the file capabilities of its own entrypoint
    (smgshm-reclaim), no_new_privs: the dead children's uid-1000 segments (in a memory emptyDir and in
    containerd's sandbox shm) deleted, the live producers' kept. Both dirs are sticky (1777: the kubelet
    mounts a memory emptyDir's tmpfs with no mode, containerd the sandbox shm with mode=1777), so
    unlinking another uid's file needs FOWNER: the exporter's two capabilities judge them leaked and
    delete nothing; the former form (uid 0, SYS_PTRACE and FOWNER) cannot judge the live pods (no
    DAC_READ_SEARCH) and deletes none of their leaks. Placed after every test that reads the workload:
    it deletes its leaks."""
    _assert_truth(workload)
    (c,) = yaml.safe_load(CRONJOB.read_text())["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    sc = c["securityContext"]  # the shipped CronJob is the form run here
    assert (sc["runAsUser"], tuple(sc["capabilities"]["add"]), sc["allowPrivilegeEscalation"]) == (
        NONROOT,
        RECLAIM_CAPS,
        False,
    )
    assert c["command"] == ["/opt/smgshm/bin/smgshm-reclaim"]
    dirs = _tmpfs_dirs(node, workload)
    assert len(dirs) >= 2
    assert {oct(d.stat().st_mode & 0o7777) for d in dirs} == {"0o1777"}
    truth = set(workload.truth)
    leaked = {k for k in truth if workload.truth[k] == "leaked" and k[0] != workload.pods[0].uid}
    leaked = {k for k in leaked if _comparable(k, workload)}
    live = {k for k in truth if workload.truth[k] == "in_flight"}
    assert leaked, leaked
    assert len(live) == 2, live

    def left() -> set[tuple[str, str, str]]:
        return set(verdicts(run_cli("--json", "gc", "--node", "--node-root", str(node.root)).json, workload.pods))

    without = _reclaim(node, exporter_pod, LEAST, "smgshm")  # the exporter's form: no FOWNER
    assert without.exit_code == 0, without.stderr
    kept = [d for t in without.json()["result"]["tmpfs"] for d in t["deleted"]]
    assert len(kept) == len(leaked), kept
    assert {d["deleted"] for d in kept} == {False}
    assert all("CAP_FOWNER" in d["reason"] for d in kept), kept
    assert leaked <= left()
    former = _reclaim(node, exporter_pod, FORMER_RECLAIM, "smgshm-plain")
    assert former.exit_code == 0, former.stderr
    judged = verdicts(former.json(), workload.pods)
    assert {judged[k] for k in leaked | live} == {"unknown"}, judged
    assert leaked <= left()
    now = _reclaim(node, exporter_pod, RECLAIM, "smgshm-reclaim")
    assert now.exit_code == 0, now.stderr
    remaining = left()
    assert not leaked & remaining, remaining
    assert live <= remaining


@pytest.mark.parametrize(("sticky", "caps"), [(True, CAPS), (True, RECLAIM_CAPS), (False, CAPS)])
def test_unlinking_another_uids_file_needs_fowner_in_a_sticky_dir_only(
    node: Node, exporter_pod: Pod, sticky: bool, caps: tuple[str, ...]
) -> None:
    """What deleting needs, measured: uid 65532 unlinks uid 1000's 0600 file in a 1777 dir (a memory
    emptyDir's tmpfs, the sandbox shm) only with CAP_FOWNER; in a 0777 dir with none (DAC_OVERRIDE is
    not what it takes: the dir is writable by all)."""
    d = Path(tempfile.mkdtemp(dir=node.scratch))
    d.chmod(0o1777 if sticky else 0o777)
    victim = d / "smg-tokenspeed-7-1-0"
    victim.write_bytes(b"x")
    victim.chmod(0o600)
    os.chown(victim, PRODUCER, PRODUCER)
    interp = "python3-reclaim" if "FOWNER" in caps else "python3"
    extra = [HostMount("/u", d, readonly=False)]
    got = probe(node, exporter_pod, security(NONROOT, caps), interp, "unlink:/u/smg-tokenspeed-7-1-0", extra=extra)
    gone = got["unlink:/u/smg-tokenspeed-7-1-0"] == "unlinked"
    assert gone is (not sticky or "FOWNER" in caps), got
    assert victim.exists() is not gone
    shutil.rmtree(d)
