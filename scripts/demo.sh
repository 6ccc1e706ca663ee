#!/usr/bin/env bash
# The README's first command: installs what is missing, builds ingressbench, and runs the
# churn scenario in quick mode: nginx, HAProxy, Envoy, Traefik and Caddy, each in front of
# three echo backends over TLS, at 500 req/s over HTTP/1.1 and over HTTP/2 (the full run
# adds 100 and 1000 req/s), while the backends scale 3->4->3 three times and the routes
# change (CORS, a header, a rewrite, revert). About two minutes after the build. Ends with a comparison table, the report's headline and the
# path of the HTML report; everything measured is in the results directory beside it
# (run.json, and per cell summary.json, latency.hlog, latency.hgrm, samples.csv.gz,
# events.jsonl, impact.json, the proxy's config and log).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release -q -p ingressbench
out=results/demo-$(date -u +%Y%m%dT%H%M%SZ)
# The lab and the load share this machine's cores; results are a smoke-level comparison.
target/release/ingressbench run scenarios/churn.yaml --quick --out "$out"

python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
run = json.load(open(os.path.join(out, "run.json")))
print(f"\n{run['scenario']} (quick: durations x{run['quick_factor']:.3f}), status {run['status']}")
print(f"{'target':<9}{'proto':>6}{'rate':>6}{'requests':>10}{'errors':>8}{'retried':>8}{'p50':>9}{'p99':>9}{'max':>10}{'CPU/1k':>9}  outcomes")
for c in run["cells"]:
    if c["status"] not in ("done", "interrupted"):
        print(f"{c['target']:<9} {c['status']}"); continue
    s = json.load(open(os.path.join(out, "cells", c["dir"], "summary.json")))
    l = s["latency_us"]
    cpu = ((c.get("usage") or {}).get("by_role", {}).get("proxy", {}).get("cpu_ms_per_1000_requests"))
    cpu = f"{cpu:>7.0f}ms" if cpu is not None else f"{'-':>9}"
    outcomes = ", ".join(f"{k}: {v}" for k, v in s["outcomes"].items())
    proto = {"http1": "h1", "http2": "h2"}.get(s.get("protocol", "http1"), "?")
    print(f"{c['target']:<9}{proto:>6}{c['settings'].get('load.rate', ''):>6}{s['requests']['total']:>10}{s['requests']['errors']:>8}{s['retries']['retried']:>8}"
          f"{l['p50']/1000:>8.2f}ms{l['p99']/1000:>7.2f}ms{l['max']/1000:>8.2f}ms{cpu}  {outcomes}")
print("\nLatency from each request's intended send time (open loop); retried: requests sent again after")
print("the proxy closed a reused connection under them (over HTTP/2: streams a GOAWAY left unprocessed);")
print("CPU/1k: the proxy's CPU per 1,000 requests; proto: h1 HTTP/1.1, h2 HTTP/2 (ALPN h2).")
print("One quick run each:")
print("differences of a few percent are noise; the errors around each event are the point.")
PY
echo
target/release/ingressbench report "$out"
