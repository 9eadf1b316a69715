#!/usr/bin/env bash
# The Gateway API Inference Extension's endpoint picker (EPP, sigs.k8s.io/gateway-api-inference-extension
# cmd/epp) at the version of the InferencePool CRD hack/gie-crds.sh installs, built once from the
# Go module proxy into a cache keyed by that version, through the wrapper module hack/gie-epp
# (its go.mod pins the version, its go.sum holds the hashes the build is verified against).
# bench/router_sessions.py runs it as a peer of our picker; the gateway tier starts it once.
# Prints the binary's path on stdout as its last line; progress goes to stderr.
set -euo pipefail

GIE_VERSION=v1.5.0
MODULE=sigs.k8s.io/gateway-api-inference-extension

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
bin=$cache/bin/gie-epp-$GIE_VERSION
out=$bin/epp
log() { printf '[gie-epp] %s\n' "$*" >&2; }

if ! grep -q "^require $MODULE $GIE_VERSION " "$here/gie-epp/go.mod"; then
  log "hack/gie-epp/go.mod does not require $MODULE $GIE_VERSION: update it with the version here"
  exit 1
fi

if [ ! -x "$out" ]; then
  started=$SECONDS
  log "building the endpoint picker $GIE_VERSION from source (cold: several minutes) ..."
  mkdir -p "$bin"
  # The checksum database is out of reach here: -mod=readonly takes no module whose hash
  # hack/gie-epp/go.sum does not record, and fails on one that differs.
  (cd "$here/gie-epp" && GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags "-s -w -X $MODULE/version.BuildRef=$GIE_VERSION" \
      -o "$out.tmp" "$MODULE/cmd/epp")
  mv "$out.tmp" "$out"
  log "built the endpoint picker in $((SECONDS - started))s"
fi
log "endpoint picker ($GIE_VERSION) at $out"
echo "$out"
