//! What `run --cluster FILE` does before the first cell: the cluster file's targets when
//! the scenario names none, each cell checked against the file and the cluster (as
//! `cluster check` does), what earlier runs left removed, and the targets that cannot
//! express the scenario's route changes refused or left out. A build without the
//! `cluster` feature (`scripts/demo.sh`'s, the lab alone) has the same two calls, which
//! say how to get cluster mode.

#[cfg(feature = "cluster")]
pub(crate) use with_cluster::{prepare, targets};

#[cfg(not(feature = "cluster"))]
pub(crate) use without_cluster::{prepare, targets};

/// The cluster file `--cluster` names: `local` (when no file has that name) is the one the
/// local cluster wrote in its directory.
pub(crate) fn named(path: &std::path::Path) -> std::path::PathBuf {
    if path == std::path::Path::new("local") && !path.exists() {
        return crate::args::local_cluster_dir().join("cluster.yaml");
    }
    path.to_owned()
}

/// The file in a local cluster's directory that says why its serving process stopped,
/// when a part of it exited (the directory stays, with the logs, until `down`).
pub(crate) const LOCAL_STOPPED: &str = "stopped";

/// When the cluster file `path` is a local cluster's whose serving process stopped on a
/// part's exit: what to tell a run that failed against it.
pub(crate) fn local_cluster_stopped(path: &std::path::Path) -> Option<String> {
    let dir = path.parent()?;
    let why = std::fs::read_to_string(dir.join(LOCAL_STOPPED)).ok()?;
    Some(format!(
        "the local cluster of {} had stopped: {}\nits parts' logs are in {}; `ingressbench cluster local down --dir {}` removes it, `up` starts one afresh",
        path.display(),
        why.trim(),
        dir.join("cluster").display(),
        dir.display()
    ))
}

#[cfg(feature = "cluster")]
mod with_cluster {
    use std::path::Path;

    use anyhow::Result;
    use ingressbench_scenario::ClusterOptions;

    use crate::args::RunArgs;
    use crate::UsageError;

    /// The cluster options of the run, `cells` and `sets` narrowed to the cluster file's
    /// targets that can run the scenario when the file chose them (`implicit`).
    pub(crate) fn prepare(
        path: &Path,
        args: &RunArgs,
        (text, file, quick): (&str, &Path, bool),
        implicit: bool,
        sets: &mut Vec<(String, String)>,
        (cells, left_out): (&mut Vec<ingressbench_scenario::Cell>, &mut Vec<String>),
    ) -> Result<ClusterOptions> {
        let options = options(path, args, cells)?;
        // What the caller has said it left out; what this adds is said at the end.
        let said = left_out.clone();
        // HTTP/3 goes to the targets whose entries say they take it: a matrix's HTTP/3
        // cells for the others are left out, saying why; a scenario that sends HTTP/3
        // throughout is refused for them.
        let no_http3 = ingressbench_scenario::cluster_site::http3_refusals(&options, cells)
            .map_err(|e| UsageError(anyhow::anyhow!(e)))?;
        let refuse_http3 = |t: &ingressbench_scenario::Target| {
            t.placed().and_then(|key| no_http3.get(key).cloned())
        };
        if !no_http3.is_empty() {
            (*cells, *left_out) =
                ingressbench_scenario::expand_with(text, file, sets, quick, &refuse_http3)
                    .map_err(|e| UsageError(e.into()))?;
            let sent = cells.iter().find(|c| {
                c.scenario.load.protocol.as_deref() == Some("http3")
                    && refuse_http3(&c.target).is_some()
            });
            if let Some(cell) = sent {
                return Err(UsageError(anyhow::anyhow!(
                    "cell {} ({}): {} (--cluster {})",
                    cell.index,
                    cell.label(),
                    refuse_http3(&cell.target).unwrap_or_default(),
                    path.display()
                ))
                .into());
            }
        }
        let refused = ingressbench_scenario::cluster_site::route_refusals(&options, cells)
            .map_err(|e| UsageError(anyhow::anyhow!(e)))?;
        // A target the command or the scenario named is refused; of the cluster
        // file's own, those that cannot express the changes are left out, saying why.
        let kept: Vec<String> = options
            .file
            .targets
            .keys()
            .filter(|t| !refused.contains_key(*t))
            .cloned()
            .collect();
        match refused.values().next() {
            Some(message) if !implicit || kept.is_empty() => {
                return Err(
                    UsageError(anyhow::anyhow!("{message} (--cluster {})", path.display())).into(),
                )
            }
            Some(_) => {
                left_out.clear();
                for (target, message) in &refused {
                    left_out.push(format!("{target}: {message}"));
                }
                let kept: Vec<String> = kept
                    .iter()
                    .map(|n| format!("{{ cluster: {n:?} }}"))
                    .collect();
                sets.retain(|(k, _)| k != "targets");
                sets.push(("targets".into(), format!("[{}]", kept.join(", "))));
                let more;
                (*cells, more) =
                    ingressbench_scenario::expand_with(text, file, sets, quick, &refuse_http3)
                        .map_err(|e| UsageError(e.into()))?;
                left_out.extend(more);
            }
            None => {}
        }
        for why in left_out.iter().filter(|w| !said.contains(w)) {
            eprintln!("left out: {why}");
        }
        Ok(options)
    }

