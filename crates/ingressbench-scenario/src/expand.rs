//! From a scenario file to the cells a runner executes.

use std::path::Path;
use std::time::Duration;

use serde_yaml_ng::Value;

use crate::model::{EventSpec, Scenario, Target};
use crate::ScenarioError;

mod matrix;

use matrix::{axes_of, fix, product};

/// More cells than this is a mistake, not an experiment.
const MAX_CELLS: u128 = 10_000;

/// One run: one target, one combination of the matrix, one repeat.
#[derive(Clone, Debug)]
pub struct Cell {
    /// Position in running order (from 0).
    pub index: usize,
    /// Which repeat (from 0).
    pub repeat: u32,
    /// The system under test.
    pub target: Target,
    /// The matrix settings of this cell, as `path=value`.
    pub settings: Vec<(String, String)>,
    /// The scenario with those settings applied.
    pub scenario: Scenario,
    /// Its validated events.
    pub events: Vec<EventSpec>,
}

impl Cell {
    /// A short label: target and settings (`nginx load.rate=500`).
    pub fn label(&self) -> String {
        let mut label = self.target.name();
        for (path, value) in &self.settings {
            label.push_str(&format!(" {path}={value}"));
        }
        label
    }
}

/// Whether a scenario's text names `{ cluster: NAME }` targets (it was written for a
/// cluster file, whose other targets it does not want).
pub fn names_cluster_targets(text: &str) -> bool {
    serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
        .ok()
        .and_then(|v| v.get("targets")?.as_sequence().cloned())
        .is_some_and(|t| t.iter().any(|t| t.get("cluster").is_some()))
}

/// The settings of the scenario's own (lab) targets that a cluster cannot take, which
/// running it against a cluster file's targets would drop: `target NAME: front` and the
/// like. `run --cluster` refuses such a scenario rather than measure something else under
/// its name.
pub fn lab_only_target_settings(text: &str) -> Vec<String> {
    let targets = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
        .ok()
        .and_then(|v| v.get("targets")?.as_sequence().cloned())
        .unwrap_or_default();
    let mut found = Vec::new();
    for t in &targets {
        let Some(map) = t.as_mapping() else { continue };
        let name = t
            .get("name")
            .or_else(|| t.get("proxy"))
            .and_then(|n| n.as_str())
            .unwrap_or("?");
        for key in crate::model::LAB_ONLY_TARGET_KEYS {
            if map.contains_key(key) {
                found.push(format!("target {name}: {key}"));
            }
        }
    }
    found
}

/// Parses `text` (the file at `path`), applies `sets` (`path`, `value` pairs, as
/// `--set`) and, with `quick`, the file's `quick` section, checks everything, and returns
/// the cells in running order: every repeat runs every combination, and within a
/// combination every target, so that the targets compared are measured close together
/// and repeats interleave (A B C A B C).
pub fn expand(
    text: &str,
    path: &Path,
    sets: &[(String, String)],
    quick: bool,
) -> Result<Vec<Cell>, ScenarioError> {
    expand_noting(text, path, sets, quick).map(|(cells, _)| cells)
}

/// [`expand`], with the cells the matrix leaves out and why: a combination whose
/// `load.protocol` is `http3` runs with the targets that serve HTTP/3 only (churn.yaml's
/// protocol axis compares http1, http2 and http3 where each can go).
pub fn expand_noting(
    text: &str,
    path: &Path,
    sets: &[(String, String)],
    quick: bool,
) -> Result<(Vec<Cell>, Vec<String>), ScenarioError> {
    expand_with(text, path, sets, quick, &|t| {
        crate::check::http3_refusal(t).map(str::to_owned)
    })
}

