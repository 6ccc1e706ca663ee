//! End-to-end tests of `ingressbench`: the binary, the lab with real proxies, the report
//! and the local cluster. One test binary for all of them: each integration-test file of
//! its own was a release link of its own (about 20 s each), and the modules run side by
//! side in one process as the tests of one file did (each names its files and network
//! namespaces so that they do not meet).

mod backend;
mod cli;
#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
mod cluster_traffic;
mod common;
mod grpc;
mod hostile;
mod http3;
mod kernel;
#[cfg(feature = "cluster")]
mod kubelet;
mod lab;
mod metrics;
mod peers;
mod process;
mod report;
mod run;
mod search;
mod soak;
mod sse;
mod trust;
mod websocket;
mod workers;
