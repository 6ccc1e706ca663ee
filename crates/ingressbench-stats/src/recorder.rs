//! The recorder: every request goes in, fixed-size histograms and counts come out.

use std::collections::{BTreeMap, HashMap};

use crate::connections::{
    ConnectionEvents, Goaway, IdleEnd, QuicEvent, MAX_GOAWAYS_KEPT, MAX_QUIC_EVENTS_KEPT,
};
use crate::wire::{self, RecorderWire};
use crate::{BackendId, HistogramUs, Outcome, OutcomeCounts, Sample, Window};

/// At most this many distinct backend names are told apart; the rest are counted as one.
const MAX_BACKENDS: usize = 1024;
/// The name under which backends past [`MAX_BACKENDS`] are counted.
const OVERFLOW_BACKEND: &str = "(other)";

/// Requests and latency of one backend.
#[derive(Clone, Debug)]
pub struct BackendStats {
    /// The value of the backend header.
    pub name: String,
    /// Requests it answered.
    pub count: u64,
    /// Latency (as recorded in [`Recorder::latency`]) of those requests.
    pub latency: HistogramUs,
}

/// At most this many (header, generation) pairs are told apart; answers with others are
/// only counted (a run would need thousands of route changes to get there).
const MAX_GENERATIONS: usize = 4096;

/// The answers that carried one configuration generation in one generation header: how
/// many, and the first and last of them. Route changes are read from this table, so it
/// sees every answer, not only the sampled ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationSeen {
    /// Which generation header (its slot in the load plan's list).
    pub slot: usize,
    /// The generation an answer carried.
    pub generation: u32,
    /// Answers that carried it.
    pub answers: u64,
    /// When the first of them ended, in nanoseconds from the start of the run.
    pub first_answer_ns: u64,
    /// When the last of them ended.
    pub last_answer_ns: u64,
}

impl GenerationSeen {
    fn add(&mut self, other: &GenerationSeen) {
        self.answers += other.answers;
        self.first_answer_ns = self.first_answer_ns.min(other.first_answer_ns);
        self.last_answer_ns = self.last_answer_ns.max(other.last_answer_ns);
    }
}

/// One histogram per request phase.
#[derive(Clone, Debug, Default)]
pub struct PhaseHistograms {
    /// DNS, for requests that opened a connection.
    pub dns: HistogramUs,
    /// TCP connect, for requests that opened a connection.
    pub connect: HistogramUs,
    /// TLS handshake, for requests that opened a TLS connection.
    pub tls: HistogramUs,
    /// Time to first byte, for requests that got a response.
    pub ttfb: HistogramUs,
    /// Whole request (service time), for requests that got a response.
    pub total: HistogramUs,
    /// TCP connect of the connections opened during warm-up, whose requests are not
    /// measured: connection set-up at the load's start (a burst of connects at a full
    /// accept queue, each waiting for a retransmitted SYN) shows here.
    pub warmup_connect: HistogramUs,
}

impl PhaseHistograms {
    fn merge(&mut self, other: &PhaseHistograms) {
        self.dns.merge(&other.dns);
        self.connect.merge(&other.connect);
        self.tls.merge(&other.tls);
        self.ttfb.merge(&other.ttfb);
        self.total.merge(&other.total);
        self.warmup_connect.merge(&other.warmup_connect);
    }
}

/// Summarises requests as they finish, in memory that does not grow with their number:
/// latency of answered requests (corrected for coordinated omission when the load was
/// open-loop), service time, time to failure of failed ones, scheduler lag, phases,
/// outcomes, retries, connection events, backends, and interval windows.
#[derive(Clone, Debug)]
pub struct Recorder {
    latency: HistogramUs,
    service_time: HistogramUs,
    time_to_failure: HistogramUs,
    scheduler_lag: HistogramUs,
    retried: OutcomeCounts,
    connection_events: ConnectionEvents,
    failure_details: BTreeMap<String, String>,
    batch_windows_us: HistogramUs,
    phases: PhaseHistograms,
    outcomes: OutcomeCounts,
    backends: Vec<BackendStats>,
    backend_ids: HashMap<Box<[u8]>, BackendId>,
    generations: Vec<GenerationSeen>,
    generations_untracked: u64,
    goaways: Vec<Goaway>,
    quic_events: Vec<QuicEvent>,
    bytes: u64,
    connections_opened: u64,
    reused_requests: u64,
    warmup_requests: u64,
    first_intended_ns: Option<u64>,
    last_intended_ns: u64,
    last_done_ns: u64,
    /// When the first and the last answer ended (none before the first).
    answers_span_ns: Option<(u64, u64)>,
    window: Window,
    finished_windows: Vec<Window>,
}

