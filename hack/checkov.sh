#!/usr/bin/env bash
# checkov's Kubernetes checks on what a cluster runs: the chart rendered with every optional
# object on (hack/checkov-values.yaml) and the children the operator creates for
# examples/autoglm.yaml, with spec.gateway off and on (its pure builders, no cluster). Fails on
# any finding that is neither fixed nor accepted, with a one-line reason, in
# hack/checkov-skips.yaml; `make checkov` and so `make test` run it. checkov lives in its own
# venv in the cache, never in .venv.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHECKOV_VERSION=3.3.30
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
venv=$cache/checkov-$CHECKOV_VERSION
py=${PYTHON:-$root/.venv/bin/python}
# The Kubernetes release the tests run (hack/k8s-bin.sh builds it).
kube_version=$(sed -n 's/^K8S_VERSION=v//p' "$root/hack/k8s-bin.sh")

if [ ! -f "$venv/.installed" ]; then
  echo "[checkov] installing checkov $CHECKOV_VERSION into $venv ..." >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION"
  touch "$venv/.installed"
fi
if [ "${1:-}" = "--install" ]; then exit 0; fi  # the venv alone (make checkov-env)
bin_dir=${AUTOGLM_BIN_DIR:-$(bash "$root/hack/k8s-bin.sh")}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/manifests"
"$bin_dir/helm" template agl "$root/charts/autoglm" --namespace autoglm-system \
  --kube-version "$kube_version" -f "$root/hack/checkov-values.yaml" \
  > "$work/manifests/chart.yaml"
# The namespace the values' NetworkPolicy covers, as a user running both would have it.
"$py" "$root/hack/render_children.py" --namespace serving "$root/examples/autoglm.yaml" \
  > "$work/manifests/children.yaml"
# The same deployment with spec.gateway on (the pool, its picker's Service, the routers' ext_proc
# port): the same namespace, so the same resource ids and accepted findings.
"$py" -c 'import sys, yaml
obj = yaml.safe_load(open(sys.argv[1]))
obj["spec"]["gateway"] = {"enabled": True}
yaml.safe_dump(obj, sys.stdout)' "$root/examples/autoglm.yaml" > "$work/gateway.yaml"
"$py" "$root/hack/render_children.py" --namespace serving "$work/gateway.yaml" \
  > "$work/manifests/children-gateway.yaml"
# --skip-download: no call to Prisma Cloud (guidelines, severities); --soft-fail: the report
# below decides, against the skips file.
(cd "$work" && "$venv/bin/checkov" --directory manifests --framework kubernetes \
  --skip-download --soft-fail --output json > results.json)
"$py" "$root/hack/checkov_report.py" "$work/results.json" "$root/hack/checkov-skips.yaml" \
  --version "$CHECKOV_VERSION"
