"""deploy/: the node image's recipe, its build-and-check script and the Kubernetes manifests.

Every core-API manifest is validated, strictly (unknown fields rejected), against the API schemas
of Kubernetes 1.29.0 and of the newest version kubernetes-validate carries, offline. Every smgshm
command a manifest (or the NPD plugin config) runs is parsed by smgshm's own click app, so an
option that does not exist, or a value its type refuses, fails here. The image build itself is
deploy/build-and-check.sh's job (minutes, root, podman): not run here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from smgshm import __version__
from smgshm.cli import cli
from tests.conftest import run_cli
from tests.support.deploy import DEPLOY, K8S, _all_docs, _manifests, _node_requirements
from tests.support.scripts import load_script

IMAGE = re.compile(r"(^|/)smgshm-node:")


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path, doc in _all_docs():
        spec = doc.get("spec", {})
        if doc["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            yield f"{path.name}:{doc['metadata']['name']}", spec["template"]["spec"]
        elif doc["kind"] == "Pod":
            yield f"{path.name}:{doc['metadata']['name']}", spec


def _smgshm_argvs() -> Iterator[tuple[str, list[str]]]:
    """Every smgshm command line the manifests run: containers of the node image (args after its
    ENTRYPOINT smgshm, or a command starting with smgshm, the exporter's smgshm-node or the reclaim's
    smgshm-reclaim), the commented
    alternatives written as `# command: [...]`, and the NPD plugin monitor's rules."""
    for where, spec in _pod_specs():
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            cmd = [*c.get("command", []), *c.get("args", [])]
            if cmd and Path(cmd[0]).name in ("smgshm", "smgshm-node", "smgshm-reclaim"):
                yield f"{where}/{c['name']}", cmd[1:]
            elif not c.get("command") and IMAGE.search(c["image"]):
                yield f"{where}/{c['name']}", cmd
    for path in _manifests():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = re.match(r"\s*#\s*command:\s*(\[.*\])\s*$", line)
            if m:
                cmd = yaml.safe_load(m.group(1))
                assert Path(cmd[0]).name == "smgshm", (path.name, n, cmd)
                yield f"{path.name}:{n} (commented)", cmd[1:]
    for path in sorted(DEPLOY.glob("npd/*.json")):  # NPD's image has no Python: its rules run no smgshm
        for rule in json.loads(path.read_text())["rules"]:
            assert Path(rule["path"]).name != "smgshm", rule


def _parse(argv: list[str]) -> tuple[list[str], list[str]]:
    """Parse argv with smgshm's click app exactly as a run would, without running it: the command
    path and what is left for the command's own arguments. Raises click.UsageError as a run would."""
    ctx = cli.make_context("smgshm", list(argv))
    cmd: click.Command = cli
    path: list[str] = []
    rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    while isinstance(cmd, click.Group) and rest:
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert name is not None
        assert sub is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        path.append(name)
        cmd = sub
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    return path, [str(a) for a in ctx.params.get("command", ())]


def test_the_deploy_folder_has_its_parts() -> None:
    for name in (
        "Containerfile",
        "build-and-check.sh",
        "node-requirements.txt",
        "node-requirements.lock",
        "lock-requirements.sh",
        "k8s/exporter-daemonset.yaml",
        "k8s/gateway-preflight.yaml",
        "k8s/podmonitor.yaml",
    ):
        assert (DEPLOY / name).is_file(), name
    assert os.access(DEPLOY / "build-and-check.sh", os.X_OK)
    assert os.access(DEPLOY / "lock-requirements.sh", os.X_OK)
    containerfile = (DEPLOY / "Containerfile").read_text()
    assert "--no-deps" in containerfile
    assert re.search(r"^USER 65532", containerfile, re.M), "the image runs as a non-root user by default"


def test_every_manifest_parses_as_yaml_with_kind_and_name() -> None:
    seen = set()
    for path, doc in _all_docs():
        for key in ("apiVersion", "kind"):
            assert doc.get(key), (path.name, key)
        assert doc.get("metadata", {}).get("name"), path.name
        seen.add(doc["kind"])
    assert {"DaemonSet", "Deployment", "ConfigMap", "PodMonitor"} <= seen


