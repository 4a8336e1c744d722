#!/usr/bin/env python3
"""Validate the Prometheus Operator's PodMonitor and PrometheusRule objects strictly, offline.

kubernetes-validate carries no schema for the Operator's kinds (it warns and passes them). This
checks them against the `openAPIV3Schema` of the Operator's own CRDs, vendored beside this file as
JSON (see README.md there: source, release, licence), with the `jsonschema` library, made strict
the way the API server's strict field validation (`kubectl apply --validate=strict`) is:

- an unknown field is an error: `additionalProperties: false` is added to every object schema that
  lists `properties` and has neither `additionalProperties` nor `x-kubernetes-preserve-unknown-fields`
  (a structural schema prunes what it does not list; strict validation reports it instead);
- `metadata` (only `type: object` in a CRD: the API server checks it as ObjectMeta) is checked
  against ObjectMeta from kubernetes-validate's schemas for the Kubernetes version given with `-k`
  (unknown fields rejected there too); without `-k` it need only be an object;
- `apiVersion` must be a version the CRD serves, `kind` its kind;
- `x-kubernetes-int-or-string`: an integer or a string; `x-kubernetes-list-type: set`: no duplicate
  items; `x-kubernetes-list-type: map`: each item carries every `x-kubernetes-list-map-keys` key, and no
  two items have the same keys' values. `x-kubernetes-map-type` changes only how a merge applies, so it
  is not checked. The two CRDs carry no `x-kubernetes-validations` (CEL) rules; a vendored schema that
  has any is refused rather than half-checked.
- OpenAPI `format`s (int32, date-time, ...) are not asserted (the jsonschema default).

Usage:
  operator_crds.py check [-k VERSION] FILE...   every PodMonitor and PrometheusRule in the YAML FILEs
                                                (other kinds are skipped); exit 1 on any error or
                                                when no such object is found
  operator_crds.py vendor --tag TAG --commit SHA CRD.yaml...
                                                write the JSON files from the Operator's CRD YAML
Needs PyYAML and jsonschema (both come with kubernetes-validate), and kubernetes-validate for -k.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = "https://github.com/prometheus-operator/prometheus-operator"
CRD_DIR = "example/prometheus-operator-crd"
KINDS = {"PodMonitor": "monitoring.coreos.com_podmonitors", "PrometheusRule": "monitoring.coreos.com_prometheusrules"}
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an openAPIV3Schema in which unknown fields are errors (see the module's doc)."""
    out = copy.deepcopy(schema)
    _tighten(out)
    return out


