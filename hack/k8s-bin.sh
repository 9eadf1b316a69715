#!/usr/bin/env bash
# Build the local control plane from upstream source, once, into a cache keyed by version:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (wrapper module hack/k8s)
#   kwok and helm (go install at pinned versions).
# Prints the bin directory on stdout as its last line; progress goes to stderr.
set -euo pipefail

K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.4
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.19.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
bin=$cache/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION
mkdir -p "$bin"

# The checksum database is out of reach here; go.sum in hack/k8s records the module hashes that
# every build is verified against, and go install of kwok/helm verifies their own go.sum.
export GOSUMDB=${GOSUMDB:-off} GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[k8s-bin] %s\n' "$*" >&2; }
have() { [ -x "$bin/$1" ]; }

build_control_plane() {
  local major minor ldflags started
  major=${K8S_VERSION#v}; major=${major%%.*}
  minor=${K8S_VERSION#v"$major".}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    if have "$cmd"; then continue; fi
    started=$SECONDS
    log "building $cmd $K8S_VERSION from source (cold: several minutes) ..."
    (cd "$here/k8s" && go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$bin/$cmd.tmp" "$bin/$cmd"
    log "built $cmd in $((SECONDS - started))s"
  done
  if ! have etcd; then
    started=$SECONDS
    log "building etcd $ETCD_VERSION from source ..."
    (cd "$here/k8s" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$bin/etcd.tmp" "$bin/etcd"
    log "built etcd in $((SECONDS - started))s"
  fi
}

go_install() {  # name module@version [ldflags]
  local name=$1 target=$2 ldflags=${3:-} started=$SECONDS
  if have "$name"; then return; fi
  log "building $name ${target#*@} from source ..."
  GOBIN="$bin/.gobin" go install -trimpath -ldflags "-s -w $ldflags" "$target"
  mv "$bin/.gobin/$name" "$bin/$name"
  log "built $name in $((SECONDS - started))s"
}

build_control_plane
go_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
  "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
helm_minor=${K8S_VERSION#v1.}; helm_minor=${helm_minor%%.*}
go_install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION
   -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm_minor
   -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$helm_minor"
rmdir "$bin/.gobin" 2>/dev/null || true
log "binaries ready in $bin ($(du -sh "$bin" | cut -f1))"
echo "$bin"