def test_every_smgshm_command_in_the_manifests_parses_with_the_real_cli() -> None:
    argvs = list(_smgshm_argvs())
    assert len(argvs) >= 3, argvs
    commands = set()
    for where, argv in argvs:
        try:
            path, _ = _parse(argv)
        except click.UsageError as err:
            pytest.fail(f"{where}: smgshm {' '.join(argv)}: {err.format_message()}")
        assert path, (where, argv)
        commands.add(" ".join(path))
        run_cli(*path, "--help")
    assert {"watch", "preflight"} <= commands  # gc: the reclaim component's (test_deploy_kustomize.py)


def test_the_parser_catches_a_wrong_option() -> None:
    with pytest.raises(click.UsageError, match="--node-rooot"):
        _parse(["gc", "--node", "--node-rooot", "/host"])
    with pytest.raises(click.BadParameter):
        _parse(["gc", "--node", "--min-age", "ten minutes"])


def test_the_manifests_run_this_versions_image() -> None:
    for where, spec in _pod_specs():
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            if IMAGE.search(c["image"]):
                assert c["image"].endswith(f"smgshm-node:{__version__}"), (where, c["image"])


def test_the_exporter_daemonset_is_least_privilege_and_read_only() -> None:
    (ds,) = [d for _, d in _all_docs() if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork")
    assert not spec.get("hostIPC")
    (c,) = spec["containers"]
    sc = c["securityContext"]
    # Not root (tests/integration/test_exporter_least_privilege.py proves the form in containerd):
    # the image's user, the two capabilities its entrypoint's file capabilities raise.
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (65532, 65532, True)
    assert c["command"] == ["/opt/smgshm/bin/smgshm-node"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["capabilities"]["add"] == ["SYS_PTRACE", "DAC_READ_SEARCH"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "fsGroup" not in spec.get("securityContext", {})
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    host = {v["name"] for v in spec["volumes"] if "hostPath" in v}
    # It only reads the node, but for its NPD verdict file's own dir (README: NPD), a file it replaces.
    writable = {m["name"]: m["mountPath"] for m in c["volumeMounts"] if m["name"] in host and not m.get("readOnly")}
    assert writable == {"npd-verdict": "/run/smgshm-npd"}
    assert {v["name"]: v.get("hostPath") for v in spec["volumes"]}["npd-verdict"] == {
        "path": "/run/smgshm-npd",
        "type": "DirectoryOrCreate",
    }
    assert os.path.dirname(c["args"][c["args"].index("--npd-file") + 1]) == "/run/smgshm-npd"
    # That dir is the kubelet's (root 0755): one init container, uid 0 with CHOWN alone, gives it to 65532.
    (init,) = spec["initContainers"]
    isc = init["securityContext"]
    assert init["command"] == ["chown", "65532:65532", "/run/smgshm-npd"]
    assert isc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert (isc["allowPrivilegeEscalation"], isc["readOnlyRootFilesystem"]) == (False, True)
    assert isc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert [(m["name"], m["mountPath"]) for m in init["volumeMounts"]] == [("npd-verdict", "/run/smgshm-npd")]
    host -= set(writable)
    (state,) = [m for m in c["volumeMounts"] if m["name"] not in host and m["name"] not in writable]
    # a dir smgshm makes inside the volume: the kubelet makes an emptyDir 0777, a state dir smgshm refuses
    assert os.path.dirname({e["name"]: e["value"] for e in c["env"]}["SMGSHM_STATE_DIR"]) == state["mountPath"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    # The runtime's sandboxes dir is each overlay's (tests/integration/test_deploy_kustomize.py).
    assert mounts["/host/var/lib/kubelet/pods"]["mountPropagation"] == "HostToContainer"
    assert "/host/var/log/pods" in mounts
    vols = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if v["name"] in host}
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"] if m["name"] in host} == {
        n: "/host" + p for n, p in vols.items()
    }
    argv = c["args"]
    assert argv[argv.index("--node-root") + 1] == "/host"
    port = c["ports"][0]["containerPort"]
    assert argv[argv.index("--serve-metrics") + 1].endswith(f":{port}")
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == str(port)
    res = c["resources"]
    assert res["requests"] == {"cpu": "30m", "memory": "64Mi"}  # the measured busy CPU, twice the idle memory
    assert res["limits"] == {"cpu": "1", "memory": "160Mi"}  # a whole core: a full scan is never throttled
    # Each added capability and hostPID has its reason written beside it.
    text = (K8S / "exporter-daemonset.yaml").read_text()
    for word in ("# SYS_PTRACE:", "# DAC_READ_SEARCH:", "# hostPID:"):
        assert word in text


def test_the_gateway_example_runs_preflight_on_the_pods_memory_emptydir() -> None:
    (dep,) = [d for _, d in _all_docs() if d["kind"] == "Deployment"]
    spec = dep["spec"]["template"]["spec"]
    (dshm,) = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    (init,) = spec["initContainers"]
    assert init["args"][:2] == ["preflight", "--init-container"]
    for c in [init, *spec["containers"]]:
        assert {"name": dshm["name"], "mountPath": "/dev/shm"} in c["volumeMounts"], c["name"]
    # The init container and the gateway run as one uid: segments are 0600 and the dir is sticky.
    uid = spec["securityContext"]["runAsUser"]
    assert all(c.get("securityContext", {}).get("runAsUser", uid) == uid for c in [init, *spec["containers"]])
    wrapper = [cmd for where, cmd in _smgshm_argvs() if "commented" in where and "gateway-preflight" in where]
    assert wrapper
    assert wrapper[0][0] == "preflight"
    _, gateway = _parse(wrapper[0])
    assert gateway[:2] == ["smg", "launch"], "the wrapper execs the gateway's own command"


def test_the_npd_configmap_carries_the_plugin_config_unchanged() -> None:
    (cm,) = [d for _, d in _all_docs() if d["kind"] == "ConfigMap" and "npd" in d["metadata"]["name"]]
    source = DEPLOY / "npd" / "smgshm-plugin-monitor.json"
    assert json.loads(cm["data"][source.name]) == json.loads(source.read_text())
    script = DEPLOY / "npd" / "smgshm-npd.sh"
    assert cm["data"][script.name] == script.read_text(), "the plugin, verbatim"


def test_the_podmonitor_selects_the_exporter_and_its_port() -> None:
    (pm,) = [d for _, d in _all_docs() if d["kind"] == "PodMonitor"]
    (ds,) = [d for _, d in _all_docs() if d["kind"] == "DaemonSet"]
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["honorLabels"] is True  # the series' own namespace and pod labels win over the target's
    assert ep["port"] == ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    assert ds["metadata"]["namespace"] in pm["spec"]["namespaceSelector"]["matchNames"]


def _pyproject_deps() -> dict[str, str]:
    import tomllib  # py3.11+: the venv's

    doc = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    return {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower(): d for d in doc["project"]["dependencies"]}


def test_the_images_requirements_are_base_dependencies_without_torch_or_grpc() -> None:
    deps = _pyproject_deps()
    reqs = _node_requirements()
    for req in reqs:
        name = re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].lower()
        assert deps.get(name) == req, f"{req!r} is not pyproject's {deps.get(name)!r}"
    assert not any(r.lower().startswith(("torch", "grpc", "numpy")) for r in reqs)


def test_the_images_requirements_are_every_base_dependency() -> None:
    # The base is the slim install (the node commands' imports): the image, which installs smgshm with
    # --no-deps, must carry all of it, or a node command it runs meets a missing module.
    reqs = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in _node_requirements()}
    assert set(_pyproject_deps()) == reqs


