"""deploy/'s kustomize overlays rendered for tests: each overlay as shipped, and with its opt-in
components turned on (its own kustomization.yaml, the commented lines uncommented, in a temp dir)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import DEPLOY

OVERLAYS = ("containerd", "k3s-rke2", "cri-o")
OPT_IN = ("reclaim-cronjob", "grafana-dashboard")
# Each runtime's dir on the host that holds its pods' sandbox shm, and where the exporter mounts it.
SANDBOXES = {
    "containerd": "/run/containerd/io.containerd.grpc.v1.cri/sandboxes",
    "k3s-rke2": "/run/k3s/containerd/io.containerd.grpc.v1.cri/sandboxes",
    "cri-o": "/run/containers/storage",
}
SANDBOXES_IN_POD = {
    "containerd": "/host/run/containerd/io.containerd.grpc.v1.cri/sandboxes",  # core/node/layout.py's
    "k3s-rke2": "/host/run/containerd/io.containerd.grpc.v1.cri/sandboxes",
    "cri-o": "/host/run/containers/storage",  # CRI-O's storage run dir, as core/node/layout.py reads it
}


def kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` renders the overlays offline")
    return exe


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize DIRECTORY` renders (kustomize's own checks: a patch that does
    not apply, a replacement whose source is missing, a path outside the tree, all fail it)."""
    got = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, (directory, got.stderr)
    return [d for d in yaml.safe_load_all(got.stdout) if d is not None]


def with_opt_ins(overlay: str, where: Path, settings: dict[str, str] | None = None) -> Path:
    """A copy of OVERLAY's kustomization in WHERE with every opt-in component turned on (its
    commented line uncommented, in place), its paths made relative to WHERE; with SETTINGS, a copy of
    the settings component whose values are those."""
    text = (DEPLOY / "overlays" / overlay / "kustomization.yaml").read_text()
    for name in OPT_IN:
        line = f"# - ../../components/{name}"
        assert line in text, (overlay, name)
        text = text.replace(line, line[2:])
    if settings is not None:
        comp = where / "settings"
        shutil.copytree(DEPLOY / "components" / "settings", comp)
        doc = yaml.safe_load((comp / "settings.yaml").read_text())
        doc["data"].update(settings)
        (comp / "settings.yaml").write_text(yaml.safe_dump(doc))
        text = text.replace("../../components/settings", "./settings")
    text = re.sub(r"\.\./\.\./(\S+)", lambda m: os.path.relpath(DEPLOY / m.group(1), where), text)
    (where / "kustomization.yaml").write_text(text)
    return where


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a workload object, None for any other kind."""
    spec = doc.get("spec", {})
    if doc["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
        return spec["template"]["spec"]  # type: ignore[no-any-return]
    if doc["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None
