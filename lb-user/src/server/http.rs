//! The one HTTP responder of the project: one request per connection, bounded by `Limits` (connections at
//! once, per client, the exchange's deadline), so that one client flooding a port leaves the others answered.
use std::{
    collections::HashMap,
    fmt::Write as _,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
    task::JoinHandle,
};

/// One HTTP response of `serve`.
pub struct Response {
    /// Status code (200, 404, 503).
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

impl Response {
    pub(super) fn json(status: u16, body: &serde_json::Value) -> Self {
        Self { status, content_type: "application/json", headers: Vec::new(), body: body.to_string() }
    }
    /// A `text/plain` response.
    pub fn text(status: u16, body: &str) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", headers: Vec::new(), body: body.to_owned() }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// What one listener of `serve` lets its clients hold. Probes and scrapes are few and tiny; the bounds are
/// for a client that is not (a pod flooding the port, a slowloris, fd exhaustion): one address holds at most
/// `per_client` connections, so the kubelet's probes and a load balancer's health checks, which come from
/// other addresses, always find a free slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; a connection beyond them is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Connections one client address is served at once; beyond them its connection is closed at once.
    pub per_client: usize,
    /// Time for one whole exchange: reading the request head, answering and writing the reply. A client
    /// that trickles its request (or reads the reply slowly) is cut off here, however it paces its bytes.
    pub deadline: Duration,
    /// Pause after a failed accept(). EMFILE/ENFILE/ENOBUFS last until something else closes, and the
    /// pending connection stays in the queue, so retrying at once would spin a core on the same error.
    pub accept_backoff: Duration,
}

impl Default for Limits {
    /// 256 connections, 8 per client address, 2 s per exchange (a probe's whole exchange takes
    /// milliseconds; the kubelet's default probe timeout is 1 s).
    fn default() -> Self {
        Self {
            max_connections: 256,
            per_client: 8,
            deadline: Duration::from_secs(2),
            accept_backoff: Duration::from_millis(100),
        }
    }
}

/// Connections held per client address; a `Held` gives its count back when dropped.
#[derive(Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

struct Held {
    table: Arc<PerClient>,
    client: IpAddr,
}

impl PerClient {
    /// One more connection of `client`, unless it holds `limit` already.
    fn take(table: &Arc<Self>, client: IpAddr, limit: usize) -> Option<Held> {
        let mut t = table.0.lock().expect("per-client lock");
        let n = t.entry(client).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(Held { table: table.clone(), client })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut t = self.table.0.lock().expect("per-client lock");
        if let Some(n) = t.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.client);
            }
        }
    }
}

/// A peer's address as one client: an IPv4-mapped IPv6 address (a dual-stack listener) as its IPv4 address.
fn client_of(peer: std::net::SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// The accept queue of every listener of the agent. A flooding client's connections wait here until the
/// accept loop closes them; when the queue is full the kernel drops new SYNs, the kubelet's among them, and
/// its retry comes 1 s later, its whole probe timeout. `TcpListener::bind`'s backlog (128, the standard
/// library's) lasts 85 ms of a 1,500 connections/s flood the agent does not drain at once (starved of CPU:
/// a CI run lost one probe so); 4096 (the kernel's default `somaxconn`, which caps it) lasts 2.7 s.
pub const ACCEPT_BACKLOG: u32 = 4096;

/// Listen on `addr` with `ACCEPT_BACKLOG` (and `SO_REUSEADDR`, as `TcpListener::bind` sets it).
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let sock =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(ACCEPT_BACKLOG)
}

/// Serve `handler(path)` on `listener` with the default `Limits` until the task is aborted: the one HTTP
/// responder of the project (the agent's health, metrics and health-check-node-port listeners, and the lab's
/// pod backends).
pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send,
{
    serve_with(listener, Limits::default(), handler)
}

/// `serve` with explicit limits.
pub fn serve_with<F, Fut>(listener: TcpListener, limits: Limits, handler: F) -> JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send,
{
    let handler = Arc::new(handler);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(PerClient::default());
    tokio::spawn(async move {
        let local = listener.local_addr().ok();
        // Set while accept() keeps failing: the error is logged once per burst, not once per retry.
        let mut failing = false;
        loop {
            let (sock, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    if !failing {
                        let retry_ms = limits.accept_backoff.as_millis();
                        tracing::warn!(listen = ?local, error = %e, retry_ms, "cannot accept; retrying");
                    }
                    failing = true;
                    tokio::time::sleep(limits.accept_backoff).await;
                    continue;
                }
            };
            if std::mem::take(&mut failing) {
                tracing::info!(listen = ?local, "accepting connections again");
            }
            // Over a limit: close at once (dropping the socket), rather than queue work for a flood. The
            // client's own limit first, so a flooding client never takes the last free slots.
            let Some(held) = PerClient::take(&clients, client_of(peer), limits.per_client) else {
                tracing::debug!(listen = ?local, %peer, limit = limits.per_client, "over the client's limit: closed");
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(listen = ?local, limit = limits.max_connections, "over the limit: closed");
                continue;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                // Cancelling the exchange drops the socket: the client sees the connection closed.
                let _ = tokio::time::timeout(limits.deadline, exchange(sock, &*handler)).await;
                drop((slot, held));
            });
        }
    })
}

/// One request on `sock`, answered by `handler`; the connection is closed after the reply.
async fn exchange<F, Fut>(mut sock: TcpStream, handler: &F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Response>,
{
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    // Read the request head (bounded); the body, if any, is ignored.
    while n < buf.len() {
        match sock.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let path = head.split_whitespace().nth(1).unwrap_or("/").split('?').next().unwrap_or("/").to_owned();
    let r = handler(path).await;
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    );
    for (k, v) in &r.headers {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&r.body);
    let _ = sock.write_all(out.as_bytes()).await;
    let _ = sock.shutdown().await;
}