/// [`expand_noting`], with why a target takes no HTTP/3 said by `no_http3` (a cluster
/// run's: its cluster file's and its controller's words) rather than by the lab.
pub fn expand_with(
    text: &str,
    path: &Path,
    sets: &[(String, String)],
    quick: bool,
    no_http3: &dyn Fn(&Target) -> Option<String>,
) -> Result<(Vec<Cell>, Vec<String>), ScenarioError> {
    let mut base: Scenario = serde_yaml_ng::from_str(text).map_err(|e| located(path, &e))?;
    for (key, values) in &base.quick.matrix {
        if !base.matrix.contains_key(key) {
            return Err(ScenarioError::at(
                path,
                format!("quick.matrix: `{key}` is not in `matrix`; it can only thin what the matrix varies"),
            ));
        }
        if quick {
            base.matrix.insert(key.clone(), values.clone());
        }
    }
    if quick {
        base.repeat = base.quick.repeat.unwrap_or(base.repeat);
    }
    if let Some(budget) = &base.quick.budget {
        match ingressbench_stats::parse_duration(budget) {
            Ok(d) if (Duration::from_secs(10)..=Duration::from_secs(3600)).contains(&d) => {}
            Ok(_) => {
                return Err(ScenarioError::at(
                    path,
                    format!("quick.budget: `{budget}`: from 10s to 1h"),
                ))
            }
            Err(e) => return Err(ScenarioError::at(path, format!("quick.budget: {e}"))),
        }
    }
    // The file's quick settings first, then the command line's, each as `--set`.
    let mut all_sets: Vec<(String, Value, &str)> = Vec::new();
    if quick {
        for (key, value) in &base.quick.set {
            all_sets.push((key.clone(), value.clone(), "quick.set"));
        }
    }
    for (key, raw) in sets {
        let value: Value =
            serde_yaml_ng::from_str(raw).unwrap_or_else(|_| Value::String(raw.clone()));
        all_sets.push((key.clone(), value, "--set"));
    }
    let mut axes = axes_of(&base.matrix).map_err(|m| ScenarioError::at(path, m))?;
    // A field fixed by a set no longer varies; in an axis of paths varied together, the
    // set keeps the values that agree with it.
    for (key, value, source) in &all_sets {
        axes =
            fix(axes, key, value).map_err(|m| ScenarioError::at(path, format!("{source} {m}")))?;
    }
    let mut tree: Value = serde_yaml_ng::from_str(text).map_err(|e| located(path, &e))?;
    if let Value::Mapping(m) = &mut tree {
        m.remove("matrix");
    }
    // Named in messages about a cell that cannot be read with them.
    let set_labels: Vec<String> = all_sets
        .iter()
        .map(|(key, value, source)| format!("{source} {key}={}", scalar_text(value)))
        .collect();
    for (key, value, source) in all_sets {
        if key == "matrix" || key.starts_with("matrix.") || key == "quick" {
            return Err(ScenarioError::at(
                path,
                format!("{source} {key}: the matrix is not a field to set; set the field itself (--set load.rate=500) to run one value of it"),
            ));
        }
        if key == "repeat" {
            // Read from the file before the sets: the set replaces it (over quick's).
            base.repeat = value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ScenarioError::at(path, format!("{source} repeat: give a whole number"))
                })?;
        }
        set_path(&mut tree, &key, value)
            .map_err(|m| ScenarioError::at(path, format!("{source} {key}: {m}")))?;
    }
    let varies = |field: &str| axes.iter().any(|a| a.paths.iter().any(|p| p == field));
    if base.search.is_some() && varies("load.rate") {
        return Err(ScenarioError::at(
            path,
            "matrix: `load.rate` cannot vary in a capacity search; the search chooses each trial's rate",
        ));
    }
    let planned = axes
        .iter()
        .map(|a| a.values.len() as u128)
        .product::<u128>()
        * u128::from(base.repeat)
        * base.targets.len() as u128;
    if planned > MAX_CELLS {
        return Err(ScenarioError::at(
            path,
            format!(
                "matrix: {planned} cells (targets x combinations x repeats); at most {MAX_CELLS}"
            ),
        ));
    }
    let combos = product(&axes);
    if base.repeat == 0 {
        return Err(ScenarioError::at(path, "repeat: must be at least 1"));
    }
    let mut cells = Vec::new();
    let mut left_out = Vec::new();
    for repeat in 0..base.repeat {
        for combo in &combos {
            let mut cell_tree = tree.clone();
            let mut settings = Vec::new();
            for (key, value) in combo {
                set_path(&mut cell_tree, key, value.clone())
                    .map_err(|m| ScenarioError::at(path, format!("matrix: `{key}`: {m}")))?;
                settings.push((key.clone(), scalar_text(value)));
            }
            // A matrix that makes some cells plain requests (long-lived.yaml's HTTP/3
            // cells beside its WebSockets) leaves the stream loads' settings to the
            // stream loads: without a matrix over the kind they are an error (load.rs).
            if combo
                .iter()
                .any(|(k, v)| k == "load.kind" && scalar_text(v) == "http")
            {
                if let Some(Value::Mapping(load)) = cell_tree.get_mut("load") {
                    load.remove("stream");
                    load.remove("websocket");
                }
            }
            let mut scenario: Scenario = serde_yaml_ng::from_value(cell_tree).map_err(|e| {
                let what = settings
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .chain(set_labels.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(", ");
                if what.is_empty() {
                    ScenarioError::at(path, e.to_string())
                } else {
                    ScenarioError::at(path, format!("with {what}: {e}"))
                }
            })?;
            if scenario.search.is_some() {
                crate::capacity::first_trial(&mut scenario)
                    .map_err(|m| ScenarioError::at(path, m))?;
            }
            if combo
                .iter()
                .any(|(k, v)| k == "load.protocol" && scalar_text(v) == "http3")
            {
                let at: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let mut serve = Vec::new();
                for t in scenario.targets.drain(..) {
                    match no_http3(&t) {
                        None => serve.push(t),
                        Some(why) if repeat == 0 => {
                            left_out.push(format!("{} with {}: {why}", t.name(), at.join(" ")));
                        }
                        Some(_) => {}
                    }
                }
                if serve.is_empty() {
                    continue;
                }
                scenario.targets = serve;
            }
            let events = crate::check::scenario(&scenario, path)?;
            for target in &scenario.targets {
                let cell = Cell {
                    index: cells.len(),
                    repeat,
                    target: target.clone(),
                    settings: settings.clone(),
                    scenario: scenario.clone(),
                    events: events.clone(),
                };
                // What the cell would find wrong when it starts, found now.
                crate::check::cell(&cell).map_err(|e| {
                    ScenarioError::at(path, format!("cell {} ({}): {e}", cell.index, cell.label()))
                })?;
                cells.push(cell);
            }
        }
    }
    if cells.is_empty() {
        return Err(ScenarioError::at(
            path,
            format!("matrix: every cell is left out ({})", left_out.join("; ")),
        ));
    }
    crate::soak::check(&cells).map_err(|m| ScenarioError::at(path, m))?;
    Ok((cells, left_out))
}

