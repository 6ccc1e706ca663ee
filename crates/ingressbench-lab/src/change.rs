//! The vocabulary of events: a change to the system under test ([`Change`]) and what
//! became of one ([`ChangeRecord`], with how the proxies took it: [`Synced`]). A lab
//! applies them (`lab/changes.rs`); a cluster site applies the same ones to a cluster;
//! a scenario's event names one with its timing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::model::{Overlay, Route};
use crate::proxy::ProxyKind;

/// A change to the system under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Start or stop backends of a pool until it has this many (stopping is graceful).
    Scale {
        /// The pool.
        pool: String,
        /// Replicas wanted.
        replicas: usize,
    },
    /// SIGKILL a backend (a crash); `None` picks one at random.
    Kill(Option<String>),
    /// SIGTERM a backend (it drains, then exits); `None` picks one at random.
    Terminate(Option<String>),
    /// Change the response header, CORS and rewrite (an empty overlay reverts).
    Overlay(Overlay),
    /// Push the current configuration again without a change (a reload).
    Reload,
    /// Stop each proxy its own graceful way and start it again, one after another (with
    /// a front, a rolling restart of its replicas), killing what is left of one after
    /// `grace`.
    Restart {
        /// How long a stopped proxy has to end what it serves.
        grace: Duration,
    },
    /// Upgrade each proxy to the binary it runs, through its own zero-downtime mechanism
    /// where it has one (nginx's binary upgrade, HAProxy's master re-exec, Envoy's hot
    /// restart), by a restart where its maintainers document none (Traefik, Caddy).
    Upgrade {
        /// How long a stopped proxy has to end what it serves (Traefik, Caddy), or an
        /// Envoy epoch drains.
        grace: Duration,
        /// The version each kind of proxy named goes to (installed beside the one it
        /// runs: [`crate::proxy::Binaries::locate_version`]); the others upgrade to the
        /// binary they run.
        to: BTreeMap<ProxyKind, String>,
        /// The version a cluster target's controller goes to (the cluster file says how:
        /// its chart or image of that version); none for the lab's proxies.
        controller: Option<String>,
    },
    /// Replace the routes with these (routes added, removed or sent elsewhere), in one
    /// update of each proxy, its own way.
    Routes(Vec<Route>),
    /// Add this many generated routes (`rN.routes.test`, after the last there is, over
    /// the pools in turn), in one update.
    AddRoutes(usize),
    /// Remove this many generated routes (the last ones), in one update.
    RemoveRoutes(usize),
    /// Add or remove generated routes until there are this many, in one update.
    GeneratedRoutes(usize),
    /// Change this many generated routes (the lowest numbers) in one update: each answers
    /// a new revision in [`crate::model::ROUTE_REVISION_HEADER`] (one above the highest
    /// any route has), as a user's edit of a route's response headers would.
    ChangeRoutes(usize),
    /// Freeze a backend (SIGSTOP) for a while, then let it go on (SIGCONT): a stuck
    /// process or a long GC pause. Its socket still accepts connections; nothing answers.
    /// The control plane does not notice, so the proxies are not told.
    Stall {
        /// The backend; `None` picks one at random.
        backend: Option<String>,
        /// How long it stays frozen.
        duration: Duration,
    },
    /// The client moves its QUIC connections to a new local port (connection migration,
    /// RFC 9000 §9), as a phone moving networks or a NAT rebinding does: a change to the
    /// client, not to the system under test, done when asked (the load takes it).
    Migrate,
}

/// What became of one requested change.
#[derive(Clone, Debug)]
pub struct ChangeRecord {
    /// What was asked, in words (`scale echo 3->4`, `kill echo-2`, …).
    pub what: String,
    /// When it was asked for (and the backend side happened).
    pub requested_at: Instant,
    /// When the proxies were told, after the propagation delay.
    pub applied_at: Option<Instant>,
    /// When the Service's EndpointSlices showed the change (in a cluster; the lab has
    /// none, its controller tells the proxies directly).
    pub endpoints_at: Option<Instant>,
    /// How each proxy took it.
    pub mechanisms: Vec<(ProxyKind, &'static str)>,
    /// After a restart or an upgrade, the version line each proxy runs.
    pub versions: Vec<(ProxyKind, String)>,
    /// Backends started by it.
    pub started: Vec<String>,
    /// Backends stopped or killed by it.
    pub removed: Vec<String>,
    /// The configuration generations that carry it, by response header: answers with
    /// this generation or a later one in that header were served after the change.
    pub generations: Vec<(&'static str, u32)>,
    /// When its controller reported it in the route's status (in a cluster, through the
    /// Gateway API: the HTTPRoute's conditions observed its generation).
    pub reported_at: Option<Instant>,
    /// After a controller's restart in a cluster: when it was complete (a rollout's every
    /// replica new and available; the local cluster's process ready). Its `applied_at` is
    /// when the first new pod (process) was ready.
    pub completed_at: Option<Instant>,
    /// Made to the proxies themselves (their routes, configuration or processes: a route
    /// change, a reload, a restart, an upgrade), or applied to them by a mechanism that
    /// can end their connections (nginx reloads for a backend's change too): what closes
    /// the connections they hold.
    pub on_proxies: bool,
}

impl Change {
    /// Its kind, as a scenario file names the event that asks for it (the live metrics'
    /// `kind` label).
    pub fn kind(&self) -> &'static str {
        match self {
            Change::Scale { .. } => "scale",
            Change::Kill(_) => "kill",
            Change::Terminate(_) => "terminate",
            Change::Overlay(_) => "config",
            Change::Reload => "reload",
            Change::Restart { .. } => "restart",
            Change::Upgrade { .. } => "upgrade",
            Change::Routes(_) => "routes",
            Change::AddRoutes(_) => "add_routes",
            Change::RemoveRoutes(_) => "remove_routes",
            Change::GeneratedRoutes(_) => "route_steps",
            Change::ChangeRoutes(_) => "change_routes",
            Change::Stall { .. } => "stall_backend",
            Change::Migrate => "migrate",
        }
    }
}

impl ChangeRecord {
    /// A change asked for at `requested_at`, nothing of it done yet.
    pub fn asked(what: String, requested_at: Instant) -> Self {
        Self {
            on_proxies: false,
            what,
            requested_at,
            applied_at: None,
            endpoints_at: None,
            reported_at: None,
            completed_at: None,
            mechanisms: Vec::new(),
            versions: Vec::new(),
            started: Vec::new(),
            removed: Vec::new(),
            generations: Vec::new(),
        }
    }
}

/// How the proxies took a change.
#[derive(Clone, Debug, Default)]
pub struct Synced {
    /// Each proxy's (and the sidecar's) mechanism.
    pub mechanisms: Vec<(ProxyKind, &'static str)>,
    /// Whether one of them can end connections it held (a reload, a restart, an upgrade,
    /// Caddy's `/load`), not only change endpoints in place.
    pub ends_connections: bool,
}
