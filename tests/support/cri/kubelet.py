"""A kubelet stand-in: makes pods over CRI (runtime.v1) the way the kubelet makes them, and removes them.

What it copies from the kubelet, since the node view reads exactly these traces:
- the sandbox uses the node's network namespace (no CNI here), its IPC namespace is the pod's, its
  pid namespace the container's own unless the pod shares one (``shareProcessNamespace``: POD);
- the cgroup parent is cgroupfs's ``/kubepods/besteffort/pod<uid>``, so every process of the pod,
  pause included, carries the pod uid in /proc/P/cgroup;
- the pod log dir is ``var/log/pods/<namespace>_<name>_<uid>/`` and a container logs to
  ``<name>/<attempt>.log`` there;
- a memory emptyDir is a tmpfs the kubelet mounts at
  ``var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~empty-dir/<volume>`` and hands to a container as
  a CRI mount; the kubelet's pods dir is a shared mount (bound on itself), as the kubelet makes it;
- a restarted container is a new container of the same name with ``attempt`` one more.
Paths are under a node root of the test's own (containerd's state dir is there too: containerd.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cri.image import IMAGE

CGROUP_ROOT = Path("/sys/fs/cgroup")
EMPTY_DIRS = "volumes/kubernetes.io~empty-dir"
LABEL = "smgshm.test/cri"  # every sandbox this stand-in makes carries it: teardown finds leftovers by it


def _pb() -> Any:
    from tests.support.cri.rpc import api_pb2

    return api_pb2


@dataclass(frozen=True)
class Security:
    """A container's securityContext as the kubelet translates it to CRI: ``allowPrivilegeEscalation:
    false`` is ``no_new_privs``, ``capabilities`` names go without ``CAP_`` (``ALL`` drops all), seccomp
    ``RuntimeDefault`` is a SecurityProfile."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    add: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    no_new_privs: bool = False
    readonly_rootfs: bool = False
    seccomp_runtime_default: bool = False


@dataclass(frozen=True)
class HostMount:
    """A hostPath volume mount as the kubelet hands it to CRI (HostToContainer is rslave)."""

    container_path: str
    host_path: Path
    readonly: bool = True
    host_to_container: bool = False


@dataclass
class Container:
    id: str
    name: str
    attempt: int
    log: Path


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    sandbox_id: str
    config: Any  # runtime.v1.PodSandboxConfig, passed again with each CreateContainer as the kubelet does
    log_dir: Path
    kubelet_dir: Path
    shared_pid: bool
    host_pid: bool = False
    empty_dirs: dict[str, Path] = field(default_factory=dict)
    containers: list[Container] = field(default_factory=list)

    @property
    def cgroup_parent(self) -> str:
        return f"/kubepods/besteffort/pod{self.uid}"


