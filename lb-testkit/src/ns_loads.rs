//! The north-south loads of issue 63, from an external client namespace to a node's node ports: a steady rate
//! of new TCP flows ([`NewFlows`]: through SNAT when the endpoint is on another node), a client that sends
//! SYNs and drops the SYN-ACKs while a second one connects ([`SynFlood`]), and a flood of one-datagram UDP
//! flows beside idle TCP connections ([`UdpFlood`]). Each drives its traffic and returns what happened as
//! figures; what they must be is the caller's: the in-kernel tests assert them on tierlb, the bench sets
//! them beside real kube-proxy's in the same topology. A caller's own state (tierlb's counters, nf_conntrack's
//! count) is taken by a snapshot closure at the points a load names.
pub mod pod;

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr, TcpStream, UdpSocket},
    os::fd::{AsRawFd as _, OwnedFd},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use nix::sys::socket;
use serde::Serialize;

use self::pod::{Close, ask, connect_from, from, on_threads, tally, tcp_once_closing};
use crate::sandbox::NetNs;

/// Another address on the client's `dev` (a second machine behind the same port, as far as the node sees).
///
/// # Errors
/// `ip addr add`'s.
pub fn add_address(client: &NetNs, dev: &str, addr: IpAddr) -> anyhow::Result<()> {
    client.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev]).map(drop)
}

/// New TCP connections at a steady rate, each a request and its answer: the SNAT load at the issue's 120 a
/// second for 50 s, and the bench's packet-rate steps.
#[derive(Clone, Copy, Debug)]
pub struct NewFlows {
    /// Connections a second.
    pub rate: usize,
    /// Seconds of load.
    pub seconds: f64,
    /// Client threads. A dropped SYN costs its connect 1.5 s: enough workers that the pace holds while
    /// every connect is failing, so failures do not also slow the load down.
    pub workers: usize,
    /// How each connection ends.
    pub close: Close,
}

impl NewFlows {
    /// The issue's load: 120 a second for 50 s (240 workers: 120 a second for 1.5 s each, with room).
    pub const ISSUE: Self = Self { rate: 120, seconds: 50.0, workers: 240, close: Close::Fin };

    /// Offer the load from `client` to `to`; a connection counts when `pod` answers it.
    #[must_use]
    pub fn run(&self, client: &NetNs, to: SocketAddr, pod: &str) -> NewFlowsFigures {
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a few hundred thousand")]
        let total = (self.rate as f64 * self.seconds).round() as usize;
        let next = AtomicUsize::new(0);
        let start = Instant::now();
        let attempts: Vec<Attempt> = on_threads(client, self.workers, |_| {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break mine;
                }
                // Slot i is due i/rate s into the run: each worker takes the next slot and waits for it, so
                // the connects are spread evenly, not sent in bursts.
                let due = start + Duration::from_secs_f64(i as f64 / self.rate as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let now = Instant::now();
                let result = match tcp_once_closing(to, self.close) {
                    Ok((name, _)) if name == pod => Ok(()),
                    Ok((name, peer)) => Err(format!("answered by {name} {peer}")),
                    Err(e) => Err(e),
                };
                mine.push(Attempt {
                    at: (now - start).as_secs_f64(),
                    late: now.saturating_duration_since(due).as_secs_f64(),
                    result,
                });
            }
        })
        .into_iter()
        .flatten()
        .collect();
        let took = start.elapsed().as_secs_f64();
        let failed: Vec<&Attempt> = attempts.iter().filter(|a| a.result.is_err()).collect();
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "seconds of a run")]
        let windows = (self.seconds / 10.0).ceil().max(1.0) as usize;
        let mut by_10s = vec![0usize; windows];
        for a in &failed {
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "seconds of a run")]
            let w = (a.at / 10.0) as usize;
            by_10s[w.min(windows - 1)] += 1;
        }
        NewFlowsFigures {
            rate: self.rate,
            seconds: self.seconds,
            offered: attempts.len(),
            failed: failed.len(),
            first_failure: failed.iter().map(|a| a.at).reduce(f64::min),
            by_10s,
            errors: tally(failed.iter().filter_map(|a| a.result.as_ref().err())),
            took,
            last_start: attempts.iter().map(|a| a.at).fold(0.0, f64::max),
            most_late: attempts.iter().map(|a| a.late).fold(0.0, f64::max),
        }
    }
}

