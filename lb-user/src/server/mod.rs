//! The agent's HTTP endpoints: kube-proxy-compatible `/healthz` and `/livez`, one listener per
//! `healthCheckNodePort`, and Prometheus `/metrics`.
//!
//! HTTP/1 by hyper (`http.rs`), bounded per client and in all so that a pod flooding a port leaves the
//! kubelet's probes and a load balancer's checks answered.
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::metrics::{self, AgentStats, ReadCounters, Snapshot};

mod service_health;
pub use service_health::{ServiceHealthServers, service_health_response};

mod http;
pub use http::{ACCEPT_BACKLOG, Limits, MAX_HEAD, Response, listen, serve, serve_with};

mod health;
pub use health::{
    HEALTH_TIMEOUT, Health, SharedHealth, health_response, livez_response, rfc3339, start_health,
};

/// What `/metrics` encodes. Nothing in it waits for the agent loop.
pub struct MetricsSource {
    /// The latest snapshot the agent loop published; a scrape holds the channel's lock only to clone the
    /// `Arc`.
    pub snapshot: watch::Receiver<Arc<Snapshot>>,
    /// The agent's statistics (shared with the loop, which counts into them).
    pub stats: AgentStats,
    /// The data path's counters through a handle of their own; `None`: no per-Service counters.
    pub counters: Option<Arc<dyn ReadCounters>>,
}

/// Serve `/metrics` on `listener` from `source`: the latest snapshot, encoded on a blocking thread with the
/// counters read there (one map lookup per counter, too slow for the runtime's threads with many
/// frontends).
pub fn start_metrics(listener: TcpListener, source: MetricsSource) -> JoinHandle<()> {
    let source = Arc::new(source);
    // One scrape encodes at a time. Every reply is encoded after its request arrived (counters as fresh as
    // without sharing), but encodings start at most every `METRICS_MIN_INTERVAL`: the scrapes that arrive
    // meanwhile wait and share the next one. A flood of scrapes costs at most five walks over every
    // frontend's counters per second, not one per scrape (a scrape waiting its turn meets the deadline).
    let cache: Arc<tokio::sync::Mutex<Option<Encoded>>> = Arc::default();
    serve(listener, move |path| {
        let (source, cache) = (source.clone(), cache.clone());
        async move {
            if path != "/metrics" {
                return Response::text(404, "not found\n");
            }
            let arrived = Instant::now();
            let mut cached = cache.lock_owned().await;
            let text = match cached.as_ref() {
                Some(e) if e.started >= arrived => Ok(e.text.clone()),
                last => {
                    if let Some(next) = last.map(|e| e.started + METRICS_MIN_INTERVAL) {
                        tokio::time::sleep_until(next.into()).await;
                    }
                    let started = Instant::now();
                    let snapshot = source.snapshot.borrow().clone();
                    // The guard goes with the work: a scrape cut off by the deadline keeps the turn until the
                    // blocking encode (which cannot be cancelled) ends, and its result serves the next.
                    tokio::task::spawn_blocking(move || {
                        let text: Arc<str> =
                            metrics::encode_text(&snapshot, &source.stats, source.counters.as_deref()).into();
                        *cached = Some(Encoded { started, text: text.clone() });
                        text
                    })
                    .await
                }
            };
            match text {
                Ok(text) => Response {
                    status: 200,
                    content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    headers: Vec::new(),
                    body: text.to_string(),
                },
                Err(_) => Response::text(503, "metrics not available\n"),
            }
        }
    })
}

/// The least time between the starts of two `/metrics` encodings.
pub const METRICS_MIN_INTERVAL: Duration = Duration::from_millis(200);

/// The last `/metrics` body and when its encoding started.
struct Encoded {
    started: Instant,
    text: Arc<str>,
}

/// `--healthz-addr` and friends: an address, or `off`.
pub fn parse_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    if s == "off" {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| format!("{s:?} is not IP:PORT or off"))
}

/// A listen address that may be `off` (a CLI value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_addr(s).map(Self)
    }
}

/// A bind IP that may be `off` (a CLI value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindIp(pub Option<IpAddr>);

