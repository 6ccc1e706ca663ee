//! The recorder: every request goes in, fixed-size histograms and counts come out.

use std::collections::HashMap;

use crate::{HistogramUs, Outcome, OutcomeCounts, Sample};

/// Index of a backend in a recorder's table of backend names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendId(pub u16);

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
}

impl PhaseHistograms {
    fn merge(&mut self, other: &PhaseHistograms) {
        self.dns.merge(&other.dns);
        self.connect.merge(&other.connect);
        self.tls.merge(&other.tls);
        self.ttfb.merge(&other.ttfb);
        self.total.merge(&other.total);
    }
}

/// What finished within one interval of the run (one second by default): the latency of
/// the requests that ended in it and their outcomes. Interval histograms are what the time
/// series, the interval log and the event impact figures are built from.
#[derive(Clone, Debug)]
pub struct Window {
    /// Position of the interval: it covers `[index * width, (index + 1) * width)`.
    pub index: u64,
    /// Width of the interval in nanoseconds.
    pub width_ns: u64,
    /// Latency of the requests that ended in the interval.
    pub latency: HistogramUs,
    /// Their outcomes.
    pub outcomes: OutcomeCounts,
}

impl Window {
    /// An empty interval.
    pub fn new(index: u64, width_ns: u64) -> Self {
        Self {
            index,
            width_ns,
            latency: HistogramUs::new(),
            outcomes: OutcomeCounts::default(),
        }
    }

    /// Start of the interval, in nanoseconds from the start of the run.
    pub fn start_ns(&self) -> u64 {
        self.index * self.width_ns
    }

    /// End of the interval (exclusive).
    pub fn end_ns(&self) -> u64 {
        (self.index + 1) * self.width_ns
    }

    /// Adds another recorder's view of the same interval.
    pub fn merge(&mut self, other: &Window) {
        debug_assert_eq!(self.index, other.index);
        self.latency.merge(&other.latency);
        self.outcomes.merge(&other.outcomes);
    }
}

/// Summarises requests as they finish, in memory that does not grow with their number:
/// latency (corrected for coordinated omission when the load was open-loop), service
/// time, scheduler lag, phases, outcomes, backends, and interval windows.
#[derive(Clone, Debug)]
pub struct Recorder {
    latency: HistogramUs,
    service_time: HistogramUs,
    scheduler_lag: HistogramUs,
    phases: PhaseHistograms,
    outcomes: OutcomeCounts,
    backends: Vec<BackendStats>,
    backend_ids: HashMap<Box<[u8]>, BackendId>,
    bytes: u64,
    connections_opened: u64,
    reused_requests: u64,
    warmup_requests: u64,
    first_intended_ns: Option<u64>,
    last_done_ns: u64,
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
            scheduler_lag: HistogramUs::new(),
            phases: PhaseHistograms::default(),
            outcomes: OutcomeCounts::default(),
            backends: Vec::new(),
            backend_ids: HashMap::new(),
            bytes: 0,
            connections_opened: 0,
            reused_requests: 0,
            warmup_requests: 0,
            first_intended_ns: None,
            last_done_ns: 0,
            window: Window::new(0, window_ns),
            finished_windows: Vec::new(),
        }
    }

    /// Records one finished request. Warm-up requests are only counted.
    #[inline]
    pub fn record(&mut self, sample: &Sample) {
        if sample.warmup {
            self.warmup_requests += 1;
            return;
        }
        self.roll_windows(sample.done_at_ns);
        let latency_ns = sample.latency_ns();
        self.latency.record_ns(latency_ns);
        self.service_time.record_ns(sample.service_time_ns());
        self.scheduler_lag.record_ns(sample.scheduler_lag_ns());
        self.outcomes.add(sample.outcome);
        self.window.latency.record_ns(latency_ns);
        self.window.outcomes.add(sample.outcome);
        self.bytes += sample.bytes;
        if sample.connection_reused {
            self.reused_requests += 1;
        } else if !matches!(
            sample.outcome,
            Outcome::NotSent | Outcome::Refused | Outcome::ConnectTimeout | Outcome::ConnectError
        ) {
            self.connections_opened += 1;
            self.phases.dns.record_ns(sample.phases.dns_ns);
            self.phases.connect.record_ns(sample.phases.connect_ns);
            if sample.phases.tls_ns > 0 {
                self.phases.tls.record_ns(sample.phases.tls_ns);
            }
        }
        if let Outcome::Status(_) = sample.outcome {
            self.phases.ttfb.record_ns(sample.phases.ttfb_ns);
            self.phases.total.record_ns(sample.service_time_ns());
        }
        if let Some(BackendId(id)) = sample.backend {
            if let Some(b) = self.backends.get_mut(usize::from(id)) {
                b.count += 1;
                b.latency.record_ns(latency_ns);
            }
        }
        self.first_intended_ns = Some(match self.first_intended_ns {
            Some(t) => t.min(sample.intended_at_ns),
            None => sample.intended_at_ns,
        });
        self.last_done_ns = self.last_done_ns.max(sample.done_at_ns);
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
        self.scheduler_lag.merge(&other.scheduler_lag);
        self.phases.merge(&other.phases);
        self.outcomes.merge(&other.outcomes);
        for b in &other.backends {
            let BackendId(id) = self.backend_id(b.name.as_bytes());
            let mine = &mut self.backends[usize::from(id)];
            mine.count += b.count;
            mine.latency.merge(&b.latency);
        }
        self.bytes += other.bytes;
        self.connections_opened += other.connections_opened;
        self.reused_requests += other.reused_requests;
        self.warmup_requests += other.warmup_requests;
        self.first_intended_ns = match (self.first_intended_ns, other.first_intended_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_done_ns = self.last_done_ns.max(other.last_done_ns);
    }

    /// Latency from the intended send time: corrected for coordinated omission under
    /// open-loop load, equal to the service time otherwise.
    pub fn latency(&self) -> &HistogramUs {
        &self.latency
    }

    /// Service time: from the actual start of each request, uncorrected.
    pub fn service_time(&self) -> &HistogramUs {
        &self.service_time
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(intended_ms: u64, sent_ms: u64, done_ms: u64, outcome: Outcome) -> Sample {
        let mut s = Sample::new(intended_ms * 1_000_000);
        s.released_at_ns = intended_ms * 1_000_000;
        s.sent_at_ns = sent_ms * 1_000_000;
        s.done_at_ns = done_ms * 1_000_000;
        s.outcome = outcome;
        s
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
    fn backend_table_is_bounded() {
        let mut r = Recorder::new(1_000_000_000);
        for i in 0..(MAX_BACKENDS + 10) {
            r.backend_id(format!("b{i}").as_bytes());
        }
        assert_eq!(r.backends().len(), MAX_BACKENDS + 1);
        assert_eq!(r.backends()[MAX_BACKENDS].name, OVERFLOW_BACKEND);
    }
}
