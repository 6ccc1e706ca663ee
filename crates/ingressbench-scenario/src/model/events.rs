//! A scenario's events as written (`events:`): when each fires ([`Timing`]) and what it
//! does ([`Action`]), checked into an [`EventSpec`].

use std::fmt;
use std::time::Duration;

use ingressbench_lab::labfile::OverlayFile;
use ingressbench_lab::model::Overlay;
use ingressbench_lab::Change;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::UpgradeTo;

/// An event as written: exactly one timing and one action.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventFile {
    /// At this time after the start of measurement.
    pub at: Option<String>,
    /// Every this long (from `at`, default from the start).
    pub every: Option<String>,
    /// How many times, with `every`.
    pub times: Option<u32>,
    /// Before sequential request number N (from 1), and before every Nth with `times`.
    pub before_request: Option<u64>,
    /// Overrides the controller's propagation delay for this event.
    pub propagation_delay: Option<String>,
    /// Scale the (first) pool to N replicas.
    pub scale: Option<usize>,
    /// SIGKILL a backend: `random` or a name.
    pub kill: Option<String>,
    /// SIGTERM (drain) a backend: `random` or a name.
    pub terminate: Option<String>,
    /// Route changes (`revert` undoes them).
    pub config: Option<ConfigChange>,
    /// Push the configuration again without a change.
    pub reload: Option<bool>,
    /// Stop the proxy its own graceful way and start it again (as a service manager's
    /// restart; with a front, one replica at a time).
    pub restart: Option<bool>,
    /// Upgrade the proxy through its own zero-downtime mechanism (nginx's binary upgrade,
    /// HAProxy's master re-exec, Envoy's hot restart; a restart for Traefik and Caddy):
    /// `same` upgrades to the binary it runs (the mechanism is what is measured), a
    /// version (`1.40.0`) or a version per proxy (`{ envoy: 1.40.0, traefik: 3.7.15 }`)
    /// to that version, installed beside the one the target starts with.
    pub upgrade: Option<UpgradeTo>,
    /// With `restart` or `upgrade`: how long the stopped proxy has to end what it serves before what
    /// is left of it is killed (default 5s; a service manager gives 90s).
    pub grace: Option<String>,
    /// Make a backend stop answering for a while: `{ backend: NAME, for: 2s }`.
    pub stall_backend: Option<StallFile>,
    /// The client moves its QUIC connections to a new local port (HTTP/3 only).
    pub migrate: Option<bool>,
    /// Add this many generated routes, in one update of the proxy.
    pub add_routes: Option<usize>,
    /// Remove this many generated routes (the last added), in one update.
    pub remove_routes: Option<usize>,
    /// Change this many generated routes (the lowest numbers) in one update: each answers
    /// a new revision in a response header.
    pub change_routes: Option<usize>,
    /// With `add_routes` or `remove_routes`: one route per update, the next once the
    /// last answers as it should (or is given up).
    pub one_at_a_time: Option<bool>,
    /// Generated routes to these counts in turn, each step in one update, the next once
    /// the last step's routes answer as they should and `pause` has passed.
    pub route_steps: Option<RouteStepsFile>,
}

/// `route_steps: { to: [50, 100, 300], pause: 2s }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RouteStepsFile {
    /// The generated route counts, in turn.
    pub to: Vec<usize>,
    /// How long each count is held once its routes are right (default 2s).
    pub pause: Option<String>,
}

/// A route change: an overlay, or `revert`.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigChange {
    /// Apply these changes.
    Set(Overlay),
    /// Back to the scenario's `overlay`.
    Revert,
}

