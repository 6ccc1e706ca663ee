//! The terminal summary of a load run.

use std::fmt::Write as _;

use ingressbench_stats::{Percentiles, Summary};

/// Renders `summary` for a terminal. `title` says what was run (target and settings).
pub fn render(summary: &Summary, title: &str) -> String {
    let mut out = String::new();
    let s = summary;
    let _ = writeln!(out, "{title}");
    let target = s
        .rate
        .target_per_s
        .map(|t| format!(" of {} req/s target", trim_float(t)))
        .unwrap_or_default();
    let answered = match s.rate.answered_per_s {
        Some(r) => format!(", {r:.1} req/s answered"),
        None => ", none answered".to_owned(),
    };
    let _ = writeln!(
        out,
        "  {} requests in {:.2}s: {} ok, {} errors; {:.1} req/s sent{target}{answered}{}",
        group(s.requests.total),
        s.duration_s,
        group(s.requests.ok),
        group(s.requests.errors),
        s.rate.achieved_per_s,
        if s.requests.warmup > 0 {
            format!(" ({} warm-up requests excluded)", group(s.requests.warmup))
        } else {
            String::new()
        },
    );
    let ramp = s
        .connect_ramp_ms
        .map(|ms| format!(" (opening them took {ms:.0} ms)"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  {} connections opened{ramp}, {} requests on reused connections, {} received",
        group(s.connections_opened),
        group(s.reused_requests),
        bytes(s.bytes_received)
    );
    let idle = &s.connection_events;
    if idle.http2_connections > 0 {
        let limit = match idle.server_stream_limit {
            0 => "no limit announced".to_owned(),
            n => format!("the server allowed {}", group(n)),
        };
        let _ = writeln!(
            out,
            "  HTTP/2: {} connections, at most {} streams in flight on one ({limit}), {} GOAWAYs received",
            group(idle.http2_connections),
            group(idle.max_streams_in_flight),
            group(idle.goaways_received)
        );
        if idle.flow_control_stalls > 0 {
            let _ = writeln!(
                out,
                "  HTTP/2: {} request bodies waited for flow-control window, {} in all",
                group(idle.flow_control_stalls),
                human_us(idle.flow_control_stall_ns as f64 / 1000.0)
            );
        }
    }
    if idle.closed_by_server_while_idle + idle.unexpected_bytes_while_idle > 0 {
        let _ = writeln!(
            out,
            "  {} idle connections closed by the server and {} with unasked bytes, retired before use",
            group(idle.closed_by_server_while_idle),
            group(idle.unexpected_bytes_while_idle)
        );
    }
    let _ = writeln!(out);
    let what = if s.latency_corrected {
        "from each request's intended send time (corrected for coordinated omission)"
    } else {
        "from each request's actual send (closed loop: no schedule to correct against)"
    };
    let _ = writeln!(
        out,
        "  Latency of {} answered requests, {what}:",
        group(s.latency_us.count)
    );
    let _ = writeln!(
        out,
        "  {:<14}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}",
        "", "p50", "p75", "p90", "p99", "p99.9", "p99.99", "max", "mean"
    );
    row(&mut out, "latency", &s.latency_us);
    if s.latency_corrected {
        row(&mut out, "service time", &s.service_time_us);
        row(&mut out, "sched. lag", &s.scheduler_lag_us);
    }
    if let Some(b) = s.batch_window.as_ref().filter(|b| b.used_us.count > 0) {
        let _ = writeln!(
            out,
            "  {:<14}batch window {}: p50 {}, p99 {} (the lag above is in the latency)",
            "",
            b.setting,
            human_us(b.used_us.p50 as f64),
            human_us(b.used_us.p99 as f64)
        );
    }
    if s.time_to_failure_us.count > 0 {
        row(&mut out, "to failure", &s.time_to_failure_us);
    }
    let _ = writeln!(out);
    let _ = write!(out, "  Phases p50/p99:");
    for name in ["dns", "connect", "tls", "ttfb", "total"] {
        if let Some(p) = s.phases_us.get(name).filter(|p| p.count > 0) {
            let _ = write!(
                out,
                "  {name} {}/{}",
                human_us(p.p50 as f64),
                human_us(p.p99 as f64)
            );
        }
    }
    let _ = writeln!(out);
    let outcomes: Vec<String> = s
        .outcomes
        .iter()
        .map(|(k, v)| format!("{k}: {}", group(*v)))
        .collect();
    let _ = writeln!(
        out,
        "  Outcomes: {}",
        if outcomes.is_empty() {
            "none".to_owned()
        } else {
            outcomes.join(", ")
        }
    );
    let causes: Vec<String> = s
        .retries
        .after
        .iter()
        .map(|(k, v)| format!("{k}: {}", group(*v)))
        .collect();
    let _ = writeln!(
        out,
        "  Retried (policy {}): {}{}",
        s.retries.policy,
        group(s.retries.retried),
        if causes.is_empty() {
            String::new()
        } else {
            format!(" after {}", causes.join(", "))
        }
    );
    if !s.backends.is_empty() {
        let total: u64 = s.backends.values().sum();
        let parts: Vec<String> = s
            .backends
            .iter()
            .map(|(name, n)| {
                let lat = &s.backend_latency_us[name];
                format!(
                    "{name} {} ({:.1}%, p50 {} p99 {})",
                    group(*n),
                    100.0 * *n as f64 / total.max(1) as f64,
                    human_us(lat.p50 as f64),
                    human_us(lat.p99 as f64)
                )
            })
            .collect();
        let _ = writeln!(out, "  Backends: {}", parts.join(", "));
    }
    if !s.generations.is_empty() {
        let parts: Vec<String> = s
            .generations
            .iter()
            .map(|g| {
                format!(
                    "{} {} {} ({:.3}-{:.3} s)",
                    g.header,
                    g.generation,
                    group(g.answers),
                    g.first_answer_s,
                    g.last_answer_s
                )
            })
            .collect();
        let _ = writeln!(out, "  Generations: {}", parts.join(", "));
    }
    for w in &s.warnings {
        let _ = writeln!(out, "  WARNING: {w}");
    }
    out
}

fn row(out: &mut String, name: &str, p: &Percentiles) {
    let _ = writeln!(
        out,
        "  {name:<14}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}",
        human_us(p.p50 as f64),
        human_us(p.p75 as f64),
        human_us(p.p90 as f64),
        human_us(p.p99 as f64),
        human_us(p.p999 as f64),
        human_us(p.p9999 as f64),
        human_us(p.max as f64),
        human_us(p.mean),
    );
}

/// A duration in microseconds, in the unit that keeps it short: `850us`, `12.34ms`, `1.234s`.
pub fn human_us(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0}us")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1_000.0)
    } else {
        format!("{:.3}s", us / 1_000_000.0)
    }
}