def _lock() -> dict[str, tuple[str, list[str], list[str]]]:
    """deploy/node-requirements.lock as {name: (version, [sha256 hashes], [what it is via])}: a
    requirement and its `--hash` lines are one logical line (backslash continuations)."""
    entries: dict[str, tuple[str, list[str], list[str]]] = {}
    name = ""
    for line in (DEPLOY / "node-requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$", line)
        if m:
            name = m.group(1).lower()
            assert name not in entries, f"{name} locked twice"
            entries[name] = (m.group(2), [], [])
            continue
        if not line.strip() or line.startswith("#"):
            continue
        assert name, f"a line before any requirement: {line!r}"
        h = re.match(r"^    --hash=sha256:([0-9a-f]{64})( \\)?$", line)
        via = re.match(r"^    #\s+(?:via\s+)?(\S.*)$", line)
        if h:
            entries[name][1].append(h.group(1))
        elif via:
            entries[name][2].append(via.group(1).strip())
        else:
            pytest.fail(f"a line the lock should not hold (only pins, sha256 hashes, via comments): {line!r}")
    return entries


def test_the_lock_pins_every_base_dependency_within_its_specifier_with_hashes() -> None:
    from packaging.requirements import Requirement

    lock = _lock()
    for req in map(Requirement, _node_requirements()):
        name = req.name.lower()
        assert name in lock, f"{name} is a base dependency missing from node-requirements.lock"
        version = lock[name][0]
        assert req.specifier.contains(version, prereleases=True), f"{name}=={version} is outside {req.specifier}"
    for name, (version, hashes, _) in lock.items():
        assert hashes, f"{name}=={version} has no --hash: pip install --require-hashes would refuse the lock"
        assert len(set(hashes)) == len(hashes), name