def _tighten(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _tighten(item)
        return
    if not isinstance(node, dict):
        return
    if "x-kubernetes-validations" in node:
        raise ValueError("x-kubernetes-validations (CEL) rules are not checked here: refusing the schema")
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in node and "additionalProperties" not in node and not preserve:
        node["additionalProperties"] = False
    for key in ("properties", "patternProperties", "$defs"):
        for sub in node.get(key, {}).values():
            _tighten(sub)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            _tighten(node[key])
    for key in ("allOf", "anyOf", "oneOf"):
        _tighten(node.get(key, []))


def _int_or_string(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    ok = isinstance(instance, str) or (isinstance(instance, int) and not isinstance(instance, bool))
    if value is True and not ok:
        yield ValidationError(f"{instance!r} is neither an integer nor a string (x-kubernetes-int-or-string)")


def _list_type(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not isinstance(instance, list):
        return
    seen: list[Any] = []
    if value == "set":
        for item in instance:
            if item in seen:
                yield ValidationError(f"duplicate item {item!r} in a list of x-kubernetes-list-type set")
            seen.append(item)
    elif value == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        for item in instance:
            if not isinstance(item, dict):
                continue  # the items' own schema reports the type
            missing = [k for k in keys if k not in item]
            if missing:
                yield ValidationError(f"list-map item lacks its key {', '.join(missing)}: {item!r}")
                continue
            key = [item[k] for k in keys]
            if key in seen:
                yield ValidationError(f"duplicate list-map key {dict(zip(keys, key, strict=True))!r}")
            seen.append(key)


def _validator_class() -> Any:
    from jsonschema import validators

    return validators.extend(
        validators.Draft202012Validator,
        {"x-kubernetes-int-or-string": _int_or_string, "x-kubernetes-list-type": _list_type},
    )


def load(kind: str, where: Path = HERE) -> dict[str, Any]:
    """A vendored file: {"source": ..., "group", "kind", "versions", "openAPIV3Schema": ...}."""
    doc: dict[str, Any] = json.loads((where / f"{KINDS[kind]}.json").read_text())
    return doc


def _object_meta_registry(version: str) -> Any:
    """kubernetes-validate's definitions for VERSION (e.g. 1.29.0), as a referencing registry."""
    import kubernetes_validate
    from referencing import Registry, Resource

    path = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"
    defs = json.loads((path / "_definitions.json").read_text())
    return Resource.from_contents(defs) @ Registry(), defs["$id"]


def validators_for(version: str | None, where: Path = HERE) -> dict[str, tuple[list[str], Any]]:
    """For each kind: the apiVersions its CRD serves, and a strict validator of its objects."""
    cls = _validator_class()
    registry = meta = None
    if version is not None:
        registry, base = _object_meta_registry(version)
        meta = {"$ref": f"{base}#/$defs/{OBJECT_META}"}
    out = {}
    for kind in KINDS:
        doc = load(kind, where)
        schema = strict(doc["openAPIV3Schema"])
        if meta is not None:
            schema["properties"]["metadata"] = meta
        api_versions = [f"{doc['group']}/{v}" for v in doc["versions"]]
        kw = {"registry": registry} if registry is not None else {}
        out[kind] = (api_versions, cls(schema, **kw))
    return out


def errors(obj: dict[str, Any], checks: dict[str, tuple[list[str], Any]]) -> list[str]:
    """What is wrong with one object of a kind in KINDS, one line each (none: it validates)."""
    api_versions, validator = checks[obj["kind"]]
    found = []
    if obj.get("apiVersion") not in api_versions:
        found.append(f"apiVersion: {obj.get('apiVersion')!r} is not served (the CRD serves {api_versions})")
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(top)"
        found.append(f"{where}: {err.message}")
    return found


def check(paths: list[Path], version: str | None) -> int:
    import yaml

    checks = validators_for(version)
    seen = bad = 0
    for path in paths:
        for obj in yaml.safe_load_all(path.read_text()):
            if not isinstance(obj, dict) or obj.get("kind") not in KINDS:
                continue
            seen += 1
            name = f"{path}: {obj['kind']}/{(obj.get('metadata') or {}).get('name')}"
            found = errors(obj, checks)
            bad += bool(found)
            for line in found:
                sys.stdout.write(f"ERROR {name}: {line}\n")
    if seen == 0:
        sys.stdout.write(f"ERROR no {' or '.join(KINDS)} in {', '.join(map(str, paths))}\n")
        return 1
    meta = version or "nowhere: -k not given"
    sys.stdout.write(f"{seen - bad}/{seen} Operator objects valid (strict; ObjectMeta from {meta})\n")
    return 1 if bad else 0


def vendor(crds: list[Path], tag: str, commit: str, where: Path = HERE) -> None:
    import yaml

    for crd_path in crds:
        crd = yaml.safe_load(crd_path.read_text())
        kind = crd["spec"]["names"]["kind"]
        name = KINDS[kind]
        served = [v for v in crd["spec"]["versions"] if v.get("served")]
        schemas = {json.dumps(v["schema"]["openAPIV3Schema"], sort_keys=True) for v in served}
        if len(schemas) != 1:
            raise SystemExit(f"{crd_path}: served versions differ in schema; vendor one per version")
        doc = {
            "source": {
                "repo": REPO,
                "tag": tag,
                "commit": commit,
                "path": f"{CRD_DIR}/{name}.yaml",
                "license": "Apache-2.0 (LICENSE.prometheus-operator, NOTICE.prometheus-operator)",
                "note": "spec.versions[*].schema.openAPIV3Schema of the CRD, unchanged, as JSON",
            },
            "group": crd["spec"]["group"],
            "kind": kind,
            "versions": [v["name"] for v in served],
            "openAPIV3Schema": served[0]["schema"]["openAPIV3Schema"],
        }
        (where / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate the PodMonitors and PrometheusRules in YAML files")
    c.add_argument("-k", "--kubernetes-version", help="check metadata as this version's ObjectMeta, e.g. 1.29.0")
    c.add_argument("files", nargs="+", type=Path)
    v = sub.add_parser("vendor", help="write the JSON schemas from the Operator's CRD YAML files")
    v.add_argument("--tag", required=True)
    v.add_argument("--commit", required=True)
    v.add_argument("crds", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "vendor":
        vendor(args.crds, args.tag, args.commit)
        return 0
    return check(args.files, args.kubernetes_version)


if __name__ == "__main__":
    sys.exit(main())
