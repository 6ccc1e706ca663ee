//! Cluster mode. Today: [`local`], a real Kubernetes control plane whose parts are local
//! processes, for the tests and for trying cluster mode without a cloud; [`api`], the
//! calls made through the ecosystem's client (`kube` with `k8s-openapi`); [`deploy`], a
//! run's namespace, backends and routes, changed through the API and found again by
//! label; [`routes`], the run's routes as an Ingress or Gateway API HTTPRoutes, and how
//! each controller takes route changes.

pub mod agent;
pub mod api;
pub mod check;
pub mod counters;
pub mod deploy;
mod error;
pub mod file;
pub mod image;
pub mod local;
mod logs;
pub mod meta;
pub mod routes;
pub mod usage;
pub mod workers;

pub use error::ClusterError;
