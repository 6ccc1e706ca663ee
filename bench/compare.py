#!/usr/bin/env python3
"""Side-by-side benchmarks of ingressbench's load engine against peer load generators.

Every tool loads the same nginx on loopback in the same run: nginx pinned to CPU 0, the
generator to CPU 1. CPU time is the generator's user+sys (getrusage of the child), so
"CPU per request" is what the generator itself spent. Prints a Markdown table with the
ratio of each tool to ingressbench; nothing here asserts a timing.

    python3 bench/compare.py closed      # 1 thread, 50 connections, closed loop, 10 s
    python3 bench/compare.py open        # open loop at 20,000 req/s, 10 s
    python3 bench/compare.py accuracy    # a server that answers after exactly 2 ms, at 2,000
                                         # and 20,000 req/s: each tool's error and CPU
    python3 bench/compare.py memory      # RSS at 1 min vs 10 min; RSS with 10,000 connections
    python3 bench/compare.py backend     # the echo backend on one core vs nginx on one core
    python3 bench/compare.py workers     # one worker process vs two (--workers 2) at the
                                         # highest rate one sustains with lag p99 under 1 ms
    python3 bench/compare.py h2-closed   # HTTP/2 (h2c): 10 connections x 100 streams, closed loop,
                                         # against h2load and oha --http2
    python3 bench/compare.py h2-open     # HTTP/2 (h2c) open loop at 20,000 req/s over 10 connections,
                                         # beside the h2 crate alone (examples/h2_floor.rs)
    python3 bench/compare.py grpc        # gRPC unary calls to the echo backend (h2c), open loop at
                                         # 2,000 and 10,000 calls/s over 10 connections, against ghz
    python3 bench/compare.py h3          # HTTP/3 open loop at 2,000 and 10,000 req/s over 10 connections
                                         # to Envoy answering after 2 ms: ingressbench --http3 against
                                         # oha-h3, h2load's HTTP/2 (TLS) to the same Envoy beside them
    python3 bench/compare.py metrics     # --metrics-listen's cost: without it, scraped once a second,
                                         # and flooded by 100 scrapers, at 20,000 req/s, 3 runs each
    python3 bench/compare.py all --duration 5

Needs nginx (scripts/install-deps.sh) and the peers (../shared/tools/install-peers.sh;
ghz from the Go module proxy: `GOBIN=~/.cache/ib-peers/bin go install
github.com/bojand/ghz/cmd/ghz@latest`);
wrk2 is used where $WRK2 (or wrk2 on PATH, or in $PEERS) names one, built from its public
repository by whoever runs this (nothing here builds it).
"""
import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.environ.get("PEERS", os.path.expanduser("~/.cache/ib-peers/bin"))
IB = os.environ.get("IB") or os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "ingressbench")
SUT_CPU, GEN_CPU = "0", "1"


def find(tool):
    for path in (os.environ.get(tool.upper()), os.path.join(PEERS, tool), shutil.which(tool)):
        if path and os.access(path, os.X_OK):
            return path
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, seconds, failure):
    """Until something accepts on 127.0.0.1:port, for at most `seconds`; else exits with `failure`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(failure)


class Nginx:
    """nginx with one worker on SUT_CPU, returning a small 200 from memory with the two
    headers the lab's answers carry (the backend's name and the configuration generation),
    so that ingressbench's per-answer path is measured as it runs in the lab."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ib-bench-nginx-")
        self.port = free_port()
        self.h2_port = free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""worker_processes 1;
