//! Lossless text forms of what a load worker process hands its coordinator: histograms in
//! HdrHistogram's V2 deflate encoding (base64, as interval logs hold them), counts by
//! outcome name, samples as arrays of numbers. Decoding and merging the recorders of N
//! workers gives exactly the recorder one process would have kept of all their requests.

use std::collections::BTreeMap;

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use serde::{Deserialize, Serialize};

use crate::sample::BackendId;
use crate::{
    HistogramUs, LagBuckets, Outcome, OutcomeCounts, Phases, Sample, Window, GENERATION_SLOTS,
};

/// A histogram as base64 of its V2 deflate encoding.
pub fn encode_histogram(h: &HistogramUs) -> String {
    let mut bytes = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h.as_hdr(), &mut bytes)
        .expect("serializing into memory cannot fail");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The histogram [`encode_histogram`] wrote.
pub fn decode_histogram(text: &str) -> Result<HistogramUs, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("a histogram is not base64: {e}"))?;
    let read: hdrhistogram::Histogram<u64> = Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| format!("a histogram does not decode: {e:?}"))?;
    // Into one of the usual bounds, so that it merges with any other.
    let mut h = HistogramUs::new();
    for v in read.iter_recorded() {
        h.record_us_n(v.value_iterated_to(), v.count_at_value());
    }
    Ok(h)
}

/// Outcome counts by outcome name.
pub fn encode_outcomes(counts: &OutcomeCounts) -> BTreeMap<String, u64> {
    counts.to_map()
}

/// The counts [`encode_outcomes`] wrote.
pub fn decode_outcomes(map: &BTreeMap<String, u64>) -> Result<OutcomeCounts, String> {
    let mut counts = OutcomeCounts::default();
    for (name, &n) in map {
        let outcome = Outcome::from_name(name).ok_or_else(|| format!("no outcome {name:?}"))?;
        counts.add_n(outcome, n);
    }
    Ok(counts)
}

/// One interval window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WindowWire {
    /// Its position.
    pub index: u64,
    /// Its width.
    pub width_ns: u64,
    /// Its latency histogram, encoded.
    pub latency: String,
    /// Its outcomes by name.
    pub outcomes: BTreeMap<String, u64>,
    /// Its scheduler lag buckets.
    #[serde(default)]
    pub lag: LagBuckets,
    /// Its retried requests.
    #[serde(default)]
    pub retries: u64,
    /// Requests in flight as it was handed over.
    #[serde(default)]
    pub in_flight: u64,
}

impl WindowWire {
    /// The text form of `window`.
    pub fn of(window: &Window) -> Self {
        Self {
            index: window.index,
            width_ns: window.width_ns,
            latency: encode_histogram(&window.latency),
            outcomes: encode_outcomes(&window.outcomes),
            lag: window.lag,
            retries: window.retries,
            in_flight: window.in_flight,
        }
    }

    /// The window back.
    pub fn decode(&self) -> Result<Window, String> {
        let mut window = Window::new(self.index, self.width_ns);
        window.latency = decode_histogram(&self.latency)?;
        window.outcomes = decode_outcomes(&self.outcomes)?;
        window.lag = self.lag;
        window.retries = self.retries;
        window.in_flight = self.in_flight;
        Ok(window)
    }
}

/// One sample: `[seq, intended, released, sent, done, dns, connect, tls, ttfb, transfer,
/// bytes, generation…]` in nanoseconds and bytes, then its outcome, backend, flags.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SampleWire(
    [u64; 11 + GENERATION_SLOTS],
    String,
    Option<u16>,
    bool,
    Option<String>,
    bool,
    bool,
);

impl SampleWire {
    /// The text form of `s`.
    pub fn of(s: &Sample) -> Self {
        let p = &s.phases;
        let mut numbers = [0u64; 11 + GENERATION_SLOTS];
        numbers[..11].copy_from_slice(&[
            s.seq,
            s.intended_at_ns,
            s.released_at_ns,
            s.sent_at_ns,
            s.done_at_ns,
            p.dns_ns,
            p.connect_ns,
            p.tls_ns,
            p.ttfb_ns,
            p.transfer_ns,
            s.bytes,
        ]);
        for (slot, g) in s.generations.iter().enumerate() {
            numbers[11 + slot] = u64::from(*g);
        }
        Self(
            numbers,
            s.outcome.name().into_owned(),
            s.backend.map(|BackendId(id)| id),
            s.connection_reused,
            s.retried_after.map(|o| o.name().into_owned()),
            s.warmup,
            s.in_sample,
        )
    }

    /// The sample back.
    pub fn decode(&self) -> Result<Sample, String> {
        let outcome = |name: &str| Outcome::from_name(name).ok_or(format!("no outcome {name:?}"));
        let n = &self.0;
        let mut generations = [0u32; GENERATION_SLOTS];
        for (slot, g) in generations.iter_mut().enumerate() {
            *g = u32::try_from(n[11 + slot]).map_err(|_| "a generation past u32".to_owned())?;
        }
        Ok(Sample {
            seq: n[0],
            intended_at_ns: n[1],
            released_at_ns: n[2],
            sent_at_ns: n[3],
            done_at_ns: n[4],
            phases: Phases {
                dns_ns: n[5],
                connect_ns: n[6],
                tls_ns: n[7],
                ttfb_ns: n[8],
                transfer_ns: n[9],
            },
            bytes: n[10],
            outcome: outcome(&self.1)?,
            backend: self.2.map(BackendId),
            generations,
            connection_reused: self.3,
            retried_after: self.4.as_deref().map(outcome).transpose()?,
            warmup: self.5,
            in_sample: self.6,
        })
    }
}

