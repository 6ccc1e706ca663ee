//! The floor under ingressbench's HTTP/2 open loop: the same `h2` crate on the same tokio
//! runtime (one thread, a task per stream), with nothing else, so that `bench/compare.py
//! h2-open` can show how much of the CPU per request is the crate and the runtime and how
//! much is ingressbench (pacing to the microsecond, latency from the intended time, phases,
//! outcomes, the frame watch). It paces on tokio's 1 ms timer, records nothing, and checks
//! only that every answer arrived.
//!
//! `cargo run --release -p ingressbench-load --example h2_floor -- 127.0.0.1:8080 20000 10 10`
//! (address of an h2c server, requests per second, seconds, connections).

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, rate, seconds, connections] = args.as_slice() else {
        eprintln!("usage: h2_floor ADDR RATE SECONDS CONNECTIONS");
        std::process::exit(2);
    };
    let (Ok(rate), Ok(seconds), Ok(connections)) = (
        rate.parse::<u64>(),
        seconds.parse::<u64>(),
        connections.parse::<usize>(),
    ) else {
        eprintln!("RATE, SECONDS and CONNECTIONS are whole numbers");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let answered = tokio::task::LocalSet::new()
        .block_on(&runtime, load(addr, rate, seconds, connections.max(1)))
        .unwrap_or_else(|e| {
            eprintln!("h2_floor: {e}");
            std::process::exit(1);
        });
    let total = rate * seconds;
    println!("{answered} of {total} requests answered");
    if answered != total {
        std::process::exit(1);
    }
}

async fn load(
    addr: &str,
    rate: u64,
    seconds: u64,
    connections: usize,
) -> Result<u64, Box<dyn std::error::Error>> {
    let mut senders = Vec::with_capacity(connections);
    for _ in 0..connections {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::handshake(tcp).await?;
        tokio::task::spawn_local(async move {
            let _ = connection.await;
        });
        senders.push(send.ready().await?);
    }
    let uri: http::Uri = format!("http://{addr}/").parse()?;
    let total = rate * seconds;
    let answered = Rc::new(Cell::new(0u64));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds + 10);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut sent = 0;
    while sent < total {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
        while sent < due {
            let request = http::Request::get(uri.clone()).body(())?;
            // Up to rate/1000 streams per connection at once: under any server's limit at
            // the rates this is run at, so no wait for a free stream is needed.
            let send = &mut senders[(sent % connections as u64) as usize];
            let (response, _) = send.send_request(request, true)?;
            let answered = answered.clone();
            tokio::task::spawn_local(async move {
                let Ok(response) = response.await else { return };
                let mut body = response.into_body();
                while let Some(Ok(chunk)) = body.data().await {
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                answered.set(answered.get() + 1);
            });
            sent += 1;
        }
    }
    while answered.get() < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(answered.get())
}
