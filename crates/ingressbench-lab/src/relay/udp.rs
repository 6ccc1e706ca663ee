//! A link's datagrams: the UDP half of a relay, so that QUIC (HTTP/3) crosses an emulated
//! link as TCP does. Each datagram is held until its due time (arrival + one-way delay ±
//! jitter, after the datagrams ahead of it have gone through the link's bandwidth) and
//! then sent on; order is kept, as the TCP half keeps it. A link's reset probability
//! drops a datagram instead (UDP has no connection to reset; QUIC sends the loss again).
//!
//! Each client address (a QUIC endpoint's socket) gets a socket of its own towards the
//! upstream, as a NAT gives it a port, so that the answers find their way back to it; a
//! client that moves (QUIC's connection migration) is a new address and a new socket. A
//! socket idle for a minute is closed, and at most [`MAX_FLOWS`] are open at once.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ingressbench_stats::compare::Rng;

use super::{jittered, on_the_wire, wait_until, LinkSpec, Shared};

/// Client addresses relayed at once; a datagram from one more is dropped.
const MAX_FLOWS: usize = 1024;

/// How long a client address's socket stays without a datagram either way.
const IDLE: Duration = Duration::from_secs(60);

/// How often the relay's reading threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// A datagram on its way: when it is due, where it goes, its bytes.
type Held<T> = (Instant, T, Vec<u8>);

/// The running UDP half of a relay. Dropping it stops it (within [`POLL`]).
pub(super) struct Datagrams {
    stop: Arc<AtomicBool>,
    inbound: Option<JoinHandle<()>>,
}

/// One client address's socket towards the upstream, and whether its reader has ended.
struct Flow {
    socket: Arc<UdpSocket>,
    ended: Arc<AtomicBool>,
}

/// The due time of a datagram of `n` bytes arriving now in `direction` (0: client to
/// upstream), never before the one ahead of it (`last`).
fn due(
    link: LinkSpec,
    shared: &Shared,
    direction: usize,
    n: usize,
    last: &Mutex<Instant>,
    rng: &mut Rng,
) -> Instant {
    let arrived = Instant::now();
    let sent = match link.bandwidth {
        Some(rate) => on_the_wire(&shared.free_at[direction], arrived, n, rate),
        None => arrived,
    };
    let mut due = sent + jittered(link, rng);
    if let Ok(mut last) = last.lock() {
        due = due.max(*last);
        *last = due;
    }
    due
}

/// Sends each held datagram when it is due, with `send`, recording how late.
fn writer<T: Send + 'static>(
    name: &str,
    rx: mpsc::Receiver<Held<T>>,
    shared: &Shared,
    send: impl Fn(&T, &[u8]) + Send + 'static,
) -> io::Result<()> {
    let overhead = shared.overhead.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            for (due, to, datagram) in rx {
                wait_until(due);
                send(&to, &datagram);
                let late = Instant::now().saturating_duration_since(due);
                if let Ok(mut h) = overhead.lock() {
                    h.record_ns(late.as_nanos() as u64);
                }
            }
        })?;
    Ok(())
}