/// Everything a [`crate::Recorder`] holds but its windows (they travel as they close).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RecorderWire {
    /// Window width.
    pub window_ns: u64,
    /// Histograms by name (`latency`, `service_time`, the phases, …), encoded.
    pub histograms: BTreeMap<String, String>,
    /// Outcome counts.
    pub outcomes: BTreeMap<String, u64>,
    /// Retried requests by first failure.
    pub retried: BTreeMap<String, u64>,
    /// Idle connection events.
    pub connection_events: crate::ConnectionEvents,
    /// First reason of each failure kind.
    pub failure_details: BTreeMap<String, String>,
    /// Backends: name, answers, latency histogram.
    pub backends: Vec<(String, u64, String)>,
    /// Generations: slot, generation, answers, first and last answer.
    pub generations: Vec<(usize, u32, u64, u64, u64)>,
    /// Counters by name (`bytes`, `warmup_requests`, …).
    pub counters: BTreeMap<String, u64>,
    /// HTTP/2 GOAWAYs received.
    #[serde(default)]
    pub goaways: Vec<crate::Goaway>,
    /// QUIC connections opened and ended.
    #[serde(default)]
    pub quic_events: Vec<crate::QuicEvent>,
    /// First intended send time of a measured request, if any.
    pub first_intended_ns: Option<u64>,
    /// Last intended send time of one.
    #[serde(default)]
    pub last_intended_ns: u64,
    /// Last end of one.
    pub last_done_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Recorder;
    use proptest::prelude::*;

    fn sample(i: u64, latency_us: u64, status: u16, backend: &str, r: &mut Recorder) -> Sample {
        let mut s = Sample::new(i * 1_000_000);
        s.seq = i;
        s.released_at_ns = s.intended_at_ns + 7_000;
        s.sent_at_ns = s.released_at_ns + 3_000;
        s.done_at_ns = s.intended_at_ns + latency_us * 1_000;
        s.phases.connect_ns = 50_000 * (i % 3);
        s.phases.ttfb_ns = latency_us * 500;
        s.bytes = 120;
        s.outcome = if status == 0 {
            Outcome::ResetAfterWrite
        } else {
            Outcome::Status(status)
        };
        s.backend = Some(r.backend_id(backend.as_bytes()));
        s.generations = [(i / 50) as u32 + 1, 0];
        s.connection_reused = !i.is_multiple_of(3);
        s.warmup = i < 2;
        s
    }

    fn figures(r: &Recorder) -> String {
        let h = |h: &HistogramUs| {
            h.as_hdr()
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect::<Vec<_>>()
        };
        // In order of first sight, which differs with the order of merging.
        let mut backends: Vec<_> = r
            .backends()
            .iter()
            .map(|b| (b.name.clone(), b.count, h(&b.latency)))
            .collect();
        backends.sort();
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {} {} {:?}",
            h(r.latency()),
            h(r.service_time()),
            h(r.time_to_failure()),
            h(r.scheduler_lag()),
            h(&r.phases().connect),
            h(&r.phases().ttfb),
            r.outcomes().to_map(),
            backends,
            r.generations(),
            r.span_ns(),
            r.bytes(),
            r.warmup_requests(),
            r.connections_opened(),
        )
    }

    proptest! {
        /// Workers' recorders, each through its text form and merged, are the recorder of
        /// all their requests.
        #[test]
        fn merged_decoded_recorders_equal_the_recorder_of_every_request(
            requests in proptest::collection::vec((1u64..5_000_000, prop_oneof![Just(200u16), Just(503), Just(0)], 0usize..4), 1..300),
            workers in 1usize..5,
        ) {
            let names = ["a", "b", "c", "d"];
            let mut whole = Recorder::new(1_000_000_000);
            let mut parts: Vec<Recorder> = (0..workers).map(|_| Recorder::new(1_000_000_000)).collect();
            for (i, (latency, status, b)) in requests.iter().enumerate() {
                let s = sample(i as u64, *latency, *status, names[*b], &mut whole);
                whole.record(&s);
                let part = &mut parts[i % workers];
                let s = sample(i as u64, *latency, *status, names[*b], part);
                part.record(&s);
            }
            let mut merged: Option<Recorder> = None;
            for part in &parts {
                let text = serde_json::to_string(&part.to_wire()).unwrap();
                let back = Recorder::from_wire(&serde_json::from_str(&text).unwrap()).unwrap();
                match merged.as_mut() {
                    Some(m) => m.merge(&back),
                    None => merged = Some(back),
                }
            }
            prop_assert_eq!(figures(&merged.unwrap()), figures(&whole));
        }

        #[test]
        fn samples_and_windows_read_back_as_written(i in 0u64..10_000, latency in 1u64..10_000_000, status in prop_oneof![Just(200u16), Just(0)]) {
            let mut r = Recorder::new(1_000_000_000);
            let s = sample(i, latency, status, "x", &mut r);
            let back = serde_json::from_str::<SampleWire>(&serde_json::to_string(&SampleWire::of(&s)).unwrap()).unwrap();
            prop_assert_eq!(back.decode().unwrap(), s);
            r.record(&s);
            for w in r.finish_windows() {
                let back = WindowWire::of(&w).decode().unwrap();
                prop_assert_eq!(back.latency.as_hdr(), w.latency.as_hdr());
                prop_assert_eq!(back.outcomes, w.outcomes);
                prop_assert_eq!(back.lag, w.lag);
                prop_assert_eq!(back.retries, w.retries);
            }
        }
    }
}
