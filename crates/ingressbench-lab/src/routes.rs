//! The arithmetic of route changes, shared by the lab and the cluster: which routes a
//! change leaves in force (generated routes added after the last, removed from the last,
//! changed from the first), and what it adds, removes and changes route by route.

use std::collections::{HashMap, HashSet};

use crate::model::{generated_index, generated_route, Route};
use crate::Change;

/// The routes `change` leaves in force of `routes`, generated ones spread over `pools`
/// (`None` for a change that is not a route change).
pub fn routes_after(routes: &[Route], pools: &[String], change: &Change) -> Option<Vec<Route>> {
    Some(match change {
        Change::Routes(after) => after.clone(),
        Change::AddRoutes(n) => generated_routes_added(routes, pools, *n),
        Change::RemoveRoutes(n) => generated_routes_removed(routes, *n),
        Change::GeneratedRoutes(n) => {
            let now = routes.iter().filter_map(generated_index).count();
            if *n >= now {
                generated_routes_added(routes, pools, n - now)
            } else {
                generated_routes_removed(routes, now - n)
            }
        }
        Change::ChangeRoutes(n) => generated_routes_changed(routes, *n),
        _ => return None,
    })
}

/// `routes` with `n` more generated ones, numbered after the last there is.
fn generated_routes_added(routes: &[Route], pools: &[String], n: usize) -> Vec<Route> {
    let next = routes
        .iter()
        .filter_map(generated_index)
        .max()
        .map_or(0, |i| i + 1);
    let mut routes = routes.to_vec();
    routes.extend((next..next + n).map(|i| generated_route(i, pools)));
    routes
}

/// `routes` without the `n` generated ones of the highest numbers.
fn generated_routes_removed(routes: &[Route], n: usize) -> Vec<Route> {
    let mut numbers: Vec<usize> = routes.iter().filter_map(generated_index).collect();
    numbers.sort_unstable();
    let gone: HashSet<usize> = numbers[numbers.len().saturating_sub(n)..]
        .iter()
        .copied()
        .collect();
    routes
        .iter()
        .filter(|r| generated_index(r).is_none_or(|i| !gone.contains(&i)))
        .cloned()
        .collect()
}

/// `routes` with the `n` generated ones of the lowest numbers at a new revision (one
/// above the highest any route has). Fewer than `n` are changed when fewer exist; the
/// change then says how many it made.
fn generated_routes_changed(routes: &[Route], n: usize) -> Vec<Route> {
    let revision = routes.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    let mut numbers: Vec<usize> = routes.iter().filter_map(generated_index).collect();
    numbers.sort_unstable();
    let changed: HashSet<usize> = numbers.into_iter().take(n).collect();
    let mut routes = routes.to_vec();
    for route in &mut routes {
        if generated_index(route).is_some_and(|i| changed.contains(&i)) {
            route.revision = revision;
        }
    }
    routes
}

/// Whether `change` changes the routes (what [`crate::Lab::routes_delta`] answers for).
pub fn is_route_change(change: &Change) -> bool {
    matches!(
        change,
        Change::Routes(_)
            | Change::AddRoutes(_)
            | Change::RemoveRoutes(_)
            | Change::GeneratedRoutes(_)
            | Change::ChangeRoutes(_)
    )
}

/// What a route change does, route by route: a route is the same one before and after
/// when its host and path prefix are (its pool or revision may change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutesDelta {
    /// Routes new after it, in their order.
    pub added: Vec<Route>,
    /// Routes gone after it, in their order before.
    pub removed: Vec<Route>,
    /// Routes there before and after but different (as they are after).
    pub changed: Vec<Route>,
}

impl RoutesDelta {
    /// The delta from `before` to `after` (linear: a change among 10,000 routes is one
    /// pass over each).
    pub fn between(before: &[Route], after: &[Route]) -> Self {
        fn key(r: &Route) -> (&str, &str) {
            (&r.host, &r.path_prefix)
        }
        let was: HashMap<(&str, &str), &Route> = before.iter().map(|r| (key(r), r)).collect();
        let is: HashSet<(&str, &str)> = after.iter().map(key).collect();
        let mut delta = RoutesDelta::default();
        for route in after {
            match was.get(&key(route)) {
                None => delta.added.push(route.clone()),
                Some(old) if *old != route => delta.changed.push(route.clone()),
                Some(_) => {}
            }
        }
        delta.removed = before
            .iter()
            .filter(|r| !is.contains(&key(r)))
            .cloned()
            .collect();
        delta
    }

    /// Routes it touches.
    pub fn len(&self) -> usize {
        self.added.len() + self.removed.len() + self.changed.len()
    }

    /// Whether it touches none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A routes change in words: `routes 1000->1100 (+100)`, `routes 1100->1000 (-100)`,
/// `routes 1000 (12 changed)`.
pub fn routes_change(before: &[Route], after: &[Route]) -> String {
    let delta = RoutesDelta::between(before, after);
    let (b, a) = (before.len(), after.len());
    let mut parts = Vec::new();
    if !delta.added.is_empty() {
        parts.push(format!("+{}", delta.added.len()));
    }
    if !delta.removed.is_empty() {
        parts.push(format!("-{}", delta.removed.len()));
    }
    if !delta.changed.is_empty() {
        parts.push(format!("{} changed", delta.changed.len()));
    }
    let counts = if a == b {
        format!("routes {a}")
    } else {
        format!("routes {b}->{a}")
    };
    if parts.is_empty() {
        format!("{counts} (unchanged)")
    } else {
        format!("{counts} ({})", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generated(n: usize) -> Vec<Route> {
        let pools = ["a".to_owned(), "b".to_owned()];
        (0..n).map(|i| generated_route(i, &pools)).collect()
    }

    #[test]
    fn a_change_raises_the_revision_of_the_lowest_generated_routes() {
        let mut routes = generated(5);
        routes.reverse();
        let once = generated_routes_changed(&routes, 2);
        let revised: Vec<(&str, u32)> = once
            .iter()
            .filter(|r| r.revision > 0)
            .map(|r| (r.host.as_str(), r.revision))
            .collect();
        assert_eq!(revised, [("r1.routes.test", 1), ("r0.routes.test", 1)]);
        let twice = generated_routes_changed(&once, 3);
        assert_eq!(twice.iter().filter(|r| r.revision == 2).count(), 3);
        assert_eq!(routes_change(&once, &twice), "routes 5 (3 changed)");
        assert_eq!(routes_change(&twice, &twice), "routes 5 (unchanged)");
        // Asked for more than there are: all of them.
        let all = generated_routes_changed(&routes, 50);
        assert!(all.iter().all(|r| r.revision == 1));
    }

    #[test]
    fn a_delta_tells_added_removed_and_changed_routes_apart() {
        let before = generated(4);
        let mut after = before[1..].to_vec();
        after[0].pool = "c".into();
        after[1].revision = 7;
        after.extend(generated(6)[4..].iter().cloned());
        let delta = RoutesDelta::between(&before, &after);
        let hosts =
            |routes: &[Route]| -> Vec<String> { routes.iter().map(|r| r.host.clone()).collect() };
        assert_eq!(hosts(&delta.added), ["r4.routes.test", "r5.routes.test"]);
        assert_eq!(hosts(&delta.removed), ["r0.routes.test"]);
        assert_eq!(hosts(&delta.changed), ["r1.routes.test", "r2.routes.test"]);
        assert_eq!(delta.len(), 5);
        assert_eq!(
            routes_change(&before, &after),
            "routes 4->5 (+2, -1, 2 changed)"
        );
    }
}
