//! An emulated link: a TCP relay that holds each chunk of bytes, in each direction, until
//! its due time (arrival + one-way delay ± jitter, after the bytes ahead of it have gone
//! through the link's bandwidth), as toxiproxy does, because this kernel has no netem.
//!
//! Each connection gets a reader and a writer thread per direction: the reader stamps each
//! chunk's arrival and hands it over; the writer sleeps until shortly before the due time
//! and spins the rest (a plain sleep overshoots by the kernel's timer slack, about 50 us),
//! then writes. Order is kept: a chunk is never due before the one ahead of it. A relay
//! cannot hold back a TCP handshake (the kernel completes it before `accept`), so the
//! first bytes of each connection wait two more one-way delays, the round trip the
//! handshake would have cost: totals match a real link, though the client sees that time
//! after connecting rather than while connecting. The relay
//! measures its own added time (write done minus due), so results can show it. A link
//! with a reset probability resets the connection (an RST both ways) instead of passing
//! a chunk, with that probability per chunk. A relay in front of a QUIC listener carries
//! datagrams too, on the UDP port of its number ([`udp`]).

mod udp;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ingressbench_stats::compare::Rng;
use ingressbench_stats::HistogramUs;

/// How much of a wait is spun instead of slept.
const SPIN: Duration = Duration::from_micros(200);

/// One direction of a link: `delay` ± up to `jitter` (uniform), an optional bandwidth, and
/// a probability of resetting the connection.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkSpec {
    /// One-way delay.
    pub delay: Duration,
    /// Largest deviation from `delay`, either way.
    pub jitter: Duration,
    /// Bytes per second each direction carries (`None`: no cap).
    pub bandwidth: Option<u64>,
    /// Probability, per chunk of bytes carried, that the connection is reset instead.
    pub reset: f64,
}

impl LinkSpec {
    /// A link that only delays: `delay` ± `jitter`.
    pub fn delay(delay: Duration, jitter: Duration) -> Self {
        Self {
            delay,
            jitter,
            ..Self::default()
        }
    }

    /// Whether the link holds nothing back and resets nothing (a plain copy).
    fn is_plain(&self) -> bool {
        *self == Self::default()
    }
}

/// A running relay. Dropping it stops accepting and closes its connections.
pub struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<Open>>>,
    overhead: Arc<Mutex<HistogramUs>>,
    accept: Option<JoinHandle<()>>,
    /// The UDP half, on the port of the same number, with `udp`; stopped when dropped.
    _datagrams: Option<udp::Datagrams>,
}

/// A relayed connection's two sockets (kept to close them when the relay stops) and how
/// many of its two directions have ended (at 2 it is forgotten, and its sockets closed).
struct Open {
    sockets: [TcpStream; 2],
    ended: Arc<AtomicUsize>,
}

/// What a relay's connections share: the measured overhead, and when each direction of the
/// link is next free to carry bytes (its bandwidth is shared by every connection).
#[derive(Clone)]
struct Shared {
    overhead: Arc<Mutex<HistogramUs>>,
    free_at: Arc<[Mutex<Instant>; 2]>,
}