class Kubelet:
    """CRI client over containerd's socket, and the node-side dirs and mounts a kubelet keeps."""

    def __init__(self, sock: str, node_root: Path) -> None:
        import grpc

        from tests.support.cri.rpc import api_pb2_grpc

        self.node_root = node_root
        self.channel = grpc.insecure_channel(f"unix://{sock}")
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.images = api_pb2_grpc.ImageServiceStub(self.channel)
        self.pods: list[Pod] = []
        self.pods_dir = node_root / "var/lib/kubelet/pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        # The kubelet makes its root a shared mount (bind on itself), so a HostToContainer mount sees a
        # tmpfs mounted below it later (a node agent's hostPath of the pods dir).
        subprocess.run(["mount", "--bind", str(self.pods_dir), str(self.pods_dir)], check=True, timeout=30)
        subprocess.run(["mount", "--make-shared", str(self.pods_dir)], check=True, timeout=30)

    def close(self) -> None:
        """Remove every pod made here (and any sandbox labelled as ours), then the pods dir's mount."""
        pb = _pb()
        for pod in list(self.pods):
            self.remove_pod(pod)
        with contextlib.suppress(Exception):  # containerd may be gone already: its own teardown unmounts
            listed = self.runtime.ListPodSandbox(
                pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(label_selector={LABEL: "1"})), timeout=30
            )
            for box in listed.items:
                self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=box.id), timeout=60)
                self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=box.id), timeout=60)
        self.channel.close()
        if subprocess.run(["umount", str(self.pods_dir)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(self.pods_dir)], capture_output=True, timeout=30)

    # -- runtime and images ------------------------------------------------------------------------

    def version(self) -> Any:
        return self.runtime.Version(_pb().VersionRequest(version="v1"), timeout=30)

    def image_present(self, image: str = IMAGE) -> bool:
        pb = _pb()
        got = self.images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=image)), timeout=30)
        return bool(got.image.id)

    # -- pods ----------------------------------------------------------------------------------------

    def run_pod(
        self, namespace: str, name: str, *, share_pid: bool = False, host_pid: bool = False, uid: str | None = None
    ) -> Pod:
        """A sandbox as the kubelet asks for one (its log dir and kubelet pod dir made first); ``host_pid``
        is a pod's ``hostPID: true``."""
        pb = _pb()
        uid = uid or str(uuid.uuid4())
        log_dir = self.node_root / "var/log/pods" / f"{namespace}_{name}_{uid}"
        log_dir.mkdir(parents=True, exist_ok=True)
        kubelet_dir = self.pods_dir / uid
        kubelet_dir.mkdir(parents=True, exist_ok=True)
        ns = pb.NamespaceOption(network=pb.NODE, pid=_pid_mode(pb, share_pid, host_pid), ipc=pb.POD)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            log_directory=str(log_dir),
            labels={LABEL: "1", "io.kubernetes.pod.uid": uid},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=f"/kubepods/besteffort/pod{uid}",
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns),
            ),
        )
        resp = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=120)
        pod = Pod(namespace, name, uid, resp.pod_sandbox_id, config, log_dir, kubelet_dir, share_pid, host_pid)
        self.pods.append(pod)
        return pod

    def sandbox_shm(self, pod: Pod) -> Path:
        """containerd's per-sandbox tmpfs, the pod's /dev/shm when no emptyDir is mounted there."""
        return self.node_root / "run/containerd/io.containerd.grpc.v1.cri/sandboxes" / pod.sandbox_id / "shm"

    def empty_dir(self, pod: Pod, volume: str, size: str = "16m") -> Path:
        """A memory emptyDir: a tmpfs at the kubelet's path for it."""
        path = pod.kubelet_dir / EMPTY_DIRS / volume
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(path)], check=True, timeout=30
        )
        pod.empty_dirs[volume] = path
        return path

    def start_container(
        self,
        pod: Pod,
        name: str,
        script: str,
        *,
        attempt: int = 0,
        mounts: dict[str, Path] | None = None,
        command: Sequence[str] | None = None,
        envs: Mapping[str, str] | None = None,
        host_mounts: Sequence[HostMount] = (),
        security: Security | None = None,
        image: str = IMAGE,
    ) -> Container:
        """Create and start a container running ``script`` under busybox sh (or ``command`` as it is);
        ``mounts`` maps a path in the container to a host path (an emptyDir), ``host_mounts`` are
        hostPath mounts, ``security`` its securityContext, ``image`` one imported already."""
        pb = _pb()
        (pod.log_dir / name).mkdir(parents=True, exist_ok=True)
        log_path = f"{name}/{attempt}.log"
        ns = pb.NamespaceOption(network=pb.NODE, pid=_pid_mode(pb, pod.shared_pid, pod.host_pid), ipc=pb.POD)
        binds = [pb.Mount(container_path=c, host_path=str(h)) for c, h in (mounts or {}).items()]
        for m in host_mounts:
            propagation = pb.PROPAGATION_HOST_TO_CONTAINER if m.host_to_container else pb.PROPAGATION_PRIVATE
            binds.append(
                pb.Mount(
                    container_path=m.container_path,
                    host_path=str(m.host_path),
                    readonly=m.readonly,
                    propagation=propagation,
                )
            )
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image),
            command=list(command) if command is not None else ["/bin/sh", "-c", script],
            envs=[pb.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
            mounts=binds,
            labels={LABEL: "1"},
            log_path=log_path,
            linux=pb.LinuxContainerConfig(security_context=_security_context(pb, ns, security or Security())),
        )
        created = self.runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id, config=config, sandbox_config=pod.config),
            timeout=120,
        )
        self.runtime.StartContainer(pb.StartContainerRequest(container_id=created.container_id), timeout=120)
        c = Container(created.container_id, name, attempt, pod.log_dir / log_path)
        pod.containers.append(c)
        return c

    def status(self, c: Container) -> Any:
        pb = _pb()
        return self.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=c.id, verbose=True), timeout=30)

    def host_pid(self, c: Container) -> int:
        """The container's first process as the host numbers it (the runtime's verbose info)."""
        return int(json.loads(self.status(c).info["info"])["pid"])

    def wait_logged(self, c: Container, text: str, timeout: float = 60.0) -> None:
        """Poll the container's log (CRI's ``<time> <stream> <tag> <line>`` lines) for ``text``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if any(line.split(" ", 3)[-1] == text for line in c.log.read_text().splitlines()):
                    return
            if self.status(c).status.state == _pb().CONTAINER_EXITED and not c.log.exists():
                break
            time.sleep(0.02)
        raise AssertionError(f"container {c.name} never logged {text!r}; its log {c.log}")

    def wait_exited(self, c: Container, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status(c).status
            if st.state == _pb().CONTAINER_EXITED:
                return st
            time.sleep(0.02)
        raise AssertionError(f"container {c.name} did not exit")

    def stop_container(self, c: Container, timeout_s: int = 0) -> None:
        """StopContainer: SIGTERM, then SIGKILL after ``timeout_s`` (0: at once)."""
        pb = _pb()
        self.runtime.StopContainer(pb.StopContainerRequest(container_id=c.id, timeout=timeout_s), timeout=120)

    def remove_pod(self, pod: Pod) -> None:
        """What the kubelet does when a pod goes: stop and remove its containers and sandbox, unmount its
        emptyDirs, remove its pod dir, log dir and cgroup; a process still in the cgroup is killed."""
        pb = _pb()
        try:
            for c in pod.containers:
                with contextlib.suppress(Exception):
                    self.runtime.StopContainer(pb.StopContainerRequest(container_id=c.id, timeout=0), timeout=120)
                    self.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=c.id), timeout=120)
            with contextlib.suppress(Exception):
                self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id), timeout=120)
                self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id), timeout=120)
        finally:
            _kill_and_remove_cgroups(pod.cgroup_parent)
            for path in pod.empty_dirs.values():
                if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode != 0:
                    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
            _rmtree(pod.kubelet_dir)
            _rmtree(pod.log_dir)
            with contextlib.suppress(ValueError):
                self.pods.remove(pod)


def _pid_mode(pb: Any, share_pid: bool, host_pid: bool) -> Any:
    return pb.NODE if host_pid else pb.POD if share_pid else pb.CONTAINER


def _security_context(pb: Any, ns: Any, sec: Security) -> Any:
    ctx = pb.LinuxContainerSecurityContext(
        namespace_options=ns, no_new_privs=sec.no_new_privs, readonly_rootfs=sec.readonly_rootfs
    )
    if sec.run_as_user is not None:
        ctx.run_as_user.CopyFrom(pb.Int64Value(value=sec.run_as_user))  # present even when 0
    if sec.run_as_group is not None:
        ctx.run_as_group.CopyFrom(pb.Int64Value(value=sec.run_as_group))
    if sec.add or sec.drop:
        ctx.capabilities.add_capabilities.extend(sec.add)
        ctx.capabilities.drop_capabilities.extend(sec.drop)
    if sec.seccomp_runtime_default:
        ctx.seccomp.CopyFrom(pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))
    return ctx


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _kill_and_remove_cgroups(parent: str) -> None:
    """The pod's cgroup in every hierarchy: any process left in it killed, then its dirs removed
    (deepest first). Its parents (kubepods, besteffort) are left: other pods, other runs may use them."""
    dirs: list[Path] = []
    with contextlib.suppress(OSError):
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / parent.lstrip("/")
            if top.is_dir():
                dirs.extend(sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts)))
                dirs.insert(0, top)
    for d in dirs:
        with contextlib.suppress(OSError):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        for _ in range(100):  # a killed process leaves its cgroup a moment later
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)


__all__ = ["EMPTY_DIRS", "LABEL", "Container", "HostMount", "Kubelet", "Pod", "Security"]