impl Recorder {
    /// A recorder whose windows are `window_ns` wide.
    pub fn new(window_ns: u64) -> Self {
        assert!(window_ns > 0, "a window has a width");
        Self {
            latency: HistogramUs::new(),
            service_time: HistogramUs::new(),
            time_to_failure: HistogramUs::new(),
            scheduler_lag: HistogramUs::new(),
            retried: OutcomeCounts::default(),
            connection_events: ConnectionEvents::default(),
            failure_details: BTreeMap::new(),
            batch_windows_us: HistogramUs::new(),
            phases: PhaseHistograms::default(),
            outcomes: OutcomeCounts::default(),
            backends: Vec::new(),
            backend_ids: HashMap::new(),
            generations: Vec::new(),
            generations_untracked: 0,
            goaways: Vec::new(),
            quic_events: Vec::new(),
            bytes: 0,
            connections_opened: 0,
            reused_requests: 0,
            warmup_requests: 0,
            first_intended_ns: None,
            last_intended_ns: 0,
            last_done_ns: 0,
            answers_span_ns: None,
            window: Window::new(0, window_ns),
            finished_windows: Vec::new(),
        }
    }

    /// Records one finished request. Warm-up requests are only counted. Latency, service
    /// time and the backend's figures take answered requests only (any status), so that
    /// fast failures cannot pull them down; failures go to the time-to-failure histogram.
    #[inline]
    pub fn record(&mut self, sample: &Sample) {
        if sample.warmup {
            self.warmup_requests += 1;
            if !sample.connection_reused && opened_connection(sample.outcome) {
                self.phases
                    .warmup_connect
                    .record_ns(sample.phases.connect_ns);
            }
            return;
        }
        self.roll_windows(sample.done_at_ns);
        let latency_ns = sample.latency_ns();
        let lag_ns = sample.scheduler_lag_ns();
        self.scheduler_lag.record_ns(lag_ns);
        self.window.lag.record_ns(lag_ns);
        self.outcomes.add(sample.outcome);
        self.window.outcomes.add(sample.outcome);
        self.bytes += sample.bytes;
        if let Some(cause) = sample.retried_after {
            self.retried.add(cause);
            self.window.retries += 1;
        }
        if sample.connection_reused {
            self.reused_requests += 1;
        } else if opened_connection(sample.outcome) {
            self.connections_opened += 1;
            self.phases.dns.record_ns(sample.phases.dns_ns);
            self.phases.connect.record_ns(sample.phases.connect_ns);
            if sample.phases.tls_ns > 0 {
                self.phases.tls.record_ns(sample.phases.tls_ns);
            }
        }
        match sample.outcome {
            answer if answer.is_answer() => {
                self.latency.record_ns(latency_ns);
                self.window.latency.record_ns(latency_ns);
                self.service_time.record_ns(sample.service_time_ns());
                self.phases.ttfb.record_ns(sample.phases.ttfb_ns);
                self.phases.total.record_ns(sample.service_time_ns());
                let done = sample.done_at_ns;
                self.answers_span_ns = Some(match self.answers_span_ns {
                    Some((first, last)) => (first.min(done), last.max(done)),
                    None => (done, done),
                });
                if let Some(BackendId(id)) = sample.backend {
                    if let Some(b) = self.backends.get_mut(usize::from(id)) {
                        b.count += 1;
                        b.latency.record_ns(latency_ns);
                    }
                }
                for (slot, &generation) in sample.generations.iter().enumerate() {
                    if generation != 0 {
                        self.add_generation(GenerationSeen {
                            slot,
                            generation,
                            answers: 1,
                            first_answer_ns: sample.done_at_ns,
                            last_answer_ns: sample.done_at_ns,
                        });
                    }
                }
            }
            // Never sent: it has no time to failure.
            Outcome::NotSent => {}
            _ => self.time_to_failure.record_ns(latency_ns),
        }
        self.first_intended_ns = Some(match self.first_intended_ns {
            Some(t) => t.min(sample.intended_at_ns),
            None => sample.intended_at_ns,
        });
        self.last_intended_ns = self.last_intended_ns.max(sample.intended_at_ns);
        self.last_done_ns = self.last_done_ns.max(sample.done_at_ns);
    }

