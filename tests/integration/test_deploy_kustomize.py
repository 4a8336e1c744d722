"""deploy/'s kustomize overlays, rendered by `kubectl kustomize` and judged by kubernetes-validate.

Each overlay (containerd, k3s-rke2, cri-o) is rendered as shipped and with its opt-in components on
(the reclaim CronJob, the Grafana dashboard). Every core-API object validates strictly (unknown
fields rejected) against Kubernetes 1.29.0 and the newest version kubernetes-validate carries,
offline; the Operator's objects (PodMonitor, PrometheusRule), which have no schema there, validate
strictly against the Operator's own CRD schemas (deploy/schemas/operator_crds.py; its negative
cases are in tests/unit/test_deploy_operator_crds.py). Then what the overlays promise: the runtime's
sandboxes dir where the node view reads it, one fully qualified image, the settings reaching every
object, the Pod Security level each pod needs, probes on the exporter's /healthz.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from smgshm import __version__
from tests.support.deploy import DEPLOY
from tests.support.kustomize import OVERLAYS, SANDBOXES, SANDBOXES_IN_POD, kustomize, pod_spec, with_opt_ins
from tests.unit.test_deploy import _parse

pytestmark = pytest.mark.slow  # each renders with kubectl and validates with a child process

IMAGE = f"registry.example.com/smgshm/smgshm-node:{__version__}"
CORE_API_GROUPS = ("v1", "apps/v1", "batch/v1", "networking.k8s.io/v1", "scheduling.k8s.io/v1")


def _validator() -> Path:
    pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    exe = Path(sys.executable).with_name("kubernetes-validate")
    if not exe.exists():
        found = shutil.which("kubernetes-validate")
        if found is None:
            pytest.skip("the kubernetes-validate command is not installed beside this Python")
        exe = Path(found)
    return exe


def _newest_version() -> str:
    import kubernetes_validate

    schemas = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    versions = [tuple(int(x) for x in d.name[1:].split("-")[0].split(".")) for d in schemas.glob("v*-local-strict")]
    return ".".join(map(str, max(versions)))


def _validate(docs: list[dict[str, Any]], version: str, where: Path) -> subprocess.CompletedProcess[str]:
    path = where / f"objects-{version}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run(
        [str(_validator()), "--strict", "--quiet", "-k", version, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _validate_operators(docs: list[dict[str, Any]], version: str, where: Path) -> subprocess.CompletedProcess[str]:
    path = where / f"operator-objects-{version}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run(
        [sys.executable, str(DEPLOY / "schemas" / "operator_crds.py"), "check", "-k", version, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _rendered(overlay: str, tmp_path: Path, opt_ins: bool) -> list[dict[str, Any]]:
    if not opt_ins:
        return kustomize(DEPLOY / "overlays" / overlay)
    where = tmp_path / f"{overlay}-opt-ins"
    where.mkdir()
    return kustomize(with_opt_ins(overlay, where))


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("opt_ins", [False, True], ids=["as-shipped", "opt-ins-on"])
def test_every_object_validates_strictly_for_1_29_and_the_newest(overlay: str, opt_ins: bool, tmp_path: Path) -> None:
    docs = _rendered(overlay, tmp_path, opt_ins)
    core = [d for d in docs if d["apiVersion"] in CORE_API_GROUPS]
    others = {d["kind"] for d in docs if d["apiVersion"] not in CORE_API_GROUPS}
    assert others == {"PodMonitor", "PrometheusRule"}, others
    newest = _newest_version()
    assert tuple(map(int, newest.split("."))) >= (1, 29, 0)
    operators = [d for d in docs if d["apiVersion"] not in CORE_API_GROUPS]
    for version in ("1.29.0", newest):
        got = _validate(core, version, tmp_path)
        assert got.returncode == 0, (overlay, version, got.stdout, got.stderr)
        got = _validate_operators(operators, version, tmp_path)
        assert got.returncode == 0, (overlay, version, got.stdout, got.stderr)
        assert f"{len(operators)}/{len(operators)} Operator objects valid" in got.stdout
    assert ("CronJob" in {d["kind"] for d in docs}) is opt_ins, "the reclaim CronJob is opt-in"


def test_strict_validation_rejects_a_bad_rendered_object(tmp_path: Path) -> None:
    """The judge can fail: an unknown field, then a wrong type, in the rendered DaemonSet."""
    docs = [d for d in kustomize(DEPLOY / "overlays" / "containerd") if d["apiVersion"] in CORE_API_GROUPS]
    ds = _one(docs, "DaemonSet")
    ds["spec"]["template"]["spec"]["hostPIDD"] = True
    assert _validate(docs, "1.29.0", tmp_path).returncode != 0
    del ds["spec"]["template"]["spec"]["hostPIDD"]
    ds["spec"]["template"]["spec"]["priorityClassName"] = 7
    assert _validate(docs, "1.29.0", tmp_path).returncode != 0


def test_strict_validation_rejects_bad_rendered_operator_objects(tmp_path: Path) -> None:
    """The Operator's judge can fail too: a misspelt PodMonitor field, then a rule without `expr`."""
    docs = [d for d in kustomize(DEPLOY / "overlays" / "containerd") if d["apiVersion"] not in CORE_API_GROUPS]
    assert _validate_operators(docs, "1.29.0", tmp_path).returncode == 0
    pm = _one(docs, "PodMonitor")
    pm["spec"]["podMetricsEndpoint"] = pm["spec"].pop("podMetricsEndpoints")
    got = _validate_operators(docs, "1.29.0", tmp_path)
    assert got.returncode == 1
    assert "'podMetricsEndpoint' was unexpected" in got.stdout
    pm["spec"]["podMetricsEndpoints"] = pm["spec"].pop("podMetricsEndpoint")
    del _one(docs, "PrometheusRule")["spec"]["groups"][0]["rules"][0]["expr"]
    got = _validate_operators(docs, "1.29.0", tmp_path)
    assert got.returncode == 1
    assert "spec.groups.0.rules.0: 'expr' is a required property" in got.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_mounts_its_runtimes_sandboxes_where_the_node_view_reads(overlay: str, tmp_path: Path) -> None:
    docs = _rendered(overlay, tmp_path, opt_ins=True)
    for kind in ("DaemonSet", "CronJob"):
        spec = pod_spec(_one(docs, kind))
        assert spec is not None
        (c,) = spec["containers"]
        vols = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        want = SANDBOXES[overlay]
        host = vols["sandboxes"]["hostPath"]
        # DirectoryOrCreate: the pod starts on a node without the dir (README: Fleet says why)
        assert host == {"path": want, "type": "DirectoryOrCreate"}, (overlay, kind)
        assert mounts["sandboxes"] == {
            "name": "sandboxes",
            "mountPath": SANDBOXES_IN_POD[overlay],
            "readOnly": True,
            "mountPropagation": "HostToContainer",
        }
        # Every other host path exists on every kubelet node: Directory, so a typo fails loudly; but smgshm's
        # own NPD verdict dir, which it makes (README: NPD).
        others = {n: v["hostPath"]["type"] for n, v in vols.items() if "hostPath" in v and n != "sandboxes"}
        assert others.pop("npd-verdict", "DirectoryOrCreate") == "DirectoryOrCreate"
        assert set(others.values()) == {"Directory"}


