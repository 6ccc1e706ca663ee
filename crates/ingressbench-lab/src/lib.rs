//! The lab: the system under test that ingressbench brings up on one machine.
//!
//! - [`backend`]: the echo server that plays the service behind the proxies.
//! - [`proxy`]: real nginx, HAProxy, Envoy, Traefik and Caddy processes, each configured
//!   from one [`model::RouteTable`] and updated the way its own ecosystem does it.
//! - [`Lab`]: backends as separate processes, a CA and certificate ([`certs`]), proxies
//!   in front, in a private directory; every child is owned ([`process`]) and dies with
//!   the lab, on every exit path.
//!
//! ```no_run
//! use ingressbench_lab::{Lab, LabSpec, proxy::ProxyKind};
//!
//! let spec = LabSpec::simple(vec![ProxyKind::Nginx], 3, "target/release/ingressbench".into());
//! let lab = Lab::up(spec)?;
//! println!("nginx at {}", lab.proxies()[0].http_url());
//! # Ok::<(), ingressbench_lab::LabError>(())
//! ```

pub mod backend;
pub mod certs;
mod change;
mod error;
pub mod front;
pub mod http1;
pub mod identity;
pub mod kernel;
mod lab;
pub mod labfile;
pub mod model;
pub mod process;
pub mod proxy;
pub mod reaper;
pub mod relay;
pub mod routes;
pub mod topology;
pub mod usage;

pub use change::{Change, ChangeRecord, Synced};
pub use error::LabError;
pub use lab::{remove_leftovers, Backend, HopSpec, Lab, LabSpec, PoolSpec};
pub use routes::{is_route_change, RoutesDelta};