    /// With `--cluster`, a scenario written for the lab (its targets proxies) runs against
    /// every target of the cluster file, unless `--set targets=…` chooses; one that names
    /// `{ cluster: NAME }` targets runs those. Made a `--set`, recorded with the run so that
    /// `--resume` runs the same. Whether it chose the targets.
    pub(crate) fn targets(
        path: &std::path::Path,
        scenario: &str,
        sets: &mut Vec<(String, String)>,
    ) -> Result<bool> {
        if ingressbench_scenario::names_cluster_targets(scenario)
            || sets.iter().any(|(k, _)| k == "targets")
        {
            return Ok(false);
        }
        // The scenario's own targets go; a setting of theirs a cluster cannot take would
        // go with them, silently, and the results would carry a wrong label.
        let dropped = ingressbench_scenario::lab_only_target_settings(scenario);
        if !dropped.is_empty() {
            return Err(UsageError(anyhow::anyhow!(
                "with --cluster, the scenario's targets are replaced by the cluster file's, and these settings of theirs would be lost: {}; a cluster's controllers take none of them from the tool (docs/CLUSTER.md). Run it in the lab, or name cluster targets with --set 'targets=[{{ cluster: NAME }}]'",
                dropped.join(", ")
            ))
            .into());
        }
        let file = ingressbench_cluster::file::ClusterFile::read(path)
            .map_err(|e| UsageError(e.into()))?;
        let names: Vec<String> = file
            .targets
            .keys()
            .map(|n| format!("{{ cluster: {n:?} }}"))
            .collect();
        eprintln!(
            "targets: those of {} ({}); --set 'targets=[{{ cluster: NAME }}]' chooses",
            path.display(),
            file.targets.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        sets.push(("targets".into(), format!("[{}]", names.join(", "))));
        Ok(true)
    }

    /// Where `--cluster` sends the cells: the file read, each cell checked against it (before
    /// anything is made), the kubeconfig and context chosen, and what earlier runs of the
    /// tool left in that cluster removed.
    fn options(
        path: &std::path::Path,
        args: &RunArgs,
        cells: &[ingressbench_scenario::Cell],
    ) -> Result<ingressbench_scenario::cluster_site::ClusterOptions> {
        let file = ingressbench_cluster::file::ClusterFile::read(path)
            .map_err(|e| UsageError(e.into()))?;
        ingressbench_scenario::cluster_site::check_cells(cells, &file)
            .map_err(|e| UsageError(anyhow::anyhow!("{e} (--cluster {})", path.display())))?;
        let kubeconfig = crate::user_kubeconfig::chosen_kubeconfig(args.kubeconfig.as_deref())?;
        let mut file = file;
        if args.context.is_some() {
            file.context = args.context.clone();
        }
        // One connection to the cluster for the whole run.
        let api =
            ingressbench_cluster::api::ClusterApi::connect(&kubeconfig, file.context.as_deref())
                .map_err(|e| UsageError(e.into()))?;
        // What `cluster check` checks, before anything is made: the API, every verb, each
        // class, each address.
        let failed: Vec<String> = api
            .run(ingressbench_cluster::check::check(&file, &kubeconfig))
            .into_iter()
            .filter(|f| !f.ok)
            .map(|f| format!("FAIL {}: {}", f.what, f.detail))
            .collect();
        if !failed.is_empty() {
            return Err(UsageError(anyhow::anyhow!(
                "{} is not ready for this run (as `ingressbench cluster check` says):\n  {}",
                path.display(),
                failed.join("\n  ")
            ))
            .into());
        }
        let removed =
            ingressbench_cluster::deploy::cleanup(&api).map_err(|e| UsageError(e.into()))?;
        for name in removed {
            eprintln!("deleted namespace {name}, left by a run that is gone");
        }
        // The second it started, and four hex digits of its own: two runs started within
        // one second (one that failed at once, and the next) took the same namespace,
        // which was still being deleted.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let run_id = format!(
            "{}{:04x}",
            crate::stamp::utc_stamp()
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>()
                .to_ascii_lowercase(),
            (nanos ^ std::process::id().rotate_left(16)) & 0xffff
        );
        let options = ingressbench_scenario::cluster_site::ClusterOptions { file, api, run_id };
        Ok(options)
    }
}

#[cfg(not(feature = "cluster"))]
mod without_cluster {
    use std::path::Path;

    use anyhow::Result;
    use ingressbench_scenario::ClusterOptions;

    use crate::args::RunArgs;

    /// Cluster mode is not in this build.
    pub(crate) fn prepare(
        _path: &Path,
        _args: &RunArgs,
        _scenario: (&str, &Path, bool),
        _implicit: bool,
        _sets: &mut Vec<(String, String)>,
        _cells: (&mut Vec<ingressbench_scenario::Cell>, &mut Vec<String>),
    ) -> Result<ClusterOptions> {
        Err(crate::no_cluster())
    }

    /// Cluster mode is not in this build.
    pub(crate) fn targets(
        _path: &Path,
        _scenario: &str,
        _sets: &mut Vec<(String, String)>,
    ) -> Result<bool> {
        Err(crate::no_cluster())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_against_a_stopped_local_cluster_is_told_why_and_where_the_logs_are() {
        let dir = std::env::temp_dir().join(format!("ib-stopped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cluster.yaml");
        assert_eq!(
            local_cluster_stopped(&file),
            None,
            "still up: nothing to add"
        );
        std::fs::write(
            dir.join(LOCAL_STOPPED),
            "kube-apiserver exited with signal: 9 (SIGKILL)\n",
        )
        .unwrap();
        let said = local_cluster_stopped(&file).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            said.contains("had stopped: kube-apiserver exited with signal: 9 (SIGKILL)")
                && said.contains(&format!("logs are in {}", dir.join("cluster").display()))
                && said.contains("cluster local down --dir"),
            "{said}"
        );
    }
}
