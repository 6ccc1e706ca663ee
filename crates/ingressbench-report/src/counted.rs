//! The client's errors in an event's window beside what the proxy counted there
//! (`impact.json`'s `errors_by_outcome` and `proxy_counted`), in words: "client: 446 ×
//! 502; envoy: 446 failed connects to backends, 0 retries, endpoints up 3 → 2". Where the
//! two disagree the sentence says so: that is a finding, not noise.

use std::fmt::Write;

use ingressbench_results::impact::{EndpointsUp, ImpactEntry, ProxyCounted};

/// Each count's words, in the order they are said.
const WORDS: [(&str, &str); 5] = [
    ("upstream_connect_failures", "failed connects to backends"),
    (
        "upstream_response_errors",
        "responses broken off by backends",
    ),
    ("retries", "retries"),
    ("responses_5xx", "5xx sent"),
    ("config_reloads", "reloads"),
];

/// The sentence for one event's impact entry, or `None` when no proxy was read.
pub fn sentence(event: &ImpactEntry) -> Option<String> {
    let proxies = event.proxy_counted.as_ref()?;
    let client_errors = event.requests.errors.unwrap_or(0);
    let mut by_outcome: Vec<String> = (event.requests.errors_by_outcome.iter())
        .map(|(k, n)| format!("{n} × {k}"))
        .collect();
    if by_outcome.is_empty() {
        by_outcome.push(format!("{client_errors} errors"));
    }
    // What the proxies' counts are set against: the client's failures that ended between
    // the same readings (a request sent just before the event that failed after it is
    // one), where the entry has them.
    let seen = event
        .client_errors_between_readings
        .unwrap_or(client_errors);
    let mut client = format!("client: {}", by_outcome.join(", "));
    if seen != client_errors {
        let _ = write!(client, " ({seen} ended between the proxy's readings)");
    }
    let mut parts = vec![client];
    for (name, counted) in proxies {
        let counted = match counted {
            ProxyCounted::NotRead { not_read } => {
                parts.push(format!("{name}: not read ({not_read})"));
                continue;
            }
            ProxyCounted::Counted(c) => c,
        };
        let count = |key: &str| counted.increases.get(key).copied();
        let mut said: Vec<String> = WORDS
            .iter()
            .filter_map(|(key, words)| Some(format!("{} {words}", count(key)?)))
            .collect();
        if let Some(EndpointsUp {
            before: Some(before),
            fewest: Some(fewest),
            after: Some(after),
        }) = counted.endpoints_up
        {
            said.push(if fewest < before.min(after) {
                format!("endpoints up {before} → {fewest} → {after}")
            } else {
                format!("endpoints up {before} → {after}")
            });
        }
        if said.is_empty() {
            said.push("counts none of these".into());
        }
        let failures = ["upstream_connect_failures", "upstream_response_errors"]
            .iter()
            .filter_map(|k| count(k))
            .sum::<u64>();
        let counts_failures = count("upstream_connect_failures").is_some();
        let retries = count("retries").unwrap_or(0);
        let finding = match (seen, failures) {
            (0, 0) if retries > 0 => {
                format!(" (the client saw no error: {name} retried {retries} requests)")
            }
            (0, f) if f > 0 => format!(
                " (the client saw no error: {name} hid {f} failed backend attempts{})",
                if retries > 0 { " by retrying" } else { "" }
            ),
            (e, 0) if e > 0 && counts_failures => {
                format!(" (disagree: the client saw {e} errors, {name} counted no failed backend attempt)")
            }
            _ => String::new(),
        };
        parts.push(format!("{name}: {}{finding}", said.join(", ")));
    }
    Some(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An entry as a file would hold it.
    fn entry(v: serde_json::Value) -> ImpactEntry {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_client_and_each_proxy_in_one_sentence_with_their_disagreement() {
        let agree = json!({
            "errors": 446, "errors_by_outcome": { "502": 446 },
            "proxy_counted": { "envoy": {
                "upstream_connect_failures": 446, "retries": 0,
                "endpoints_up": { "before": 3, "fewest": 2, "after": 2 } } }
        });
        assert_eq!(
            sentence(&entry(agree)).unwrap(),
            "client: 446 × 502; envoy: 446 failed connects to backends, 0 retries, endpoints up 3 → 2"
        );
        let hidden = json!({
            "errors": 0, "errors_by_outcome": {},
            "proxy_counted": { "haproxy": { "upstream_connect_failures": 3, "retries": 3 } }
        });
        assert!(sentence(&entry(hidden)).unwrap().ends_with(
            "(the client saw no error: haproxy hid 3 failed backend attempts by retrying)"
        ));
        let disagree = json!({
            "errors": 5, "errors_by_outcome": { "refused": 5 },
            "proxy_counted": { "nginx": { "upstream_connect_failures": 0, "upstream_response_errors": 0 } }
        });
        assert!(sentence(&entry(disagree)).unwrap().contains("disagree"));
        let retried = json!({
            "errors": 0,
            "proxy_counted": { "haproxy-ingress": { "upstream_connect_failures": 0, "retries": 13 } }
        });
        assert!(sentence(&entry(retried))
            .unwrap()
            .ends_with("(the client saw no error: haproxy-ingress retried 13 requests)"));
        // A request sent just before the event failed after it: in the proxy's readings,
        // not in the window's errors; no finding.
        let before = json!({
            "errors": 0, "client_errors_between_readings": 1,
            "proxy_counted": { "nginx": { "upstream_connect_failures": 0, "upstream_response_errors": 1 } }
        });
        assert_eq!(
            sentence(&entry(before)).unwrap(),
            "client: 0 errors (1 ended between the proxy's readings); nginx: 0 failed connects to backends, 1 responses broken off by backends"
        );
        assert!(sentence(&entry(json!({ "errors": 1 }))).is_none());
        let not_read =
            json!({ "errors": 2, "proxy_counted": { "traefik": { "not_read": "off" } } });
        assert_eq!(
            sentence(&entry(not_read)).unwrap(),
            "client: 2 errors; traefik: not read (off)"
        );
    }
}
