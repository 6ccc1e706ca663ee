//! A proxy's counts from the text of its Prometheus endpoint, under the names of
//! [`super::counters`]: what a run reads of a controller's proxy on a cluster whose
//! sockets this machine cannot reach (through the API server's pod proxy). Each
//! exposition's series map to the same counts its native interface gives (Envoy's `/stats`,
//! HAProxy's `show stat`): a test reads one process both ways and finds them equal.
//!
//! Only what the proxy names is counted: a series it does not export (Traefik's
//! `traefik_service_server_up` without health checks) leaves its count out, never 0.

use serde::Deserialize;

use super::counters::{
    Counted, CONFIG_RELOADS, CONNECT_FAILURES, ENDPOINTS_UP, RESPONSES_5XX, RESPONSE_ERRORS,
    RETRIES,
};

/// Whose Prometheus text it is.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Exposition {
    /// Envoy's `/stats/prometheus` (Contour's Envoy serves it on port 8002).
    Envoy,
    /// HAProxy's built-in exporter (`prometheus-exporter` service).
    Haproxy,
    /// Traefik's Prometheus metrics (its metrics entrypoint).
    Traefik,
}

impl Exposition {
    /// Where the endpoint usually is.
    pub fn default_path(self) -> &'static str {
        match self {
            Exposition::Envoy => "/stats/prometheus",
            Exposition::Haproxy | Exposition::Traefik => "/metrics",
        }
    }

    /// Its name in the cluster file.
    pub fn name(self) -> &'static str {
        match self {
            Exposition::Envoy => "envoy",
            Exposition::Haproxy => "haproxy",
            Exposition::Traefik => "traefik",
        }
    }

    /// The prefix every series of it has: text without one is another endpoint's.
    fn prefix(self) -> &'static str {
        match self {
            Exposition::Envoy => "envoy_",
            Exposition::Haproxy => "haproxy_",
            Exposition::Traefik => "traefik_",
        }
    }
}

