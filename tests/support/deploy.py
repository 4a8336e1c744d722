"""Shared by the tests of deploy (moved out of tests/test_deploy.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


K8S = DEPLOY / "k8s"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _manifests() -> list[Path]:
    """The Kubernetes objects of deploy/k8s (the kustomize base and the gateway example), without
    the base's kustomization.yaml, which is kustomize's input, not an object."""
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _all_docs() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in _manifests():
        for doc in _docs(path):
            yield path, doc


def _node_requirements() -> list[str]:
    lines = (DEPLOY / "node-requirements.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
