//! Live metrics (#35): `load --metrics-listen` scraped once a second by a real Prometheus
//! (Debian's), what Prometheus then answers compared with the run's own summary, and the
//! Grafana dashboard's queries answered from it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{scratch, server, text, BIN};

/// A process the test started (a Prometheus server, a proxy), killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on 127.0.0.1:`port`: the status line's code and the body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut all = String::new();
    s.read_to_string(&mut all).ok()?;
    let (head, body) = all.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// A PromQL instant query's result at `at` (Unix seconds; none: now), failing the test if
/// Prometheus refused it.
fn query_all(port: u16, promql: &str, at: Option<f64>) -> Vec<serde_json::Value> {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let time = at.map(|t| format!("&time={t:.3}")).unwrap_or_default();
    let (code, body) = get(port, &format!("/api/v1/query?query={encoded}{time}")).unwrap();
    assert_eq!(code, 200, "{promql}: {body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A PromQL instant query's single value.
fn query(port: u16, promql: &str) -> f64 {
    let result = query_all(port, promql, None);
    assert_eq!(result.len(), 1, "{promql}: {result:?}");
    result[0]["value"][1].as_str().unwrap().parse().unwrap()
}

/// deploy/grafana-dashboard.json has the shape Grafana imports (a title and uid, a
/// schema version, panels with an id, a place on the 24-column grid and queries with a
/// reference id), and every query it makes, with its variables given values, is one
/// Prometheus takes and answers from a load's metrics (the events' only when a run had
/// events). The queries are asked as of `at`, while the load's series were current (once
/// its endpoint is gone Prometheus marks them stale).
fn the_dashboard_reads_the_live_metrics(web: u16, at: f64) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana-dashboard.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for key in ["title", "uid"] {
        assert!(dashboard[key].is_string(), "{key}");
    }
    assert!(dashboard["schemaVersion"].is_u64());
    assert_eq!(dashboard["__inputs"][0]["pluginId"], "prometheus");
    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids = std::collections::BTreeSet::new();
    let mut queries = Vec::new();
    for panel in panels {
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "{panel}");
        assert!(
            panel["title"].is_string() && panel["type"].is_string(),
            "{panel}"
        );
        let grid = &panel["gridPos"];
        let at = |k: &str| grid[k].as_u64().unwrap_or_else(|| panic!("{k}: {panel}"));
        assert!(at("x") + at("w") <= 24 && at("h") > 0, "{panel}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{panel}");
        for t in targets {
            assert!(t["refId"].is_string(), "{t}");
            queries.push((
                panel["title"].clone(),
                t["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for a in dashboard["annotations"]["list"].as_array().unwrap() {
        queries.push((a["name"].clone(), a["expr"].as_str().unwrap().to_owned()));
    }
    for (title, expr) in queries {
        let promql = expr.replace("$__rate_interval", "1m").replace("$job", ".*");
        let result = query_all(web, &promql, Some(at));
        assert!(
            !result.is_empty() || expr.contains("ingressbench_events_total"),
            "{title}: {promql} answered nothing"
        );
    }
}

/// Asserts that a p99 Prometheus read from the latency buckets (`p99_s`) lies within the
/// width of the bucket that holds the summary's (`p99_us`); returns that bucket (us).
fn within_its_bucket(p99_s: f64, p99_us: f64) -> (f64, f64) {
    // The buckets are 10 us × 2^(k/4): the one holding the summary's p99.
    let k = (4.0 * (p99_us / 10.0).log2()).ceil();
    let (lo, hi) = (10.0 * 2f64.powf((k - 1.0) / 4.0), 10.0 * 2f64.powf(k / 4.0));
    assert!(
        (p99_s * 1e6 - p99_us).abs() <= hi - lo,
        "Prometheus p99 {} us, the summary's {p99_us} us, bucket {lo:.1}-{hi:.1} us",
        p99_s * 1e6
    );
    (lo, hi)
}

/// Prometheus on a free port, its data in `dir/tsdb`, scraping 127.0.0.1:`scrape` every
/// second (none: scraping nothing).
fn start_prometheus(dir: &Path, scrape: Option<u16>) -> (Running, u16) {
    let web = free_port();
    let config = dir.join("prometheus.yml");
    let scrapes = scrape.map_or(String::new(), |port| format!(
        "scrape_configs:\n  - job_name: ingressbench\n    static_configs: [{{ targets: ['127.0.0.1:{port}'] }}]\n"
    ));
    std::fs::write(
        &config,
        format!("global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n{scrapes}"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("prometheus (apt-get install prometheus; scripts/install-deps.sh installs it)");
    let prometheus = Running(child);
    let started = Instant::now();
    while get(web, "/-/ready").map(|(c, _)| c) != Some(200) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "prometheus not ready: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (prometheus, web)
}

/// A 20 s load at 500 req/s with `--metrics-listen`, scraped every second by Prometheus:
/// afterwards the request count Prometheus holds is the summary's exactly, and the p99
/// it reads from the histogram's buckets is the summary's within the width of the bucket
/// that holds it.
#[test]
fn prometheus_scraping_a_load_agrees_with_its_summary() {
    let dir = scratch("metrics-prometheus");
    let target = server();
    let scrape = free_port();
    let (_prometheus, web) = start_prometheus(&dir, Some(scrape));
    let summary_path = dir.join("summary.json");
    let load = Command::new(BIN)
        .args([
            "load",
            &format!("http://{target}/"),
            "-R",
            "500",
            "-c",
            "10",
        ])
        .args(["-d", "20s", "--quiet", "--metrics-listen"])
        .arg(format!("127.0.0.1:{scrape}"))
        .arg("--json")
        .arg(&summary_path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(load.status.success(), "{}", text(&load));
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        text(&load).contains(&format!("metrics: http://127.0.0.1:{scrape}/metrics")),
        "{}",
        text(&load)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    let total = summary["requests"]["total"].as_u64().unwrap();
    assert!(total > 9_000, "{summary}");
    let counted = query(
        web,
        "sum(last_over_time(ingressbench_requests_total{job=\"ingressbench\"}[5m]))",
    );
    assert_eq!(counted as u64, total, "Prometheus against the summary");
    let ok = query(
        web,
        "sum(last_over_time(ingressbench_requests_total{outcome=\"200\"}[5m]))",
    );
    assert_eq!(ok as u64, summary["requests"]["ok"].as_u64().unwrap());
    // Every request's scheduler lag is in the live histogram, and its worst bucket holds
    // the summary's maximum.
    let lagged = query(
        web,
        "sum(last_over_time(ingressbench_scheduler_lag_seconds_count[5m]))",
    );
    assert_eq!(lagged as u64, total, "lag histogram against the summary");
    // The bucket counts agree with the summary's maximum lag: every request at or under
    // the first bound past it (the summary's value is an HdrHistogram's, within 0.1%), and
    // not every one under the last bound before it.
    let lag_max_s = summary["scheduler_lag_us"]["max"].as_f64().unwrap() / 1e6;
    let mut buckets: Vec<(f64, u64)> = query_all(
        web,
        "last_over_time(ingressbench_scheduler_lag_seconds_bucket[5m])",
        None,
    )
    .iter()
    .map(|r| {
        let le = r["metric"]["le"].as_str().unwrap();
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        (
            le,
            r["value"][1].as_str().unwrap().parse::<f64>().unwrap() as u64,
        )
    })
    .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let over = buckets
        .iter()
        .find(|(le, _)| *le >= lag_max_s * 1.001)
        .unwrap();
    assert_eq!(over.1, total, "lag max {lag_max_s} s: {buckets:?}");
    if let Some(under) = buckets.iter().rev().find(|(le, _)| *le < lag_max_s / 1.001) {
        assert!(under.1 < total, "lag max {lag_max_s} s: {buckets:?}");
    }
    let p99_s = query(
        web,
        "histogram_quantile(0.99, sum by (le) (last_over_time(ingressbench_latency_seconds_bucket[5m])))",
    );
    let p99_us = summary["latency_us"]["p99"].as_f64().unwrap();
    let (lo, hi) = within_its_bucket(p99_s, p99_us);
    eprintln!(
        "{total} requests: Prometheus counted {counted}; p99 {p99_us} us, Prometheus {:.1} us (bucket {lo:.1}-{hi:.1})",
        p99_s * 1e6
    );
    the_dashboard_reads_the_live_metrics(web, ended - 1.5);
}

/// `export prometheus` of the run in `out` (its `dir` a scratch directory), backfilled with
/// promtool into a new Prometheus: each cell's requests, p99 and events as Prometheus
/// reads them agree with the cell's summary and `events.jsonl` (count exactly, p99 within
/// its bucket). Called by the run test that made `out`.
pub(crate) fn a_backfilled_run_agrees_with_its_summaries(dir: &Path, out: &Path) {
    let om = dir.join("run.om");
    let export = Command::new(BIN)
        .args(["export", "prometheus"])
        .arg(out)
        .arg("--out")
        .arg(&om)
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", text(&export));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    let cells = record["cells"].as_array().unwrap();
    assert!(
        text(&export).contains(&format!("{} cells", cells.len())),
        "{}",
        text(&export)
    );
    let backfill = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(dir.join("tsdb"))
        .output()
        .expect("promtool (Debian's prometheus package)");
    assert!(backfill.status.success(), "{}", text(&backfill));
    let (_prometheus, web) = start_prometheus(dir, None);
    let at = Some(record["finished_at_unix_s"].as_f64().unwrap() + 1.0);
    let one = |promql: &str| -> f64 {
        let result = query_all(web, promql, at);
        assert_eq!(result.len(), 1, "{promql}: {result:?}");
        result[0]["value"][1].as_str().unwrap().parse().unwrap()
    };
    for cell in cells {
        let name = cell["dir"].as_str().unwrap();
        let cell_dir = out.join("cells").join(name);
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(cell_dir.join("summary.json")).unwrap())
                .unwrap();
        // Counters grow through the cell: their largest value is the cell's whole.
        let whole = |series: &str| format!("max_over_time({series}{{cell=\"{name}\"}}[1h])");
        let total = one(&format!("sum({})", whole("ingressbench_requests_total")));
        assert_eq!(
            total as u64,
            summary["requests"]["total"].as_u64().unwrap(),
            "{name}"
        );
        let answered = one(&format!(
            "sum({})",
            whole("ingressbench_latency_seconds_count")
        ));
        assert_eq!(
            answered as u64,
            summary["latency_us"]["count"].as_u64().unwrap(),
            "{name}"
        );
        let p99_s = one(&format!(
            "histogram_quantile(0.99, sum by (le) ({}))",
            whole("ingressbench_latency_seconds_bucket")
        ));
        within_its_bucket(p99_s, summary["latency_us"]["p99"].as_f64().unwrap());
        let fired = std::fs::read_to_string(cell_dir.join("events.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"requested_s\""))
            .count();
        assert!(fired > 0, "{name}");
        let events = one(&format!("sum({})", whole("ingressbench_events_total")));
        assert_eq!(events as usize, fired, "{name}");
    }
}

/// A backend killed under load while the proxies still route to it (for 1.5 s, a slow
/// controller): each proxy's own counts through the cell, read once a second into
/// `proxy-metrics.jsonl`, show the failed backend attempts behind the errors the client
/// saw, and the event's `proxy_counted` says what they were. With retries off in the lab, HAProxy's and Envoy's 5xx are the client's errors
/// exactly; nginx and Caddy count no 5xx, and their logs hold a failed attempt for each
/// 502; Traefik's are not read, and the report says why.
#[test]
fn each_proxy_counts_the_failed_backend_attempts_the_client_saw_at_a_kill() {
    let (_dir, out) = crate::run::run_ok(
        "proxy-counts",
        "name: proxy-counts\ntargets: [nginx, haproxy, envoy, caddy, traefik]\nbackends: [{ name: echo, replicas: 3 }]\nload: { mode: open, rate: 200, connections: 10, duration: 4s, sample_rate: 1 }\nevents:\n  - { at: 1s, kill: echo-2, propagation_delay: 1500ms }\n",
    );
    let json = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let record = json(&out.join("run.json"));
    for cell in record["cells"].as_array().unwrap() {
        let proxy = cell["target"].as_str().unwrap();
        let cell_dir = out.join("cells").join(cell["dir"].as_str().unwrap());
        let impact = json(&cell_dir.join("impact.json"));
        let kill = &impact[0];
        if proxy == "traefik" {
            let said = kill["proxy_counted"]["traefik"]["not_read"]
                .as_str()
                .unwrap_or_default();
            assert!(said.contains("access log"), "{kill}");
            continue;
        }
        let readings: Vec<serde_json::Value> =
            std::fs::read_to_string(cell_dir.join("proxy-metrics.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        // One a second through the 4 s load, and one at its end.
        assert!(readings.len() >= 5, "{proxy}: {readings:?}");
        let times: Vec<f64> = readings
            .iter()
            .map(|r| r["t_s"].as_f64().unwrap())
            .collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
        // The whole cell's, the client's and the proxy's: the event's window holds the
        // requests scheduled in it, and one scheduled a millisecond before the kill can
        // fail after it, in the proxy's window but not the client's (CI saw nginx's one
        // broken response counted there with the client's 502 just before).
        let summary = json(&cell_dir.join("summary.json"));
        let client_errors = summary["requests"]["errors"].as_u64().unwrap();
        let count = |key: &str| -> Option<u64> {
            let values: Vec<u64> = (readings.iter())
                .filter_map(|r| r["proxies"][proxy][key].as_u64())
                .collect();
            // No reload in a kill: each count only grows.
            assert!(
                values.windows(2).all(|w| w[0] <= w[1]),
                "{proxy} {key}: {values:?}"
            );
            Some(values.last()? - values.first()?)
        };
        // A failed connect (to the dead backend's port) or a response broken off (a
        // request on a kept-alive connection to it when it died).
        let failed = count("upstream_connect_failures").unwrap()
            + count("upstream_response_errors").unwrap();
        assert!(
            client_errors > 0,
            "{proxy}: the kill cost the client nothing: {summary}"
        );
        assert!(
            failed > 0,
            "{proxy}: no failed backend attempt counted: {readings:?}"
        );
        let counted = &kill["proxy_counted"][proxy];
        match proxy {
            "nginx" | "caddy" => {
                assert!(counted["responses_5xx"].is_null(), "{counted}");
                assert!(
                    client_errors <= failed,
                    "{proxy}: {client_errors} {readings:?}"
                );
            }
            _ => {
                assert_eq!(
                    count("responses_5xx").unwrap(),
                    client_errors,
                    "{proxy}: {readings:?}"
                );
                // And over the event's readings: the 5xx counted there are the client's
                // failures that ended between them.
                assert_eq!(
                    counted["responses_5xx"], kill["client_errors_between_readings"],
                    "{proxy}: {kill}"
                );
            }
        }
        if proxy == "envoy" {
            let up = &counted["endpoints_up"];
            assert_eq!(
                (up["before"].as_u64(), up["after"].as_u64()),
                (Some(3), Some(2)),
                "{counted}"
            );
        }
        eprintln!(
            "{proxy}: client {client_errors} errors {}; proxy {counted}",
            kill["errors_by_outcome"]
        );
    }
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        report.contains("failed connects to backends"),
        "the report's events table says what the proxies counted"
    );
    assert!(
        !report.contains("disagree:"),
        "client and proxies agree here"
    );
}

/// What a run reads of a controller's proxy on a real cluster, its Prometheus endpoint
/// (through the API server's pod proxy), counts what its own interface does: one real
/// Envoy read through `/stats` and `/stats/prometheus`, one HAProxy through `show stat`
/// and its exporter, both after requests to a backend pool with a dead member; Traefik's
/// metrics against the 502s the client saw, and its servers up by its health check.
#[test]
fn each_proxys_prometheus_endpoint_counts_what_its_own_interface_does() {
    use ingressbench_lab::proxy::counters::{self, RESPONSES_5XX};
    use ingressbench_lab::proxy::exposition::{self, Exposition};
    use ingressbench_lab::proxy::{unix_request, Binaries, ProxyKind};
    let dir = scratch("exposition");
    let live = server();
    let dead = free_port();
    let binaries = Binaries::discover();
    let start = |kind: ProxyKind, args: &[String]| -> Running {
        let log = std::fs::File::create(dir.join(format!("{}.log", kind.name()))).unwrap();
        Running(
            Command::new(binaries.locate(kind).unwrap())
                .args(args)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    };
    // 20 requests once the proxy answers with its routes (Traefik answers 404 from its
    // entrypoint until its file provider has loaded them); the codes the client saw.
    let requests = |port: u16, path: &str| -> Vec<u16> {
        let started = Instant::now();
        let first = loop {
            if let Some(code) = status(port, path).filter(|c| *c != 404) {
                break code;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "port {port}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let rest = (1..20).map(|_| status(port, path).unwrap());
        std::iter::once(first).chain(rest).collect()
    };
    let fives = |codes: &[u16]| codes.iter().filter(|c| **c >= 500).count() as u64;
    let unix_text = |socket: &Path, path: &str| -> String {
        let (code, body) = unix_request(socket, "GET", path, None).unwrap();
        assert_eq!(code, 200, "{path}: {body}");
        body
    };

    // Envoy: a static pool of the live backend and a dead port.
    let admin = dir.join("envoy-admin.sock");
    let envoy_port = free_port();
    let endpoint = |port: u16| {
        format!("{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }} }}")
    };
    let config = format!(
        "admin: {{ address: {{ pipe: {{ path: {} }} }} }}\nstatic_resources:\n  listeners:\n  - name: l\n    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {envoy_port} }} }}\n    filter_chains:\n    - filters:\n      - name: envoy.filters.network.http_connection_manager\n        typed_config:\n          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          stat_prefix: ingress_http\n          route_config: {{ virtual_hosts: [ {{ name: a, domains: [\"*\"], routes: [ {{ match: {{ prefix: \"/\" }}, route: {{ cluster: echo }} }} ] }} ] }}\n          http_filters: [ {{ name: envoy.filters.http.router, typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }} }} ]\n  clusters:\n  - name: echo\n    type: STATIC\n    load_assignment: {{ cluster_name: echo, endpoints: [ {{ lb_endpoints: [ {}, {} ] }} ] }}\n",
        admin.display(),
        endpoint(live.port()),
        endpoint(dead)
    );
    std::fs::write(dir.join("envoy.yaml"), config).unwrap();
    // No hot restart: no shared memory to collide with another test's Envoy.
    let envoy = start(
        ProxyKind::Envoy,
        &[
            "-c".into(),
            dir.join("envoy.yaml").display().to_string(),
            "--disable-hot-restart".into(),
        ],
    );
    let codes = requests(envoy_port, "/");
    let native = counters::envoy_admin(&admin).unwrap();
    let scraped =
        exposition::counted(Exposition::Envoy, &unix_text(&admin, "/stats/prometheus")).unwrap();
    assert_eq!(native, scraped, "Envoy: /stats and /stats/prometheus");
    assert!(fives(&codes) > 0, "{codes:?}");
    assert_eq!(
        scraped[RESPONSES_5XX],
        fives(&codes),
        "{scraped:?} {codes:?}"
    );
    assert_eq!(
        scraped[counters::CONNECT_FAILURES],
        fives(&codes),
        "{scraped:?}"
    );
    assert_eq!(
        scraped[counters::ENDPOINTS_UP],
        2,
        "no health check: both up"
    );
    drop(envoy);

    // HAProxy: the same pool, its exporter on a Unix socket of its own.
    let stat = dir.join("haproxy.sock");
    let metrics = dir.join("haproxy-metrics.sock");
    let haproxy_port = free_port();
    std::fs::write(
        dir.join("haproxy.cfg"),
        format!(
            "global\n  stats socket {} mode 600 level admin\ndefaults\n  mode http\n  retries 1\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\nfrontend fe\n  bind 127.0.0.1:{haproxy_port}\n  default_backend be\nfrontend metrics\n  bind unix@{} mode 600\n  http-request use-service prometheus-exporter\nbackend be\n  server live {live}\n  server dead 127.0.0.1:{dead}\n",
            stat.display(),
            metrics.display()
        ),
    )
    .unwrap();
    let haproxy = start(
        ProxyKind::Haproxy,
        &["-f".into(), dir.join("haproxy.cfg").display().to_string()],
    );
    let codes = requests(haproxy_port, "/");
    let native = counters::haproxy_stat(&stat).unwrap();
    let scraped =
        exposition::counted(Exposition::Haproxy, &unix_text(&metrics, "/metrics")).unwrap();
    assert_eq!(native, scraped, "HAProxy: show stat and its exporter");
    assert!(fives(&codes) > 0, "{codes:?}");
    assert_eq!(
        scraped[RESPONSES_5XX],
        fives(&codes),
        "{scraped:?} {codes:?}"
    );
    assert!(
        scraped[counters::RETRIES] >= fives(&codes),
        "one retry each: {scraped:?}"
    );
    drop(haproxy);

    // Traefik: /a through a pool with no health check (its 502s), /b through one whose
    // check finds the dead member down.
    let web = free_port();
    let metrics_port = free_port();
    std::fs::write(
        dir.join("traefik.yaml"),
        format!(
            "http:\n  routers:\n    a: {{ rule: \"PathPrefix(`/a`)\", service: a, entryPoints: [web] }}\n    b: {{ rule: \"PathPrefix(`/b`)\", service: b, entryPoints: [web] }}\n  services:\n    a: {{ loadBalancer: {{ servers: [ {{ url: \"http://{live}\" }}, {{ url: \"http://127.0.0.1:{dead}\" }} ] }} }}\n    b: {{ loadBalancer: {{ healthCheck: {{ path: /, interval: 1s, timeout: 1s }}, servers: [ {{ url: \"http://{live}\" }}, {{ url: \"http://127.0.0.1:{dead}\" }} ] }} }}\n"
        ),
    )
    .unwrap();
    let _traefik = start(
        ProxyKind::Traefik,
        &[
            format!("--entrypoints.web.address=127.0.0.1:{web}"),
            format!("--entrypoints.metrics.address=127.0.0.1:{metrics_port}"),
            "--metrics.prometheus=true".into(),
            "--metrics.prometheus.entrypoint=metrics".into(),
            "--metrics.prometheus.addServicesLabels=true".into(),
            format!(
                "--providers.file.filename={}",
                dir.join("traefik.yaml").display()
            ),
        ],
    );
    let codes = requests(web, "/a");
    let started = Instant::now();
    // Its metrics router may answer 404 a moment after its web entrypoint answers.
    let scraped = loop {
        let (code, text) = get(metrics_port, "/metrics").unwrap();
        let c = (code == 200).then(|| exposition::counted(Exposition::Traefik, &text).unwrap());
        if let Some(c) = c.filter(|c| c.get(counters::ENDPOINTS_UP) == Some(&1)) {
            break c;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{code}: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(fives(&codes) > 0, "{codes:?}");
    assert_eq!(
        scraped[RESPONSES_5XX],
        fives(&codes),
        "{scraped:?} {codes:?}"
    );
    assert!(scraped[counters::CONFIG_RELOADS] >= 1, "{scraped:?}");
    assert!(
        !scraped.contains_key(counters::CONNECT_FAILURES),
        "{scraped:?}"
    );
}

/// `GET path` on 127.0.0.1:`port` over HTTP/1.1 (Envoy refuses HTTP/1.0): the status.
fn status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut all = String::new();
    s.read_to_string(&mut all).ok()?;
    all.split(' ').nth(1)?.parse().ok()
}

/// Load from several worker processes (the path the cluster's load pods take: each
/// worker's windows travel to the coordinator, which merges them): the coordinator's
/// endpoint shows the merged windows, and its last scrape counts what the summary does.
#[test]
fn the_endpoint_of_a_load_from_several_workers_shows_their_merged_windows() {
    let dir = scratch("metrics-workers");
    let target = server();
    let scrape = free_port();
    let summary_path = dir.join("summary.json");
    let mut load = Command::new(BIN)
        .args(["load", &format!("http://{target}/"), "-R", "400", "-c", "8"])
        .args(["-d", "4s", "--workers", "2", "--quiet", "--metrics-listen"])
        .arg(format!("127.0.0.1:{scrape}"))
        .arg("--json")
        .arg(&summary_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Scraped every 200 ms until the load is gone: the endpoint waits for a scrape after
    // the load, so the last one answered holds the final figures.
    let started = Instant::now();
    let mut last = None;
    while load.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the load did not end"
        );
        if let Some((200, body)) = get(scrape, "/metrics") {
            last = Some(body);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(load.wait().unwrap().success());
    let last = last.expect("scraped at least once");
    let value = |name: &str| -> u64 {
        last.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    let total = summary["requests"]["total"].as_u64().unwrap();
    assert!(total > 1_000, "{summary}");
    assert_eq!(value("ingressbench_requests_total{"), total, "{last}");
    assert_eq!(
        value("ingressbench_scheduler_lag_seconds_count"),
        total,
        "{last}"
    );
    assert_eq!(
        value("ingressbench_latency_seconds_count"),
        summary["latency_us"]["count"].as_u64().unwrap(),
        "{last}"
    );
}

/// What the live endpoint serves passes Prometheus's own tools: the text format
/// `promtool check metrics` (no error, no lint), the OpenMetrics text Prometheus's
/// OpenMetrics parser (promtool's backfill, each sample stamped); and neither shows the
/// target's query string.
#[test]
fn the_live_metrics_pass_promtool_in_both_formats_and_hide_the_query() {
    let dir = scratch("metrics-promtool");
    let target = server();
    let scrape = free_port();
    let mut load = Command::new(BIN)
        .args([
            "load",
            &format!("http://{target}/?token=sekrit"),
            "-R",
            "200",
            "-c",
            "2",
        ])
        .args(["-d", "4s", "--quiet", "--metrics-listen"])
        .arg(format!("127.0.0.1:{scrape}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // After a window or two has closed.
    std::thread::sleep(Duration::from_millis(2500));
    let fetch = |accept: &str| -> String {
        let mut s = TcpStream::connect(("127.0.0.1", scrape)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nAccept: {accept}\r\n\r\n").unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).unwrap();
        all.split_once("\r\n\r\n").unwrap().1.to_owned()
    };
    let plain = fetch("text/plain");
    let openmetrics = fetch("application/openmetrics-text; version=1.0.0");
    let _ = load.wait();
    for body in [&plain, &openmetrics] {
        assert!(body.contains("ingressbench_requests_total{"), "{body}");
        assert!(!body.contains("sekrit"), "{body}");
    }
    let check = |args: &[&str], input: Option<&str>| {
        let mut child = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool (Debian's prometheus package)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.unwrap_or_default().as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let linted = check(&["check", "metrics"], Some(&plain));
    assert!(
        linted.status.success() && linted.stdout.is_empty() && linted.stderr.is_empty(),
        "promtool check metrics: {}\n{plain}",
        text(&linted)
    );
    // The backfill takes OpenMetrics with a timestamp on each sample.
    let stamped: String = openmetrics
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("{l}\n")
            } else {
                format!("{l} 1700000000\n")
            }
        })
        .collect();
    std::fs::write(dir.join("live.om"), &stamped).unwrap();
    let parsed = check(
        &[
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "live.om",
            "blocks",
        ],
        None,
    );
    assert!(parsed.status.success(), "{}\n{stamped}", text(&parsed));
}
