"""deploy/alerts and the dashboard, judged by promtool (Prometheus's own checker).

The rules file passes `promtool check rules`; its unit tests (`promtool test rules`, every alert
firing and not firing) pass, and fail when any alert's expression is broken either way (so no alert
goes untested); every query of the Grafana dashboard is accepted by `promtool check rules` as a
recording rule's expression.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import DEPLOY

pytestmark = pytest.mark.slow  # promtool runs as a child

ALERTS = DEPLOY / "alerts"
DASHBOARD = DEPLOY / "components" / "grafana-dashboard" / "smgshm-node.json"


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load((ALERTS / "smgshm.rules.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_the_rules_file_passes_promtool_check_rules() -> None:
    got = _promtool("check", "rules", str(ALERTS / "smgshm.rules.yaml"))
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in got.stdout


def test_every_alerts_unit_tests_pass() -> None:
    got = _promtool("test", "rules", "smgshm.rules.test.yaml", cwd=ALERTS)
    assert got.returncode == 0, got.stdout + got.stderr


@pytest.mark.parametrize(
    ("broken", "expr"),
    [("never firing", "vector(0) > 1"), ("always firing", "vector(1)")],
)
def test_the_unit_tests_catch_each_alert_broken(broken: str, expr: str, tmp_path: Path) -> None:
    """Each alert's expression replaced in turn: the unit tests fail on that alert, so every alert
    has expectations that a wrong expression misses (firing ones for the first, exact label sets or
    silence for the second)."""
    shutil.copy(ALERTS / "smgshm.rules.test.yaml", tmp_path)
    doc = yaml.safe_load((ALERTS / "smgshm.rules.yaml").read_text())
    for name in [a["alert"] for a in _alerts()]:
        mutated = json.loads(json.dumps(doc))
        for g in mutated["groups"]:
            for r in g["rules"]:
                if r.get("alert") == name:
                    r["expr"] = expr
        (tmp_path / "smgshm.rules.yaml").write_text(yaml.safe_dump(mutated))
        got = _promtool("test", "rules", "smgshm.rules.test.yaml", cwd=tmp_path)
        assert got.returncode != 0, (name, broken)
        assert f"alertname: {name}," in got.stdout + got.stderr, (name, broken, got.stdout[-2000:])


def _dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def test_every_dashboard_query_passes_promtool(tmp_path: Path) -> None:
    queries = _dashboard_queries()
    assert len(queries) >= 10
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(queries)]}
        ]
    }
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    got = _promtool("check", "rules", str(path))
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(queries)} rules found" in got.stdout


def test_promtool_refuses_a_bad_query(tmp_path: Path) -> None:
    """The dashboard check's judge can fail: a Grafana-only variable is not PromQL."""
    path = tmp_path / "bad.rules.yaml"
    rule = {"record": "dashboard:bad", "expr": "rate(smgshm_node_scans_total[$__rate_interval])"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [rule]}]}))
    assert _promtool("check", "rules", str(path)).returncode != 0