impl<'de> Deserialize<'de> for ConfigChange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ConfigChange;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`revert` or { response_header: {name, value}, cors_origin, rewrite: {from, to} }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfigChange, E> {
                if v == "revert" {
                    Ok(ConfigChange::Revert)
                } else {
                    Err(E::custom(format!(
                        "`{v}`: expected `revert` or a map of changes"
                    )))
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ConfigChange, A::Error> {
                let o = OverlayFile::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ConfigChange::Set(o.to_overlay()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A stall as written.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StallFile {
    /// The backend (`random` or a name).
    pub backend: String,
    /// How long.
    #[serde(rename = "for")]
    pub duration: String,
}

/// When an event fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Once, at this time after the start of measurement.
    At(Duration),
    /// `times` times, `every` apart, the first at `first`.
    Every {
        /// First firing.
        first: Duration,
        /// The time between firings.
        every: Duration,
        /// How many times it fires.
        times: u32,
    },
    /// Before sequential requests `first`, `first + every`, … (`times` of them).
    BeforeRequest {
        /// First request number (from 1).
        first: u64,
        /// Requests between firings.
        every: u64,
        /// How many times it fires.
        times: u32,
    },
}

impl Timing {
    /// How many times the event fires.
    pub fn times(&self) -> u32 {
        match self {
            Timing::At(_) => 1,
            Timing::Every { times, .. } | Timing::BeforeRequest { times, .. } => *times,
        }
    }
}

/// What an event does: a change to the system under test, as a lab or a cluster takes
/// it, or what it becomes once the cell it fires in is known.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// A change that needs nothing of the cell.
    Change(Change),
    /// Scale the cell's first pool to this many.
    Scale(usize),
    /// Back to the cell's own overlay (`config: revert`).
    Revert,
    /// Upgrade the proxy its own way, to the binary it runs or to another version (the
    /// cell's target picks its own from `to`).
    Upgrade {
        /// How long a stopped proxy has to end what it serves (where the upgrade stops it).
        grace: Duration,
        /// To what.
        to: UpgradeTo,
    },
    /// Generated routes to these counts in turn, each held `pause` once right (a change
    /// per step; the driver holds the steps).
    RouteSteps {
        /// The counts.
        to: Vec<usize>,
        /// How long each is held.
        pause: Duration,
    },
}

impl Action {
    /// Its kind, as the scenario file names it (the live metrics' `kind` label).
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Change(c) => c.kind(),
            Action::Scale(_) => "scale",
            Action::Revert => "config",
            Action::Upgrade { .. } => "upgrade",
            Action::RouteSteps { .. } => "route_steps",
        }
    }

    /// Whether it adds, removes or changes generated routes (the route probe times it).
    pub fn is_route_event(&self) -> bool {
        matches!(
            self,
            Action::Change(
                Change::AddRoutes(_) | Change::RemoveRoutes(_) | Change::ChangeRoutes(_)
            ) | Action::RouteSteps { .. }
        )
    }

    /// The change it asks for alone, if it needs nothing of the cell.
    pub fn change(&self) -> Option<&Change> {
        match self {
            Action::Change(c) => Some(c),
            _ => None,
        }
    }
}

/// A validated event.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSpec {
    /// When it fires: a time, a period, or before numbered requests.
    pub timing: Timing,
    /// What it does.
    pub action: Action,
    /// Delay before the proxies are told (`None`: the controller's).
    pub propagation_delay: Option<Duration>,
    /// Routes added or removed one per update, each once the last is right.
    pub one_at_a_time: bool,
}

fn duration(field: &str, v: &str) -> Result<Duration, String> {
    ingressbench_stats::parse_duration(v).map_err(|e| format!("{field}: {e}"))
}

fn random_or_name(v: &str) -> Option<String> {
    (v != "random").then(|| v.to_owned())
}