    /// Keeps `detail` as the reason for failures of kind `outcome`, unless one is kept
    /// already (the first reason is the one a person needs; later ones repeat it). Called
    /// on the failure path only.
    pub fn note_failure_detail(&mut self, outcome: Outcome, detail: impl FnOnce() -> String) {
        let name = outcome.name();
        if !self.failure_details.contains_key(name.as_ref()) {
            self.failure_details.insert(name.into_owned(), detail());
        }
    }

    /// The first reason kept for each kind of failure, by outcome name.
    pub fn failure_details(&self) -> &BTreeMap<String, String> {
        &self.failure_details
    }

    /// Adds the open-loop pacer's batch windows (one value per adjustment period).
    pub fn record_batch_windows(&mut self, windows_us: &HistogramUs) {
        self.batch_windows_us.merge(windows_us);
    }

    /// The batch windows the pacer used, one value per adjustment period and worker.
    pub fn batch_windows_us(&self) -> &HistogramUs {
        &self.batch_windows_us
    }

    /// Counts a connection that left the pool while idle.
    pub fn record_idle_end(&mut self, end: IdleEnd) {
        match end {
            IdleEnd::Closed => self.connection_events.closed_by_server_while_idle += 1,
            IdleEnd::UnexpectedBytes => self.connection_events.unexpected_bytes_while_idle += 1,
        }
    }

    /// Counts a connection that speaks HTTP/2, with the concurrent streams its server
    /// allows (`None`: it announced no limit).
    pub fn record_http2_connection(&mut self, server_limit: Option<u32>) {
        let events = &mut self.connection_events;
        events.http2_connections += 1;
        if let Some(limit) = server_limit {
            let limit = u64::from(limit);
            if events.server_stream_limit == 0 || limit < events.server_stream_limit {
                events.server_stream_limit = limit;
            }
        }
    }

    /// Notes that one HTTP/2 connection carries `streams` at once.
    pub fn record_streams_in_flight(&mut self, streams: u64) {
        let most = &mut self.connection_events.max_streams_in_flight;
        *most = (*most).max(streams);
    }

    /// Counts a request body that waited `waited_ns` for flow-control window.
    pub fn record_flow_control_stall(&mut self, waited_ns: u64) {
        self.connection_events.flow_control_stalls += 1;
        self.connection_events.flow_control_stall_ns += waited_ns;
    }

    /// Records a GOAWAY frame received.
    pub fn record_goaway(&mut self, goaway: Goaway) {
        self.connection_events.goaways_received += 1;
        if self.goaways.len() < MAX_GOAWAYS_KEPT {
            self.goaways.push(goaway);
        }
    }

    /// The GOAWAY frames received, in order of arrival per worker (up to
    /// [`MAX_GOAWAYS_KEPT`]).
    pub fn goaways(&self) -> &[Goaway] {
        &self.goaways
    }

    /// Counts a QUIC connection opened or ended, and keeps it (up to
    /// [`MAX_QUIC_EVENTS_KEPT`]).
    pub fn record_quic(&mut self, event: QuicEvent) {
        if event.what == "opened" {
            self.connection_events.quic_opened += 1;
        } else {
            self.connection_events.quic_ended += 1;
        }
        if self.quic_events.len() < MAX_QUIC_EVENTS_KEPT {
            self.quic_events.push(event);
        }
    }

    /// The QUIC connections opened and ended, in order per worker (up to
    /// [`MAX_QUIC_EVENTS_KEPT`]).
    pub fn quic_events(&self) -> &[QuicEvent] {
        &self.quic_events
    }

    /// The backends' names, in the order of their ids (what a sample's `backend` indexes).
    pub fn backend_names(&self) -> Vec<String> {
        self.backends.iter().map(|b| b.name.clone()).collect()
    }