worker_rlimit_nofile 65536;
daemon off;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log;
events {{ worker_connections 30000; }}
http {{
  access_log off;
  keepalive_requests 1000000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{self.port} backlog=16384 reuseport;
    location / {{ add_header x-backend nginx; add_header x-ingressbench-generation 1; return 200 "hello from nginx\\n"; }}
  }}
  # The same answer over HTTP/2 without TLS (h2c, prior knowledge; nginx 1.22's syntax).
  server {{
    listen 127.0.0.1:{self.h2_port} http2 backlog=16384;
    http2_max_concurrent_streams 128;
    location / {{ add_header x-backend nginx; add_header x-ingressbench-generation 1; return 200 "hello from nginx\\n"; }}
  }}
}}
""")
        self.proc = subprocess.Popen(["taskset", "-c", SUT_CPU, "nginx", "-c", conf, "-e", f"{self.dir}/error.log"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.port, 10, f"nginx did not start; see {self.dir}/error.log")
        self.url = f"http://127.0.0.1:{self.port}/"
        self.h2_url = f"http://127.0.0.1:{self.h2_port}/"

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(cmd, stdout_path=None):
    """Runs cmd pinned to GEN_CPU; returns (stdout text, cpu seconds, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    out = open(stdout_path, "w") if stdout_path else subprocess.PIPE
    proc = subprocess.run(["taskset", "-c", GEN_CPU] + cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"  ! {' '.join(cmd[:3])}... exited {proc.returncode}: {proc.stderr.strip()[:300]}", file=sys.stderr)
    return (proc.stdout if not stdout_path else ""), cpu, wall


def run_ingressbench(args, url, tmp):
    out = os.path.join(tmp, "ib.json")
    _, cpu, wall = measure([IB, "load", "-q", "--json", out] + args + [url])
    with open(out) as f:
        s = json.load(f)
    if s["rate"]["target_per_s"]:
        print(f"  ingressbench {' '.join(args)}: scheduler lag p50 {s['scheduler_lag_us']['p50']} us, "
              f"p99 {s['scheduler_lag_us']['p99']} us; achieved {s['rate']['achieved_per_s']:.1f}/s", file=sys.stderr)
    return {"requests": s["requests"]["total"], "ok": s["requests"]["ok"], "rate": s["rate"]["achieved_per_s"],
            "p50_us": s["latency_us"]["p50"], "p90_us": s["latency_us"]["p90"], "p99_us": s["latency_us"]["p99"],
            "cpu": cpu, "lag_p50_us": s["scheduler_lag_us"]["p50"], "lag_p99_us": s["scheduler_lag_us"]["p99"],
            "window_us": (s.get("batch_window") or {}).get("used_us", {}).get("p50")}


def run_wrk2(rate, seconds, url):
    text, cpu, _ = measure([find("wrk2"), "-t1", "-c50", f"-d{seconds}s", f"-R{rate}", "--latency", url])
    reqs = int(next(l for l in text.splitlines() if "requests in" in l).split()[0])
    rate_line = next(l for l in text.splitlines() if l.startswith("Requests/sec"))
    # wrk2 --latency: " 50.000%    2.10ms" rows of its HdrHistogram spectrum.
    def pct(label):
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == label:
                return wrk_latency(f"x {parts[1]}", "x")
        return None
    return {"requests": reqs, "ok": reqs, "rate": float(rate_line.split()[1]), "p50_us": pct("50.000%"),
            "p90_us": pct("90.000%"), "p99_us": pct("99.000%"), "cpu": cpu}


def run_wrk(conns, seconds, url):
    text, cpu, _ = measure([find("wrk"), "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", url])
    reqs = int(next(l for l in text.splitlines() if "requests in" in l).split()[0])
    rate = float(next(l for l in text.splitlines() if l.startswith("Requests/sec")).split()[1])
    return {"requests": reqs, "ok": reqs, "rate": rate, "p50_us": wrk_latency(text, "50%"), "p99_us": wrk_latency(text, "99%"), "cpu": cpu}


def wrk_latency(text, label):
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == label:
            v = parts[1]
            for unit, scale in (("us", 1), ("ms", 1000), ("s", 1_000_000)):
                if v.endswith(unit):
                    return float(v[: -len(unit)]) * scale
    return None


def run_oha(conns, seconds, url, rate=None, http2_parallel=None):
    cmd = [find("oha"), "--no-tui", "--output-format", "json", "-c", str(conns), "-z", f"{seconds}s"]
    if http2_parallel:
        cmd += ["--http2", "-p", str(http2_parallel)]
    if rate:
        cmd += ["-q", str(rate), "--latency-correction"]
    text, cpu, _ = measure(cmd + [url])
    s = json.loads(text)
    total = sum(s["statusCodeDistribution"].values())
    pct = s.get("latencyPercentiles", {})
    return {"requests": total, "ok": s["statusCodeDistribution"].get("200", 0), "rate": s["summary"]["requestsPerSec"],
            "p50_us": pct.get("p50", 0) * 1e6, "p90_us": pct.get("p90", 0) * 1e6, "p99_us": pct.get("p99", 0) * 1e6,
            "cpu": cpu}


def run_h2load(conns, streams, seconds, url, rate=None):
    cmd = [find("h2load"), "-t", "1", "-c", str(conns), "-m", str(streams), "-D", str(seconds)]
    if rate:
        cmd += ["--rps", str(max(1, round(rate / conns)))]
    text, cpu, _ = measure(cmd + [url])
    line = next(l for l in text.splitlines() if l.startswith("requests:"))
    parts = line.replace(",", "").split()
    total, ok = int(parts[1]), int(parts[7])
    rate_per_s = float(next(l for l in text.splitlines() if l.startswith("finished in")).split(",")[1].split()[0])
    # h2load gives no percentiles: min, max, mean of "time for request".
    mean = None
    for l in text.splitlines():
        if l.strip().startswith("time for request:"):
            mean = wrk_latency(f"x {l.split()[5]}", "x")
    return {"requests": total, "ok": ok, "rate": rate_per_s, "p50_us": None, "p99_us": None, "mean_us": mean,
            "cpu": cpu}


def run_hey(conns, seconds, url):
    text, cpu, _ = measure([find("hey"), "-c", str(conns), "-z", f"{seconds}s", url])
    rate = float(next(l for l in text.splitlines() if "Requests/sec" in l).split()[1])
    reqs = sum(int(l.split()[1]) for l in text.splitlines() if l.strip().startswith("[2"))
    def pct(label):
        for l in text.splitlines():
            if l.strip().startswith(f"{label}% in"):
                return float(l.split()[2]) * 1e6
    return {"requests": reqs, "ok": reqs, "rate": rate, "p50_us": pct(50), "p99_us": pct(99), "cpu": cpu}


def run_vegeta(rate, seconds, url, tmp):
    results = os.path.join(tmp, "vegeta.bin")
    targets = os.path.join(tmp, "targets.txt")
    with open(targets, "w") as f:
        f.write(f"GET {url}\n")
    _, cpu, _ = measure([find("vegeta"), "attack", f"-targets={targets}", f"-rate={rate}", f"-duration={seconds}s",
                         "-max-workers=50", "-workers=50"], stdout_path=results)
    report = subprocess.run([find("vegeta"), "report", "-type=json", results], capture_output=True, text=True)
    s = json.loads(report.stdout)
    return {"requests": s["requests"], "ok": s["status_codes"].get("200", 0), "rate": s["rate"],
            "p50_us": s["latencies"]["50th"] / 1000, "p90_us": s["latencies"]["90th"] / 1000,
            "p99_us": s["latencies"]["99th"] / 1000, "cpu": cpu}


def table(title, rows, key, better, base_name="ingressbench"):
    print(f"\n### {title}\n")
    print("| tool | requests | ok | req/s | p50 | p99 | CPU s | CPU us/req | " + f"{key} vs {base_name} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = rows.get(base_name)
    for name, r in rows.items():
        if r is None:
            print(f"| {name} | not installed | | | | | | | |")
            continue
        per_req = r["cpu"] / max(r["requests"], 1) * 1e6
        r["cpu_per_req_us"] = per_req
        ratio = ""
        if base:
            if key == "req/s":
                ratio = f"{r['rate'] / base['rate']:.2f}x"
            else:
                ratio = f"{per_req / (base['cpu'] / max(base['requests'], 1) * 1e6):.2f}x"
        fmt = lambda us: "-" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} us")
        print(f"| {name} | {r['requests']:,} | {r['ok']:,} | {r['rate']:,.0f} | {fmt(r['p50_us'])} | {fmt(r['p99_us'])} "
              f"| {r['cpu']:.2f} | {per_req:.2f} | {ratio} |")
    print(f"\n({better})")


def closed(nginx, seconds, tmp):
    rows = {"ingressbench": run_ingressbench(["-c", "50", "--threads", "1", "-d", f"{seconds}s"], nginx.url, tmp)}
    rows["wrk"] = run_wrk(50, seconds, nginx.url) if find("wrk") else None
    rows["oha"] = run_oha(50, seconds, nginx.url) if find("oha") else None
    rows["hey"] = run_hey(50, seconds, nginx.url) if find("hey") else None
    table(f"Closed loop, 1 thread, 50 connections, {seconds} s", rows, "req/s", "higher req/s is better")
    return rows


def open_loop(nginx, seconds, tmp, rate=20000, grids=("0us", "250us", "500us", "1ms")):
    # The default pacing grid first (it is the baseline of the ratios), then other grids.
    rows = {"ingressbench": run_ingressbench(["-R", str(rate), "-c", "50", "-d", f"{seconds}s"], nginx.url, tmp)}
    for grid in grids:
        rows[f"ingressbench --batch-window {grid}"] = run_ingressbench(
            ["-R", str(rate), "-c", "50", "-d", f"{seconds}s", "--batch-window", grid], nginx.url, tmp)
    rows["oha --latency-correction"] = run_oha(50, seconds, nginx.url, rate=rate) if find("oha") else None
    rows["vegeta"] = run_vegeta(rate, seconds, nginx.url, tmp) if find("vegeta") else None
    table(f"Open loop at {rate:,} req/s, 50 connections, {seconds} s", rows, "CPU/request",
          "lower CPU per request is better; achieved rate should be within 0.5% of the target")
    return rows


class DelayServer:
    """bench/delay_server.c on SUT_CPU: answers every request after exactly delay_us and
    says, when stopped, which delays it applied (read of the request to write of the answer)."""

    def __init__(self, tmp, delay_us):
        binary = os.path.join(tmp, "delay_server")
        if not os.path.exists(binary):
            subprocess.run(["cc", "-O2", "-o", binary, os.path.join(ROOT, "bench", "delay_server.c")], check=True)
        self.proc = subprocess.Popen(["taskset", "-c", SUT_CPU, binary, str(delay_us)], stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().split()[1]}/"

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        return json.loads(out.strip().splitlines()[-1])


def accuracy(seconds, tmp, rates=(2000, 20000), delay_us=2000):
    """Each tool against a server whose delay is known and logged: how far each tool's p50
    and p90 are from what the server applied, and what it cost the generator."""
    tools = [("ingressbench (default: --batch-window auto)", lambda r, u: run_ingressbench(["-R", str(r), "-c", "50", "-d", f"{seconds}s"], u, tmp))]
    for grid in ("0us", "100us", "250us", "500us", "1ms"):
        tools.append((f"ingressbench --batch-window {grid}", lambda r, u, g=grid: run_ingressbench(
            ["-R", str(r), "-c", "50", "-d", f"{seconds}s", "--batch-window", g], u, tmp)))
    if find("wrk2"):
        tools.append(("wrk2 -R", lambda r, u: run_wrk2(r, seconds, u)))
    if find("oha"):
        tools.append(("oha -q --latency-correction", lambda r, u: run_oha(50, seconds, u, rate=r)))
    if find("vegeta"):
        tools.append(("vegeta -rate", lambda r, u: run_vegeta(r, seconds, u, tmp)))
    for rate in rates:
        print(f"\n### Accuracy at {rate:,} req/s: a server that answers after exactly {delay_us / 1000:g} ms, "
              f"50 connections, {seconds} s\n")
        print("| tool | achieved req/s | server applied p50 | reported p50 | p50 error | reported p90 | p90 error "
              "| CPU us/req | CPU/req vs wrk2 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        rows = []
        for name, go in tools:
            server = DelayServer(tmp, delay_us)
            try:
                r = go(rate, server.url)
            finally:
                applied = server.stop()
            r["applied_p50_us"] = applied["applied_us"]["p50"]
            r["applied_p90_us"] = applied["applied_us"]["p90"]
            r["cpu_per_req_us"] = r["cpu"] / max(r["requests"], 1) * 1e6
            rows.append((name, r))
        wrk2 = next((r for n, r in rows if n.startswith("wrk2")), None)
        for name, r in rows:
            err50 = r["p50_us"] - r["applied_p50_us"]
            err90 = (r.get("p90_us") or 0) - r["applied_p90_us"]
            vs = f"{r['cpu_per_req_us'] / wrk2['cpu_per_req_us']:.2f}x" if wrk2 else "-"
            extra = f" (window p50 {r['window_us']} us, lag p50 {r['lag_p50_us']} us)" if r.get("window_us") is not None else ""
            print(f"| {name}{extra} | {r['rate']:,.0f} | {r['applied_p50_us']} us | {r['p50_us']:.0f} us | +{err50:.0f} us "
                  f"| {r.get('p90_us') or 0:.0f} us | +{err90:.0f} us | {r['cpu_per_req_us']:.2f} | {vs} |")
    print("\n(error: reported minus what the server applied; what remains is the wire, the kernel and the "
          "generator's own lateness)")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def memory(nginx, tmp, long_minutes):
    print("\n### Memory\n")
    # RSS over a long open-loop run: after 1 minute and at the end.
    proc = subprocess.Popen(["taskset", "-c", GEN_CPU, IB, "load", "-q", "-R", "5000", "-c", "50", "-d", f"{long_minutes}m",
                             "--hlog", os.path.join(tmp, "long.hlog"), nginx.url], stdout=subprocess.DEVNULL)
    samples = []
    for minute in range(1, long_minutes + 1):
        time.sleep(60)
        samples.append((minute, rss_kib(proc.pid)))
    proc.wait()
    print("| minute | RSS |\n|---:|---:|")
    for minute, kib in samples:
        print(f"| {minute} | {kib / 1024:.1f} MiB |")
    if len(samples) >= 2:
        print(f"\nRSS at the end / RSS after 1 minute: {samples[-1][1] / samples[0][1]:.3f}")
    # RSS with 10,000 open connections (open loop at 10,000 req/s: every connection used).
    proc = subprocess.Popen(["taskset", "-c", GEN_CPU, IB, "load", "-q", "-R", "10000", "-c", "10000", "-d", "30s", nginx.url],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(20)
    kib = rss_kib(proc.pid)
    with open(f"/proc/{proc.pid}/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    out, _ = proc.communicate()
    opened = next((l for l in out.splitlines() if "connections opened" in l), "").strip()
    print(f"\n10,000 connections: RSS {kib / 1024:.1f} MiB after 20 s, peak {hwm / 1024:.1f} MiB ({opened})")


def backend(nginx, seconds, tmp):
    """Throughput of the echo backend on one core (CPU 0), next to nginx on the same core."""
    proc = subprocess.Popen(["taskset", "-c", SUT_CPU, IB, "backend", "--name", "bench"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    addr = proc.stdout.readline().strip().removeprefix("listening on ")
    url = f"http://{addr}/"
    try:
        rows = {"ingressbench backend (615 B body)": run_ingressbench(["-c", "50", "-d", f"{seconds}s"], url, tmp),
                "nginx return 200 (17 B body)": run_ingressbench(["-c", "50", "-d", f"{seconds}s"], nginx.url, tmp)}
        if find("wrk"):
            rows["ingressbench backend, loaded by wrk"] = run_wrk(50, seconds, url)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    table(f"Server on one core, closed loop with 50 connections, {seconds} s", rows, "req/s",
          "the backend must serve well over 50k small req/s on one core so it is never the bottleneck")


def workers(nginx, seconds, tmp, rates=(5000, 10000, 20000, 30000, 40000, 60000)):
    """The highest rate of `rates` one worker process sustains with scheduler lag p99 under
    1 ms, then one worker against two (--workers 2) at that rate, all on GEN_CPU: what a
    second process costs per request (the coordinator, its merge, the JSON lines)."""
    best = None
    for rate in rates:
        r = run_ingressbench(["-R", str(rate), "-c", "50", "-d", f"{seconds}s"], nginx.url, tmp)
        if r["lag_p99_us"] >= 1000 or r["rate"] < rate * 0.99:
            break
        best = (rate, r)
    if best is None:
        print("\n(one worker did not sustain the lowest rate with lag p99 under 1 ms)")
        return {}
    rate, one = best
    two = run_ingressbench(["-R", str(rate), "-c", "50", "-d", f"{seconds}s", "--workers", "2"], nginx.url, tmp)
    rows = {"ingressbench": one, "ingressbench --workers 2": two}
    table(f"One worker vs two at {rate:,} req/s (the highest of {', '.join(map(str, rates))} "
          f"one sustains with lag p99 under 1 ms), 50 connections, {seconds} s", rows, "CPU/request",
          "lower CPU per request is better; lag p99: " +
          ", ".join(f"{name} {r['lag_p99_us']} us" for name, r in rows.items()))
    return rows


def h2_closed(nginx, seconds, tmp, conns=10, streams=100):
    rows = {"ingressbench": run_ingressbench(["--http2", "-c", str(conns), "--streams", str(streams), "-d", f"{seconds}s"],
                                             nginx.h2_url, tmp)}
    rows["h2load"] = run_h2load(conns, streams, seconds, nginx.h2_url) if find("h2load") else None
    rows["oha --http2"] = run_oha(conns, seconds, nginx.h2_url, http2_parallel=streams) if find("oha") else None
    table(f"HTTP/2 (h2c) closed loop, 1 thread, {conns} connections x {streams} streams, {seconds} s", rows, "req/s",
          "higher req/s is better; h2load reports no percentiles")
    return rows


H2_FLOOR = os.path.join(ROOT, "target", "release", "examples", "h2_floor")


def run_h2_floor(conns, seconds, url, rate):
    """The h2 crate on tokio with nothing of ingressbench's
    (crates/ingressbench-load/examples/h2_floor.rs): the floor under its HTTP/2 path."""
    if not os.access(H2_FLOOR, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "ingressbench-load", "--example", "h2_floor"],
                       cwd=ROOT, check=True)
    addr = url.split("//")[1].rstrip("/")
    text, cpu, _ = measure([H2_FLOOR, addr, str(rate), str(seconds), str(conns)])
    answered, total = (int(x) for x in text.split()[0:3:2])
    return {"requests": total, "ok": answered, "rate": answered / seconds, "p50_us": None, "p99_us": None,
            "cpu": cpu}


def h2_open(nginx, seconds, tmp, rate=20000, conns=10, streams=100, grids=("500us", "1ms")):
    args = ["--http2", "-R", str(rate), "-c", str(conns), "--streams", str(streams), "-d", f"{seconds}s"]
    rows = {"ingressbench": run_ingressbench(args, nginx.h2_url, tmp)}
    for grid in grids:
        rows[f"ingressbench --batch-window {grid}"] = run_ingressbench(args + ["--batch-window", grid], nginx.h2_url, tmp)
    rows["h2 crate alone (examples/h2_floor.rs)"] = run_h2_floor(conns, seconds, nginx.h2_url, rate)
    rows["h2load --rps"] = run_h2load(conns, streams, seconds, nginx.h2_url, rate=rate) if find("h2load") else None
    rows["oha --http2 --latency-correction"] = (
        run_oha(conns, seconds, nginx.h2_url, rate=rate, http2_parallel=streams) if find("oha") else None)
    table(f"HTTP/2 (h2c) open loop at {rate:,} req/s, {conns} connections (up to {streams} streams each), {seconds} s",
          rows, "CPU/request", "lower CPU per request is better; achieved rate should be within 0.5% of the target "
          "(h2load's --rps paces each connection on its own and reports no percentiles; the h2 crate alone paces "
          "on tokio's 1 ms timer and measures nothing)")
    return rows


def run_ghz(rate, conns, seconds, addr):
    """ghz (grpc-go) calling the echo service's Unary with the proto file: --rps throttles
    its workers (a worker waits for its answer before its next call: not an open loop, so
    its latencies are from each call's send, not its due time)."""
    proto = os.path.join(ROOT, "proto", "ingressbench", "echo", "v1", "echo.proto")
    text, cpu, _ = measure([find("ghz"), "--insecure", "--proto", proto, "--call", "ingressbench.echo.v1.Echo.Unary",
                            "-d", '{"seq": 1, "payload": "' + "A" * 52 + '"}', "--connections", str(conns),
                            "-c", str(conns * 5), "--rps", str(rate), "-z", f"{seconds}s", "--format", "json", addr])
    s = json.loads(text)
    pct = {p["percentage"]: p["latency"] / 1000 for p in s.get("latencyDistribution") or []}
    return {"requests": s["count"], "ok": (s.get("statusCodeDistribution") or {}).get("OK", 0), "rate": s["rps"],
            "p50_us": pct.get(50), "p90_us": pct.get(90), "p99_us": pct.get(99), "cpu": cpu}


def grpc(seconds, tmp, rates=(2000, 10000), conns=10):
    """gRPC unary calls to the echo backend on SUT_CPU (h2c, HTTP/2 prior knowledge), open
    loop at each of `rates` over `conns` connections: ingressbench's calls (tonic over hyper)
    against ghz's (grpc-go), calls a second achieved and CPU per call."""
    proc = subprocess.Popen(["taskset", "-c", SUT_CPU, IB, "backend", "--name", "bench"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    addr = proc.stdout.readline().strip().removeprefix("listening on ")
    try:
        for rate in rates:
            args = ["--grpc", "-R", str(rate), "-c", str(conns), "-d", f"{seconds}s"]
            rows = {"ingressbench": run_ingressbench(args, f"http://{addr}/", tmp),
                    # Its default batch window grows with the rate (timer wakes shared,
                    # the lag counted in every latency); a window of 0 wakes for each call.
                    "ingressbench --batch-window 0us": run_ingressbench(args + ["--batch-window", "0us"],
                                                                        f"http://{addr}/", tmp)}
            rows["ghz"] = run_ghz(rate, conns, seconds, addr) if find("ghz") else None
            table(f"gRPC unary at {rate:,} calls/s over {conns} connections, {seconds} s", rows, "CPU/call",
                  "lower CPU per call is better; a row short of the rate could not keep it")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


class EnvoyH3:
    """Envoy (the lab's, .venv/bin/envoy) on SUT_CPU with one worker, answering every request
    from its own memory after a fixed delay (its fault filter), over HTTP/3 on a UDP port
    and over HTTP/2 with TLS on the TCP port of the same number: the same server, the same
    delay, for an HTTP/3 client and h2load. Its certificate is self-signed for 127.0.0.1."""

    def __init__(self, tmp, delay_us):
        envoy = find("envoy") or os.path.join(ROOT, ".venv", "bin", "envoy")
        self.dir = tempfile.mkdtemp(prefix="ib-bench-envoy-h3-")
        self.cert, key = os.path.join(self.dir, "cert.pem"), os.path.join(self.dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", self.cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                        # Not a CA (rustls refuses a CA's certificate as a server's).
                        "-extensions", "v3_req", "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        self.port = free_port()
        tls = lambda alpn: {"common_tls_context": {"alpn_protocols": alpn, "tls_certificates": [
            {"certificate_chain": {"filename": self.cert}, "private_key": {"filename": key}}]}}
        def manager(codec):
            return {"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": codec.lower(), "codec_type": codec,
                "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "hello from envoy\n"}}}]}]},
                "http_filters": [
                    {"name": "envoy.filters.http.fault", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
                        "delay": {"fixed_delay": f"{delay_us / 1e6:.6f}s", "percentage": {"numerator": 100}}}},
                    {"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}
        address = lambda protocol: {"socket_address": {"protocol": protocol, "address": "127.0.0.1", "port_value": self.port}}
        config = {"static_resources": {"listeners": [
            {"name": "h2", "address": address("TCP"), "filter_chains": [{"filters": [manager("HTTP2")], "transport_socket": {
                "name": "envoy.transport_sockets.tls", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext", **tls(["h2"])}}}]},
            {"name": "h3", "address": address("UDP"),
             "udp_listener_config": {"quic_options": {}, "downstream_socket_config": {"prefer_gro": True}},
             "filter_chains": [{"filters": [manager("HTTP3")], "transport_socket": {
                 "name": "envoy.transport_sockets.quic", "typed_config": {
                     "@type": "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport",
                     "downstream_tls_context": tls(["h3"])}}}]}]}}
        conf = os.path.join(self.dir, "envoy.json")
        with open(conf, "w") as f:
            json.dump(config, f)
        self.log = open(os.path.join(self.dir, "envoy.log"), "w")
        self.proc = subprocess.Popen(["taskset", "-c", SUT_CPU, envoy, "-c", conf, "--concurrency", "1",
                                      "--disable-hot-restart", "--log-level", "warn"],
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        wait_for_port(self.port, 20, f"Envoy did not start; see {self.dir}/envoy.log")
        self.url = f"https://127.0.0.1:{self.port}/"

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_oha_h3(conns, seconds, url, rate):
    cmd = [find("oha-h3"), "--no-tui", "--output-format", "json", "--http-version", "3", "--insecure",
           "-c", str(conns), "-z", f"{seconds}s", "-q", str(rate), "--latency-correction", url]
    text, cpu, _ = measure(cmd)
    s = json.loads(text)
    pct = s.get("latencyPercentiles", {})
    return {"requests": sum(s["statusCodeDistribution"].values()), "ok": s["statusCodeDistribution"].get("200", 0),
            "rate": s["summary"]["requestsPerSec"], "p50_us": pct.get("p50", 0) * 1e6, "p90_us": pct.get("p90", 0) * 1e6,
            "p99_us": pct.get("p99", 0) * 1e6, "cpu": cpu}


def h3(seconds, tmp, rates=(2000, 10000), conns=10, delay_us=2000):
    """HTTP/3 (issue 51): at each rate, open loop over `conns` connections to Envoy answering
    after a fixed delay (EnvoyH3): ingressbench --http3 and oha built with HTTP/3 (oha-h3)
    over QUIC, h2load over HTTP/2 with TLS to the same Envoy, ingressbench over HTTP/2 too.
    What to read: CPU per request against h2load's HTTP/2 (goal: ingressbench's HTTP/3 at
    most 1.5x), and each p50's distance from the delay against oha's (goal: at most oha's)."""
    for rate in rates:
        server = EnvoyH3(tmp, delay_us)
        try:
            base = ["-R", str(rate), "-c", str(conns), "-d", f"{seconds}s", "--cacert", server.cert]
            rows = {"ingressbench --http3": run_ingressbench(base + ["--http3"], server.url, tmp),
                    "oha-h3 --http-version 3": run_oha_h3(conns, seconds, server.url, rate) if find("oha-h3") else None,
                    "ingressbench --http2": run_ingressbench(base + ["--http2"], server.url, tmp),
                    "h2load (HTTP/2, TLS)": run_h2load(conns, 100, seconds, server.url, rate=rate) if find("h2load") else None}
        finally:
            server.stop()
        table(f"HTTP/3 at {rate:,} req/s over {conns} connections to Envoy answering after {delay_us / 1000:g} ms, "
              f"{seconds} s", rows, "CPU/request", "lower CPU per request is better", base_name="ingressbench --http3")
        for name, r in rows.items():
            if r and r.get("p50_us"):
                print(f"- {name}: p50 {r['p50_us'] - delay_us:+.0f} us from the delay")


def scraper(port, stop, interval, served):
    """GETs /metrics at 127.0.0.1:port until stop: every `interval` s, or back to back
    (interval 0, a flood). Runs on SUT_CPU (the thread pins itself), off the generator's."""
    os.sched_setaffinity(0, {int(SUT_CPU)})
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"GET /metrics HTTP/1.0\r\nAccept: application/openmetrics-text\r\n\r\n")
                while s.recv(65536):
                    pass
            served.append(1)
        except OSError:
            time.sleep(0.01)
        if interval:
            stop.wait(interval)


def metrics(nginx, seconds, tmp, rate=20000, repeats=3):
    """--metrics-listen's cost to the generator (#35): the same open-loop load without it,
    with it and a scrape a second (Prometheus's pace, 1 s being a short interval), and
    with 100 scrapers asking back to back; the three in turn, `repeats` times, summed.
    What to read: CPU per request (goal: within 2% of without at 1 scrape/s), and the
    achieved rate and scheduler lag under the flood."""
    import threading
    kinds = [("ingressbench", 0, None), ("--metrics-listen, 1 scrape/s", 1, 1.0),
             ("--metrics-listen, 100 scrapers back to back", 100, 0)]
    rows = {}
    for _ in range(repeats):
        for name, scrapers, interval in kinds:
            args = ["-R", str(rate), "-c", "50", "-d", f"{seconds}s"]
            stop, served, threads = threading.Event(), [], []
            if scrapers:
                port = free_port()
                args += ["--metrics-listen", f"127.0.0.1:{port}"]
                threads = [threading.Thread(target=scraper, args=(port, stop, interval, served), daemon=True)
                           for _ in range(scrapers)]
                for t in threads:
                    t.start()
            r = run_ingressbench(args, nginx.url, tmp)
            stop.set()
            for t in threads:
                t.join()
            r["scrapes"] = len(served)
            if name in rows:
                acc = rows[name]
                for k in ("requests", "ok", "cpu", "scrapes"):
                    acc[k] += r[k]
                for k in ("rate", "p50_us", "p99_us", "lag_p99_us"):
                    acc[k] = max(acc[k], r[k]) if k != "rate" else min(acc[k], r[k])
            else:
                rows[name] = r
    table(f"--metrics-listen at {rate:,} req/s, 50 connections, {seconds} s, {repeats} runs each in turn", rows,
          "CPU/request", "lower CPU per request is better; req/s is the lowest of the runs, p50/p99 the highest")
    for name, r in rows.items():
        print(f"- {name}: {r['scrapes']:,} scrapes answered; scheduler lag p99 (highest run) {r['lag_p99_us']} us")
    return rows


def soak(tmp, long_minutes):
    # A soak of bench/soak-bench.yaml (nginx reloaded every 10 s under 5,000 req/s, the
    # lab's proxy and backends and the tool on the machine's cores as a user runs it):
    # the tool's own resident memory from soak.jsonl, a line a minute, and the results
    # directory's size against the soak's 200 MB budget.
    print("\n### A soak's own cost\n")
    out = os.path.join(tmp, "soak")
    run = subprocess.run([IB, "run", os.path.join(ROOT, "bench", "soak-bench.yaml"), "--soak", f"{long_minutes}m",
                          "--out", out], cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stderr[-2000:])
        return None
    record = json.load(open(os.path.join(out, "run.json")))
    cell = record["cells"][0]
    lines = [json.loads(l) for l in open(os.path.join(out, "cells", cell["dir"], "soak.jsonl"))]
    print("| minute | tool RSS | CPU ms per 1,000 requests | descriptors | results directory |\n|---:|---:|---:|---:|---:|")
    for l in lines:
        print(f"| {l['t_s'] / 60:.0f} | {l['rss_bytes'] / 2**20:.1f} MiB | {l['cpu_ms_per_1000_requests']} | {l['fds']} | "
              f"{l['results_bytes'] / 1e6:.1f} MB |")
    first, last = lines[0], lines[-2] if len(lines) > 2 else lines[-1]
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    tool = cell["soak"]["tool"]
    print(f"\nRSS at minute {last['t_s'] / 60:.0f} / RSS at minute 1: {last['rss_bytes'] / first['rss_bytes']:.3f} "
          f"(target: within 10%); its slope {tool.get('rss_bytes_per_min')} bytes a minute; "
          f"{cell['summary']['requests']:,} requests, {cell['soak']['firings']} reloads; "
          f"results directory {size / 1e6:.1f} MB (estimated {cell['soak']['estimate_bytes'] / 1e6:.1f} MB, target under 200 MB)")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["closed", "open", "accuracy", "memory", "backend", "workers", "h2-closed", "h2-open", "grpc",
                                    "h3", "metrics", "soak", "all"])
    ap.add_argument("--duration", type=int, default=10, help="seconds per tool (default 10)")
    ap.add_argument("--rate", type=int, default=20000)
    ap.add_argument("--accuracy-rates", default="2000,20000", help="rates of the accuracy tables")
    ap.add_argument("--long-minutes", type=int, default=10)
    args = ap.parse_args()
    if not os.access(IB, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "ingressbench"], cwd=ROOT, check=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sys.stdout.reconfigure(line_buffering=True)
    print(f"machine: {os.cpu_count()} CPUs, {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}; "
          f"nginx on CPU {SUT_CPU}, generators on CPU {GEN_CPU}")
    nginx = Nginx()
    tmp = tempfile.mkdtemp(prefix="ib-bench-")
    try:
        if args.what in ("closed", "all"):
            closed(nginx, args.duration, tmp)
        if args.what in ("open", "all"):
            open_loop(nginx, args.duration, tmp, args.rate)
        if args.what in ("h2-closed", "all"):
            h2_closed(nginx, args.duration, tmp)
        if args.what in ("h2-open", "all"):
            h2_open(nginx, args.duration, tmp, args.rate)
        if args.what in ("accuracy", "all"):
            accuracy(args.duration, tmp, rates=[int(r) for r in args.accuracy_rates.split(",")])
        if args.what in ("backend", "all"):
            backend(nginx, args.duration, tmp)
        if args.what in ("workers", "all"):
            workers(nginx, args.duration, tmp)
        if args.what in ("grpc", "all"):
            grpc(args.duration, tmp)
        if args.what in ("h3", "all"):
            h3(args.duration, tmp)
        if args.what in ("metrics", "all"):
            metrics(nginx, args.duration, tmp, args.rate)
        if args.what in ("memory", "all"):
            memory(nginx, tmp, args.long_minutes)
        if args.what in ("soak", "all"):
            soak(tmp, args.long_minutes)
    finally:
        nginx.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
