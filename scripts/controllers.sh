#!/usr/bin/env bash
# Fetches and builds what the local test cluster's ingress controllers need, from the Go
# module proxy, into cache folders keyed by version (skipped when they are there), and
# prints one line per part: NAME DIR.
#
#   gateway-api  the Gateway API's CRDs (sigs.k8s.io/gateway-api), of the experimental
#                channel: Contour watches TCPRoute, TLSRoute v1alpha2 and BackendTLSPolicy
#                v1alpha3, which the standard channel does not serve
#   contour      Contour's binary (go install) and its CRDs (examples/contour/01-crds.yaml)
#   haproxy-ingress
#                HAProxy Ingress's controller (jcmoraisjr/haproxy-ingress, built in a
#                wrapper module, see below) and its rootfs/ (templates and Lua scripts)
#   helm         Helm (helm.sh/helm/v3), which installs Envoy Gateway by its chart
#   envoy-gateway
#                for each of ENVOY_GATEWAY_VERSIONS: the envoy-gateway binary (what its
#                image runs) and its Helm chart (charts/gateway-helm, its images named)
#
#   GATEWAY_API_VERSION, CONTOUR_VERSION, HAPROXY_INGRESS_VERSION, HELM_VERSION,
#   ENVOY_GATEWAY_VERSIONS (space-separated; the last is the one installed)
#                                          override the pinned versions
#   INGRESSBENCH_CACHE                     where caches live (as scripts/kube-binaries.sh)
set -euo pipefail

GATEWAY_API_VERSION=${GATEWAY_API_VERSION:-1.5.1}
CONTOUR_VERSION=${CONTOUR_VERSION:-1.33.8}
HAPROXY_INGRESS_VERSION=${HAPROXY_INGRESS_VERSION:-0.14.7}
HELM_VERSION=${HELM_VERSION:-3.22.0}
ENVOY_GATEWAY_VERSIONS=${ENVOY_GATEWAY_VERSIONS:-1.9.0 1.9.1}
CACHE_ROOT=${INGRESSBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ingressbench}
log() { echo "controllers: $*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  log "go is missing; install Go 1.24 or later (https://go.dev/dl/)"
  exit 1
fi
export GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The directory of module $1 in the module cache (downloaded if needed).
module_dir() {
  local dir
  dir=$(cd "$work" && go mod download -json "$1" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
  if [ ! -d "$dir" ]; then
    log "could not download $1 from the Go module proxy"
    exit 1
  fi
  echo "$dir"
}

out=$CACHE_ROOT/gateway-api/v$GATEWAY_API_VERSION-experimental
if [ ! -f "$out/httproutes.yaml" ]; then
  log "Gateway API v$GATEWAY_API_VERSION CRDs (experimental channel) into $out"
  src=$(module_dir "sigs.k8s.io/gateway-api@v$GATEWAY_API_VERSION")/config/crd/experimental
  mkdir -p "$out.partial"
  for f in "$src"/gateway.networking.k8s.io_*.yaml; do
    case $f in *_vap_*) continue ;; esac
    cp "$f" "$out.partial/${f##*_}"
  done
  rm -rf "$out" && mv "$out.partial" "$out"
fi
echo "gateway-api $out"

out=$CACHE_ROOT/contour/v$CONTOUR_VERSION
if [ ! -x "$out/contour" ] || [ ! -f "$out/crds.yaml" ]; then
  log "building Contour v$CONTOUR_VERSION into $out (about 2 minutes the first time)"
  mkdir -p "$out.partial"
  GOBIN=$out.partial CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/projectcontour/contour/cmd/contour@v$CONTOUR_VERSION"
  cp "$(module_dir "github.com/projectcontour/contour@v$CONTOUR_VERSION")/examples/contour/01-crds.yaml" \
    "$out.partial/crds.yaml"
  rm -rf "$out" && mv "$out.partial" "$out"
fi
echo "contour $out"

# HAProxy Ingress: the checksum database has no entry for its module (GONOSUMDB), and its
# main package, built in a module of ours that declares go 1.21, runs; built with the Go
# toolchain's own language version, newer URL routing makes it panic at start.
out=$CACHE_ROOT/haproxy-ingress/v$HAPROXY_INGRESS_VERSION
if [ ! -x "$out/haproxy-ingress" ] || [ ! -d "$out/rootfs/etc/templates" ]; then
  log "building HAProxy Ingress v$HAPROXY_INGRESS_VERSION into $out (about 1 minute the first time)"
  module=github.com/jcmoraisjr/haproxy-ingress
  export GONOSUMDB=$module
  mkdir -p "$out.partial" "$work/haproxy-ingress"
  printf 'module ingressbench.local/haproxy-ingress\n\ngo 1.21\n\nrequire %s v%s\n' \
    "$module" "$HAPROXY_INGRESS_VERSION" >"$work/haproxy-ingress/go.mod"
  (cd "$work/haproxy-ingress" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$out.partial/haproxy-ingress" "$module/pkg")
  cp -r "$(module_dir "$module@v$HAPROXY_INGRESS_VERSION")/rootfs" "$out.partial/rootfs"
  chmod -R u+w "$out.partial/rootfs"
  rm -rf "$out" && mv "$out.partial" "$out"
fi
echo "haproxy-ingress $out"

out=$CACHE_ROOT/helm/v$HELM_VERSION
if [ ! -x "$out/helm" ]; then
  log "building Helm v$HELM_VERSION into $out (about 1 minute the first time)"
  mkdir -p "$out.partial"
  GOBIN=$out.partial CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  rm -rf "$out" && mv "$out.partial" "$out"
fi
echo "helm $out"

# Envoy Gateway: the binary its image runs, and its chart with the image references that
# the release's own build writes into values.yaml (from values.tmpl.yaml) and its version.
for version in $ENVOY_GATEWAY_VERSIONS; do
  out=$CACHE_ROOT/envoy-gateway/v$version
  if [ ! -x "$out/envoy-gateway" ] || [ ! -f "$out/chart/Chart.yaml" ]; then
    log "building Envoy Gateway v$version into $out (about 3 minutes the first time)"
    module=github.com/envoyproxy/gateway
    mkdir -p "$out.partial"
    GOBIN=$out.partial CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "$module/cmd/envoy-gateway@v$version"
    cp -r "$(module_dir "$module@v$version")/charts/gateway-helm" "$out.partial/chart"
    chmod -R u+w "$out.partial/chart"
    sed -e "s|\${GatewayImage}|docker.io/envoyproxy/gateway:v$version|" \
      -e "s|\${GatewayImagePullPolicy}|IfNotPresent|" \
      "$out.partial/chart/values.tmpl.yaml" >"$out.partial/chart/values.yaml"
    sed -i -e "s|^version: .*|version: v$version|" -e "s|^appVersion: .*|appVersion: v$version|" \
      "$out.partial/chart/Chart.yaml"
    rm -rf "$out" && mv "$out.partial" "$out"
  fi
  echo "envoy-gateway $out"
done
