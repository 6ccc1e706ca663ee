//! Route scale in a cluster: every generated route an object of its own (an Ingress of
//! the target's class, or an HTTPRoute on its Gateway; see
//! [`ingressbench_cluster::routes::generated`]), made at the start and then added,
//! removed and changed K at a time through the API, as a pipeline applying a folder of
//! manifests would (up to [`IN_FLIGHT`] calls at a time). A change is applied when the
//! API has stored every object of it; the route probe reads, per route, when the
//! controller's proxy answered it.

use std::time::{Duration, Instant};

use ingressbench_cluster::routes::generated;
use ingressbench_lab::model::{generated_index, Route};
use ingressbench_lab::routes::{routes_after, routes_change};
use ingressbench_lab::{Change, RoutesDelta};
use ingressbench_load::probe::{Expect, ProbeRoute, Prober};
use serde_json::json;

use super::errands::{Answer, Job, Lane};
use super::ClusterSite;
use crate::site::CellFailure;

/// API calls in flight at a time when K objects are made or deleted.
const IN_FLIGHT: usize = 16;

/// Routes named in a message about routes that never answered, at most.
const NAMED: usize = 5;

impl ClusterSite {
    /// Makes `count` generated routes through the API and waits until the probe has every
    /// one answering from its pool (at most `options.give_up_after` after the last was
    /// made); how long each took goes into the routes record.
    pub(super) fn make_generated(
        &mut self,
        count: usize,
        options: ingressbench_load::probe::ProbeOptions,
    ) -> Result<(), CellFailure> {
        let Some(at) = self.probe_at else {
            return Err("generated routes need the target's plain HTTP address".into());
        };
        let asked = Instant::now();
        let (_, make) = self
            .generated_job(&Change::AddRoutes(count))
            .map_err(CellFailure::from)?;
        make(&self.run).map_err(CellFailure::from)?;
        let made = Instant::now();
        let added: Vec<Route> = self
            .routes
            .iter()
            .filter(|r| generated_index(r).is_some())
            .cloned()
            .collect();
        let prober = Prober::start(at, options, || Ok(())).map_err(CellFailure::from)?;
        prober.probe(0, added.iter().map(probe_added).collect(), asked);
        // The prober gives a route up itself after `give_up_after`; the bound here only
        // keeps a stuck probe from holding the cell.
        let deadline = made + options.give_up_after + Duration::from_secs(10);
        while prober.settled() < count as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let report = prober.finish();
        let routes = report
            .jobs
            .into_iter()
            .next()
            .map(|j| j.routes)
            .unwrap_or_default();
        let never: Vec<&str> = routes
            .iter()
            .filter(|r| r.right_at.is_none())
            .map(|r| r.host.as_str())
            .collect();
        if !never.is_empty() || routes.len() < count {
            return Err(CellFailure::from(format!(
                "{} of the {count} generated routes did not answer from their pool through {} within {} s of being made ({}{}); is the controller keeping up? a longer routes.probe.give_up_after waits longer",
                never.len().max(count - routes.len()),
                self.door.address,
                options.give_up_after.as_secs(),
                never[..never.len().min(NAMED)].join(", "),
                if never.len() > NAMED { ", …" } else { "" }
            )));
        }
        let last = routes
            .iter()
            .filter_map(|r| r.right_at)
            .max()
            .unwrap_or(made);
        self.routes_record["generated"] = json!({
            "count": count,
            "objects_made_s": made.saturating_duration_since(asked).as_secs_f64(),
            "all_answered_s": last.saturating_duration_since(asked).as_secs_f64(),
        });
        Ok(())
    }

    /// What a generated-route change would add, remove and change (`None`: not one).
    pub(super) fn generated_delta(&self, change: &Change) -> Option<RoutesDelta> {
        let after = routes_after(&self.routes, &self.pool_names, change)?;
        Some(RoutesDelta::between(&self.routes, &after))
    }

    /// Makes a generated-route change through the API: an object for each route it adds
    /// or changes (what they name first), deleting each it removes; applied when the API
    /// has stored them all (an errand: a thousand objects take seconds).
    pub(super) fn change_generated(&mut self, change: &Change) -> Result<usize, String> {
        let (what, job) = self.generated_job(change)?;
        let index = self.record(what, None);
        // A change of the routes, which carry no generation here.
        self.records[index].on_proxies = true;
        self.errands.event(index, Some(Lane::Routes), job);
        Ok(index)
    }

    /// What a generated-route change is, and the API calls that make it; the routes in
    /// force are the new ones from here on.
    pub(super) fn generated_job(&mut self, change: &Change) -> Result<(String, Job), String> {
        let after = routes_after(&self.routes, &self.pool_names, change)
            .ok_or("not a change of generated routes")?;
        let delta = RoutesDelta::between(&self.routes, &after);
        if delta
            .added
            .iter()
            .chain(&delta.changed)
            .chain(&delta.removed)
            .any(|r| generated_index(r).is_none())
        {
            return Err("only generated routes are made and changed through the API in a cluster; the scenario's own routes stay as they are".into());
        }
        let what = routes_change(&self.routes, &after);
        let o = self.run.objects();
        let touched: Vec<Route> = delta.added.iter().chain(&delta.changed).cloned().collect();
        let (first, then) = generated::objects(o, self.plain_parent.as_ref(), &touched);
        let gone: Vec<(&'static str, &'static str, String)> = delta
            .removed
            .iter()
            .map(|r| generated::object_ref(o, r))
            .collect();
        self.routes = after;
        let job: Job = Box::new(move |run| {
            if !first.is_empty() {
                run.apply(&first).map_err(|e| e.to_string())?;
            }
            run.apply_concurrently(&then, IN_FLIGHT)
                .map_err(|e| e.to_string())?;
            run.delete_concurrently(&gone, IN_FLIGHT)
                .map_err(|e| e.to_string())?;
            Ok(Answer::Stored)
        });
        Ok((what, job))
    }
}

/// A new route, for the probe: its pool's answer after 404s.
fn probe_added(route: &Route) -> ProbeRoute {
    ProbeRoute {
        host: route.host.clone(),
        path: route.path_prefix.clone(),
        expect: Expect::Added {
            pool: route.pool.clone(),
        },
    }
}
