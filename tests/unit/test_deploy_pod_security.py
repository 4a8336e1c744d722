"""The Pod Security level each object of deploy/k8s needs, as README's table states it, read from the
objects themselves: what makes the exporter `privileged`, and that the gateway example meets
`restricted` (its pod may run in a namespace that enforces it)."""

from __future__ import annotations

from typing import Any

from tests.support.deploy import _all_docs

# Volume types the `restricted` level admits (Kubernetes' Pod Security Standards).
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _pod(kind: str) -> dict[str, Any]:
    (doc,) = [d for _, d in _all_docs() if d["kind"] == kind]
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the `restricted` level (empty when it meets it)."""
    out = []
    pod_sc = spec.get("securityContext", {})
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        if spec.get(key):
            out.append(key)
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds)}")
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{c['name']}: capabilities not dropped")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: adds {caps['add']}")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccomp {seccomp}")
    return out


def test_the_gateway_example_meets_restricted() -> None:
    assert _restricted_violations(_pod("Deployment")) == []


def test_the_exporter_needs_privileged_for_exactly_the_stated_reasons() -> None:
    got = _restricted_violations(_pod("DaemonSet"))
    assert "hostPID" in got
    assert any(v.startswith("volume ") and "hostPath" in v for v in got)
    assert "exporter: adds ['SYS_PTRACE', 'DAC_READ_SEARCH']" in got
    assert not [v for v in got if v.startswith("exporter: runAs")]  # uid 65532, runAsNonRoot
    # its init container is uid 0 for one chown, with CHOWN alone (which `baseline` admits)
    assert [v for v in got if v.startswith("npd-dir-owner")] == [
        "npd-dir-owner: adds ['CHOWN']",
        "npd-dir-owner: runAsNonRoot not true",
        "npd-dir-owner: runAsUser 0",
    ]
    (ns,) = [d for _, d in _all_docs() if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_checker_sees_a_violation() -> None:
    spec = _pod("Deployment")
    spec = {**spec, "containers": [{**spec["containers"][0], "securityContext": {"privileged": True}}]}
    assert any("privileged" in v for v in _restricted_violations(spec))
