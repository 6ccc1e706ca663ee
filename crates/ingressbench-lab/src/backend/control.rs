//! The echo backend's control endpoint: a stall on demand (an action on the benchmark,
//! so obeyed only from the tool) and the process's own CPU and memory, as a controller's
//! metrics endpoint offers them.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{simple_response, Hold};

/// The environment variable that carries the control endpoint's token (never an argument:
/// a command line is every local user's to read).
pub const CONTROL_TOKEN_ENV: &str = "INGRESSBENCH_CONTROL_TOKEN";

/// The request header a control request carries the token in (not `Authorization`: the
/// API server's pod proxy takes that one for itself).
pub const CONTROL_TOKEN_HEADER: &str = "x-ingressbench-token";

/// The backend's control endpoint on `listener` (until its task is dropped): `POST
/// /stall?for=DURATION` holds every answer (health checks included) for that long from
/// now, as a process that stops answering would; `GET /metrics` answers the process's CPU
/// time and resident memory as the Prometheus clients' process collector names them
/// ([`process_metrics`]); anything else is 404.
///
/// A stall is an action on the benchmark: with a `token`, only a request that carries it
/// in [`CONTROL_TOKEN_HEADER`] is obeyed (403 otherwise); without one, only a listener on
/// loopback obeys (any pod of a cluster reaches a pod's address). `/metrics` reads and is
/// open, as a controller's own is.
pub async fn serve_control(listener: TcpListener, hold: Hold, token: Option<String>) {
    let token = std::sync::Arc::new(token);
    let open_to_all = token.is_none() && listener.local_addr().is_ok_and(|a| !a.ip().is_loopback());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (hold, token) = (hold.clone(), token.clone());
        tokio::spawn(async move {
            let mut stream = stream;
            let mut head = Vec::with_capacity(512);
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 4096 {
                match stream.read_buf(&mut head).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
            let line = String::from_utf8_lossy(&head);
            let target = line.split_whitespace().take(2).collect::<Vec<_>>();
            if target[..] == ["GET", "/metrics"] {
                let _ = stream.write_all(&process_metrics()).await;
                let _ = stream.shutdown().await;
                return;
            }
            let asked = match target[..] {
                ["POST", t] => t.strip_prefix("/stall?for="),
                _ => None,
            };
            let allowed = match token.as_ref() {
                Some(token) => carries_token(&line, token),
                None => !open_to_all,
            };
            let answer = match asked.map(ingressbench_stats::parse_duration) {
                Some(_) if !allowed => {
                    simple_response(403, "a stall needs this backend's control token\n", true)
                }
                Some(Ok(d)) => {
                    hold.hold_for(d);
                    simple_response(200, &format!("holding answers for {d:?}\n"), true)
                }
                Some(Err(e)) => simple_response(400, &format!("{e}\n"), true),
                None => simple_response(404, "POST /stall?for=DURATION or GET /metrics\n", true),
            };
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// Whether the request head `head` carries `token` in [`CONTROL_TOKEN_HEADER`], compared in
/// time that does not depend on where they differ.
fn carries_token(head: &str, token: &str) -> bool {
    let given = head.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case(CONTROL_TOKEN_HEADER)
            .then(|| value.trim())
    });
    given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0u8, |d, (a, b)| d | (a ^ b))
                == 0
    })
}

/// This process's `process_cpu_seconds_total` and `process_resident_memory_bytes`, in
/// Prometheus text exposition: what a controller's own endpoint offers, so a cluster run
/// can read a pod's usage through the API server's pod proxy the way it reads one.
fn process_metrics() -> Vec<u8> {
    use crate::usage::{Part, UsageReader};
    let own = Part::process("backend", "backend", std::process::id());
    let read = UsageReader::new().read(std::slice::from_ref(&own));
    let (cpu_s, rss) = read.first().map_or((0.0, 0), |u| (u.cpu_s, u.rss_bytes));
    let body = format!(
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
         # TYPE process_cpu_seconds_total counter\n\
         process_cpu_seconds_total {cpu_s}\n\
         # HELP process_resident_memory_bytes Resident memory size in bytes.\n\
         # TYPE process_resident_memory_bytes gauge\n\
         process_resident_memory_bytes {rss}\n"
    );
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