    /// The id of the backend called `name`, adding it on first sight. Past the table's
    /// capacity every new name shares one id.
    pub fn backend_id(&mut self, name: &[u8]) -> BackendId {
        // A hash lookup: it runs once per response, and a pool can have hundreds of pods.
        if let Some(id) = self.backend_ids.get(name) {
            return *id;
        }
        let id = if self.backends.len() >= MAX_BACKENDS {
            match self
                .backends
                .iter()
                .position(|b| b.name == OVERFLOW_BACKEND)
            {
                Some(i) => BackendId(i as u16),
                None => self.add_backend(OVERFLOW_BACKEND.to_owned()),
            }
        } else {
            self.add_backend(String::from_utf8_lossy(name).into_owned())
        };
        if self.backend_ids.len() < 4 * MAX_BACKENDS {
            self.backend_ids.insert(name.into(), id);
        }
        id
    }

    /// Adds answers of one generation to the table. The newest generations are at the
    /// end, and nearly every answer carries one of them, so the search runs backwards.
    fn add_generation(&mut self, seen: GenerationSeen) {
        let found = self
            .generations
            .iter()
            .rposition(|g| g.slot == seen.slot && g.generation == seen.generation);
        match found {
            Some(i) => self.generations[i].add(&seen),
            None if self.generations.len() < MAX_GENERATIONS => self.generations.push(seen),
            None => self.generations_untracked += seen.answers,
        }
    }

    fn add_backend(&mut self, name: String) -> BackendId {
        self.backends.push(BackendStats {
            name,
            count: 0,
            latency: HistogramUs::new(),
        });
        BackendId((self.backends.len() - 1) as u16)
    }

    /// Closes every window that ends at or before `now_ns`; they wait in
    /// [`Recorder::take_finished_windows`]. Empty windows are closed too, so that every
    /// interval of the run appears once.
    pub fn roll_windows(&mut self, now_ns: u64) {
        while now_ns >= self.window.end_ns() {
            let next = Window::new(self.window.index + 1, self.window.width_ns);
            self.finished_windows
                .push(std::mem::replace(&mut self.window, next));
        }
    }

    /// The windows closed so far and not yet taken, oldest first.
    pub fn take_finished_windows(&mut self) -> Vec<Window> {
        std::mem::take(&mut self.finished_windows)
    }

    /// Closes the open window (at the end of a run) and returns every window not yet taken.
    pub fn finish_windows(&mut self) -> Vec<Window> {
        let next = Window::new(self.window.index + 1, self.window.width_ns);
        self.finished_windows
            .push(std::mem::replace(&mut self.window, next));
        self.take_finished_windows()
    }