impl std::str::FromStr for BindIp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(Self(None));
        }
        s.parse().map(|ip| Self(Some(ip))).map_err(|_| format!("{s:?} is not an IP address or off"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use tokio::{
        io::{AsyncReadExt as _, AsyncWriteExt as _},
        net::TcpStream,
    };

    use super::*;
    use crate::{
        datapath::{Desired, DesiredFrontend, Reconciler, addr, fake::FakeMaps},
        model::{ObjKey, ServicePortName},
    };

    /// Counters as a test sets them.
    struct FixedCounters(BTreeMap<u32, metrics::Counts>);

    impl ReadCounters for FixedCounters {
        fn counters(&self, svc_id: u32) -> Option<metrics::Counts> {
            self.0.get(&svc_id).copied()
        }
    }

    fn frontends(services: &[(&str, [u8; 4])]) -> Desired {
        services
            .iter()
            .map(|(name, vip)| {
                let backend = addr::backend(SocketAddr::from(([10, 244, 1, 1], 8080)), 6);
                let tiers = [vec![backend], Vec::new(), vec![backend]];
                let name = ServicePortName::new(ObjKey::new("default", *name), "");
                (
                    addr::frontend_key(IpAddr::from(*vip), 80, 6),
                    DesiredFrontend { name: name.into(), tiers, flags: 0, affinity_timeout_s: 0 },
                )
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_answers_from_the_snapshot_while_the_agent_loop_is_busy() {
        let mut rec = Reconciler::new(FakeMaps::new(16, 64));
        rec.apply(&frontends(&[("web", [10, 96, 0, 10])]), Instant::now());
        let svc_id = rec.applied().next().unwrap().1.svc_id;
        let snapshots = watch::Sender::new(Arc::new(Snapshot::of(&rec, 64)));
        let stats = AgentStats::default();
        let mut counts = metrics::Counts::default();
        counts[lb_common::COUNTER_NODE as usize] = 7;
        let counters = Arc::new(FixedCounters(BTreeMap::from([(svc_id, counts)])));
        let (l, addr) = listener();
        let source =
            MetricsSource { snapshot: snapshots.subscribe(), stats: stats.clone(), counters: Some(counters) };
        let _server = start_metrics(l, source);
        // The agent loop, busy in a long sync: it holds the reconciler and publishes nothing until released.
        let (release, busy) = std::sync::mpsc::channel::<()>();
        let agent_loop = std::thread::spawn(move || {
            busy.recv().unwrap();
            rec.apply(&frontends(&[("web", [10, 96, 0, 10]), ("api", [10, 96, 0, 11])]), Instant::now());
            stats.syncs.inc();
            snapshots.send_replace(Arc::new(Snapshot::of(&rec, 64)));
            snapshots
        });
        let m = tokio::time::timeout(Duration::from_secs(2), get(addr, "/metrics"))
            .await
            .expect("a scrape does not wait for the loop")
            .expect("a reply");
        assert!(m.starts_with("HTTP/1.1 200 OK"), "{m}");
        let web_node = concat!(
            r#"tierlb_connections_total{service="default/web",port="","#,
            r#"frontend="10.96.0.10:80",tier="node"} 7"#
        );
        assert!(m.contains(web_node), "{m}");
        assert!(
            m.contains("tierlb_syncs_total 0") && m.contains(r#"tierlb_map_entries{map="FRONTENDS"} 1"#),
            "{m}"
        );
        // The loop finishes its sync and publishes: the next scrape sees it.
        release.send(()).unwrap();
        let _snapshots = tokio::task::spawn_blocking(move || agent_loop.join().unwrap()).await.unwrap();
        let m = get(addr, "/metrics").await.unwrap();
        assert!(
            m.contains("tierlb_syncs_total 1") && m.contains(r#"tierlb_map_entries{map="FRONTENDS"} 2"#),
            "{m}"
        );
        assert!(m.contains(web_node), "{m}");
        assert_eq!(get(addr, "/other").await.unwrap().split_whitespace().nth(1), Some("404"));
    }

    /// Counts the counter reads: one per frontend per encoding.
    struct CountingCounters(std::sync::atomic::AtomicUsize);

    impl ReadCounters for CountingCounters {
        fn counters(&self, _svc_id: u32) -> Option<metrics::Counts> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(metrics::Counts::default())
        }
    }

    #[tokio::test]
    async fn a_flood_of_scrapes_shares_encodings_and_every_reply_is_encoded_after_its_request() {
        let mut rec = Reconciler::new(FakeMaps::new(16, 64));
        rec.apply(&frontends(&[("web", [10, 96, 0, 10])]), Instant::now());
        let snapshots = watch::Sender::new(Arc::new(Snapshot::of(&rec, 64)));
        let reads = Arc::new(CountingCounters(std::sync::atomic::AtomicUsize::new(0)));
        let (l, addr) = listener();
        let counters: Arc<dyn ReadCounters> = reads.clone();
        let source = MetricsSource {
            snapshot: snapshots.subscribe(),
            stats: AgentStats::default(),
            counters: Some(counters),
        };
        let _server = start_metrics(l, source);
        // One scrape alone: the counter reads of one encoding.
        assert!(get(addr, "/metrics").await.is_some());
        let per = reads.0.swap(0, std::sync::atomic::Ordering::Relaxed);
        assert!(per > 0);
        // Rounds of 8 at once (one client's limit): 80 scrapes.
        let start = Instant::now();
        for _ in 0..10 {
            let scrapes: Vec<_> = (0..8).map(|_| tokio::spawn(get(addr, "/metrics"))).collect();
            for s in scrapes {
                assert!(s.await.unwrap().is_some_and(|r| r.starts_with("HTTP/1.1 200 OK")));
            }
        }
        let (n, took) = (reads.0.load(std::sync::atomic::Ordering::Relaxed) / per, start.elapsed());
        let most = took.as_millis() / METRICS_MIN_INTERVAL.as_millis() + 1;
        assert!(n as u128 <= most, "80 scrapes in {took:?}: {n} encodings, at most {most}");
        assert!(n < 40, "{n} encodings for 80 scrapes");
        // A reply is encoded after its request: a change made just before a scrape shows in it.
        rec.apply(&frontends(&[("web", [10, 96, 0, 10]), ("api", [10, 96, 0, 11])]), Instant::now());
        snapshots.send_replace(Arc::new(Snapshot::of(&rec, 64)));
        let m = get(addr, "/metrics").await.unwrap();
        assert!(m.contains(r#"tierlb_map_entries{map="FRONTENDS"} 2"#), "{m}");
    }

    /// GET `path` from `addr`: the whole reply, or `None` if the connection was closed without one.
    pub(crate) async fn get(addr: SocketAddr, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        (!out.is_empty()).then_some(out)
    }

    /// Within 2 s, `addr` answers a GET again (the slots of closed connections came back).
    async fn answered_again(addr: SocketAddr) {
        let mut reply = None;
        for _ in 0..100 {
            reply = get(addr, "/").await;
            if reply.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(reply.is_some_and(|r| r.starts_with("HTTP/1.1 200 OK")));
    }

    pub(crate) fn listener() -> (TcpListener, SocketAddr) {
        let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        (l, addr)
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_closed_at_once() {
        let (l, addr) = listener();
        let limits = Limits { max_connections: 2, deadline: Duration::from_secs(30), ..Limits::default() };
        let _server = serve_with(l, limits, |_| async { Response::text(200, "ok\n") });
        // Two clients that send nothing hold both connection slots.
        let mut held = [TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(2), third.read(&mut buf)).await;
        assert!(matches!(r, Ok(Ok(0) | Err(_))), "the third connection is closed at once: {r:?}");
        for s in &mut held {
            let r = tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await;
            assert!(r.is_err(), "a connection within the limit stays open: {r:?}");
        }
        drop(held);
        // Their slots free up as soon as the server sees them closed.
        answered_again(addr).await;
    }

    #[tokio::test]
    async fn a_client_trickling_its_request_is_cut_off_at_the_deadline() {
        let (l, addr) = listener();
        let limits = Limits { deadline: Duration::from_millis(500), ..Limits::default() };
        let _server = serve_with(l, limits, |_| async { Response::text(200, "ok\n") });
        let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        let start = Instant::now();
        // One byte per 100 ms: each read is quick (a per-read timeout never fires), the whole head takes 3 s.
        let writer = tokio::spawn(async move {
            for b in b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" {
                if wr.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut got = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(3), rd.read_to_end(&mut got)).await;
        let elapsed = start.elapsed();
        writer.abort();
        assert!(r.is_ok(), "still open after 3 s");
        assert!(got.is_empty(), "an unfinished request gets no reply: {:?}", String::from_utf8_lossy(&got));
        assert!(
            elapsed >= Duration::from_millis(450) && elapsed < Duration::from_millis(1500),
            "closed after {elapsed:?}, the deadline is 500 ms"
        );
        // The server is not stuck on it.
        assert!(get(addr, "/").await.is_some_and(|r| r.starts_with("HTTP/1.1 200 OK")));
    }

    #[tokio::test]
    async fn one_client_at_its_limit_is_refused_while_another_address_is_served() {
        let (l, addr) = listener();
        let limits = Limits { per_client: 3, deadline: Duration::from_secs(30), ..Limits::default() };
        let _server = serve_with(l, limits, |_| async { Response::text(200, "ok\n") });
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(2), fourth.read(&mut buf)).await;
        assert!(matches!(r, Ok(Ok(0) | Err(_))), "over its own limit: closed at once: {r:?}");
        // Another address (the kubelet's, a balancer's) is answered while the first holds its three.
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut s = other.connect(addr).await.unwrap();
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut out)).await.unwrap().unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        // The first client's slots come back when it closes.
        drop(held);
        answered_again(addr).await;
    }

    /// 4,000 connections (a pod's flood the agent has not drained) wait in the queue, and the one after them
    /// is still accepted: with tokio's default backlog of 1024 the kernel drops its SYN.
    #[tokio::test]
    async fn a_listener_queues_4000_connections_before_the_agent_accepts_one() {
        let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let mut queued = Vec::new();
        for i in 0..4000 {
            let c = tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr)).await;
            match c {
                Ok(Ok(c)) => queued.push(c),
                other => panic!("connection {i} not queued: {other:?}"),
            }
        }
        let _server = serve_with(l, Limits { per_client: 5000, ..Limits::default() }, |_| async {
            Response::text(200, "ok\n")
        });
        drop(queued);
        answered_again(addr).await;
    }

    #[test]
    fn off_turns_a_listener_off() {
        assert_eq!(parse_addr("off"), Ok(None));
        assert_eq!(parse_addr("0.0.0.0:10256"), Ok(Some("0.0.0.0:10256".parse().unwrap())));
        assert!(parse_addr("nope").is_err());
    }
}
