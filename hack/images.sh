#!/usr/bin/env bash
# Build the operator, runtime and router images and push them to your registry, tagged with the project
# version (pyproject.toml):
#   REGISTRY=registry.example.com/team bash hack/images.sh     (or: make images REGISTRY=...)
# gives registry.example.com/team/autoglm-operator:<version>, .../autoglm-runtime:<version> and
# .../autoglm-router:<version>.
# Builder: Docker when its daemon answers, else podman, else buildah; BUILDER=docker|podman|buildah
# picks one. PUSH=0 builds without pushing; PLATFORM=linux/amd64 builds for another platform.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The image names the chart and the CRD default to (operator/autoglm_operator/resource/images.py).
OPERATOR_IMAGE=autoglm-operator
RUNTIME_IMAGE=autoglm-runtime
ROUTER_IMAGE=autoglm-router

fail() { echo "[images] $*" >&2; exit 1; }

REGISTRY=${REGISTRY:-}
REGISTRY=${REGISTRY%/}
[ -n "$REGISTRY" ] || fail "set REGISTRY to the registry and path to push to, e.g.
  make images REGISTRY=registry.example.com/team"
[[ $REGISTRY =~ ^[a-z0-9]([-a-z0-9._:]*[a-z0-9])?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*$ ]] \
  || fail "REGISTRY=$REGISTRY is not a registry host with an optional lowercase path"

version=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$root/pyproject.toml" | head -n 1)
[ -n "$version" ] || fail "no version = \"...\" line in pyproject.toml"

pick_builder() {
  if [ -n "${BUILDER:-}" ]; then
    command -v "$BUILDER" >/dev/null || fail "BUILDER=$BUILDER is not on PATH"
    echo "$BUILDER"; return
  fi
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker; return; fi
  if command -v podman >/dev/null; then echo podman; return; fi
  if command -v buildah >/dev/null; then echo buildah; return; fi
  if command -v docker >/dev/null; then
    fail "docker is installed but its daemon does not answer (docker info failed), and neither
  podman nor buildah is on PATH: start the Docker daemon or install podman"
  fi
  fail "no image builder: install Docker (with a running daemon), podman or buildah"
}

build() {  # builder dockerfile reference
  local builder=$1 dockerfile=$root/images/$2 ref=$3 platform=()
  [ -z "${PLATFORM:-}" ] || platform=(--platform "$PLATFORM")
  echo "[images] building $ref with $builder" >&2
  case $builder in
    # BuildKit reads images/<name>.Dockerfile.dockerignore beside the Dockerfile.
    docker) DOCKER_BUILDKIT=1 docker build "${platform[@]}" -f "$dockerfile" -t "$ref" "$root" ;;
    # podman and buildah take the ignore file by name.
    podman) podman build "${platform[@]}" --ignorefile "$dockerfile.dockerignore" \
              -f "$dockerfile" -t "$ref" "$root" ;;
    buildah) buildah build "${platform[@]}" --ignorefile "$dockerfile.dockerignore" \
               -f "$dockerfile" -t "$ref" "$root" ;;
    *) fail "unknown BUILDER=$builder (docker, podman or buildah)" ;;
  esac
}

builder=$(pick_builder)
refs=()
for pair in "operator.Dockerfile $OPERATOR_IMAGE" "runtime.Dockerfile $RUNTIME_IMAGE" \
            "router.Dockerfile $ROUTER_IMAGE"; do
  read -r dockerfile name <<<"$pair"
  ref=$REGISTRY/$name:$version
  build "$builder" "$dockerfile" "$ref"
  refs+=("$ref")
done
if [ "${PUSH:-1}" != 0 ]; then
  for ref in "${refs[@]}"; do
    echo "[images] pushing $ref" >&2
    "$builder" push "$ref"
  done
fi
printf '%s\n' "${refs[@]}"
