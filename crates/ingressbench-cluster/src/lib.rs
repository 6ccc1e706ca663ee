//! Cluster mode. Today: [`local`], a real Kubernetes control plane whose parts are local
//! processes, for the tests and for trying cluster mode without a cloud, and [`api`], the
//! calls made through the ecosystem's client (`kube` with `k8s-openapi`).

pub mod agent;
pub mod api;
pub mod check;
mod error;
pub mod file;
pub mod local;

pub use error::ClusterError;
