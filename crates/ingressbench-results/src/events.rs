//! `events.jsonl`: a cell's events as they happened, a line each time something did: an
//! event fired and its change was asked of the site ([`Requested`]), or could not be
//! ([`Failed`]); the site applied a change ([`Applied`]). Times are seconds from the
//! start of measurement. Written by the scenario's driver as it goes (a run killed
//! mid-cell keeps what came before), read by `export prometheus`.

use serde::{Deserialize, Serialize};

/// One line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EventLine {
    /// An event fired.
    Requested(Requested),
    /// An event fired and its change could not be asked for.
    Failed(Failed),
    /// A change was applied.
    Applied(Applied),
}

/// An event fired: its change asked of the site.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Requested {
    /// The event, an index into the scenario's.
    pub event: usize,
    /// Its kind as the scenario names it (`kill`; none in runs before it was written:
    /// the first word of `what`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// What it asked, in words (`scale echo 3->4`).
    #[serde(default)]
    pub what: String,
    /// When it was asked for, in seconds from the start of measurement.
    pub requested_s: f64,
    /// How long the proxies were told after.
    #[serde(default)]
    pub propagation_delay_s: f64,
    /// Backends it started.
    #[serde(default)]
    pub started: Vec<String>,
    /// Backends it stopped or killed.
    #[serde(default)]
    pub removed: Vec<String>,
    /// The configuration generations that carry it, by response header.
    #[serde(default)]
    pub generations: Vec<Generation>,
    /// When it was due.
    #[serde(flatten)]
    pub due: Due,
}

impl Requested {
    /// Its kind: as written, or the first word of what it did.
    pub fn kind(&self) -> &str {
        match &self.kind {
            Some(kind) => kind,
            None => self.what.split(' ').next().unwrap_or("event"),
        }
    }
}

/// An event whose change the site refused or failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Failed {
    /// The event.
    pub event: usize,
    /// The error, as the site reported it.
    pub error: String,
    /// When it was due.
    #[serde(flatten)]
    pub due: Due,
}

/// When an event was due: one of the three, as its timing says.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Due {
    /// A timed event: seconds from the start of measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_s: Option<f64>,
    /// An event before a request: its number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_request: Option<u64>,
    /// A step of a sequence: its number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

/// A generation a change is carried by.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The response header.
    pub header: String,
    /// The configuration generation the change made.
    pub generation: u32,
}

/// A change the site applied.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    /// What, in words.
    #[serde(default)]
    pub what: String,
    /// When the proxies were told.
    pub applied_s: f64,
    /// How each took it (`nginx: reload`).
    #[serde(default)]
    pub mechanisms: Vec<String>,
    /// In a cluster: when the Service's EndpointSlices showed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints_s: Option<f64>,
    /// In a cluster, known once the API answered: the pods it started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub started: Vec<String>,
    /// And removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// A controller's restart: when it was complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_s: Option<f64>,
    /// After a restart or an upgrade, the version line each proxy runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions_after: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_of_line_reads_as_its_own() {
        let read = |text: &str| serde_json::from_str::<EventLine>(text).unwrap();
        let EventLine::Requested(r) = read(
            r#"{"event":1,"what":"kill echo-2","requested_s":2.5,"due_s":2.5,"generations":[{"header":"x-gen","generation":3}]}"#,
        ) else {
            panic!("requested");
        };
        assert_eq!(
            (r.kind(), r.due.due_s, r.generations[0].generation),
            ("kill", Some(2.5), 3)
        );
        assert!(
            matches!(read(r#"{"event":1,"error":"no such pod","step":2}"#), EventLine::Failed(f) if f.due.step == Some(2))
        );
        assert!(
            matches!(read(r#"{"what":"reload","applied_s":3.0,"mechanisms":["nginx: reload"]}"#), EventLine::Applied(a) if a.mechanisms.len() == 1)
        );
        assert!(serde_json::from_str::<EventLine>(r#"{"event":0}"#).is_err());
    }
}
