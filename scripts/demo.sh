#!/usr/bin/env bash
# The README's first command: installs what is missing, builds ingressbench, and measures
# a real nginx on loopback (nginx on CPU 0, the load generator on CPU 1):
#   1. open loop at 1,000 req/s for 10 s, latency corrected for coordinated omission;
#   2. the same with a new TLS-less connection per request (a curl loop's cost);
#   3. closed loop with 50 connections (wrk-style throughput).
# Outputs (JSON summary, .hgrm spectrum, .hlog interval log, sampled requests) land in
# results/demo-<time>/. Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release -q -p ingressbench
ib=target/release/ingressbench

work=$(mktemp -d /tmp/ib-demo.XXXXXX)
chmod 700 "$work"
nginx_pid=
cleanup() {
  if [ -n "$nginx_pid" ]; then kill -TERM -- "-$nginx_pid" 2>/dev/null || kill "$nginx_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$port;
    location / { add_header x-backend nginx-demo; return 200 "hello from nginx\n"; }
  }
}
CONF
setsid taskset -c 0 nginx -c "$work/nginx.conf" -e "$work/error.log" &
nginx_pid=$!
for _ in $(seq 50); do
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
  sleep 0.1
done

out=results/demo-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
url=http://127.0.0.1:$port/
echo; echo "== open loop, 1000 req/s, keep-alive"
taskset -c 1 "$ib" load -R 1000 -c 20 -d 10s --warmup 2s --json "$out/open.json" --hgrm "$out/open.hgrm" \
  --hlog "$out/open.hlog" --samples "$out/open-samples.csv.gz" --sample-rate 0.1 "$url"
echo; echo "== open loop, 1000 req/s, a new connection per request"
taskset -c 1 "$ib" load -R 1000 -c 20 -d 10s --no-keepalive --json "$out/open-no-keepalive.json" "$url"
echo; echo "== closed loop, 50 connections"
taskset -c 1 "$ib" load -c 50 -d 5s --json "$out/closed.json" "$url"
echo
echo "results: $out"
