#!/usr/bin/env bash
# The README's first command: installs what is missing, builds ingressbench, and runs the
# churn scenario in quick mode: nginx, HAProxy, Envoy, Traefik and Caddy, each in front of
# three echo backends over TLS, at 500 req/s over HTTP/1.1, HTTP/2 and HTTP/3 (Envoy,
# Traefik and Caddy; nginx 1.22 and HAProxy 2.6 as packaged have none, and those cells are
# left out saying so; the full run adds 100 and 1000 req/s), while the backends scale 3->4->3 three times and the routes
# change (CORS, a header, a rewrite, revert). About two minutes after the build. Ends with
# the headline table (a row per proxy and protocol: p50, p99, the verdict against nginx,
# errors and the events they fell in, how long each kind of event took to show, the
# proxy's CPU) and the path of the HTML report; everything measured is in the results
# directory beside it
# (run.json, and per cell summary.json, latency.hlog, latency.hgrm, samples.csv.gz,
# events.jsonl, impact.json, the proxy's config and log).
set -euo pipefail
cd "$(dirname "$0")/.."
# The lab alone: no local cluster, no image tools, and a build without cluster mode (the
# Kubernetes client crates are half the build); the test command installs and builds the
# rest (scripts/test.sh).
started=$(date +%s)
bash scripts/install-deps.sh --lab
cargo build --release -q -p ingressbench --no-default-features
echo "demo: installed and built in $(( $(date +%s) - started )) s"
out=results/demo-$(date -u +%Y%m%dT%H%M%SZ)
# The lab and the load share this machine's cores; results are a smoke-level comparison.
"${CARGO_TARGET_DIR:-target}/release/ingressbench" run scenarios/churn.yaml --quick --out "$out"

echo
echo "Latency from each request's intended send time (open loop), in ms with the 95% interval in"
echo "brackets; errors with the events they fell in; took effect: from each event's request until"
echo "the traffic showed it. One quick run each: differences of a few percent are noise, the errors"
echo "around each event are the point. The report: $out/report.html"