fn located(path: &Path, e: &serde_yaml_ng::Error) -> ScenarioError {
    let (location, message) = ingressbench_lab::labfile::yaml_error(e);
    ScenarioError::Invalid {
        path: path.to_owned(),
        location,
        message,
    }
}

/// A matrix value as a cell's label and settings show it: a scalar as written, a list or
/// a mapping (`events: [[], [...]]`) on one line, in full, so that two values never share
/// a label.
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Sequence(_) | Value::Mapping(_) => serde_json::to_string(v).unwrap_or_default(),
        other => serde_yaml_ng::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

/// Sets a dotted path (`load.rate`, `backends.0.replicas`) in a YAML tree, creating
/// mappings on the way.
fn set_path(tree: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let mut node = tree;
    let mut parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err("write a dotted path such as load.rate".into());
    }
    // A sysctl's name is one key with dots in it (`tuning.sysctls.net.core.somaxconn`).
    let sysctl = parts
        .iter()
        .position(|p| *p == "sysctls")
        .map(|at| at + 1)
        .or_else(|| (parts.len() > 3 && parts[..2] == ["tuning", "nodes"]).then_some(3));
    let joined;
    if let Some(at) = sysctl.filter(|at| *at < parts.len()) {
        joined = parts[at..].join(".");
        parts.truncate(at);
        parts.push(&joined);
    }
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        node = match node {
            Value::Sequence(seq) => {
                let index: usize = part
                    .parse()
                    .map_err(|_| format!("`{part}` is not a list index"))?;
                let len = seq.len();
                seq.get_mut(index)
                    .ok_or_else(|| format!("index {index} is past the end of a list of {len}"))?
            }
            Value::Mapping(map) => {
                let key = Value::String((*part).to_owned());
                if !map.contains_key(&key) {
                    map.insert(
                        key.clone(),
                        if last {
                            Value::Null
                        } else {
                            Value::Mapping(Default::default())
                        },
                    );
                }
                map.get_mut(&key).ok_or_else(|| "unreachable".to_owned())?
            }
            _ => {
                return Err(format!(
                    "`{part}` is inside a value that is neither a map nor a list"
                ))
            }
        };
    }
    *node = value;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const BASE: &str =
        "name: t\ntargets: [nginx, haproxy]\nload: { mode: open, rate: 100, duration: 10s }\n";

    pub(super) fn run(text: &str) -> Result<Vec<Cell>, String> {
        expand(text, Path::new("s.yaml"), &[], false).map_err(|e| e.to_string())
    }

    #[test]
    fn a_cluster_target_refuses_what_only_the_lab_builds_and_says_why() {
        // A hop it takes (a sidecar in its backends' pods), under a name of its own.
        let cells = run("name: t\ntargets: [{ cluster: contour }, { cluster: contour, name: contour-mesh, hop: { proxy: envoy, mtls: true } }]\nload: { rate: 5, duration: 1s }\n").unwrap();
        assert_eq!(cells[1].target.name(), "contour-mesh");
        assert_eq!(cells[1].target.placed(), Some("contour"));
        assert!(cells[1].target.hop().unwrap().mtls);
        assert!(cells[0].target.hop().is_none());
        let err = run("name: t\ntargets: [{ cluster: contour, hop: { proxy: nginx } }]\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(err.contains("the sidecar is envoy"), "{err}");
        let err = run("name: t\ntargets: [{ cluster: contour, front: { replicas: 2 } }]\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(err.contains("takes no `front`"), "{err}");
        assert!(err.contains("service:"), "{err}");
        let err = run("name: t\ntargets: [{ cluster: contour, workers: 2 }]\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(err.contains("takes no `workers`"), "{err}");
        // A lab scenario whose targets would be replaced names what would be lost.
        let closed_loop = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scenarios/closed-loop.yaml"
        ))
        .unwrap();
        assert_eq!(
            lab_only_target_settings(&closed_loop),
            [
                "target nginx-behind-l4: front",
                "target haproxy-behind-l4: front"
            ]
        );
        assert!(lab_only_target_settings(BASE).is_empty());
        // A lab proxy's starting version is not: a controller runs its own.
        let long_lived = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scenarios/long-lived.yaml"
        ))
        .unwrap();
        assert!(long_lived.contains("version: 1.39.3"));
        assert!(lab_only_target_settings(&long_lived).is_empty());
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn a_cluster_cell_refuses_the_labs_tuning_before_anything_starts() {
        let file = ingressbench_cluster::file::ClusterFile::parse(
            "targets:\n  contour: { ingress_class: contour, address: \"http://127.0.0.1:1\" }\n",
        )
        .unwrap();
        let cells = run("name: t\ntargets: [{ cluster: contour }]\ntls: false\ntuning: { upstream_keepalive: 100 }\nload: { rate: 5, duration: 1s }\n").unwrap();
        let err = crate::cluster_site::check_cells(&cells, &file).unwrap_err();
        assert!(err.contains("tuning.upstream_keepalive"), "{err}");
        assert!(
            err.contains("--set tuning.upstream_keepalive=null"),
            "{err}"
        );
        let cells = run("name: t\ntargets: [{ cluster: contour }]\ntls: false\nload: { rate: 5, duration: 1s }\n").unwrap();
        crate::cluster_site::check_cells(&cells, &file).unwrap();
        // gRPC runs (each controller told its own way, asked of the cluster later), but
        // not what has no meaning for it.
        let grpc = "name: t\ntargets: [{ cluster: contour }]\ntls: false\nload: { kind: grpc_stream, rate: 5, duration: 1s }\n";
        crate::cluster_site::check_cells(&run(grpc).unwrap(), &file).unwrap();
        for (more, says) in [
            ("events: [{ at: 500ms, config: { rewrite: { from: /a, to: /b } } }]\n", "path rewrite has no meaning for gRPC"),
            ("routes: { count: 10 }\n", "asks generated routes over HTTP"),
            ("backends: [{ name: a, replicas: 1 }, { name: b, replicas: 1 }]\nroutes: [{ host: x.test, path_prefix: /, pool: a }, { host: x.test, path_prefix: /b, pool: b }]\n", "give each host one pool"),
        ] {
            let cells = run(&format!("{grpc}{more}")).unwrap();
            let err = crate::cluster_site::check_cells(&cells, &file).unwrap_err();
            assert!(err.contains(says), "{more}: {err}");
        }
        let meshed = grpc.replace(
            "{ cluster: contour }",
            "{ cluster: contour, hop: { proxy: envoy } }",
        );
        let err = crate::cluster_site::check_cells(&run(&meshed).unwrap(), &file).unwrap_err();
        assert!(err.contains("gRPC load through a mesh"), "{err}");
        // A cluster target under a name of its own is looked up by the file's.
        let cells = run("name: t\ntargets: [{ cluster: contour, name: in-mesh, hop: { proxy: envoy } }]\ntls: false\nload: { rate: 5, duration: 1s }\n").unwrap();
        crate::cluster_site::check_cells(&cells, &file).unwrap();
        let cells = run("name: t\ntargets: [{ cluster: contour-gateway, name: contour }]\ntls: false\nload: { rate: 5, duration: 1s }\n").unwrap();
        let err = crate::cluster_site::check_cells(&cells, &file).unwrap_err();
        assert!(
            err.contains("does not place target(s) contour-gateway"),
            "{err}"
        );
    }

    #[test]
    fn a_set_value_of_the_wrong_type_is_named_with_its_field() {
        let sets = [("load.rate".to_owned(), "abc".to_owned())];
        let err = expand(
            "name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\n",
            Path::new("s.yaml"),
            &sets,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("with --set load.rate=abc: invalid type: string \"abc\""),
            "{err}"
        );
    }

    #[test]
    fn a_scenario_written_for_a_cluster_file_names_its_targets() {
        assert!(names_cluster_targets(
            "name: t\ntargets: [{ cluster: traefik }]\n"
        ));
        assert!(!names_cluster_targets(
            "name: t\ntargets: [nginx, { proxy: envoy }]\n"
        ));
        assert!(!names_cluster_targets("not: [yaml"));
    }

    #[test]
    fn cells_interleave_repeats_and_vary_targets_fastest() {
        let cells = run(&format!("{BASE}matrix: {{ load.rate: [100, 500], tuning.keepalive_requests: [100, 10000] }}\nrepeat: 2\n")).unwrap();
        assert_eq!(cells.len(), 2 * 2 * 2 * 2);
        let labels: Vec<String> = cells.iter().take(4).map(Cell::label).collect();
        assert_eq!(
            labels,
            [
                "nginx load.rate=100 tuning.keepalive_requests=100",
                "haproxy load.rate=100 tuning.keepalive_requests=100",
                "nginx load.rate=100 tuning.keepalive_requests=10000",
                "haproxy load.rate=100 tuning.keepalive_requests=10000",
            ]
        );
        assert_eq!(
            cells[8].label(),
            cells[0].label(),
            "the second repeat starts over"
        );
        assert_eq!(cells[8].repeat, 1);
        assert_eq!(cells[2].scenario.tuning.keepalive_requests, Some(10000));
        assert_eq!(cells[5].scenario.load.rate, Some(500.0));
    }

    #[test]
    fn routes_take_a_count_of_generated_routes_on_top_of_their_own_and_a_matrix_varies_it() {
        let text = "name: t\ntargets: [nginx]\nbackends: [{ name: a, replicas: 1 }, { name: b, replicas: 1 }]\nroutes: { count: 3, routes: [{ host: app.test, pool: a }] }\nload: { rate: 5, duration: 3s }\nmatrix: { routes.count: [10, 1000] }\nevents: [{ at: 1s, add_routes: 5 }, { at: 2s, remove_routes: 5 }]\n";
        let cells = run(text).unwrap();
        let counts: Vec<usize> = cells.iter().map(|c| c.scenario.routes.count).collect();
        assert_eq!(counts, [10, 1000]);
        let all = cells[0].scenario.routes.all(&["a".into(), "b".into()]);
        assert_eq!(all.len(), 11);
        assert_eq!(
            (all[0].host.as_str(), all[2].host.as_str()),
            ("app.test", "r1.routes.test")
        );
        assert_eq!(all[2].pool, "b");
        assert_eq!(
            cells[0].events[0].action,
            crate::model::Action::Change(ingressbench_lab::Change::AddRoutes(5))
        );
        assert_eq!(
            cells[0].events[1].action,
            crate::model::Action::Change(ingressbench_lab::Change::RemoveRoutes(5))
        );
        // Today's list still reads as before.
        let cells = run("name: t\ntargets: [nginx]\nroutes: [{ host: a.test, pool: echo }]\nload: { rate: 5, duration: 1s }\n").unwrap();
        assert_eq!(
            (
                cells[0].scenario.routes.own.len(),
                cells[0].scenario.routes.count
            ),
            (1, 0)
        );
        let err = run(
            "name: t\ntargets: [nginx]\nroutes: { count: many }\nload: { rate: 5, duration: 1s }\n",
        )
        .unwrap_err();
        assert!(
            err.contains("s.yaml:3:18: routes.count: invalid type: string \"many\""),
            "{err}"
        );
        let err = run("name: t\ntargets: [nginx]\nroutes: [{ hots: a.test, pool: echo }]\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(
            err.contains("s.yaml:3:12: routes[0]: unknown field `hots`"),
            "{err}"
        );
        let err = run("name: t\ntargets: [nginx]\nroutes: 3\nload: { rate: 5, duration: 1s }\n")
            .unwrap_err();
        assert!(err.contains("{ count: N, routes: [...] }"), "{err}");
        // A count the machine would not hold is refused before a route is made.
        let err = run("name: t\ntargets: [nginx]\nroutes: { count: 1000000000000 }\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(err.contains("at most 100000 in a cell"), "{err}");
        let err = run("name: t\ntargets: [nginx]\nroutes: { count: 90000 }\nload: { rate: 5, duration: 30s }\nevents: [{ every: 1s, times: 20, add_routes: 1000 }]\n").unwrap_err();
        assert!(err.contains("up to 110000 generated routes"), "{err}");
        // An own route in the generated routes' domain would clash with them.
        let err = run("name: t\ntargets: [nginx]\nroutes: [{ host: r1.routes.test, pool: echo }]\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(err.contains("the generated routes' domain"), "{err}");
        // A route step past the bound, a probe that could not keep its rate, and
        // one_at_a_time on an event that is not about routes.
        let err = run("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 30s }\nevents: [{ at: 1s, route_steps: { to: [10, 200000] } }]\n").unwrap_err();
        assert!(err.contains("up to 200000 generated routes"), "{err}");
        let err = run("name: t\ntargets: [nginx]\nroutes: { count: 1, probe: { rate: 0 } }\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(err.contains("routes.probe.rate: 0 probes/s"), "{err}");
        let err = run("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 3s }\nevents: [{ at: 1s, scale: 2, one_at_a_time: true }]\n").unwrap_err();
        assert!(
            err.contains("`one_at_a_time` goes with add_routes or remove_routes"),
            "{err}"
        );
        let cells = run("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 30s }\nevents: [{ at: 1s, route_steps: { to: [50, 10], pause: 1s } }]\n").unwrap();
        assert_eq!(
            cells[0].events[0].action,
            crate::model::Action::RouteSteps {
                to: vec![50, 10],
                pause: std::time::Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn a_set_repeat_replaces_the_files_and_quicks() {
        let text = format!("{BASE}repeat: 5\nquick: {{ repeat: 2 }}\n");
        let sets = [("repeat".to_owned(), "3".to_owned())];
        for quick in [false, true] {
            let cells = expand(&text, Path::new("t.yaml"), &sets, quick).unwrap();
            assert_eq!(
                cells.iter().map(|c| c.repeat).max(),
                Some(2),
                "quick {quick}"
            );
        }
        let bad = [("repeat".to_owned(), "many".to_owned())];
        let err = expand(&text, Path::new("t.yaml"), &bad, false).unwrap_err();
        assert!(
            err.to_string()
                .contains("--set repeat: give a whole number"),
            "{err}"
        );
    }

    #[test]
    fn quick_thins_the_matrix_and_the_repeats_only_when_asked() {
        let text = format!("{BASE}matrix: {{ load.rate: [100, 200, 300] }}\nrepeat: 5\nquick: {{ matrix: {{ load.rate: [100] }}, repeat: 2 }}\n");
        let full = expand(&text, Path::new("s.yaml"), &[], false).unwrap();
        assert_eq!(full.len(), 2 * 3 * 5);
        let quick = expand(&text, Path::new("s.yaml"), &[], true).unwrap();
        assert_eq!(quick.len(), 2 * 2);
        assert!(quick.iter().all(|c| c.scenario.load.rate == Some(100.0)));
        for budget in ["5s", "2h", "soon"] {
            let text = format!("{BASE}quick: {{ budget: {budget} }}\n");
            let err = expand(&text, Path::new("s.yaml"), &[], true).unwrap_err();
            assert!(err.to_string().contains("quick.budget"), "{err}");
        }
        let fewer = format!("{BASE}quick: {{ set: {{ load.rate: 7 }} }}\n");
        let full = expand(&fewer, Path::new("s.yaml"), &[], false).unwrap();
        let thin = expand(&fewer, Path::new("s.yaml"), &[], true).unwrap();
        assert_eq!(full[0].scenario.load.rate, Some(100.0));
        assert_eq!(thin[0].scenario.load.rate, Some(7.0));
        let sets = [("load.rate".to_owned(), "9".to_owned())];
        let cli = expand(&fewer, Path::new("s.yaml"), &sets, true).unwrap();
        assert_eq!(
            cli[0].scenario.load.rate,
            Some(9.0),
            "the command line wins"
        );
        let stray = format!("{BASE}quick: {{ matrix: {{ load.connections: [1] }} }}\n");
        let e = run(&stray).unwrap_err();
        assert!(
            e.contains("quick.matrix: `load.connections` is not in `matrix`"),
            "{e}"
        );
    }

    #[test]
    fn the_matrix_cannot_be_set_but_a_field_it_varies_can_be_fixed() {
        let sets = [("matrix".to_owned(), "{}".to_owned())];
        let e = expand(BASE, Path::new("s.yaml"), &sets, false).unwrap_err();
        assert!(
            e.to_string().contains("the matrix is not a field to set"),
            "{e}"
        );
        let text = format!("{BASE}matrix: {{ load.rate: [100, 200, 300] }}\n");
        let sets = [("load.rate".to_owned(), "250".to_owned())];
        let cells = expand(&text, Path::new("s.yaml"), &sets, false).unwrap();
        assert_eq!(cells.len(), 2, "one value, two targets");
        assert!(cells.iter().all(|c| c.scenario.load.rate == Some(250.0)));
    }

    #[test]
    fn a_sysctl_name_is_one_key_in_a_path() {
        let mut tree: Value =
            serde_yaml_ng::from_str("tuning: { sysctls: { net.core.somaxconn: 128 } }").unwrap();
        set_path(
            &mut tree,
            "tuning.sysctls.net.core.somaxconn",
            Value::from(32768),
        )
        .unwrap();
        set_path(
            &mut tree,
            "tuning.nodes.client.net.ipv4.ip_local_port_range",
            Value::from("1024 65000"),
        )
        .unwrap();
        let want: Value = serde_yaml_ng::from_str("tuning: { sysctls: { net.core.somaxconn: 32768 }, nodes: { client: { net.ipv4.ip_local_port_range: 1024 65000 } } }").unwrap();
        assert_eq!(tree, want);
    }

    #[test]
    fn an_http3_axis_runs_where_http3_goes_and_says_what_it_left_out() {
        let text = "name: p\ntargets: [nginx, envoy, caddy]\nbackends: [{ name: echo, replicas: 1 }]\ntls: true\nload: { rate: 10, duration: 1s }\nmatrix:\n  load.protocol: [http1, http3]\n";
        let (cells, left_out) = expand_noting(text, Path::new("s.yaml"), &[], false).unwrap();
        let labels: Vec<String> = cells.iter().map(Cell::label).collect();
        assert_eq!(
            labels,
            [
                "nginx load.protocol=http1",
                "envoy load.protocol=http1",
                "caddy load.protocol=http1",
                "envoy load.protocol=http3",
                "caddy load.protocol=http3",
            ]
        );
        assert_eq!(left_out.len(), 1, "{left_out:?}");
        assert!(
            left_out[0].starts_with("nginx with load.protocol=http3: nginx 1.22"),
            "{left_out:?}"
        );
        // Set rather than varied, it is what was asked for: refused as a whole.
        let sets = [("load.protocol".to_owned(), "http3".to_owned())];
        let e = expand(text, Path::new("s.yaml"), &sets, false).unwrap_err();
        assert!(e.to_string().contains("`nginx`: nginx 1.22"), "{e}");
        // Where nothing serves it, that combination is left out whole, and with nothing
        // else, the run refused.
        let none = text.replace("[nginx, envoy, caddy]", "[nginx, haproxy]");
        let (cells, left_out) = expand_noting(&none, Path::new("s.yaml"), &[], false).unwrap();
        assert_eq!(cells.len(), 2);
        assert!(
            left_out[1].starts_with("haproxy with load.protocol=http3: HAProxy 2.6"),
            "{left_out:?}"
        );
        let only = none.replace("[http1, http3]", "[http3]");
        let e = expand(&only, Path::new("s.yaml"), &[], false).unwrap_err();
        assert!(
            e.to_string().contains("every cell is left out (nginx with"),
            "{e}"
        );
    }

    #[test]
    fn a_cluster_targets_http3_is_its_cluster_files_to_say() {
        let text = "name: p\ntargets: [{ cluster: eg }, { cluster: contour }]\nbackends: [{ name: echo, replicas: 1 }]\ntls: true\nload: { rate: 10, duration: 1s }\nmatrix:\n  load.protocol: [http1, http3]\n";
        // Without the file, nothing is known against either: both take the row.
        let (cells, left_out) = expand_noting(text, Path::new("s.yaml"), &[], false).unwrap();
        assert_eq!(cells.len(), 4);
        assert!(left_out.is_empty(), "{left_out:?}");
        // A cluster run says why one takes none: its HTTP/3 cell is left out, saying so.
        let no_http3 = |t: &Target| (t.placed() == Some("contour")).then(|| "no QUIC".to_owned());
        let (cells, left_out) =
            expand_with(text, Path::new("s.yaml"), &[], false, &no_http3).unwrap();
        let labels: Vec<String> = cells.iter().map(Cell::label).collect();
        assert_eq!(
            labels,
            [
                "eg load.protocol=http1",
                "contour load.protocol=http1",
                "eg load.protocol=http3"
            ]
        );
        assert_eq!(left_out, ["contour with load.protocol=http3: no QUIC"]);
    }

    #[test]
    fn a_stream_load_goes_over_its_own_protocol_only() {
        for (load, says) in [
            (
                "{ kind: websocket, protocol: http3, rate: 5, duration: 1s }",
                "load.protocol: http3 with a WebSocket or event-stream load",
            ),
            (
                "{ kind: sse, protocol: http2, rate: 5, duration: 1s }",
                "load.protocol: http2 with a WebSocket or event-stream load",
            ),
            (
                "{ kind: grpc, protocol: http3, rate: 5, duration: 1s }",
                "load.protocol: http3 with a gRPC load",
            ),
            (
                "{ kind: grpc_stream, protocol: http1, rate: 5, duration: 1s }",
                "load.protocol: http1 with a gRPC load",
            ),
        ] {
            let t = format!("name: t\ntargets: [envoy]\nbackends: [{{ name: echo, replicas: 1 }}]\ntls: true\nload: {load}\n");
            let e = run(&t).unwrap_err();
            assert!(e.contains(says), "{load}: {e}");
        }
        for load in [
            "{ kind: grpc, rate: 5, duration: 1s }",
            "{ kind: grpc, protocol: http2, rate: 5, duration: 1s }",
            "{ kind: websocket, protocol: http1, rate: 5, duration: 1s }",
        ] {
            let t = format!("name: t\ntargets: [envoy]\nbackends: [{{ name: echo, replicas: 1 }}]\ntls: true\nload: {load}\n");
            run(&t).unwrap();
        }
    }

    #[test]
    fn set_overrides_any_field() {
        let sets = [
            ("load.rate".to_owned(), "250".to_owned()),
            ("tuning.workers".to_owned(), "2".to_owned()),
        ];
        let cells = expand(BASE, Path::new("s.yaml"), &sets, false).unwrap();
        assert_eq!(cells[0].scenario.load.rate, Some(250.0));
        assert_eq!(cells[0].scenario.tuning.workers, Some(2));
    }

    #[test]
    fn an_upgrade_goes_to_the_same_binary_a_version_or_a_version_per_proxy() {
        use crate::model::{Action, UpgradeTo};
        use ingressbench_lab::proxy::ProxyKind;
        let text = |upgrade: &str| {
            format!("name: t\ntargets: [nginx, {{ proxy: envoy, version: 1.39.3 }}]\nload: {{ rate: 5, duration: 5s }}\nevents: [{{ at: 1s, upgrade: {upgrade} }}]\n")
        };
        let to = |upgrade: &str| match run(&text(upgrade)).unwrap()[1].events[0].action.clone() {
            Action::Upgrade { to, .. } => to,
            other => panic!("{other:?}"),
        };
        assert_eq!(to("same"), UpgradeTo::Same);
        assert_eq!(to("1.40.0"), UpgradeTo::Version("1.40.0".into()));
        let each = to("{ envoy: 1.40.0 }");
        assert_eq!(
            each.for_kind(ProxyKind::Envoy),
            Some((ProxyKind::Envoy, "1.40.0".into()))
        );
        assert_eq!(each.for_kind(ProxyKind::Nginx), None);
        let cells = run(&text("same")).unwrap();
        assert!(
            matches!(&cells[1].target, Target::Proxy { version: Some(v), .. } if v == "1.39.3"),
            "{:?}",
            cells[1].target
        );
        for bad in ["\"1.40.0; rm -rf /\"", "{ envoy: \"\" }", "[1, 2]"] {
            let err = run(&text(bad)).unwrap_err();
            assert!(err.contains("upgrade"), "{bad}: {err}");
        }
        let err = run("name: t\ntargets: [{ cluster: contour, version: 1.2.3 }]\nload: { rate: 5, duration: 1s }\n").unwrap_err();
        assert!(err.contains("takes no `version`"), "{err}");
    }

    #[test]
    fn events_parse_into_timings_and_actions() {
        let text = "name: t\ntargets: [envoy]\nload: { mode: sequential, requests: 20, interval: 500ms }\nevents:\n  - { before_request: 2, times: 10, kill: random }\n  - { at: 1s, config: { response_header: { name: X-A, value: b } } }\n  - { at: 2s, config: revert, propagation_delay: 3s }\n";
        let cells = run(text).unwrap();
        let e = &cells[0].events;
        assert_eq!(
            e[0].timing,
            crate::Timing::BeforeRequest {
                first: 2,
                every: 2,
                times: 10
            }
        );
        assert_eq!(
            e[0].action,
            crate::model::Action::Change(ingressbench_lab::Change::Kill(None))
        );
        assert_eq!(
            e[2].propagation_delay,
            Some(std::time::Duration::from_secs(3))
        );
        assert!(matches!(e[2].action, crate::model::Action::Revert));
    }

    /// Malformed scenario files: each gives an error naming where and what would be valid.
    #[test]
    fn bad_files_say_where_and_what_would_be_valid() {
        let cases: &[(&str, &str)] = &[
            ("name: t\ntargets: [nginx]\nload: { rate: 1, duration: 1s }\nbogus: 1\n", "s.yaml:4:1: unknown field `bogus`"),
            ("name: t\ntargets: [nginz]\nload: { rate: 1, duration: 1s }\n", "s.yaml:2:11: targets[0]: unknown proxy `nginz`"),
            ("name: t\ntargets: [{ proxy: nginx, upstream: http://x/ }]\nload: { rate: 1, duration: 1s }\n", "exactly one of `proxy`, `upstream` or `cluster`"),
            ("name: t\ntargets: [{ upstream: ftp://x/, name: lb }]\nload: { rate: 1, duration: 1s }\n", "must be an http:// or https:// URL"),
            ("name: t\ntargets: [{ upstream: http://x/ }]\nload: { rate: 1, duration: 1s }\n", "needs a `name`"),
            ("name: t\ntargets: [nginx, nginx]\nload: { rate: 1, duration: 1s }\n", "two targets are called `nginx`"),
            ("name: t\ntargets: []\nload: { rate: 1, duration: 1s }\n", "name at least one system"),
            ("name: t\ntargets: [nginx]\nload: { duration: 1s }\n", "load.rate: open-loop load needs a rate"),
            ("name: t\ntargets: [nginx]\nload: { mode: closed, rate: 5, duration: 1s }\n", "only open-loop load has a rate"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5 }\n", "give a `duration`"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s, requests: 5 }\n", "not both"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: soon }\n", "load.duration: `soon` is not a duration"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s, sample_rate: 2 }\n", "load.sample_rate: 2 is not between 0 and 1"),
            ("name: t\ntargets: [nginx]\nload: { mode: warp, duration: 1s }\n", "s.yaml:3:15: load.mode: unknown variant `warp`"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nevents: [{ at: 1s }]\n", "events[0]: give exactly one action"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nevents: [{ kill: random }]\n", "events[0]: give a time"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nevents: [{ at: 1s, times: 3, kill: random }]\n", "`times` needs `every`"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nevents: [{ before_request: 3, kill: random }]\n", "needs sequential load"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nevents: [{ at: 1s, config: undo }]\n", "expected `revert` or a map of changes"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nevents: [{ at: 1s, scael: 4 }]\n", "s.yaml:4:20: events[0]: unknown field `scael`, expected one of `at`"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nmatrix: { targets: [[nginx]] }\n", "matrix: `targets` cannot vary"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nmatrix: { load.rate: [] }\n", "matrix: `load.rate` lists no values"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nmatrix: { load.rate: [fast] }\n", "with load.rate=fast: invalid type: string \"fast\", expected f64"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nrepeat: 0\n", "repeat: must be at least 1"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s, path: abc }\n", "load.path: \"abc\" is not a request path"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s, path: \"/a b\" }\n", "load.path: \"/a b\" is not a request path"),
            ("name: ../../victim\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\n", "name: \"../../victim\" cannot name a results directory"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\ncontroller: { propagation_delay: later }\n", "controller.propagation_delay: `later` is not a duration"),
            ("targets: [nginx]\nload: { rate: 5, duration: 1s }\n", "missing field `name`"),
            ("name: t\ntargets: [{ proxy: nginx, name: \"a\\u001b[2Jb\" }]\nload: { rate: 5, duration: 1s }\n", "targets: the name \"a\\u{1b}[2Jb\" cannot be stored or printed"),
            (&format!("name: t\ntargets: [{{ proxy: nginx, name: {} }}]\nload: {{ rate: 5, duration: 1s }}\n", "x".repeat(5000)), "give 1-100 characters"),
            ("name: t\ntargets: [nginx]\nload: [1, 2]\n", "load: invalid type: sequence"),
            ("name: t\ntargets: [nginx]\nload: { rate: 5, duration: 1s }\nmatrix: { a: [1,2,3,4,5,6,7,8,9,10], b: [1,2,3,4,5,6,7,8,9,10], c: [1,2,3,4,5,6,7,8,9,10], d: [1,2,3,4,5,6,7,8,9,10,11] }\n", "matrix: 11000 cells"),
        ];
        assert!(cases.len() >= 15);
        let mut wrong = Vec::new();
        for (text, want) in cases {
            match run(text) {
                Ok(_) => wrong.push(format!("should fail:\n{text}")),
                Err(err) if !err.contains(want) => {
                    wrong.push(format!("for\n{text}got: {err}\nwanted: {want}"))
                }
                Err(_) => {}
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    }
}
