//! The lab: the system under test that ingressbench brings up on one machine.
//!
//! Today it holds the echo backend ([`backend`]), the project's own small HTTP/1.1 server
//! that plays the service behind the proxies: it names itself in a header, can be made
//! slow, erroring or stalling, and drains on SIGTERM so that a graceful stop can be told
//! apart from a crash.
//!
//! ```no_run
//! use ingressbench_lab::backend::{BackendConfig, serve};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = BackendConfig { name: "b1".into(), ..BackendConfig::default() };
//! serve(listener, config, std::future::pending()).await?;
//! # Ok(()) }
//! ```

pub mod backend;
mod error;

pub use error::LabError;