/// One attempt of the paced run: when it started (seconds into the run), how late against its slot, and
/// how it ended.
struct Attempt {
    at: f64,
    late: f64,
    result: Result<(), String>,
}

/// What a [`NewFlows`] run did.
#[derive(Clone, Debug, Serialize)]
pub struct NewFlowsFigures {
    /// The rate offered, connections a second.
    pub rate: usize,
    /// The run's length, seconds.
    pub seconds: f64,
    /// Connections attempted.
    pub offered: usize,
    /// Connections that failed (no connect, no answer, or another pod's).
    pub failed: usize,
    /// When the first failed one started, seconds into the run.
    pub first_failure: Option<f64>,
    /// Failures by 10 s of the run.
    pub by_10s: Vec<usize>,
    /// Failures by their error.
    pub errors: BTreeMap<String, usize>,
    /// The whole run, seconds.
    pub took: f64,
    /// When the last connect started, seconds into the run.
    pub last_start: f64,
    /// The most a connect started behind its slot, seconds.
    pub most_late: f64,
}

impl NewFlowsFigures {
    /// Whether the rate was really offered: every connect started within `slack` seconds of the run's end
    /// (not slowed into a gentler rate by a loaded machine).
    #[must_use]
    pub fn pace_held(&self, slack: f64) -> bool {
        self.last_start < self.seconds + slack
    }
}

impl fmt::Display for NewFlowsFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.first_failure.map_or("none".to_owned(), |t| format!("{t:.1} s into the run"));
        write!(
            f,
            "{} of {} new connections failed at {} a second (the first: {first}); failures by 10 s: {:?}; \
             errors: {:?}; the run took {:.1} s, the last connect started at {:.1} s, at most {:.2} s behind \
             its slot",
            self.failed,
            self.offered,
            self.rate,
            self.by_10s,
            self.errors,
            self.took,
            self.last_start,
            self.most_late
        )
    }
}

/// A client whose firewall drops every SYN-ACK (no spoofing: its kernel keeps retransmitting the SYNs of
/// its connects), then a second client address that connects and asks.
#[derive(Clone, Copy, Debug)]
pub struct SynFlood {
    /// Half-open connects from `flooder`.
    pub flood: usize,
    /// The flooding client's address (its SYN-ACKs dropped).
    pub flooder: IpAddr,
    /// The second client's address.
    pub other: IpAddr,
    /// Connects from `other`, each with a request.
    pub asks: usize,
}

/// The flood's connects are sent 500 every 100 ms.
const FLOOD_BATCH: usize = 500;
/// The second client's connects run on this many threads.
const ASK_THREADS: usize = 10;

impl SynFlood {
    /// In the client's namespace only: `other` on `dev`, and an nftables rule that drops (and counts) the
    /// SYN-ACKs sent to `flooder`.
    ///
    /// # Errors
    /// `ip`'s or `nft`'s.
    pub fn prepare(&self, client: &NetNs, dev: &str) -> anyhow::Result<()> {
        add_address(client, dev, self.other)?;
        let rule = format!(
            "add table ip synflood; add chain ip synflood in {{ type filter hook input priority 0; }}; \
             add rule ip synflood in ip daddr {} tcp flags & (syn | ack) == syn | ack counter drop",
            self.flooder
        );
        let out =
            std::process::Command::new("ip").args(["netns", "exec", client.name(), "nft", &rule]).output()?;
        anyhow::ensure!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    }

    /// One connect and request from `other` to `to` (before the flood: the path works).
    ///
    /// # Errors
    /// The connect's or the request's.
    pub fn warm(&self, client: &NetNs, to: SocketAddr) -> Result<String, String> {
        let other = self.other;
        from(client, move || {
            connect_from(other, to, false).map(TcpStream::from).and_then(|mut s| ask(&mut s))
        })
    }

