#!/usr/bin/env bash
# Copy the CRD (crds/, generated from operator/autoglm_operator/resource/spec.py) into the Helm chart.
# `--check` only compares and fails when the chart's copy is stale; tests/helm checks too.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$root/crds/autoglm.io_autoglmdeployments.yaml
dst=$root/charts/autoglm/crds/autoglm.io_autoglmdeployments.yaml
if [ "${1:-}" = "--check" ]; then
  if ! cmp -s "$src" "$dst"; then
    echo "charts/autoglm/crds/ is stale: run hack/sync-chart-crd.sh" >&2
    exit 1
  fi
  exit 0
fi
mkdir -p "$(dirname "$dst")"
cp "$src" "$dst"
echo "synced ${dst#"$root"/}" >&2
