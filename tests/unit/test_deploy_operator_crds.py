"""deploy/schemas/operator_crds.py: the Operator's PodMonitor and PrometheusRule judged strictly
against the Operator's own CRD schemas (vendored in deploy/schemas), offline. The shipped objects
pass; a misspelt field, a rule without `expr`, a metadata typo, a wrong type, an unserved version
and a duplicate list-map key fail. The rendered overlays: tests/integration/test_deploy_kustomize.py."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.support.deploy import DEPLOY, K8S
from tests.support.scripts import load_script

SCHEMAS = DEPLOY / "schemas"
CHECKER = SCHEMAS / "operator_crds.py"


def _checker() -> ModuleType:
    return load_script("deploy_operator_crds", CHECKER)


def _shipped(kind: str) -> dict[str, Any]:
    (doc,) = yaml.safe_load_all((K8S / f"{kind.lower()}.yaml").read_text())
    assert doc["kind"] == kind
    return dict(doc)


def _errors(obj: dict[str, Any], version: str | None = "1.29.0") -> list[str]:
    pytest.importorskip("jsonschema")
    if version is not None:
        pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    mod = _checker()
    found: list[str] = mod.errors(obj, mod.validators_for(version))
    return found


def test_the_vendored_schemas_name_their_source_and_are_the_operators_kinds() -> None:
    mod = _checker()
    for kind, stem in mod.KINDS.items():
        doc = json.loads((SCHEMAS / f"{stem}.json").read_text())
        assert doc["kind"] == kind
        assert doc["group"] == "monitoring.coreos.com"
        assert doc["versions"] == ["v1"]
        src = doc["source"]
        assert src["repo"] == "https://github.com/prometheus-operator/prometheus-operator"
        assert src["tag"].startswith("v")
        assert len(src["commit"]) == 40
        assert src["path"] == f"example/prometheus-operator-crd/{stem}.yaml"
        assert src["license"].startswith("Apache-2.0")
        readme = (SCHEMAS / "README.md").read_text()
        assert src["tag"] in readme
        assert src["commit"] in readme
        assert src["path"] in readme
        schema = doc["openAPIV3Schema"]
        assert set(schema["properties"]) >= {"apiVersion", "kind", "metadata", "spec"}
        assert "additionalProperties" not in schema, "vendored unchanged: strictness is added on load"
    assert "Apache License" in (SCHEMAS / "LICENSE.prometheus-operator").read_text()
    assert (SCHEMAS / "NOTICE.prometheus-operator").read_text().strip()


@pytest.mark.parametrize("version", [None, "1.29.0", "1.37.0"])
@pytest.mark.parametrize("kind", ["PodMonitor", "PrometheusRule"])
def test_the_shipped_objects_validate(kind: str, version: str | None) -> None:
    assert _errors(_shipped(kind), version) == []


def test_a_misspelt_podmonitor_field_is_rejected() -> None:
    pm = _shipped("PodMonitor")
    pm["spec"]["podMetricsEndpoint"] = pm["spec"].pop("podMetricsEndpoints")
    (err,) = _errors(pm)
    assert err.startswith("spec: ")
    assert "'podMetricsEndpoint' was unexpected" in err


def test_a_misspelt_field_deep_in_an_endpoint_is_rejected() -> None:
    pm = _shipped("PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["sourceLable"] = ["a"]
    (err,) = _errors(pm)
    assert err.startswith("spec.podMetricsEndpoints.0.relabelings.0: ")
    assert "'sourceLable' was unexpected" in err


def test_a_rule_without_expr_is_rejected() -> None:
    pr = _shipped("PrometheusRule")
    rule = pr["spec"]["groups"][0]["rules"][0]
    assert "alert" in rule
    del rule["expr"]
    (err,) = _errors(pr)
    assert err == "spec.groups.0.rules.0: 'expr' is a required property"


def test_metadata_is_checked_as_objectmeta_when_a_version_is_given() -> None:
    pm = _shipped("PodMonitor")
    pm["metadata"]["lables"] = pm["metadata"].pop("labels")
    (err,) = _errors(pm, "1.29.0")
    assert err.startswith("metadata: ")
    assert "'lables' was unexpected" in err
    assert _errors(pm, None) == [], "without -k metadata need only be an object"


def test_a_wrong_type_an_unserved_version_and_a_duplicate_list_map_key_are_rejected() -> None:
    pm = _shipped("PodMonitor")
    bad = copy.deepcopy(pm)
    bad["spec"]["podMetricsEndpoints"][0]["port"] = 9400
    assert any("9400 is not of type 'string'" in e for e in _errors(bad))
    bad = copy.deepcopy(pm)
    bad["apiVersion"] = "monitoring.coreos.com/v1alpha1"
    assert any(e.startswith("apiVersion: ") for e in _errors(bad))
    pr = _shipped("PrometheusRule")
    pr["spec"]["groups"].append(copy.deepcopy(pr["spec"]["groups"][0]))
    errs = _errors(pr)
    assert any("duplicate list-map key {'name': " in e for e in errs), errs


def test_strictness_is_added_where_the_schema_lists_properties_and_not_where_it_preserves() -> None:
    mod = _checker()
    got = mod.strict(
        {
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "string"}}},
                "m": {"type": "object", "additionalProperties": {"type": "string"}},
                "p": {"type": "object", "properties": {}, "x-kubernetes-preserve-unknown-fields": True},
                "l": {"type": "array", "items": {"type": "object", "properties": {"c": {"type": "integer"}}}},
            },
        }
    )
    assert got["additionalProperties"] is False
    assert got["properties"]["a"]["additionalProperties"] is False
    assert got["properties"]["m"]["additionalProperties"] == {"type": "string"}
    assert "additionalProperties" not in got["properties"]["p"]
    assert got["properties"]["l"]["items"]["additionalProperties"] is False
    with pytest.raises(ValueError, match="x-kubernetes-validations"):
        mod.strict({"type": "object", "x-kubernetes-validations": [{"rule": "self.a > 0"}]})


def test_the_command_exits_1_with_each_error_and_0_when_clean(tmp_path: Path) -> None:
    pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    pm, pr = _shipped("PodMonitor"), _shipped("PrometheusRule")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump_all([{"apiVersion": "v1", "kind": "ConfigMap"}, pm, pr]))
    run = [sys.executable, str(CHECKER), "check", "-k", "1.29.0"]
    got = subprocess.run([*run, str(good)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "2/2 Operator objects valid" in got.stdout
    pm["spec"]["podMetricsEndpoint"] = pm["spec"].pop("podMetricsEndpoints")
    del pr["spec"]["groups"][0]["rules"][0]["expr"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([pm, pr]))
    got = subprocess.run([*run, str(bad)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 1, got.stdout + got.stderr
    errs = [ln for ln in got.stdout.splitlines() if ln.startswith("ERROR ")]
    assert len(errs) == 2, got.stdout
    assert "PodMonitor/smgshm-exporter: spec:" in errs[0]
    assert "PrometheusRule/smgshm: spec.groups.0.rules.0: 'expr' is a required property" in errs[1]
    assert "0/2 Operator objects valid" in got.stdout
    none = tmp_path / "none.yaml"
    none.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap"}))
    got = subprocess.run([*run, str(none)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 1
    assert "ERROR no PodMonitor or PrometheusRule" in got.stdout