/// One sample line: its name, labels and value.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl Sample<'_> {
    fn label(&self, name: &str) -> Option<&str> {
        (self.labels.iter())
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the proxy counted, from its endpoint's text; an error when the text holds none
/// of the exposition's series (another endpoint, or another proxy's).
pub fn counted(exposition: Exposition, text: &str) -> Result<Counted, String> {
    let mut counted = Counted::new();
    let mut own = 0usize;
    for sample in text.lines().filter_map(sample) {
        if !sample.name.starts_with(exposition.prefix()) {
            continue;
        }
        own += 1;
        let into = match exposition {
            Exposition::Envoy => envoy(&sample),
            Exposition::Haproxy => haproxy(&sample),
            Exposition::Traefik => traefik(&sample),
        };
        if let Some((into, value)) = into {
            *counted.entry(into).or_default() += value.max(0.0).round() as u64;
        }
    }
    if own == 0 {
        return Err(format!(
            "no {}* series in it: is this {}'s Prometheus endpoint (usually {})?",
            exposition.prefix(),
            exposition.name(),
            exposition.default_path()
        ));
    }
    Ok(counted)
}

/// What one series adds to: a count, and how much (0 for a series that only says the
/// count is kept, such as a server in another state than UP).
type Adds = Option<(&'static str, f64)>;

/// Envoy's series for the counts its `/stats` gives (see `counters::envoy`): per cluster,
/// failed connects, connections a backend closed with a request on them, retries, healthy
/// members and accepted endpoint updates; listener and cluster discovery updates; the 5xx
/// of every HTTP connection manager but the admin interface's.
fn envoy(s: &Sample<'_>) -> Adds {
    let into = match s.name {
        "envoy_cluster_upstream_cx_connect_fail" | "envoy_cluster_upstream_cx_connect_timeout" => {
            CONNECT_FAILURES
        }
        "envoy_cluster_upstream_cx_destroy_remote_with_active_rq" => RESPONSE_ERRORS,
        "envoy_cluster_upstream_rq_retry" => RETRIES,
        "envoy_cluster_membership_healthy" => ENDPOINTS_UP,
        "envoy_cluster_update_success"
        | "envoy_listener_manager_lds_update_success"
        | "envoy_cluster_manager_cds_update_success" => CONFIG_RELOADS,
        "envoy_http_downstream_rq_xx"
            if s.label("envoy_response_code_class") == Some("5")
                && s.label("envoy_http_conn_manager_prefix") != Some("admin") =>
        {
            RESPONSES_5XX
        }
        _ => return None,
    };
    Some((into, s.value))
}

/// HAProxy's exporter for the counts `show stat` gives: the backends' connection and
/// response errors, retries and redispatches; the frontends' 5xx; servers UP.
fn haproxy(s: &Sample<'_>) -> Adds {
    Some(match s.name {
        "haproxy_backend_connection_errors_total" => (CONNECT_FAILURES, s.value),
        "haproxy_backend_response_errors_total" => (RESPONSE_ERRORS, s.value),
        "haproxy_backend_retry_warnings_total" | "haproxy_backend_redispatch_warnings_total" => {
            (RETRIES, s.value)
        }
        "haproxy_frontend_http_responses_total" if s.label("code") == Some("5xx") => {
            (RESPONSES_5XX, s.value)
        }
        "haproxy_server_status" if s.label("state") == Some("UP") => (ENDPOINTS_UP, s.value),
        "haproxy_server_status" => (ENDPOINTS_UP, 0.0),
        _ => return None,
    })
}

/// Traefik's: the 5xx its entrypoints sent, its services' retries (with the retry
/// middleware), servers up (with health checks), configuration reloads. It counts no
/// failed connect or broken response apart from the 502 it answers for them.
fn traefik(s: &Sample<'_>) -> Adds {
    Some(match s.name {
        "traefik_entrypoint_requests_total" => {
            let fives = s.label("code").is_some_and(|c| c.starts_with('5'));
            (RESPONSES_5XX, if fives { s.value } else { 0.0 })
        }
        "traefik_service_retries_total" => (RETRIES, s.value),
        "traefik_service_server_up" => (ENDPOINTS_UP, s.value),
        "traefik_config_reloads_total" => (CONFIG_RELOADS, s.value),
        _ => return None,
    })
}

/// A sample line (`name{label="value",…} value [timestamp]`), or `None` for a comment, a
/// blank line or one that does not parse.
fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t'])?;
    let name = &line[..name_end];
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(inner) => labels(inner)?,
        None => (Vec::new(), &line[name_end..]),
    };
    let value = match rest.split_whitespace().next()? {
        "+Inf" | "-Inf" | "NaN" => return None,
        v => v.parse::<f64>().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The labels after a sample's `{`, and what follows its `}`.
fn labels(inner: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut labels = Vec::new();
    let mut s = inner;
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (label, after) = s.split_once('=')?;
        let quoted = after.strip_prefix('"')?;
        let mut chars = quoted.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (i, '"') => break i + 1,
                (_, c) => value.push(c),
            }
        };
        labels.push((label.trim(), value));
        s = &quoted[end..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_lines_parse_with_labels_escapes_and_timestamps() {
        let s = sample(r#"a_b{x="1",y="q\"uo\\te",z="n\nl"} 2.5e+02 1700000000000"#).unwrap();
        assert_eq!(s.name, "a_b");
        assert_eq!(s.label("x"), Some("1"));
        assert_eq!(s.label("y"), Some("q\"uo\\te"));
        assert_eq!(s.label("z"), Some("n\nl"));
        assert_eq!(s.value, 250.0);
        let s = sample("plain 7").unwrap();
        assert_eq!((s.name, s.labels.len(), s.value), ("plain", 0, 7.0));
        let s = sample(r#"trailing{a="1",} 3"#).unwrap();
        assert_eq!((s.label("a"), s.value), (Some("1"), 3.0));
        for bad in [
            "# HELP a b",
            "",
            "x{a=1} 2",
            r#"x{a="1} 2"#,
            "x notanumber",
            "x +Inf",
        ] {
            assert!(sample(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn each_exposition_sums_its_series_into_the_counts() {
        let envoy_text = r#"# TYPE envoy_cluster_upstream_cx_connect_fail counter
envoy_cluster_upstream_cx_connect_fail{envoy_cluster_name="a"} 3
envoy_cluster_upstream_cx_connect_fail{envoy_cluster_name="b"} 2
envoy_cluster_upstream_cx_connect_timeout{envoy_cluster_name="a"} 1
envoy_cluster_upstream_rq_retry{envoy_cluster_name="a"} 4
envoy_cluster_upstream_rq_retry_success{envoy_cluster_name="a"} 9
envoy_cluster_membership_healthy{envoy_cluster_name="a"} 3
envoy_http_downstream_rq_xx{envoy_response_code_class="5",envoy_http_conn_manager_prefix="admin"} 8
envoy_http_downstream_rq_xx{envoy_response_code_class="5",envoy_http_conn_manager_prefix="ingress_http"} 5
envoy_http_downstream_rq_xx{envoy_response_code_class="2",envoy_http_conn_manager_prefix="ingress_http"} 50
envoy_listener_manager_lds_update_success 2
"#;
        let c = counted(Exposition::Envoy, envoy_text).unwrap();
        assert_eq!(c[CONNECT_FAILURES], 6);
        assert_eq!(c[RETRIES], 4);
        assert_eq!(c[ENDPOINTS_UP], 3);
        assert_eq!(c[RESPONSES_5XX], 5);
        assert_eq!(c[CONFIG_RELOADS], 2);
        assert!(
            !c.contains_key(RESPONSE_ERRORS),
            "not in the text: not said"
        );

        let haproxy_text = r#"haproxy_frontend_http_responses_total{proxy="fe",code="5xx"} 5
haproxy_frontend_http_responses_total{proxy="fe",code="2xx"} 9
haproxy_backend_connection_errors_total{proxy="be"} 5
haproxy_backend_response_errors_total{proxy="be"} 1
haproxy_backend_retry_warnings_total{proxy="be"} 15
haproxy_backend_redispatch_warnings_total{proxy="be"} 2
haproxy_server_status{proxy="be",server="s1",state="UP"} 1
haproxy_server_status{proxy="be",server="s1",state="DOWN"} 0
haproxy_server_status{proxy="be",server="s2",state="UP"} 0
haproxy_server_status{proxy="be",server="s2",state="MAINT"} 1
"#;
        let c = counted(Exposition::Haproxy, haproxy_text).unwrap();
        assert_eq!(
            (c[CONNECT_FAILURES], c[RESPONSE_ERRORS], c[RETRIES]),
            (5, 1, 17)
        );
        assert_eq!((c[RESPONSES_5XX], c[ENDPOINTS_UP]), (5, 1));

        let traefik_text = r#"traefik_config_reloads_total 1
traefik_entrypoint_requests_total{code="200",entrypoint="web",method="GET",protocol="http"} 5
traefik_entrypoint_requests_total{code="502",entrypoint="web",method="GET",protocol="http"} 4
traefik_entrypoint_requests_total{code="503",entrypoint="web",method="GET",protocol="http"} 1
"#;
        let c = counted(Exposition::Traefik, traefik_text).unwrap();
        assert_eq!((c[RESPONSES_5XX], c[CONFIG_RELOADS]), (5, 1));
        assert!(!c.contains_key(RETRIES) && !c.contains_key(ENDPOINTS_UP));
        assert!(!c.contains_key(CONNECT_FAILURES));

        let err = counted(Exposition::Envoy, haproxy_text).unwrap_err();
        assert!(
            err.contains("envoy_") && err.contains("/stats/prometheus"),
            "{err}"
        );
    }
}
