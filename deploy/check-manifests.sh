#!/usr/bin/env bash
# Check deploy/'s Kubernetes objects, alerts and dashboard, offline and without root (no cluster, no
# image): each overlay rendered by `kubectl kustomize`, as shipped and with its opt-in components on;
# every object validated by `kubernetes-validate --strict` for Kubernetes 1.29.0 and the newest
# version it carries, and the Operator's PodMonitor and PrometheusRule (no schema there: it warns and
# passes them) strictly against the Operator's own CRD schemas, vendored in deploy/schemas;
# `promtool check rules` and `promtool test rules` on deploy/alerts; every dashboard query through
# `promtool check rules`; the PrometheusRule fresh from its rules file.
#
# Usage: deploy/check-manifests.sh
# Needs kubectl, kubernetes-validate (PYTHON's, or on PATH; it brings the jsonschema and PyYAML the
# CRD check uses) and promtool; a check whose tool is missing prints SKIP with the reason. Prints
# PASS/FAIL per check; exits 1 on any FAIL, 2 on bad usage.
# tests/integration/test_deploy_kustomize.py and test_deploy_alerts.py make the same checks (and more).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
if [ $# -gt 0 ]; then
    case $1 in
        -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "check-manifests: unknown argument: $1" >&2; exit 2 ;;
    esac
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
checks=0
fails=0
verdict() {  # NAME RC [DETAIL]
    checks=$((checks + 1))
    if [ "$2" = 0 ]; then echo "PASS $1"; else fails=$((fails + 1)); echo "FAIL $1${3:+: $3}"; fi
}
skip() { echo "SKIP $1: $2"; }

validator=$(dirname "$(command -v "$py")")/kubernetes-validate
[ -x "$validator" ] || validator=$(command -v kubernetes-validate || true)
newest=""
if [ -n "$validator" ]; then
    newest=$("$py" -c 'import kubernetes_validate, pathlib
d = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
v = [tuple(int(x) for x in p.name[1:].split("-")[0].split(".")) for p in d.glob("v*-local-strict")]
print(".".join(map(str, max(v))))' 2>/dev/null || true)
fi

# --- 1. each overlay, as shipped and with the opt-ins on, rendered and validated -------------------
for overlay in containerd k3s-rke2 cri-o; do
    on="$work/$overlay-opt-ins"
    mkdir -p "$on"
    rel=$(realpath --relative-to="$on" "$here")
    sed -e 's|# - \.\./\.\./components/|- ../../components/|' -e "s|\.\./\.\./|$rel/|g" \
        "$here/overlays/$overlay/kustomization.yaml" >"$on/kustomization.yaml"
    for variant in shipped opt-ins; do
        src="$here/overlays/$overlay"
        [ "$variant" = opt-ins ] && src=$on
        out="$work/$overlay-$variant.yaml"
        if ! command -v kubectl >/dev/null; then
            skip "$overlay ($variant) renders" "kubectl is not installed"
            continue
        fi
        rc=0; kubectl kustomize "$src" >"$out" 2>"$work/err" || rc=$?
        verdict "$overlay ($variant) renders with kubectl kustomize" "$rc" "$(head -c 300 "$work/err")"
        [ "$rc" = 0 ] || continue
        if [ -z "$validator" ] || [ -z "$newest" ]; then
            skip "$overlay ($variant) validates" "kubernetes-validate is not installed (pip install kubernetes-validate)"
            continue
        fi
        for version in 1.29.0 "$newest"; do
            rc=0; "$validator" --strict --quiet -k "$version" "$out" >"$work/err" 2>&1 || rc=$?
            verdict "$overlay ($variant) validates strictly for $version" "$rc" "$(grep -m 3 ERROR "$work/err" || true)"
            # The Operator's kinds, which kubernetes-validate passes unchecked: against the Operator's
            # own CRD schemas (deploy/schemas), metadata as this version's ObjectMeta.
            rc=0; "$py" "$here/schemas/operator_crds.py" check -k "$version" "$out" >"$work/err" 2>&1 || rc=$?
            verdict "$overlay ($variant) PodMonitor and PrometheusRule validate strictly against the Operator's CRDs for $version" \
                "$rc" "$(grep -m 3 ERROR "$work/err" || tail -n 3 "$work/err")"
        done
    done
done

# --- 2. the alerts and the dashboard ---------------------------------------------------------------
rc=0; "$py" "$here/alerts/generate.py" --check 2>"$work/err" || rc=$?
verdict "deploy/k8s/prometheusrule.yaml is fresh from deploy/alerts/smgshm.rules.yaml" "$rc" "$(cat "$work/err")"
if command -v promtool >/dev/null; then
    rc=0; promtool check rules "$here/alerts/smgshm.rules.yaml" >"$work/err" 2>&1 || rc=$?
    verdict "promtool check rules: the alerts" "$rc" "$(tail -n 3 "$work/err")"
    rc=0; (cd "$here/alerts" && promtool test rules smgshm.rules.test.yaml) >"$work/err" 2>&1 || rc=$?
    verdict "promtool test rules: every alert firing and not firing" "$rc" "$(tail -n 20 "$work/err")"
    # Each dashboard query as a recording rule's expression (JSON is YAML: promtool reads it).
    "$py" -c 'import json, sys
d = json.load(open(sys.argv[1]))
q = [t["expr"] for p in d["panels"] for t in p["targets"]]
rules = [{"record": "dashboard:q%d" % i, "expr": e} for i, e in enumerate(q)]
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))' \
        "$here/components/grafana-dashboard/smgshm-node.json" "$work/dashboard.rules.json"
    rc=0; promtool check rules "$work/dashboard.rules.json" >"$work/err" 2>&1 || rc=$?
    verdict "promtool check rules: every dashboard query" "$rc" "$(tail -n 3 "$work/err")"
else
    skip "promtool checks" "promtool is not installed (Debian: apt-get install prometheus)"
fi

echo "$((checks - fails))/$checks checks passed"
[ "$fails" = 0 ] || exit 1