    /// The flood (kept open to the end), 2 s for the SYN-ACKs to come back and be dropped, `during()`, then
    /// the second client's connects; `pod` is who must answer them.
    pub fn run<S>(
        &self,
        client: &NetNs,
        to: SocketAddr,
        pod: &str,
        during: impl FnOnce() -> S,
    ) -> (SynFloodFigures, S) {
        crate::tenant::allow_files(self.flood + 4_096);
        let (flooder, flood) = (self.flooder, self.flood);
        let started = Instant::now();
        // Each SYN a new flow; the sockets stay open to the end, so their kernel keeps retransmitting the SYNs
        // while the second client connects.
        let fds: Vec<Result<OwnedFd, String>> = from(client, move || {
            let mut fds = Vec::with_capacity(flood);
            for batch in 0..flood.div_ceil(FLOOD_BATCH) {
                let due = started + Duration::from_millis(100 * batch as u64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let n = FLOOD_BATCH.min(flood - batch * FLOOD_BATCH);
                fds.extend((0..n).map(|_| connect_from(flooder, to, true)));
            }
            fds
        });
        let flood_errors = tally(fds.iter().filter_map(|r| r.as_ref().err()));
        let fds: Vec<OwnedFd> = fds.into_iter().flatten().collect();
        let flood_took = started.elapsed().as_secs_f64();
        // The pod's SYN-ACKs come back within moments; the client's first SYN retransmissions leave after 1 s.
        std::thread::sleep(Duration::from_secs(2));
        let snapshot = during();
        let asked = Instant::now();
        let (other, per) = (self.other, self.asks.div_ceil(ASK_THREADS));
        let answers: Vec<Result<String, String>> = on_threads(client, ASK_THREADS, |t| {
            (0..per.min(self.asks.saturating_sub(t * per)))
                .map(|_| connect_from(other, to, false).map(TcpStream::from).and_then(|mut s| ask(&mut s)))
                .collect::<Vec<_>>()
        })
        .into_iter()
        .flatten()
        .collect();
        let asked_took = asked.elapsed().as_secs_f64();
        // Whether the flood really was half-open: a connect of the first client that completed had its
        // SYN-ACK through.
        let connected =
            fds.iter().filter(|fd| socket::getpeername::<socket::SockaddrIn>(fd.as_raw_fd()).is_ok()).count();
        let figures = SynFloodFigures {
            flood: self.flood,
            started: fds.len(),
            flood_errors,
            flood_took,
            asks: answers.len(),
            answered: answers.iter().filter(|a| a.as_deref() == Ok(pod)).count(),
            errors: tally(answers.iter().filter_map(|a| a.as_ref().err())),
            asked_took,
            syn_acks_dropped: nft_dropped(client),
            connected,
        };
        drop(fds);
        (figures, snapshot)
    }
}

/// Packets the client's `synflood` rule dropped (its counter).
fn nft_dropped(ns: &NetNs) -> u64 {
    let Ok(out) = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", "list", "chain", "ip", "synflood", "in"])
        .output()
    else {
        return 0;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    words.windows(2).find(|w| w[0] == "packets").and_then(|w| w[1].parse().ok()).unwrap_or(0)
}

/// What a [`SynFlood`] run did.
#[derive(Clone, Debug, Serialize)]
pub struct SynFloodFigures {
    /// Half-open connects asked for.
    pub flood: usize,
    /// The flood's connects that started (their SYN sent).
    pub started: usize,
    /// The flood's connects that did not start, by error.
    pub flood_errors: BTreeMap<String, usize>,
    /// Seconds the flood took to send.
    pub flood_took: f64,
    /// The second client's connects.
    pub asks: usize,
    /// Of them, answered by the pod.
    pub answered: usize,
    /// The others, by error.
    pub errors: BTreeMap<String, usize>,
    /// Seconds the second client's connects took.
    pub asked_took: f64,
    /// SYN-ACKs the flooding client dropped.
    pub syn_acks_dropped: u64,
    /// The flood's connects that completed (0 when its SYN-ACKs were all dropped).
    pub connected: usize,
}

impl fmt::Display for SynFloodFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} connects from the second client answered after {} half-open connects ({} started, \
             errors {:?}, sent in {:.1} s; 2 s later the connects took {:.1} s); errors: {:?}; the flood's \
             SYN-ACKs dropped by the client: {}, its connects completed: {}",
            self.answered,
            self.asks,
            self.flood,
            self.started,
            self.flood_errors,
            self.flood_took,
            self.asked_took,
            self.errors,
            self.syn_acks_dropped,
            self.connected
        )
    }
}

/// Idle TCP connections, then one-datagram UDP flows from many (address, port) pairs, then a request on each
/// idle connection: whether the flood evicted them.
#[derive(Clone, Debug)]
pub struct UdpFlood {
    /// One-datagram flows.
    pub flows: usize,
    /// Idle TCP connections.
    pub idle: usize,
    /// Datagrams a second, sent in batches of 500: a few thousand queries a second, the load the issue
    /// describes, which the veth, the bridge and the pod's server keep up with here.
    pub rate: usize,
    /// The client's source addresses, 64,512 ports each: every datagram a 5-tuple not seen before.
    pub sources: Vec<IpAddr>,
}