    /// Adds everything `other` recorded (another worker's share of the same run). Windows
    /// are not merged here: they travel separately while the run goes.
    pub fn merge(&mut self, other: &Recorder) {
        self.latency.merge(&other.latency);
        self.service_time.merge(&other.service_time);
        self.time_to_failure.merge(&other.time_to_failure);
        self.scheduler_lag.merge(&other.scheduler_lag);
        self.retried.merge(&other.retried);
        self.connection_events.merge(&other.connection_events);
        self.batch_windows_us.merge(&other.batch_windows_us);
        for (kind, detail) in &other.failure_details {
            self.failure_details
                .entry(kind.clone())
                .or_insert_with(|| detail.clone());
        }
        self.phases.merge(&other.phases);
        self.outcomes.merge(&other.outcomes);
        for b in &other.backends {
            let BackendId(id) = self.backend_id(b.name.as_bytes());
            let mine = &mut self.backends[usize::from(id)];
            mine.count += b.count;
            mine.latency.merge(&b.latency);
        }
        for g in &other.generations {
            self.add_generation(*g);
        }
        self.generations_untracked += other.generations_untracked;
        let room = MAX_GOAWAYS_KEPT.saturating_sub(self.goaways.len());
        self.goaways
            .extend(other.goaways.iter().take(room).copied());
        self.goaways.sort_by_key(|g| g.at_ns);
        let room = MAX_QUIC_EVENTS_KEPT.saturating_sub(self.quic_events.len());
        (self.quic_events).extend(other.quic_events.iter().take(room).cloned());
        self.quic_events.sort_by_key(|e| e.at_ns);
        self.bytes += other.bytes;
        self.connections_opened += other.connections_opened;
        self.reused_requests += other.reused_requests;
        self.warmup_requests += other.warmup_requests;
        self.first_intended_ns = match (self.first_intended_ns, other.first_intended_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_intended_ns = self.last_intended_ns.max(other.last_intended_ns);
        self.last_done_ns = self.last_done_ns.max(other.last_done_ns);
        self.answers_span_ns = match (self.answers_span_ns, other.answers_span_ns) {
            (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
            (a, b) => a.or(b),
        };
    }

    /// Latency of answered requests from the intended send time: corrected for
    /// coordinated omission under open-loop load, equal to the service time otherwise.
    pub fn latency(&self) -> &HistogramUs {
        &self.latency
    }

    /// Service time of answered requests: from the actual start, uncorrected.
    pub fn service_time(&self) -> &HistogramUs {
        &self.service_time
    }

    /// Time to failure of failed requests (not answered, but sent), from the intended
    /// send time.
    pub fn time_to_failure(&self) -> &HistogramUs {
        &self.time_to_failure
    }

    /// Requests sent a second time, counted by what the first attempt ran into.
    pub fn retried(&self) -> &OutcomeCounts {
        &self.retried
    }

    /// Connections retired while idle.
    pub fn connection_events(&self) -> &ConnectionEvents {
        &self.connection_events
    }

    /// How late the generator released each request against its schedule.
    pub fn scheduler_lag(&self) -> &HistogramUs {
        &self.scheduler_lag
    }

    /// Per-phase histograms.
    pub fn phases(&self) -> &PhaseHistograms {
        &self.phases
    }

    /// Outcome counts.
    pub fn outcomes(&self) -> &OutcomeCounts {
        &self.outcomes
    }

    /// Backends seen, in order of first sight.
    pub fn backends(&self) -> &[BackendStats] {
        &self.backends
    }

    /// The configuration generations answers carried, by header slot and generation, in
    /// order of first sight.
    pub fn generations(&self) -> &[GenerationSeen] {
        &self.generations
    }

    /// Counts `units` (requests, messages, events, calls) that were sent and were still
    /// waiting for their answer when the run ended (its drain over, or a stop's grace):
    /// each ends as [`Outcome::WaitingAtEnd`], a failure, in the totals and in the window
    /// open now, so that what was sent always equals the sum of the outcomes.
    pub fn record_waiting_at_end(&mut self, units: u64) {
        self.outcomes.add_n(Outcome::WaitingAtEnd, units);
        self.window.outcomes.add_n(Outcome::WaitingAtEnd, units);
    }

    /// Units still waiting for an answer when the run ended ([`Outcome::WaitingAtEnd`]).
    pub fn abandoned_at_stop(&self) -> u64 {
        self.outcomes.get(Outcome::WaitingAtEnd)
    }

    /// Answers whose generation the table had no room for.
    pub fn generations_untracked(&self) -> u64 {
        self.generations_untracked
    }

    /// Response bytes received.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Connections opened by measured requests.
    pub fn connections_opened(&self) -> u64 {
        self.connections_opened
    }

    /// Measured requests that went over an already used connection.
    pub fn reused_requests(&self) -> u64 {
        self.reused_requests
    }

    /// Requests excluded as warm-up.
    pub fn warmup_requests(&self) -> u64 {
        self.warmup_requests
    }

    /// From the first measured request's intended time to the last one's end, if any.
    pub fn span_ns(&self) -> Option<(u64, u64)> {
        self.first_intended_ns
            .map(|first| (first, self.last_done_ns))
    }

    /// When the first answer ended and when the last one did, if any came: the span the
    /// answered rate is taken over.
    pub fn answers_span_ns(&self) -> Option<(u64, u64)> {
        self.answers_span_ns
    }

    /// How long the open-loop schedule of `rate_per_s` that the measured requests belong
    /// to ran: from the first one's intended time to one slot after the last one's, so
    /// that `n` requests due `1/rate` apart span `n/rate` (the answers' wind-down after
    /// the last send is not in it). `None` without a measured request.
    pub fn schedule_span_ns(&self, rate_per_s: f64) -> Option<u64> {
        let slot_ns = if rate_per_s > 0.0 {
            (1e9 / rate_per_s) as u64
        } else {
            0
        };
        self.first_intended_ns
            .map(|first| self.last_intended_ns.saturating_sub(first) + slot_ns)
    }

    /// Adds a window's latency and outcomes: all that is known of a worker that stopped
    /// before handing over its recorder. Its span grows to cover the window.
    pub fn absorb_window(&mut self, window: &Window) {
        self.latency.merge(&window.latency);
        self.outcomes.merge(&window.outcomes);
        if window.outcomes.total() > 0 {
            let (start, end) = (window.start_ns(), window.end_ns());
            self.first_intended_ns = Some(self.first_intended_ns.map_or(start, |f| f.min(start)));
            self.last_intended_ns = self.last_intended_ns.max(end);
            self.last_done_ns = self.last_done_ns.max(end);
        }
    }

    /// Its text form, windows aside (see [`crate::wire`]).
    pub fn to_wire(&self) -> RecorderWire {
        let histograms: BTreeMap<String, String> = [
            ("latency", &self.latency),
            ("service_time", &self.service_time),
            ("time_to_failure", &self.time_to_failure),
            ("scheduler_lag", &self.scheduler_lag),
            ("batch_windows", &self.batch_windows_us),
            ("dns", &self.phases.dns),
            ("connect", &self.phases.connect),
            ("tls", &self.phases.tls),
            ("ttfb", &self.phases.ttfb),
            ("total", &self.phases.total),
            ("warmup_connect", &self.phases.warmup_connect),
        ]
        .into_iter()
        .map(|(name, h)| (name.to_owned(), wire::encode_histogram(h)))
        .collect();
        let counters = [
            ("generations_untracked", self.generations_untracked),
            ("bytes", self.bytes),
            ("connections_opened", self.connections_opened),
            ("reused_requests", self.reused_requests),
            ("warmup_requests", self.warmup_requests),
            // One past the time, so that 0 says none came.
            (
                "first_answer_ns",
                self.answers_span_ns.map_or(0, |(f, _)| f + 1),
            ),
            ("last_answer_ns", self.answers_span_ns.map_or(0, |(_, l)| l)),
        ]
        .into_iter()
        .map(|(name, n)| (name.to_owned(), n))
        .collect();
        RecorderWire {
            window_ns: self.window.width_ns,
            histograms,
            outcomes: wire::encode_outcomes(&self.outcomes),
            retried: wire::encode_outcomes(&self.retried),
            connection_events: self.connection_events,
            failure_details: self.failure_details.clone(),
            backends: self
                .backends
                .iter()
                .map(|b| (b.name.clone(), b.count, wire::encode_histogram(&b.latency)))
                .collect(),
            generations: self
                .generations
                .iter()
                .map(|g| {
                    (
                        g.slot,
                        g.generation,
                        g.answers,
                        g.first_answer_ns,
                        g.last_answer_ns,
                    )
                })
                .collect(),
            counters,
            goaways: self.goaways.clone(),
            quic_events: self.quic_events.clone(),
            first_intended_ns: self.first_intended_ns,
            last_intended_ns: self.last_intended_ns,
            last_done_ns: self.last_done_ns,
        }
    }

    /// The recorder [`Recorder::to_wire`] wrote (without windows).
    pub fn from_wire(w: &RecorderWire) -> Result<Self, String> {
        if w.window_ns == 0 {
            return Err("a recorder's windows have no width".into());
        }
        let mut r = Recorder::new(w.window_ns);
        let histogram = |name: &str| match w.histograms.get(name) {
            Some(text) => wire::decode_histogram(text),
            None => Err(format!("a recorder lacks its {name} histogram")),
        };
        r.latency = histogram("latency")?;
        r.service_time = histogram("service_time")?;
        r.time_to_failure = histogram("time_to_failure")?;
        r.scheduler_lag = histogram("scheduler_lag")?;
        r.batch_windows_us = histogram("batch_windows")?;
        r.phases = PhaseHistograms {
            dns: histogram("dns")?,
            connect: histogram("connect")?,
            tls: histogram("tls")?,
            ttfb: histogram("ttfb")?,
            total: histogram("total")?,
            warmup_connect: histogram("warmup_connect")?,
        };
        r.outcomes = wire::decode_outcomes(&w.outcomes)?;
        r.retried = wire::decode_outcomes(&w.retried)?;
        r.connection_events = w.connection_events;
        r.failure_details = w.failure_details.clone();
        for (name, count, latency) in &w.backends {
            let BackendId(id) = r.backend_id(name.as_bytes());
            let b = &mut r.backends[usize::from(id)];
            b.count += count;
            b.latency.merge(&wire::decode_histogram(latency)?);
        }
        for &(slot, generation, answers, first_answer_ns, last_answer_ns) in &w.generations {
            r.add_generation(GenerationSeen {
                slot,
                generation,
                answers,
                first_answer_ns,
                last_answer_ns,
            });
        }
        let counter = |name: &str| w.counters.get(name).copied().unwrap_or(0);
        r.generations_untracked = counter("generations_untracked");
        r.goaways = w.goaways.clone();
        r.quic_events = w.quic_events.clone();
        r.bytes = counter("bytes");
        r.connections_opened = counter("connections_opened");
        r.reused_requests = counter("reused_requests");
        r.warmup_requests = counter("warmup_requests");
        r.first_intended_ns = w.first_intended_ns;
        r.last_intended_ns = w.last_intended_ns;
        r.last_done_ns = w.last_done_ns;
        r.answers_span_ns = match counter("first_answer_ns") {
            0 => None,
            first => Some((first - 1, counter("last_answer_ns"))),
        };
        Ok(r)
    }
}

/// Whether a request that did not reuse a connection opened one (and so has a connect
/// phase).
fn opened_connection(outcome: Outcome) -> bool {
    !matches!(
        outcome,
        Outcome::NotSent
            | Outcome::Refused
            | Outcome::ConnectTimeout
            | Outcome::DnsError
            | Outcome::ConnectError
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GENERATION_SLOTS;
    use crate::LAG_BOUNDS_NS;

    fn sample(intended_ms: u64, sent_ms: u64, done_ms: u64, outcome: Outcome) -> Sample {
        let mut s = Sample::new(intended_ms * 1_000_000);
        s.released_at_ns = intended_ms * 1_000_000;
        s.sent_at_ns = sent_ms * 1_000_000;
        s.done_at_ns = done_ms * 1_000_000;
        s.outcome = outcome;
        s
    }

    #[test]
    fn the_schedule_span_is_its_slots_whatever_the_wind_down() {
        // 1,000 requests due every 10 ms (100 req/s), the last answered 150 ms late.
        let mut r = Recorder::new(1_000_000_000);
        for j in 0..1000 {
            let done = if j == 999 { j * 10 + 150 } else { j * 10 + 1 };
            r.record(&sample(j * 10, j * 10, done, Outcome::Status(200)));
        }
        assert_eq!(r.schedule_span_ns(100.0), Some(10_000_000_000));
        // The span to the last answer is longer by the wind-down.
        assert_eq!(r.span_ns(), Some((0, 10_140_000_000)));
        // Split over two recorders (two workers' stripes), merged: the same.
        let (mut even, mut odd) = (Recorder::new(1_000_000_000), Recorder::new(1_000_000_000));
        for j in 0..1000 {
            let half = if j % 2 == 0 { &mut even } else { &mut odd };
            half.record(&sample(j * 10, j * 10, j * 10 + 1, Outcome::Status(200)));
        }
        assert_eq!(even.schedule_span_ns(50.0), Some(10_000_000_000));
        even.merge(&odd);
        assert_eq!(even.schedule_span_ns(100.0), Some(10_000_000_000));
        assert_eq!(Recorder::new(1).schedule_span_ns(100.0), None);
    }

    #[test]
    fn corrected_and_service_time_differ_when_a_request_waited() {
        let mut r = Recorder::new(1_000_000_000);
        r.record(&sample(0, 100, 110, Outcome::Status(200)));
        let within = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.001;
        assert!(within(r.latency().max(), 110_000), "{}", r.latency().max());
        assert!(
            within(r.service_time().max(), 10_000),
            "{}",
            r.service_time().max()
        );
    }

    #[test]
    fn windows_close_in_order_including_empty_ones() {
        let mut r = Recorder::new(1_000_000_000);
        r.record(&sample(0, 0, 500, Outcome::Status(200)));
        r.record(&sample(2_000, 2_000, 2_600, Outcome::Refused));
        let closed = r.take_finished_windows();
        assert_eq!(
            closed.iter().map(|w| w.index).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(closed[0].outcomes.total(), 1);
        assert_eq!(closed[1].outcomes.total(), 0);
        let rest = r.finish_windows();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].index, 2);
        assert_eq!(rest[0].outcomes.get(Outcome::Refused), 1);
    }

    #[test]
    fn a_window_counts_its_requests_lag_and_retries() {
        let mut r = Recorder::new(1_000_000_000);
        // Released on time, 30 ms late, and 3 s late (the last retried after a refusal).
        let released_late = |intended_ms: u64, late_ms: u64, outcome| {
            let mut s = sample(
                intended_ms,
                intended_ms + late_ms,
                intended_ms + late_ms + 1,
                outcome,
            );
            s.released_at_ns = s.sent_at_ns;
            s
        };
        r.record(&released_late(0, 0, Outcome::Status(200)));
        r.record(&released_late(10, 30, Outcome::Status(200)));
        let mut late = released_late(20, 3_000, Outcome::Status(503));
        late.retried_after = Some(Outcome::Refused);
        r.record(&late);
        let mut all = Window::new(0, 1);
        for w in r.finish_windows() {
            all.lag.merge(&w.lag);
            all.retries += w.retries;
        }
        assert_eq!(all.lag.count(), 3);
        assert_eq!(all.retries, 1);
        let at = |ns: u64| LAG_BOUNDS_NS.partition_point(|b| *b < ns);
        assert_eq!(all.lag.counts[0], 1);
        assert_eq!(all.lag.counts[at(30_000_000)], 1);
        assert_eq!(all.lag.counts[at(3_000_000_000)], 1);
        assert_eq!(at(30_000_000), 11, "25 ms < 30 ms <= 50 ms");
        assert_eq!(all.lag.sum_ns, 3_030_000_000);
    }

    #[test]
    fn warmup_is_counted_but_not_recorded() {
        let mut r = Recorder::new(1_000_000_000);
        let mut s = sample(0, 0, 1, Outcome::Status(200));
        s.warmup = true;
        r.record(&s);
        assert_eq!(r.warmup_requests(), 1);
        assert_eq!(r.outcomes().total(), 0);
        assert!(r.latency().is_empty());
    }

    #[test]
    fn backends_merge_by_name() {
        let mut a = Recorder::new(1_000_000_000);
        let mut b = Recorder::new(1_000_000_000);
        let a1 = a.backend_id(b"one");
        let b2 = b.backend_id(b"two");
        let b1 = b.backend_id(b"one");
        let served = |id| {
            let mut s = sample(0, 0, 1, Outcome::Status(200));
            s.backend = Some(id);
            s
        };
        a.record(&served(a1));
        for id in [b2, b1, b1] {
            b.record(&served(id));
        }
        a.merge(&b);
        let counts: Vec<_> = a
            .backends()
            .iter()
            .map(|b| (b.name.as_str(), b.count))
            .collect();
        assert_eq!(counts, vec![("one", 3), ("two", 1)]);
    }

    #[test]
    fn generations_keep_the_first_and_last_answer_across_workers() {
        let answered = |done_ms: u64, generations: [u32; GENERATION_SLOTS]| {
            let mut s = sample(0, 0, done_ms, Outcome::Status(200));
            s.generations = generations;
            s
        };
        let mut a = Recorder::new(1_000_000_000);
        let mut b = Recorder::new(1_000_000_000);
        a.record(&answered(10, [1, 0]));
        a.record(&answered(30, [2, 0]));
        a.record(&answered(40, [1, 0]));
        b.record(&answered(20, [2, 5]));
        b.record(&answered(50, [0, 0]));
        let mut failed = answered(60, [3, 0]);
        failed.outcome = Outcome::Eof;
        b.record(&failed);
        a.merge(&b);
        let table: Vec<_> = a
            .generations()
            .iter()
            .map(|g| {
                (
                    g.slot,
                    g.generation,
                    g.answers,
                    g.first_answer_ns / 1_000_000,
                    g.last_answer_ns / 1_000_000,
                )
            })
            .collect();
        assert_eq!(
            table,
            vec![(0, 1, 2, 10, 40), (0, 2, 2, 20, 30), (1, 5, 1, 20, 20)]
        );
    }

    #[test]
    fn generation_table_is_bounded() {
        let mut r = Recorder::new(1_000_000_000);
        for g in 1..=(MAX_GENERATIONS as u32 + 5) {
            let mut s = sample(0, 0, 1, Outcome::Status(200));
            s.generations = [g, 0];
            r.record(&s);
        }
        assert_eq!(r.generations().len(), MAX_GENERATIONS);
        assert_eq!(r.generations_untracked(), 5);
    }

    #[test]
    fn backend_table_is_bounded() {
        let mut r = Recorder::new(1_000_000_000);
        for i in 0..(MAX_BACKENDS + 10) {
            r.backend_id(format!("b{i}").as_bytes());
        }
        assert_eq!(r.backends().len(), MAX_BACKENDS + 1);
        assert_eq!(r.backends()[MAX_BACKENDS].name, OVERFLOW_BACKEND);
    }
}
