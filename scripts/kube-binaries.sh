#!/usr/bin/env bash
# Builds the Kubernetes control plane that `ingressbench cluster local` runs
# (kube-apiserver, kube-controller-manager, kube-scheduler) from the Go module proxy, into
# a cache folder keyed by version, and prints that folder. Skips the build when the three
# binaries are there already (a cold build takes about 11 minutes on 2 cores).
#
#   KUBE_VERSION       the Kubernetes release (default 1.33.13)
#   INGRESSBENCH_CACHE where caches live (default $XDG_CACHE_HOME/ingressbench, else
#                      ~/.cache/ingressbench)
#
# k8s.io/kubernetes is not meant to be a dependency: its go.mod points every k8s.io
# staging module at ./staging. A wrapper module requires it and replaces each of those with
# the published v0.X.Y of the same release; the versions are pinned or `go` upgrades them.
# The version strings are stamped with -X, or the server says v0.0.0 and clients refuse it.
set -euo pipefail

VERSION=${KUBE_VERSION:-1.33.13}
MINOR=${VERSION#*.}; MINOR=${MINOR%%.*}
STAGING_VERSION=v0.${VERSION#*.}
CACHE_ROOT=${INGRESSBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ingressbench}
OUT=$CACHE_ROOT/kube/v$VERSION
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler)

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
if have_all; then
  echo "$OUT"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "kube-binaries: go is missing; install Go 1.24 or later (https://go.dev/dl/)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod
log() { echo "kube-binaries: $*" >&2; }

log "building Kubernetes v$VERSION into $OUT (about 11 minutes the first time)"
go mod init ingressbench.local/kube-binaries >/dev/null 2>&1
# Which modules k8s.io/kubernetes takes from its own staging directory.
gomod=$(go mod download -json "k8s.io/kubernetes@v$VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
if [ ! -f "$gomod" ]; then
  log "could not download k8s.io/kubernetes@v$VERSION from the Go module proxy"
  exit 1
fi
staging=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod" | sort -u)
{
  echo "require k8s.io/kubernetes v$VERSION"
  echo "replace ("
  for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
  echo ")"
} >> go.mod
cat > tools.go <<EOF
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
go mod tidy -e >/dev/null 2>&1 || true
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=v$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
mkdir -p "$OUT.partial"
for b in "${BINARIES[@]}"; do
  log "go build $b"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w$stamp" -o "$OUT.partial/$b" "k8s.io/kubernetes/cmd/$b"
done
rm -rf "$OUT"
mv "$OUT.partial" "$OUT"
echo "$OUT"
