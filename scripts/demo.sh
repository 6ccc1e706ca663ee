#!/usr/bin/env bash
# The README's first command: installs what is missing, builds ingressbench, brings up all
# five real proxies (nginx, HAProxy, Envoy, Traefik, Caddy) in front of three echo
# backends, and measures each over TLS at the same constant rate, one after another:
# the lab runs on CPU 0, the load generator on CPU 1. Ends with a comparison table;
# every run's JSON summary, .hgrm spectrum and .hlog interval log are in results/demo-*/.
#
# Until the scenario runner lands (issue #4) this is a steady-state comparison; the churn
# events (scaling, kills, route changes) come with it.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-500}
DURATION=${DURATION:-10s}
bash scripts/install-deps.sh
cargo build --release -q -p ingressbench
ib=$PWD/target/release/ingressbench

out=results/demo-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
lab_log=$out/lab.txt
taskset -c 0 "$ib" lab up examples/lab-all-proxies.yaml > "$lab_log" 2>&1 &
lab_pid=$!
trap 'kill -INT $lab_pid 2>/dev/null; wait $lab_pid 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 100); do
  grep -q '^Ctrl-C' "$lab_log" && break
  if ! kill -0 $lab_pid 2>/dev/null; then cat "$lab_log"; echo "demo: the lab did not come up" >&2; exit 1; fi
  sleep 0.2
done
cat "$lab_log"

ca=$(grep -o -- '--cacert [^ ]*' "$lab_log" | head -1 | cut -d' ' -f2)
# "https://app.test:PORT/" lines, in the order the proxies are listed.
mapfile -t ports < <(grep -o 'https://app.test:[0-9]*/$' "$lab_log" | sed 's|.*:\([0-9]*\)/$|\1|')
mapfile -t kinds < <(grep -E '^[a-z]+ .*\(pid [0-9]+, started' "$lab_log" | cut -d' ' -f1)
for i in "${!kinds[@]}"; do
  kind=${kinds[$i]}; port=${ports[$i]}
  echo; echo "== $kind: open loop at $RATE req/s over TLS for $DURATION"
  taskset -c 1 "$ib" load -q -R "$RATE" -c 50 -d "$DURATION" --warmup 2s \
    --resolve "app.test:$port:127.0.0.1" --cacert "$ca" \
    --json "$out/$kind.json" --hgrm "$out/$kind.hgrm" --hlog "$out/$kind.hlog" \
    "https://app.test:$port/" || true
done

echo
python3 - "$out" "${kinds[@]}" <<'PY'
import json, sys
out, kinds = sys.argv[1], sys.argv[2:]
print(f"{'proxy':<9}{'requests':>10}{'errors':>8}{'p50':>10}{'p90':>10}{'p99':>10}{'p99.9':>10}{'max':>10}")
fmt = lambda us: f"{us/1000:.2f}ms"
for k in kinds:
    try:
        s = json.load(open(f"{out}/{k}.json"))
    except OSError:
        print(f"{k:<9} (no result)"); continue
    l = s["latency_us"]
    print(f"{k:<9}{s['requests']['total']:>10}{s['requests']['errors']:>8}{fmt(l['p50']):>10}{fmt(l['p90']):>10}{fmt(l['p99']):>10}{fmt(l['p999']):>10}{fmt(l['max']):>10}")
    for w in s["warnings"]:
        print(f"         warning: {w}")
print("\nlatency from each request's intended send time (open loop, corrected for coordinated omission);")
print("one run each, no repeats: differences of a few percent are inside the noise.")
PY
echo
echo "results: $out"
