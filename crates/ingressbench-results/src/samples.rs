//! Sampled requests as CSV, one row per request, with curl's `-w` names for the phase
//! columns (cumulative seconds from the start of the request, as curl prints them).

use std::io::{self, Write};

use ingressbench_stats::{Outcome, Sample};

/// The header row.
pub const HEADER: &str = "intended_at_s,sent_at_s,latency_s,scheduler_lag_s,time_namelookup,time_connect,time_appconnect,time_pretransfer,time_starttransfer,time_total,size_download,outcome,status,backend,connection_reused,generation,sidecar_generation,in_sample";

/// Writes sampled requests as CSV rows.
pub struct SampleWriter<W: Write> {
    out: W,
}

impl<W: Write> SampleWriter<W> {
    /// Starts a CSV file, writing its header.
    pub fn new(mut out: W) -> io::Result<Self> {
        writeln!(out, "{HEADER}")?;
        Ok(Self { out })
    }

    /// Appends rows; `backends` names the backend ids the samples carry.
    pub fn write(&mut self, samples: &[Sample], backends: &[String]) -> io::Result<()> {
        for s in samples {
            let p = &s.phases;
            let namelookup = p.dns_ns;
            let connect = namelookup + p.connect_ns;
            let appconnect = if p.tls_ns > 0 { connect + p.tls_ns } else { 0 };
            let pretransfer = connect + p.tls_ns;
            let starttransfer = if p.ttfb_ns > 0 {
                pretransfer + p.ttfb_ns
            } else {
                0
            };
            let status = match s.outcome {
                Outcome::Status(code) => code.to_string(),
                _ => String::new(),
            };
            let backend = s
                .backend
                .and_then(|b| backends.get(usize::from(b.0)))
                .map(|name| csv_field(name))
                .unwrap_or_default();
            let generation = |slot: usize| match s.generations.get(slot) {
                Some(&g) if g > 0 => g.to_string(),
                _ => String::new(),
            };
            writeln!(
                self.out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                secs(s.intended_at_ns),
                secs(s.sent_at_ns),
                secs(s.latency_ns()),
                secs(s.scheduler_lag_ns()),
                secs(namelookup),
                secs(connect),
                secs(appconnect),
                secs(pretransfer),
                secs(starttransfer),
                secs(s.service_time_ns()),
                s.bytes,
                s.outcome.name(),
                status,
                backend,
                u8::from(s.connection_reused),
                generation(0),
                generation(1),
                u8::from(s.in_sample),
            )?;
        }
        Ok(())
    }

    /// Flushes what was written.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Returns the underlying writer (to finish a compressor, say).
    pub fn into_inner(self) -> W {
        self.out
    }
}

fn secs(ns: u64) -> String {
    format!("{}.{:06}", ns / 1_000_000_000, (ns % 1_000_000_000) / 1_000)
}

/// Quotes a field when it holds a comma, quote or line break; also defuses a leading
/// `=`, `+`, `-` or `@`, which spreadsheets would run as a formula.
fn csv_field(s: &str) -> String {
    let defused = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_owned()
    };
    if defused.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", defused.replace('"', "\"\""))
    } else {
        defused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_stats::{BackendId, Phases};

    #[test]
    fn writes_curl_style_cumulative_columns() {
        let mut s = Sample::new(1_000_000_000);
        s.released_at_ns = 1_000_100_000;
        s.sent_at_ns = 1_000_200_000;
        s.done_at_ns = 1_005_200_000;
        s.phases = Phases {
            dns_ns: 0,
            connect_ns: 100_000,
            tls_ns: 2_000_000,
            ttfb_ns: 1_500_000,
            transfer_ns: 1_000,
        };
        s.outcome = Outcome::Status(200);
        s.backend = Some(BackendId(1));
        s.generations = [4, 0];
        s.bytes = 850;
        let mut w = SampleWriter::new(Vec::new()).unwrap();
        w.write(&[s], &["a".into(), "b,\"x\"".into()]).unwrap();
        let text = String::from_utf8(w.into_inner()).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(HEADER));
        assert_eq!(
            lines.next(),
            Some("1.000000,1.000200,0.005200,0.000100,0.000000,0.000100,0.002100,0.002100,0.003600,0.005000,850,200,200,\"b,\"\"x\"\"\",0,4,,0")
        );
    }

    #[test]
    fn formula_like_backend_names_are_defused() {
        assert_eq!(csv_field("=cmd()"), "'=cmd()");
        assert_eq!(csv_field("plain"), "plain");
    }
}