impl Relay {
    /// Listens on `listen` (port 0 for any) and relays each connection to `upstream`
    /// through `link`, both ways; with `udp`, the datagrams to the UDP port of the same
    /// number go to `upstream`'s UDP port too (HTTP/3 to a proxy's QUIC listener). With
    /// `netns` (a network namespace's path), the relay's sockets live in that namespace.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        link: LinkSpec,
        udp: bool,
        netns: Option<&Path>,
    ) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            overhead: Arc::new(Mutex::new(HistogramUs::new())),
            free_at: Arc::new([Mutex::new(Instant::now()), Mutex::new(Instant::now())]),
        };
        let overhead = shared.overhead.clone();
        let (bound_tx, bound_rx) = mpsc::channel();
        let netns: Option<PathBuf> = netns.map(Path::to_owned);
        let accept = {
            let (stop, streams) = (stop.clone(), streams.clone());
            std::thread::Builder::new()
                .name("ib-relay-accept".into())
                .spawn(move || {
                    // Sockets are made in the namespace of the thread that makes them; the
                    // connection threads it starts inherit it.
                    let bound = netns
                        .as_deref()
                        .map_or(Ok(()), crate::process::enter_netns)
                        .and_then(|()| bind(listen, udp))
                        .and_then(|(l, datagrams)| {
                            let datagrams = datagrams
                                .map(|d| {
                                    udp::Datagrams::start(
                                        d,
                                        upstream,
                                        link,
                                        shared.clone(),
                                        0x5bd1_e995,
                                    )
                                })
                                .transpose()?;
                            Ok((l.local_addr()?, l, datagrams))
                        });
                    let listener = match bound {
                        Ok((addr, listener, datagrams)) => {
                            let _ = bound_tx.send(Ok((addr, datagrams)));
                            listener
                        }
                        Err(e) => {
                            let _ = bound_tx.send(Err(e));
                            return;
                        }
                    };
                    let mut seed = 0x9e37_79b9_u64;
                    for client in listener.incoming() {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let Ok(client) = client else { continue };
                        let Ok(server) = TcpStream::connect(upstream) else {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        };
                        seed = seed.wrapping_add(0x6a09_e667);
                        let _ = connect_pair(client, server, link, &streams, &shared, seed);
                    }
                })?
        };
        let (addr, datagrams) = bound_rx
            .recv()
            .map_err(|_| io::Error::other("the relay's thread ended before listening"))??;
        Ok(Self {
            addr,
            stop,
            streams,
            overhead,
            accept: Some(accept),
            _datagrams: datagrams,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its own added time per chunk (write done minus due), in microseconds, so far.
    pub fn overhead(&self) -> HistogramUs {
        self.overhead.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// Forgets the added time measured so far.
    pub fn reset_overhead(&self) {
        if let Ok(mut h) = self.overhead.lock() {
            *h = HistogramUs::new();
        }
    }
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("addr", &self.addr).finish()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
        if let Ok(open) = self.streams.lock() {
            for s in open.iter().flat_map(|o| &o.sockets) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// A listener on `listen`, and with `udp` a UDP socket on the same address and port (a
/// port free for both: tried again on another while the UDP one is taken).
fn bind(listen: SocketAddr, udp: bool) -> io::Result<(TcpListener, Option<UdpSocket>)> {
    let mut tries = 0;
    loop {
        let listener = TcpListener::bind(listen)?;
        if !udp {
            return Ok((listener, None));
        }
        match UdpSocket::bind(listener.local_addr()?) {
            Ok(socket) => return Ok((listener, Some(socket))),
            Err(e) if listen.port() != 0 || tries == 20 => return Err(e),
            Err(_) => tries += 1,
        }
    }
}

fn connect_pair(
    client: TcpStream,
    server: TcpStream,
    link: LinkSpec,
    streams: &Arc<Mutex<Vec<Open>>>,
    shared: &Shared,
    seed: u64,
) -> io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let ended = Arc::new(AtomicUsize::new(0));
    if let Ok(mut open) = streams.lock() {
        // Forget the connections that have ended, so that their descriptors close.
        open.retain(|o| o.ended.load(Ordering::Relaxed) < 2);
        open.push(Open {
            sockets: [client.try_clone()?, server.try_clone()?],
            ended: ended.clone(),
        });
    }
    let (a, b) = (client.try_clone()?, server.try_clone()?);
    pipe([a, b], 0, link, shared.clone(), seed, ended.clone())?;
    pipe(
        [server, client],
        1,
        link,
        shared.clone(),
        seed ^ 0xffff,
        ended,
    )?;
    Ok(())
}

/// Carries the first socket's bytes to the second through the link (`direction` 0 is
/// client to server): a reader and a writer thread.
fn pipe(
    [mut from, mut to]: [TcpStream; 2],
    direction: usize,
    link: LinkSpec,
    shared: Shared,
    seed: u64,
    ended: Arc<AtomicUsize>,
) -> io::Result<()> {
    let overhead = shared.overhead.clone();
    if link.is_plain() {
        // Nothing to hold back: copy in one thread, without a hand-over to wait for.
        std::thread::Builder::new()
            .name("ib-relay-copy".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = from.read(&mut buf) {
                    let arrived = Instant::now();
                    if n == 0 || to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if let Ok(mut h) = overhead.lock() {
                        h.record_ns(arrived.elapsed().as_nanos() as u64);
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
                ended.fetch_add(1, Ordering::Relaxed);
            })?;
        return Ok(());
    }
    // `None` in place of a chunk: reset the connection when its turn comes.
    let (tx, rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>();
    let reader_end = from.try_clone()?;
    std::thread::Builder::new()
        .name("ib-relay-read".into())
        .spawn(move || {
            let mut rng = Rng::new(seed);
            let mut last_due = Instant::now();
            let mut buf = vec![0u8; 64 * 1024];
            // The kernel completed the client's handshake at once, on this side of the
            // link; its first bytes wait for the round trip the handshake would have taken.
            let mut handshake = if direction == 0 {
                2 * link.delay
            } else {
                Duration::ZERO
            };
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let arrived = Instant::now();
                        let sent = match link.bandwidth {
                            Some(rate) => on_the_wire(&shared.free_at[direction], arrived, n, rate),
                            None => arrived,
                        };
                        let due =
                            (sent + std::mem::take(&mut handshake) + jittered(link, &mut rng))
                                .max(last_due);
                        last_due = due;
                        let reset = link.reset > 0.0 && rng.unit() < link.reset;
                        let chunk = (!reset).then(|| buf[..n].to_vec());
                        if tx.send((due, chunk)).is_err() || reset {
                            break;
                        }
                    }
                }
            }
        })?;
    std::thread::Builder::new()
        .name("ib-relay-write".into())
        .spawn(move || {
            for (due, chunk) in rx {
                wait_until(due);
                let Some(chunk) = chunk else {
                    // Disconnecting an established TCP socket sends an RST. The side this
                    // direction reads from first: disconnecting the other side first lets
                    // the other direction pass a close (a FIN) on to it ahead of the RST.
                    for s in [&reader_end, &to] {
                        let _ = rustix::net::connect_unspec(s);
                    }
                    break;
                };
                if to.write_all(&chunk).is_err() {
                    break;
                }
                let late = Instant::now().saturating_duration_since(due);
                if let Ok(mut h) = overhead.lock() {
                    h.record_ns(late.as_nanos() as u64);
                }
            }
            // The other side closed its sending half: pass that on, after the data.
            let _ = to.shutdown(Shutdown::Write);
            ended.fetch_add(1, Ordering::Relaxed);
        })?;
    Ok(())
}

/// When `n` bytes arriving at `arrived` have gone through a link of `rate` bytes per
/// second that is busy until `free_at` (which moves on by their transmission time).
fn on_the_wire(free_at: &Mutex<Instant>, arrived: Instant, n: usize, rate: u64) -> Instant {
    let transmit = Duration::from_secs_f64(n as f64 / rate.max(1) as f64);
    let Ok(mut free) = free_at.lock() else {
        return arrived + transmit;
    };
    let done = (*free).max(arrived) + transmit;
    *free = done;
    done
}

fn jittered(link: LinkSpec, rng: &mut Rng) -> Duration {
    if link.jitter.is_zero() {
        return link.delay;
    }
    let j = link.jitter.as_secs_f64() * (2.0 * rng.unit() - 1.0);
    Duration::from_secs_f64((link.delay.as_secs_f64() + j).max(0.0))
}

/// Sleeps until shortly before `due`, then spins to it.
fn wait_until(due: Instant) {
    let now = Instant::now();
    if due <= now {
        return;
    }
    if due - now > SPIN {
        std::thread::sleep(due - now - SPIN);
    }
    while Instant::now() < due {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback: answers every byte it reads.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = s;
                    let _ = s.set_nodelay(true);
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Round trips of `n` 100-byte messages through `relay`; returns the median.
    fn median_round_trip(addr: SocketAddr, n: usize) -> Duration {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        let msg = [7u8; 100];
        let mut back = [0u8; 100];
        let mut times: Vec<Duration> = (0..n)
            .map(|_| {
                let t = Instant::now();
                s.write_all(&msg).unwrap();
                s.read_exact(&mut back).unwrap();
                assert_eq!(back, msg, "bytes pass unchanged");
                t.elapsed()
            })
            .collect();
        times.sort();
        times[n / 2]
    }

    #[test]
    fn a_link_delays_each_direction_and_passes_bytes_unchanged() {
        let upstream = echo();
        let direct = median_round_trip(upstream, 50);
        let delay = Duration::from_millis(2);
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            upstream,
            LinkSpec::delay(delay, Duration::ZERO),
            false,
            None,
        )
        .unwrap();
        let through = median_round_trip(relay.addr(), 50);
        // Each message crosses the link twice: the relay can only add, never take away.
        assert!(
            through >= direct + 2 * delay,
            "{through:?} through a 2 ms link vs {direct:?} direct"
        );
        let overhead = relay.overhead();
        // Each chunk is measured after its write; the last may still be on its way.
        assert!(
            overhead.count() >= 99,
            "every chunk measured: {}",
            overhead.count()
        );
        eprintln!(
            "round trip: direct {direct:?}, through 2 x 2 ms {through:?}; relay's own added time p50 {} us, p99 {} us",
            overhead.value_at_percentile(50.0),
            overhead.value_at_percentile(99.0)
        );
    }

    #[test]
    fn a_new_connection_pays_the_handshake_round_trip_on_its_first_bytes() {
        let delay = Duration::from_millis(5);
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            echo(),
            LinkSpec::delay(delay, Duration::ZERO),
            false,
            None,
        )
        .unwrap();
        let started = Instant::now();
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        s.write_all(b"x").unwrap();
        let mut back = [0u8; 1];
        s.read_exact(&mut back).unwrap();
        let first = started.elapsed();
        let again = Instant::now();
        s.write_all(b"y").unwrap();
        s.read_exact(&mut back).unwrap();
        let second = again.elapsed();
        // Handshake (2 delays), then the request and its answer (2 more); after that, 2.
        assert!(first >= 4 * delay, "first exchange {first:?}");
        assert!(second >= 2 * delay, "second exchange {second:?}");
        assert!(second < first, "{second:?} then {first:?}");
    }

    #[test]
    fn a_zero_delay_link_reports_its_own_cost() {
        let upstream = echo();
        let direct = median_round_trip(upstream, 200);
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            upstream,
            LinkSpec::default(),
            false,
            None,
        )
        .unwrap();
        let through = median_round_trip(relay.addr(), 200);
        let added = through.saturating_sub(direct) / 2;
        // Timings are printed, not asserted (docs/PERFORMANCE.md has them).
        eprintln!(
            "0 ms link: round trip direct {direct:?}, through {through:?}: {added:?} added per crossing; relay-measured p50 {} us",
            relay.overhead().value_at_percentile(50.0)
        );
        // 200 round trips: 400 chunks, each measured. A chunk is measured after it is
        // written, so the last of each direction may be counted a moment after its echo
        // arrived: wait for them (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while relay.overhead().count() < 400 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(relay.overhead().count(), 400);
    }

    #[test]
    fn ended_connections_are_forgotten() {
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            echo(),
            LinkSpec::delay(Duration::from_micros(100), Duration::ZERO),
            false,
            None,
        )
        .unwrap();
        for _ in 0..20 {
            let mut s = TcpStream::connect(relay.addr()).unwrap();
            s.write_all(b"x").unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let mut back = Vec::new();
            s.read_to_end(&mut back).unwrap();
            assert_eq!(back, b"x");
        }
        // Each new connection prunes the ended ones before it is added.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut keep = Vec::new();
        loop {
            keep.push(TcpStream::connect(relay.addr()).unwrap());
            std::thread::sleep(Duration::from_millis(20));
            if relay.streams.lock().unwrap().len() <= keep.len() {
                break;
            }
            assert!(Instant::now() < deadline, "ended connections still held");
        }
    }

    #[test]
    fn a_bandwidth_cap_paces_the_bytes() {
        // 1 MB/s each way: 200 KB take at least 0.2 s to cross, however fast the sockets.
        let link = LinkSpec {
            bandwidth: Some(1_000_000),
            ..LinkSpec::default()
        };
        let relay =
            Relay::start("127.0.0.1:0".parse().unwrap(), echo(), link, false, None).unwrap();
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        let sent = vec![5u8; 200_000];
        let started = Instant::now();
        let writer = {
            let mut w = s.try_clone().unwrap();
            let sent = sent.clone();
            std::thread::spawn(move || w.write_all(&sent).unwrap())
        };
        let mut got = vec![0u8; sent.len()];
        s.read_exact(&mut got).unwrap();
        let took = started.elapsed();
        writer.join().unwrap();
        assert_eq!(got, sent);
        eprintln!("200 KB through a 1 MB/s link and back: {took:?}");
        assert!(
            took >= Duration::from_millis(195),
            "{took:?}: the cap held nothing back"
        );
    }

    #[test]
    fn a_reset_link_resets_the_connection() {
        let link = LinkSpec {
            reset: 1.0,
            ..LinkSpec::default()
        };
        let relay =
            Relay::start("127.0.0.1:0".parse().unwrap(), echo(), link, false, None).unwrap();
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        s.write_all(b"hello").unwrap();
        let mut buf = [0u8; 16];
        let e = s
            .read(&mut buf)
            .expect_err("a reset, not an answer or a clean close");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
    }

    #[test]
    fn jitter_never_reorders_bytes_and_a_close_passes_through() {
        let upstream = echo();
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            upstream,
            LinkSpec::delay(Duration::from_micros(300), Duration::from_micros(250)),
            false,
            None,
        )
        .unwrap();
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        let sent: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        for chunk in sent.chunks(97) {
            s.write_all(chunk).unwrap();
        }
        s.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, sent, "in order, complete, then closed");
        drop(relay);
    }
}
