#!/usr/bin/env bash
# The Gateway API Inference Extension's InferencePool CRD (inference.networking.k8s.io/v1), as
# the Go module sigs.k8s.io/gateway-api-inference-extension ships it at a pinned version, taken
# once from the Go module proxy into a cache keyed by that version. The local control plane
# installs it (tests/conftest.py); spec.gateway publishes InferencePools of this API.
# Prints the CRD file's path on stdout as its last line; progress goes to stderr.
set -euo pipefail

GIE_VERSION=v1.5.0
# The module zip's hash (go.sum's h1: form): the checksum database is out of reach here, so the
# download is checked against this record instead.
GIE_SUM=h1:w9Awt60cmI1vM7Y6N81h8wDCBP0WkmxpdI7GKY0v070=
MODULE=sigs.k8s.io/gateway-api-inference-extension
CRD=config/crd/bases/inference.networking.k8s.io_inferencepools.yaml

cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
dir=$cache/gie-$GIE_VERSION
out=$dir/$(basename "$CRD")
log() { printf '[gie-crds] %s\n' "$*" >&2; }

if [ ! -s "$out" ]; then
  log "downloading $MODULE@$GIE_VERSION from the Go module proxy ..."
  started=$SECONDS
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  info=$(cd "$tmp" && GOSUMDB=off GOFLAGS=-mod=mod GOTOOLCHAIN=local \
    go mod download -json "$MODULE@$GIE_VERSION")
  field() { python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$1" <<<"$info"; }
  error=$(field Error)
  if [ -n "$error" ]; then
    log "go mod download failed: $error"
    exit 1
  fi
  sum=$(field Sum)
  if [ "$sum" != "$GIE_SUM" ]; then
    log "$MODULE@$GIE_VERSION has hash $sum, not the recorded $GIE_SUM: refusing it"
    exit 1
  fi
  mkdir -p "$dir"
  cp "$(field Dir)/$CRD" "$out.tmp"
  chmod 0644 "$out.tmp"
  mv "$out.tmp" "$out"
  log "took $CRD from $MODULE@$GIE_VERSION in $((SECONDS - started))s"
fi
log "InferencePool CRD ($GIE_VERSION) at $out"
echo "$out"