impl EventFile {
    /// Checks that exactly one timing and one action are given, and parses them.
    pub fn validate(&self, index: usize) -> Result<EventSpec, String> {
        let here = |m: String| format!("events[{index}]: {m}");
        let actions = [
            self.scale.is_some(),
            self.kill.is_some(),
            self.terminate.is_some(),
            self.config.is_some(),
            self.reload.is_some(),
            self.restart.is_some(),
            self.upgrade.is_some(),
            self.stall_backend.is_some(),
            self.migrate.is_some(),
            self.add_routes.is_some(),
            self.remove_routes.is_some(),
            self.change_routes.is_some(),
            self.route_steps.is_some(),
        ];
        if actions.iter().filter(|a| **a).count() != 1 {
            return Err(here(
                "give exactly one action: scale, kill, terminate, config, reload, restart, upgrade, stall_backend, migrate, add_routes, remove_routes, change_routes or route_steps"
                    .into(),
            ));
        }
        if self.grace.is_some() && self.restart != Some(true) && self.upgrade.is_none() {
            return Err(here(
                "grace: only a restart or an upgrade has a grace (how long the stopped proxy has to end what it serves)".into(),
            ));
        }
        let grace = duration("grace", self.grace.as_deref().unwrap_or("5s")).map_err(here)?;
        let action = if let Some(n) = self.scale {
            Action::Scale(n)
        } else if let Some(k) = &self.kill {
            Action::Change(Change::Kill(random_or_name(k)))
        } else if let Some(t) = &self.terminate {
            Action::Change(Change::Terminate(random_or_name(t)))
        } else if let Some(c) = &self.config {
            match c {
                ConfigChange::Set(o) => Action::Change(Change::Overlay(o.clone())),
                ConfigChange::Revert => Action::Revert,
            }
        } else if self.reload == Some(true) {
            Action::Change(Change::Reload)
        } else if self.restart == Some(true) {
            Action::Change(Change::Restart { grace })
        } else if let Some(to) = &self.upgrade {
            Action::Upgrade {
                grace,
                to: to.clone(),
            }
        } else if let Some(n) = self.add_routes {
            Action::Change(Change::AddRoutes(n))
        } else if let Some(n) = self.remove_routes {
            Action::Change(Change::RemoveRoutes(n))
        } else if let Some(n) = self.change_routes {
            Action::Change(Change::ChangeRoutes(n))
        } else if let Some(steps) = &self.route_steps {
            if steps.to.is_empty() {
                return Err(here("route_steps.to: give at least one count".into()));
            }
            Action::RouteSteps {
                to: steps.to.clone(),
                pause: duration("route_steps.pause", steps.pause.as_deref().unwrap_or("2s"))
                    .map_err(here)?,
            }
        } else if self.migrate == Some(true) {
            Action::Change(Change::Migrate)
        } else if let Some(s) = &self.stall_backend {
            Action::Change(Change::Stall {
                backend: random_or_name(&s.backend),
                duration: duration("stall_backend.for", &s.duration).map_err(here)?,
            })
        } else {
            return Err(here(
                "`reload: false` and `migrate: false` do nothing; remove the event".into(),
            ));
        };
        let times = self.times.unwrap_or(1);
        if times == 0 {
            return Err(here("`times` must be at least 1".into()));
        }
        if let Some(n) = self.before_request {
            if self.at.is_some() || self.every.is_some() {
                return Err(here(format!(
                    "`before_request: {n}` cannot be combined with `at` or `every`"
                )));
            }
        }
        let timing = match (&self.at, &self.every, self.before_request) {
            (_, _, Some(0)) => return Err(here("`before_request` counts from 1".into())),
            (_, _, Some(first)) => Timing::BeforeRequest {
                first,
                every: first,
                times,
            },
            (at, Some(every), None) => {
                let every = duration("every", every).map_err(here)?;
                if every.is_zero() {
                    return Err(here("`every` must be longer than 0".into()));
                }
                let first = at
                    .as_deref()
                    .map(|a| duration("at", a))
                    .transpose()
                    .map_err(here)?
                    .unwrap_or(every);
                Timing::Every {
                    first,
                    every,
                    times,
                }
            }
            (Some(at), None, None) => {
                if self.times.is_some() {
                    return Err(here("`times` needs `every` (or `before_request`)".into()));
                }
                Timing::At(duration("at", at).map_err(here)?)
            }
            (None, None, None) => {
                return Err(here(
                    "give a time: `at`, `every` (with `times`), or `before_request`".into(),
                ))
            }
        };
        let propagation_delay = self
            .propagation_delay
            .as_deref()
            .map(|d| duration("propagation_delay", d))
            .transpose()
            .map_err(here)?;
        let one_at_a_time = self.one_at_a_time == Some(true);
        if one_at_a_time
            && !matches!(
                action.change(),
                Some(Change::AddRoutes(_) | Change::RemoveRoutes(_))
            )
        {
            return Err(here(
                "`one_at_a_time` goes with add_routes or remove_routes".into(),
            ));
        }
        Ok(EventSpec {
            timing,
            action,
            propagation_delay,
            one_at_a_time,
        })
    }
}
