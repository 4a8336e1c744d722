"""deploy/check-manifests.sh: the offline checks of deploy/ (overlays rendered and validated, the
alerts' promtool tests, the dashboard's queries) as one script, run for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.deploy import DEPLOY

SCRIPT = DEPLOY / "check-manifests.sh"


def _run(env: dict[str, str] | None = None, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )


def test_the_script_is_bash_n_clean_and_refuses_an_unknown_argument() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    got = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert got.returncode == 2
    assert "unknown argument: --bogus" in got.stderr
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.slow
def test_every_check_passes_here() -> None:
    missing = [t for t in ("kubectl", "promtool") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (the script would SKIP those checks)")
    pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    got = _run()
    assert got.returncode == 0, got.stdout + got.stderr
    assert "FAIL" not in got.stdout
    assert "SKIP" not in got.stdout
    (last,) = [ln for ln in got.stdout.splitlines() if ln.endswith("checks passed")]
    passed, total = last.split()[0].split("/")
    assert passed == total
    assert int(total) >= 34
    operators = [ln for ln in got.stdout.splitlines() if "validate strictly against the Operator's CRDs" in ln]
    assert len(operators) == 12, got.stdout  # 3 overlays x (shipped, opt-ins) x (1.29.0, newest)


@pytest.mark.slow
def test_a_failing_tool_is_a_fail_and_exit_1(tmp_path: Path) -> None:
    """The script's judge can fail: a promtool that refuses everything."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    fake = tmp_path / "promtool"
    fake.write_text("#!/bin/sh\necho refused >&2\nexit 1\n")
    fake.chmod(0o755)
    got = _run({"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert got.returncode == 1, got.stdout + got.stderr
    assert "FAIL promtool test rules: every alert firing and not firing" in got.stdout


@pytest.mark.slow
def test_a_misspelt_podmonitor_field_fails_each_overlays_operator_check(tmp_path: Path) -> None:
    """A copy of deploy/ whose PodMonitor has `podMetricsEndpoint`: kubernetes-validate passes it (no
    schema), the Operator's CRD schema does not, on every overlay."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("__pycache__"))
    pm = copy / "k8s" / "podmonitor.yaml"
    text = pm.read_text()
    assert text.count("podMetricsEndpoints:") == 1
    pm.write_text(text.replace("podMetricsEndpoints:", "podMetricsEndpoint:"))
    got = _run(script=copy / "check-manifests.sh")
    assert got.returncode == 1, got.stdout + got.stderr
    lines = got.stdout.splitlines()
    failed = [ln for ln in lines if ln.startswith("FAIL ")]
    assert len(failed) == 12, got.stdout
    assert all("validate strictly against the Operator's CRDs" in ln for ln in failed), failed
    assert all("'podMetricsEndpoint' was unexpected" in ln for ln in failed), failed
    assert any(ln.startswith("PASS containerd (shipped) validates strictly for 1.29.0") for ln in lines)
