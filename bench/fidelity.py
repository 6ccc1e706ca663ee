#!/usr/bin/env python3
"""What different clients count on the same nginx at the moments a proxy benchmark is about:
reloads and idle keep-alive closes. Every tool loads the same nginx (one worker, CPU 0) in
turn, generators on CPU 1, and the table gives each tool's answered requests and errors.

    python3 bench/fidelity.py reload   # 100 req/s over 50 keep-alive connections for 20 s,
                                       # nginx reloaded (SIGHUP) every 2 s
    python3 bench/fidelity.py idle     # keepalive_timeout 1s, 25 req/s over 50 connections, 20 s
    python3 bench/fidelity.py all

ingressbench runs twice: with its default retry policy (idempotent) and with
--retry-policy none, which counts the requests that raced a close as errors. Peers (vegeta,
oha, wrk2) are used where bench/compare.py finds them. Nothing here asserts anything.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import GEN_CPU, IB, SUT_CPU, find, free_port  # noqa: E402


class Nginx:
    def __init__(self, keepalive_timeout="75s"):
        self.dir = tempfile.mkdtemp(prefix="ib-fidelity-nginx-")
        self.port = free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""worker_processes 1;
daemon off;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_timeout {keepalive_timeout};
  server {{
    listen 127.0.0.1:{self.port};
    location / {{ add_header x-backend nginx; return 200 "hello from nginx\\n"; }}
  }}
}}
""")
        self.proc = subprocess.Popen(["taskset", "-c", SUT_CPU, "nginx", "-c", conf, "-e", f"{self.dir}/error.log"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(0.5)
        self.url = f"http://127.0.0.1:{self.port}/"

    def reload(self):
        os.kill(self.proc.pid, signal.SIGHUP)

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def pinned(cmd, **kw):
    return subprocess.run(["taskset", "-c", GEN_CPU] + cmd, capture_output=True, text=True, **kw)


def ingressbench(extra):
    def go(url, rate, seconds, tmp):
        out = os.path.join(tmp, "ib.json")
        pinned([IB, "load", "-q", "--json", out, "-R", str(rate), "-c", "50", "-d", f"{seconds}s"] + extra + [url])
        s = json.load(open(out))
        errors = {k: v for k, v in s["outcomes"].items() if not k.isdigit() or int(k) >= 400}
        return {"requests": s["requests"]["total"], "ok": s["requests"]["ok"], "errors": errors,
                "retried": s["retries"]["retried"], "idle_closed": s["connection_events"]["closed_by_server_while_idle"]}
    return go


def vegeta(url, rate, seconds, tmp):
    targets, results = os.path.join(tmp, "targets"), os.path.join(tmp, "vegeta.bin")
    open(targets, "w").write(f"GET {url}\n")
    with open(results, "wb") as out:
        subprocess.run(["taskset", "-c", GEN_CPU, find("vegeta"), "attack", f"-targets={targets}", f"-rate={rate}",
                        f"-duration={seconds}s", "-workers=50", "-max-workers=50"], stdout=out, stderr=subprocess.DEVNULL)
    s = json.loads(subprocess.run([find("vegeta"), "report", "-type=json", results], capture_output=True, text=True).stdout)
    ok = sum(v for k, v in s["status_codes"].items() if k.isdigit() and 100 <= int(k) < 400)
    errors = {}
    for e in s.get("errors") or []:
        errors[e[-60:]] = errors.get(e[-60:], 0) + 1
    if s["requests"] - ok and not errors:
        errors["failed"] = s["requests"] - ok
    return {"requests": s["requests"], "ok": ok, "errors": errors}


def oha(url, rate, seconds, tmp):
    r = pinned([find("oha"), "--no-tui", "--output-format", "json", "-c", "50", "-q", str(rate), "-z", f"{seconds}s", url])
    s = json.loads(r.stdout)
    ok = sum(v for k, v in s["statusCodeDistribution"].items() if int(k) < 400)
    errors = dict(s.get("errorDistribution") or {})
    return {"requests": ok + sum(errors.values()), "ok": ok, "errors": errors}


def wrk2(url, rate, seconds, tmp):
    r = pinned([find("wrk2"), "-t1", "-c50", f"-d{seconds}s", f"-R{rate}", url])
    reqs = int(next(l for l in r.stdout.splitlines() if "requests in" in l).split()[0])
    errors = {}
    for line in r.stdout.splitlines():
        if "Socket errors" in line:
            for part in line.split(":", 1)[1].split(","):
                name, n = part.split()
                if int(n):
                    errors[name] = int(n)
    return {"requests": reqs, "ok": reqs, "errors": errors}


def experiment(title, nginx, rate, seconds, reload_every, tmp):
    tools = [("ingressbench (default: --retry-policy idempotent)", ingressbench([])),
             ("ingressbench --retry-policy none", ingressbench(["--retry-policy", "none"]))]
    for name, fn in (("vegeta", vegeta), ("oha", oha), ("wrk2", wrk2)):
        if find(name):
            tools.append((name, fn))
    print(f"\n### {title}\n")
    print("| tool | requests | answered | errors | by kind | retried | idle closes seen |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for name, go in tools:
        stop = threading.Event()

        def reloader():
            while not stop.wait(reload_every):
                nginx.reload()
        thread = threading.Thread(target=reloader, daemon=True) if reload_every else None
        if thread:
            thread.start()
        try:
            r = go(nginx.url, rate, seconds, tmp)
        finally:
            stop.set()
            if thread:
                thread.join()
        time.sleep(1)
        kinds = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "-"
        print(f"| {name} | {r['requests']:,} | {r['ok']:,} | {sum(r['errors'].values()):,} | {kinds} "
              f"| {r.get('retried', '-')} | {r.get('idle_closed', '-')} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["reload", "idle", "all"])
    ap.add_argument("--duration", type=int, default=20)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    tmp = tempfile.mkdtemp(prefix="ib-fidelity-")
    try:
        if args.what in ("reload", "all"):
            nginx = Nginx()
            try:
                experiment(f"nginx (1 worker) reloaded every 2 s, 100 req/s over 50 keep-alive connections, "
                           f"{args.duration} s", nginx, 100, args.duration, 2.0, tmp)
            finally:
                nginx.stop()
        if args.what in ("idle", "all"):
            nginx = Nginx(keepalive_timeout="1s")
            try:
                experiment(f"nginx keepalive_timeout 1s, 25 req/s over 50 connections, {args.duration} s",
                           nginx, 25, args.duration, None, tmp)
            finally:
                nginx.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
