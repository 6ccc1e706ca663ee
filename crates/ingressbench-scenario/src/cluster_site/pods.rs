//! Load from the cluster's own pods: a Job of `ingressbench` workers, placed beside the
//! controller or apart from it, reaching it the way the cluster's clients would.

use ingressbench_cluster::workers::{FleetSpec, LoadJob, Placement};
use ingressbench_load::TlsOptions;

use super::ClusterSite;
use crate::site::{CellFailure, Entry};

impl ClusterSite {
    /// The cell's load as a Job of the cluster's own pods, placed as `placement` says,
    /// and the entry they reach the controller through.
    pub(super) fn load_job(
        &self,
        (tls, host, path): (bool, &str, &str),
        workers: usize,
        placement: Option<&crate::model::PlacementFile>,
    ) -> Result<(Entry, LoadJob), CellFailure> {
        let input = CellFailure::input;
        let (http, https) = &self.inside.addresses;
        let address = if tls { https } else { http };
        let address = address.as_deref().ok_or_else(|| {
            input(format!(
                "load.from: cluster: the cluster file gives the target no {} (nor `cluster_{}`)",
                if tls { "tls_address" } else { "address" },
                if tls { "tls_address" } else { "address" },
            ))
        })?;
        // The pods resolve the address themselves; over TLS they send the scenario's host
        // as the TLS name and trust the cell's CA, which travels in their plan.
        let entry = Entry {
            url: format!("{}{path}", address.trim_end_matches('/')),
            tls: match (&self.door.tls, tls) {
                (Some((ca, _)), true) => Some((
                    TlsOptions {
                        cacert: Some(ca.clone()),
                        sni: Some(host.to_owned()),
                        ..TlsOptions::default()
                    },
                    None,
                )),
                _ => None,
            },
            host_header: true,
            proxy_version: None,
        };
        use crate::model::NodePlacement;
        let placement = match placement {
            None => Placement::Any,
            Some(p) => match p.node {
                None => Placement::Nodes(p.node_selector.clone()),
                Some(NodePlacement::Any) => Placement::Any,
                Some(NodePlacement::SameAsBackends) => Placement::SameAsBackends,
                Some(NodePlacement::OtherThanBackends) => Placement::OtherThanBackends,
                Some(NodePlacement::SameAsIngress) => Placement::SameAsIngress,
            },
        };
        let job = self.run.load_job(FleetSpec {
            workers,
            placement,
            host_network: self.inside.host_network,
            ingress_pods: self.inside.ingress_pods.clone(),
        });
        Ok((entry, job))
    }
}