fn trim_float(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.2} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// `text` with every control character (an escape sequence, a carriage return, a
/// bell) written as `\u{..}`, so that a string from a results directory printed on a
/// terminal stays text: it cannot move the cursor, retitle the window or hide a line.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_stats::{LoadMode, Outcome, Recorder, Sample, SummaryContext};

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert_eq!(printable("nginx p99 1 ms"), "nginx p99 1 ms");
        assert_eq!(printable("a\x1b[2Jb\rc\u{7}"), "a\\u{1b}[2Jb\\u{d}c\\u{7}");
    }

    #[test]
    fn summary_names_what_each_figure_is() {
        let mut r = Recorder::new(1_000_000_000);
        let id = r.backend_id(b"b1");
        for i in 0..100u64 {
            let mut s = Sample::new(i * 10_000_000);
            s.done_at_ns = s.intended_at_ns + 1_500_000;
            s.outcome = if i == 0 {
                Outcome::Status(502)
            } else {
                Outcome::Status(200)
            };
            s.backend = Some(id);
            // A route change half way: generation 2 from the 50th request on.
            s.generations = [1 + u32::from(i >= 50), 0];
            r.record(&s);
        }
        let ctx = SummaryContext {
            mode: LoadMode::Open,
            target_rate_per_s: Some(100.0),
            measured_ns: 1_000_000_000,
            interrupted: false,
            retry_policy: "idempotent",
            batch_window: Some("auto".to_owned()),
            generation_headers: vec!["x-gen".to_owned()],
            protocol: "http1",
        };
        let text = render(&Summary::new(&r, &ctx), "GET http://x/");
        assert!(
            text.contains("Generations: x-gen 1 50 (0.002-0.491 s), x-gen 2 50 (0.501-0.992 s)"),
            "{text}"
        );
        assert!(
            text.contains(
                "100 requests in 1.00s: 99 ok, 1 errors; 100.0 req/s sent of 100 req/s target, 100.0 req/s answered"
            ),
            "{text}"
        );
        assert!(text.contains("corrected for coordinated omission"));
        assert!(text.contains("200: 99, 502: 1"));
        assert!(text.contains("b1 100 (100.0%"));
        assert!(text.contains("WARNING: only 100 requests"));
    }

    #[test]
    fn units() {
        assert_eq!(human_us(850.0), "850us");
        assert_eq!(human_us(12_340.0), "12.34ms");
        assert_eq!(human_us(1_234_000.0), "1.234s");
        assert_eq!(group(1234567), "1,234,567");
    }
}