def test_the_node_view_reads_the_sandboxes_path_the_overlays_mount() -> None:
    from smgshm.core.node.layout import CONTAINERD_STATES, CRI_SANDBOXES, CRIO_RUN_ROOTS

    assert "/host/" + "/".join((*CONTAINERD_STATES[0], *CRI_SANDBOXES)) == SANDBOXES_IN_POD["containerd"]
    assert "/host/" + "/".join(CRIO_RUN_ROOTS[0]) == SANDBOXES_IN_POD["cri-o"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_fully_qualified_image_everywhere(overlay: str, tmp_path: Path) -> None:
    docs = _rendered(overlay, tmp_path, opt_ins=True)
    images = set()
    for d in docs:
        spec = pod_spec(d)
        if spec is not None:
            images |= {c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}
    assert images == {IMAGE}
    registry = IMAGE.split("/", 1)[0]
    assert "." in registry or ":" in registry, "a registry host, not a short name a runtime resolves"


def test_the_settings_reach_the_podmonitor_the_rule_and_the_networkpolicy(tmp_path: Path) -> None:
    docs = kustomize(
        with_opt_ins("containerd", tmp_path, {"prometheus-release": "prom-x", "monitoring-namespace": "obs"})
    )
    assert _one(docs, "PodMonitor")["metadata"]["labels"]["release"] == "prom-x"
    assert _one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "prom-x"
    (rule,) = _one(docs, "NetworkPolicy")["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}]
    assert not [d for d in docs if d["metadata"]["name"] == "smgshm-settings"], "local config: never applied"
    shipped = kustomize(DEPLOY / "overlays" / "containerd")
    assert _one(shipped, "PodMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_each_pod_runs_in_a_namespace_whose_pod_security_level_admits_it(tmp_path: Path) -> None:
    """hostPID, a hostPath volume or an added capability each need `privileged` (baseline refuses
    them): such a pod's Namespace must say so; the namespace holds nothing else that runs a pod."""
    docs = _rendered("containerd", tmp_path, opt_ins=True)
    levels = {
        d["metadata"]["name"]: d["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
        for d in docs
        if d["kind"] == "Namespace"
    }
    assert levels == {"smgshm": "privileged"}
    seen = 0
    for d in docs:
        spec = pod_spec(d)
        if spec is None:
            continue
        seen += 1
        containers = spec["containers"]
        needs = bool(
            spec.get("hostPID")
            or any("hostPath" in v for v in spec.get("volumes", []))
            or any(c.get("securityContext", {}).get("capabilities", {}).get("add") for c in containers)
        )
        assert needs, d["metadata"]["name"]
        assert levels[d["metadata"]["namespace"]] == "privileged"
    assert seen == 2  # the exporter DaemonSet and the reclaim CronJob


def test_the_exporter_pod_is_placed_probed_and_sized_as_measured() -> None:
    docs = kustomize(DEPLOY / "overlays" / "containerd")
    ds = _one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    pc = _one(docs, "PriorityClass", spec["priorityClassName"])
    assert pc["preemptionPolicy"] == "Never", "never evicts a tenant's pod"
    assert 0 < pc["value"] < 1_000_000_000  # above ordinary pods, below the system classes
    (c,) = spec["containers"]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] in port
        assert c[probe]["httpGet"]["path"] == "/healthz"  # the scans' health, served: the next test
    res = c["resources"]
    # a full scan took 0.09 s of CPU and 0.79 s under a 100m limit (fleet figures): no limit under a core
    assert res["limits"]["cpu"] == "1"
    assert res["requests"]["cpu"] == "30m"
    assert res["requests"]["memory"] == "64Mi"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_probes_path_is_served_by_the_real_exporter(tmp_path: Path) -> None:
    """The DaemonSet's own args, run for real on an empty node root: its probes' path answers 200 ok
    once the first full scan is done, and /metrics has the node's series."""
    ds = _one(kustomize(DEPLOY / "overlays" / "containerd"), "DaemonSet")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    args = list(c["args"])
    root = tmp_path / "host"
    (root / "var" / "log" / "pods").mkdir(parents=True)
    args[args.index("--node-root") + 1] = str(root)
    port = _free_port()
    args[args.index("--serve-metrics") + 1] = f"127.0.0.1:{port}"
    verdict = tmp_path / "npd" / "gc"  # the host's /run/smgshm-npd, here
    verdict.parent.mkdir()
    args[args.index("--npd-file") + 1] = str(verdict)
    url = f"http://127.0.0.1:{port}/metrics"
    probe = f"http://127.0.0.1:{port}{c['livenessProbe']['httpGet']['path']}"
    assert c["readinessProbe"]["httpGet"]["path"] == c["livenessProbe"]["httpGet"]["path"]
    log = tmp_path / "exporter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smgshm", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(DEPLOY.parent)},
            start_new_session=True,
        )
    try:
        body, deadline = "", time.monotonic() + 30
        while "smgshm_node_last_scan_timestamp_seconds" not in body:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, ("no full scan within 30 s", log.read_text())
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    assert resp.status == 200
                    body = resp.read().decode()
            except OSError:
                time.sleep(0.1)  # not listening yet: polled, bounded by the deadline
        with urllib.request.urlopen(probe, timeout=5) as resp:
            assert (resp.status, resp.read()) == (200, b"ok\n")
        assert verdict.read_text().startswith("smgshm-npd/1 "), "NPD's verdict, written by the first full scan"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_the_networkpolicy_admits_only_the_monitoring_namespace_to_the_metrics_port() -> None:
    docs = kustomize(DEPLOY / "overlays" / "containerd")
    ds = _one(docs, "DaemonSet")
    np = _one(docs, "NetworkPolicy")["spec"]
    assert np["podSelector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert set(np["policyTypes"]) == {"Ingress", "Egress"}
    assert np["egress"] == []  # it talks to nothing
    (rule,) = np["ingress"]
    (port,) = rule["ports"]
    assert port["port"] in {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    svc = _one(docs, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_the_operators_objects_carry_the_fields_it_reads(tmp_path: Path) -> None:
    """Beyond the CRD schemas (checked above): the PodMonitor scrapes one endpoint, and the rule's
    groups are the rules file's (deploy/alerts/smgshm.rules.yaml, the one source)."""
    docs = _rendered("containerd", tmp_path, opt_ins=True)
    pm = _one(docs, "PodMonitor")
    assert set(pm["spec"]) == {"selector", "namespaceSelector", "podMetricsEndpoints"}
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "metrics"
    pr = _one(docs, "PrometheusRule")
    assert pr["apiVersion"] == "monitoring.coreos.com/v1"
    assert pr["spec"] == yaml.safe_load((DEPLOY / "alerts" / "smgshm.rules.yaml").read_text())
    assert pr["metadata"]["labels"]["release"] == pm["metadata"]["labels"]["release"]
    cm = _one(docs, "ConfigMap", "smgshm-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (DEPLOY / "components" / "grafana-dashboard" / "smgshm-node.json").read_text()
    assert cm["data"]["smgshm-node.json"] == shipped


def test_the_reclaim_cronjob_spreads_one_pod_per_node_and_runs_gc_node_delete(tmp_path: Path) -> None:
    docs = _rendered("k3s-rke2", tmp_path, opt_ins=True)
    cj = _one(docs, "CronJob")
    job = cj["spec"]["jobTemplate"]["spec"]
    assert job["parallelism"] == job["completions"]
    assert cj["spec"]["concurrencyPolicy"] == "Forbid"
    spec = job["template"]["spec"]
    (tsc,) = spec["topologySpreadConstraints"]
    assert (tsc["maxSkew"], tsc["topologyKey"], tsc["whenUnsatisfiable"]) == (
        1,
        "kubernetes.io/hostname",
        "DoNotSchedule",
    )
    assert tsc["labelSelector"]["matchLabels"].items() <= job["template"]["metadata"]["labels"].items()
    (c,) = spec["containers"]
    path, _ = _parse(c["args"])
    assert path == ["gc"]
    assert {"--node", "--delete", "--yes", "--all-users"} <= set(c["args"])
    # The form test_exporter_least_privilege.py proves in containerd: uid 65532, its own capped entrypoint.
    sc = c["securityContext"]
    assert c["command"] == ["/opt/smgshm/bin/smgshm-reclaim"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (65532, 65532, True)
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH", "FOWNER"]}
    assert c["resources"]["limits"]["cpu"] == "1"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_smgshm_command_rendered_parses_with_the_real_cli(overlay: str, tmp_path: Path) -> None:
    import click

    for d in _rendered(overlay, tmp_path, opt_ins=True):
        spec = pod_spec(d)
        if spec is None:
            continue
        for c in spec["containers"]:
            try:
                path, _ = _parse(c["args"])
            except click.UsageError as err:
                pytest.fail(f"{d['kind']}/{c['name']}: smgshm {' '.join(c['args'])}: {err.format_message()}")
            assert path in (["watch"], ["gc"]), c["args"]