/// Datagrams sent between two waits for the pace.
const UDP_BATCH: usize = 500;

impl UdpFlood {
    /// The issue's load: 300,000 flows beside 20 idle connections, from five addresses of 192.0.2.0/24.
    #[must_use]
    pub fn issue() -> Self {
        Self {
            flows: 300_000,
            idle: 20,
            rate: 10_000,
            sources: (110..115).map(|i| IpAddr::from([192, 0, 2, i])).collect(),
        }
    }

    /// The source addresses on the client's `dev`.
    ///
    /// # Errors
    /// `ip addr add`'s.
    pub fn prepare(&self, client: &NetNs, dev: &str) -> anyhow::Result<()> {
        self.sources.iter().try_for_each(|a| add_address(client, dev, *a))
    }

    /// The idle connections to `tcp` (each asked once: `pod` must answer), `snapshot()`, the flood to `udp`,
    /// `snapshot()` again, and a request on each idle connection.
    ///
    /// # Errors
    /// When an idle connection cannot be opened.
    pub fn run<S>(
        &self,
        client: &NetNs,
        (tcp, udp): (SocketAddr, SocketAddr),
        pod: &str,
        snapshot: impl Fn() -> S,
    ) -> Result<(UdpFloodFigures, [S; 2]), String> {
        let n = self.idle;
        let mut idle: Vec<TcpStream> = from(client, move || {
            (0..n)
                .map(|_| TcpStream::connect_timeout(&tcp, Duration::from_secs(3)))
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(|e| format!("an idle connection to {tcp}: {e}"))?;
        let first = idle.iter_mut().map(ask).filter(|a| a.as_deref() == Ok(pod)).count();
        let before = snapshot();
        let started = Instant::now();
        let (flows, rate) = (self.flows, self.rate);
        let sources = self.sources.clone();
        let (sent, send_errors) = from(client, move || {
            let tuples = sources.iter().flat_map(|a| (1024..=u16::MAX).map(move |p| SocketAddr::new(*a, p)));
            let (mut sent, mut errors) = (0usize, BTreeMap::<String, usize>::new());
            for (i, local) in tuples.take(flows).enumerate() {
                if i % UDP_BATCH == 0 {
                    let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
                // A socket per flow, closed at once: the pod's answer meets a closed port (the client
                // kernel's port unreachable errors are rate limited, icmp_ratelimit).
                match UdpSocket::bind(local).and_then(|s| s.send_to(b"query\n", udp)) {
                    Ok(_) => sent += 1,
                    Err(e) => *errors.entry(e.to_string()).or_default() += 1,
                }
            }
            (sent, errors)
        });
        let took = started.elapsed().as_secs_f64();
        let after = snapshot();
        let answers: Vec<Result<String, String>> = idle.iter_mut().map(ask).collect();
        let figures = UdpFloodFigures {
            flows: self.flows,
            sent,
            send_errors,
            took,
            idle: self.idle,
            answered_before: first,
            alive: answers.iter().filter(|a| a.as_deref() == Ok(pod)).count(),
            errors: tally(answers.iter().filter_map(|a| a.as_ref().err())),
        };
        Ok((figures, [before, after]))
    }
}

/// What a [`UdpFlood`] run did.
#[derive(Clone, Debug, Serialize)]
pub struct UdpFloodFigures {
    /// Flows asked for.
    pub flows: usize,
    /// Datagrams sent.
    pub sent: usize,
    /// Datagrams not sent, by error.
    pub send_errors: BTreeMap<String, usize>,
    /// Seconds the flood took.
    pub took: f64,
    /// Idle connections.
    pub idle: usize,
    /// Of them, answered by the pod before the flood.
    pub answered_before: usize,
    /// Of them, answered by the pod after the flood.
    pub alive: usize,
    /// The others' errors after the flood.
    pub errors: BTreeMap<String, usize>,
}

impl fmt::Display for UdpFloodFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} idle TCP connections answered after {} one-datagram UDP flows in {:.1} s (send errors: \
             {:?}); {} of them answered before; the connections' errors: {:?}",
            self.alive, self.idle, self.sent, self.took, self.send_errors, self.answered_before, self.errors
        )
    }
}
