//! `ingressbench backend`: the echo server the lab runs as separate processes.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ingressbench_lab::backend::{
    serve, serve_control, serve_http3, BackendConfig, BackendTls, Hold, Http3Options, Latency,
    Stall, WebSocketBehaviour, CONTROL_TOKEN_ENV,
};

use crate::args::BackendArgs;
use crate::UsageError;

pub(crate) fn run(args: BackendArgs) -> Result<ExitCode> {
    let config = config_from(&args).map_err(|e| anyhow::Error::new(UsageError(e)))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (report, http3) = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| {
                UsageError(
                    anyhow::Error::new(e).context(format!("cannot listen on {}", args.listen)),
                )
            })?;
        let addr = listener.local_addr()?;
        // The control endpoint lives as long as the backend serves.
        let _control = match args.control {
            Some(at) => {
                let control = tokio::net::TcpListener::bind(at).await.map_err(|e| {
                    UsageError(anyhow::Error::new(e).context(format!("cannot listen on {at}")))
                })?;
                let token = std::env::var(CONTROL_TOKEN_ENV)
                    .ok()
                    .filter(|t| !t.is_empty());
                if token.is_none() && !at.ip().is_loopback() {
                    eprintln!(
                        "backend {}: the control endpoint on {at} has no token ({CONTROL_TOKEN_ENV}): it serves /metrics and refuses stalls",
                        args.name
                    );
                }
                Some(AbortOnDrop(tokio::spawn(serve_control(
                    control,
                    config.hold.clone(),
                    token,
                ))))
            }
            None => None,
        };
        // HTTP/3 on the UDP port of the same number, bound before the port is said.
        let quic = if args.http3 {
            let socket = std::net::UdpSocket::bind(addr).map_err(|e| {
                UsageError(anyhow::Error::new(e).context(format!("cannot listen on UDP {addr}")))
            })?;
            let options = Http3Options {
                max_streams: args.http3_max_streams,
                reset_key: args.quic_reset_key.clone(),
            };
            Some(serve_http3(
                socket,
                config.clone(),
                options,
                shutdown_signal(),
            ))
        } else {
            None
        };
        // The lab reads this line to learn the port.
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on {addr}").and_then(|()| stdout.flush())?;
        drop(stdout);
        let over_tcp = serve(listener, config, shutdown_signal());
        let (report, http3) = match quic {
            Some(quic) => {
                let (report, http3) = tokio::join!(over_tcp, quic);
                (report, Some(http3.context("serving HTTP/3")?))
            }
            None => (over_tcp.await, None),
        };
        Ok::<_, anyhow::Error>((report.context("serving")?, http3))
    })?;
    eprintln!(
        "backend {}: drained after {} connections ({} HTTP/2), {} requests{}{}{}{}{}",
        args.name,
        report.connections,
        report.http2_connections,
        report.requests,
        http3.map_or_else(String::new, |n| format!(", {n} requests over HTTP/3")),
        if report.websockets > 0 {
            format!(
                ", {} WebSockets ({} messages echoed)",
                report.websockets, report.websocket_messages
            )
        } else {
            String::new()
        },
        if report.event_streams > 0 {
            format!(
                ", {} event streams ({} events sent)",
                report.event_streams, report.events
            )
        } else {
            String::new()
        },
        if report.grpc_calls + report.grpc_streams > 0 {
            format!(
                ", {} gRPC calls and {} gRPC streams ({} messages sent)",
                report.grpc_calls, report.grpc_streams, report.grpc_messages
            )
        } else {
            String::new()
        },
        if report.dropped_at_drain > 0 {
            format!(
                ", {} connections dropped at the drain timeout",
                report.dropped_at_drain
            )
        } else {
            String::new()
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn config_from(args: &BackendArgs) -> Result<BackendConfig> {
    let config = BackendConfig {
        name: args.name.clone(),
        body_bytes: args.body_bytes,
        status: args.status,
        latency: args.latency.parse::<Latency>()?,
        error_rate: args.error_rate,
        stall: match (args.stall_every, args.stall_for) {
            (Some(every), Some(duration)) => Some(Stall { every, duration }),
            _ => None,
        },
        hold: Hold::default(),
        drain_timeout: args.drain_timeout,
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(BackendTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.client_ca.clone(),
            }),
            _ => None,
        },
        at_most: args.serve_at_most,
        websocket: WebSocketBehaviour {
            drop_every: args.ws_drop_every,
            duplicate_every: args.ws_duplicate_every,
            close_on_drain: !args.ws_no_close_on_drain,
        },
        leak_per_request: args.leak_per_request,
    };
    if let Some(tls) = &config.tls {
        // Bad certificate files are bad input: say so before listening.
        tls.acceptor()?;
    }
    config.validate()?;
    Ok(config)
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// SIGTERM or SIGINT: drain. (SIGKILL is a crash, as it should be.)
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}