def test_the_lock_holds_nothing_but_the_base_dependencies_and_theirs() -> None:
    # Every other entry is there because a locked package needs it (pip-compile's "via"): an entry
    # left from a dependency since dropped, or torch or gRPC, fails here.
    lock = _lock()
    direct = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in _node_requirements()}
    for name, (_, _, vias) in lock.items():
        if name in direct:
            continue
        parents = {v.lower() for v in vias if not v.startswith("-r ")}
        assert parents & set(lock), f"{name} is locked but no locked package needs it (via {vias})"
    assert not any(n.startswith(("torch", "grpc", "numpy", "tokenizers")) for n in lock)


def test_the_lock_parser_refuses_an_unhashed_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The checks above rest on this parser: a pin without hashes must show up as one.
    import tests.unit.test_deploy as me

    (tmp_path / "node-requirements.lock").write_text(
        "click==8.1.7 \\\n    # via -r node-requirements.txt\nrich==13.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    )
    monkeypatch.setattr(me, "DEPLOY", tmp_path)
    lock = _lock()
    assert lock["click"] == ("8.1.7", [], ["-r node-requirements.txt"])
    assert lock["rich"] == ("13.0", ["a" * 64], [])


def test_the_sbom_gets_one_component_per_installed_debian_package_with_its_purl() -> None:
    mod = load_script("sbom_debian", DEPLOY / "sbom_debian.py")
    dpkg = (
        "ii \tzlib1g\t1:1.2.13.dfsg-1\tamd64\tzlib\n"
        "ii \tbash\t5.2.15-2+b7\tamd64\tbash\n"
        "rc \tgone\t1.0\tamd64\tgone\n"  # removed, its config left: not in the image's software
    )
    comps = mod.debian_components(dpkg, "debian-12")
    assert [c["name"] for c in comps] == ["bash", "zlib1g"]
    assert comps[0]["purl"] == "pkg:deb/debian/bash@5.2.15-2%2Bb7?arch=amd64&distro=debian-12"
    assert comps[1]["purl"] == "pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64&distro=debian-12"
    assert comps[1]["version"] == "1:1.2.13.dfsg-1"
    assert comps[1]["properties"] == [{"name": "debian:source", "value": "zlib"}]
    assert "properties" not in comps[0]
    assert mod.os_release('ID=debian\nVERSION_ID="12"\n') == {"ID": "debian", "VERSION_ID": "12"}