impl Datagrams {
    /// Relays what arrives at `socket` to `upstream` through `link`, and the answers back.
    /// Call it on a thread in the relay's namespace: the sockets it makes live there.
    pub(super) fn start(
        socket: UdpSocket,
        upstream: SocketAddr,
        link: LinkSpec,
        shared: Shared,
        seed: u64,
    ) -> io::Result<Self> {
        socket.set_read_timeout(Some(POLL))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (out_tx, out_rx) = mpsc::channel::<Held<Arc<UdpSocket>>>();
        let (back_tx, back_rx) = mpsc::channel::<Held<SocketAddr>>();
        writer("ib-relay-udp-out", out_rx, &shared, |to, d| {
            let _ = to.send(d);
        })?;
        let answering = socket.try_clone()?;
        writer("ib-relay-udp-back", back_rx, &shared, move |to, d| {
            let _ = answering.send_to(d, to);
        })?;
        let last = Arc::new([Mutex::new(Instant::now()), Mutex::new(Instant::now())]);
        let inbound = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("ib-relay-udp-in".into())
                .spawn(move || {
                    let mut rng = Rng::new(seed);
                    let mut flows: HashMap<SocketAddr, Flow> = HashMap::new();
                    let mut buf = vec![0u8; 65_536];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((n, from)) = socket.recv_from(&mut buf) else {
                            continue;
                        };
                        flows.retain(|_, f| !f.ended.load(Ordering::Relaxed));
                        if !flows.contains_key(&from) {
                            if flows.len() >= MAX_FLOWS {
                                continue;
                            }
                            let Ok(flow) = Flow::open(
                                (upstream, from),
                                link,
                                (&shared, &last),
                                &stop,
                                back_tx.clone(),
                                seed ^ flows.len() as u64,
                            ) else {
                                continue;
                            };
                            flows.insert(from, flow);
                        }
                        let due = due(link, &shared, 0, n, &last[0], &mut rng);
                        if link.reset > 0.0 && rng.unit() < link.reset {
                            continue;
                        }
                        let socket = flows[&from].socket.clone();
                        if out_tx.send((due, socket, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                    for flow in flows.values() {
                        flow.ended.store(true, Ordering::Relaxed);
                    }
                })?
        };
        Ok(Self {
            stop,
            inbound: Some(inbound),
        })
    }
}

impl Flow {
    /// A socket towards `upstream` for the client at `client`, and the thread that reads
    /// its answers and holds each on the link back (`last[1]`: the back direction's latest
    /// due time, shared by every flow) before it goes to the client.
    fn open(
        (upstream, client): (SocketAddr, SocketAddr),
        link: LinkSpec,
        (shared, last): (&Shared, &Arc<[Mutex<Instant>; 2]>),
        stop: &Arc<AtomicBool>,
        back: mpsc::Sender<Held<SocketAddr>>,
        seed: u64,
    ) -> io::Result<Self> {
        let any: SocketAddr = if upstream.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = Arc::new(UdpSocket::bind(any)?);
        socket.connect(upstream)?;
        socket.set_read_timeout(Some(POLL))?;
        let ended = Arc::new(AtomicBool::new(false));
        let (reader, done, stop) = (socket.clone(), ended.clone(), stop.clone());
        let (shared, last) = (shared.clone(), last.clone());
        std::thread::Builder::new()
            .name("ib-relay-udp-flow".into())
            .spawn(move || {
                let mut rng = Rng::new(seed);
                let mut buf = vec![0u8; 65_536];
                let mut heard = Instant::now();
                while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
                    let Ok(n) = reader.recv(&mut buf) else {
                        if heard.elapsed() > IDLE {
                            break;
                        }
                        continue;
                    };
                    heard = Instant::now();
                    let due = due(link, &shared, 1, n, &last[1], &mut rng);
                    if link.reset > 0.0 && rng.unit() < link.reset {
                        continue;
                    }
                    if back.send((due, client, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                done.store(true, Ordering::Relaxed);
            })?;
        Ok(Self { socket, ended })
    }
}

impl Drop for Datagrams {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.inbound.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Relay;
    use super::*;

    /// A UDP echo server on loopback: sends every datagram back to where it came from.
    fn echo() -> SocketAddr {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(&buf[..n], from);
            }
        });
        addr
    }

    /// A client socket that gives up on an answer after a second.
    fn client() -> UdpSocket {
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        c
    }

    #[test]
    fn datagrams_cross_the_link_both_ways_each_client_getting_its_own_answers() {
        let delay = Duration::from_millis(3);
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            echo(),
            LinkSpec::delay(delay, Duration::from_micros(500)),
            true,
            None,
        )
        .unwrap();
        let (a, b) = (client(), client());
        let mut buf = [0u8; 2048];
        for i in 0..20u8 {
            let started = Instant::now();
            a.send_to(&[i; 1200], relay.addr()).unwrap();
            b.send_to(&[i + 100; 30], relay.addr()).unwrap();
            let n = a.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &[i; 1200], "a's own datagram, unchanged");
            let n = b.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &[i + 100; 30], "b's own datagram, unchanged");
            // Each crossed the link twice, each time at least the delay less the jitter.
            let took = started.elapsed();
            assert!(took >= 2 * (delay - Duration::from_micros(500)), "{took:?}");
        }
        // Every datagram (20 each way for each client) was measured when it was sent on.
        let deadline = Instant::now() + Duration::from_secs(5);
        while relay.overhead().count() < 80 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(relay.overhead().count(), 80);
    }

    #[test]
    fn a_reset_link_drops_every_datagram_and_a_plain_relay_has_no_udp_half() {
        let link = LinkSpec {
            reset: 1.0,
            ..LinkSpec::default()
        };
        let relay = Relay::start("127.0.0.1:0".parse().unwrap(), echo(), link, true, None).unwrap();
        let c = client();
        c.send_to(b"lost", relay.addr()).unwrap();
        let mut buf = [0u8; 16];
        let e = c.recv(&mut buf).expect_err("dropped, not answered");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        drop(relay);
        // Without `udp` the port's UDP twin is not the relay's: nothing answers there.
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            echo(),
            LinkSpec::default(),
            false,
            None,
        )
        .unwrap();
        let free = UdpSocket::bind(relay.addr());
        assert!(free.is_ok(), "{free:?}");
    }
}
