//! The one HTTP server of the project (hyper's HTTP/1), bounded by `Limits` (connections at once, per client,
//! the time between requests), so that one client flooding a port leaves the others answered.
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Method, StatusCode,
    header::{HeaderName, HeaderValue},
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    task::JoinHandle,
    time::Instant,
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
    /// Time from a connection's start, or from its previous request, to its next request's whole head; the
    /// reply is written within it too. A client that trickles its request (or reads the reply slowly, or
    /// idles on a kept connection) is cut off here, however it paces its bytes.
    pub deadline: Duration,
    /// Pause after a failed accept(). EMFILE/ENFILE/ENOBUFS last until something else closes, and the
    /// pending connection stays in the queue, so retrying at once would spin a core on the same error.
    pub accept_backoff: Duration,
}

impl Default for Limits {
    /// 256 connections, 8 per client address, 2 s per request (a probe's whole exchange takes milliseconds;
    /// the kubelet's default probe timeout is 1 s).
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
/// server of the project (the agent's health, metrics and health-check-node-port listeners, and the lab's
/// pod backends).
pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    serve_with(listener, Limits::default(), handler)
}

/// The longest request head served (request line and headers); a longer one is answered 431 and closed.
/// A probe's head is about 100 bytes, a browser's under 2 KiB; kube-proxy's Go server allows 1 MiB.
pub const MAX_HEAD: usize = 8 * 1024;

/// `serve` with explicit limits.
///
/// HTTP/1 by hyper. A connection is closed after its reply unless the client asks to keep it
/// (`Connection: keep-alive`): the ports are probed and scraped over fresh connections, and an idle open
/// connection only holds one of the client's slots. Every request must arrive within `limits.deadline` of the
/// connection's start or of the previous request, which bounds a slow head, a reply the client does not read
/// and an idle kept connection alike. GET and HEAD are served (HEAD without the body); other methods get 405.
pub fn serve_with<F, Fut>(listener: TcpListener, limits: Limits, handler: F) -> JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    let handler = Arc::new(handler);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(PerClient::default());
    let mut h1 = hyper::server::conn::http1::Builder::new();
    h1.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.deadline)
        .max_buf_size(2 * MAX_HEAD)
        .max_header_size(MAX_HEAD)
        // A client that sends its request and shuts down its side still gets the reply.
        .half_close(true)
        // `X-Load-Balancing-Endpoint-Weight` as kube-proxy writes it (load balancers match names in any case,
        // people reading a capture do not).
        .title_case_headers(true);
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
            let conn = connection(&h1, sock, handler.clone(), limits.deadline);
            tokio::spawn(async move {
                conn.await;
                drop((slot, held));
            });
        }
    })
}

/// One connection served until it ends or `deadline` passes without a new request (dropping it closes the
/// socket).
fn connection<F, Fut>(
    h1: &hyper::server::conn::http1::Builder,
    sock: TcpStream,
    handler: Arc<F>,
    deadline: Duration,
) -> impl Future<Output = ()> + Send + 'static
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    let (arrived, mut arrivals) = watch::channel(Instant::now());
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        arrived.send_replace(Instant::now());
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let keep = asks_keep_alive(req.headers());
        let handler = handler.clone();
        async move {
            let r = if method == Method::GET || method == Method::HEAD {
                handler(path).await
            } else {
                let mut r = Response::text(405, "method not allowed\n");
                r.headers.push(("Allow", "GET, HEAD".into()));
                r
            };
            Ok::<_, std::convert::Infallible>(into_hyper(r, keep))
        }
    });
    let conn = h1.serve_connection(hyper_util::rt::TokioIo::new(sock), svc);
    async move {
        tokio::pin!(conn);
        loop {
            let by = *arrivals.borrow_and_update() + deadline;
            tokio::select! {
                _ = &mut conn => return,
                () = tokio::time::sleep_until(by) => return,
                changed = arrivals.changed() => if changed.is_err() { return },
            }
        }
    }
}

/// The client asked to keep the connection: `keep-alive` among the `Connection` header's tokens, and no
/// `close`.
fn asks_keep_alive(headers: &hyper::HeaderMap) -> bool {
    let tokens = || {
        headers.get_all(hyper::header::CONNECTION).iter().flat_map(|v| v.to_str().unwrap_or("").split(','))
    };
    let has = |token: &str| tokens().any(|t| t.trim().eq_ignore_ascii_case(token));
    has("keep-alive") && !has("close")
}

fn into_hyper(r: Response, keep: bool) -> hyper::Response<Full<Bytes>> {
    let mut out = hyper::Response::new(Full::new(Bytes::from(r.body)));
    *out.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = out.headers_mut();
    headers.insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static(r.content_type));
    for (k, v) in r.headers {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(&v)) {
            headers.append(k, v);
        }
    }
    if !keep {
        // hyper sees it and closes the connection after this reply.
        headers.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    }
    out
}

#[cfg(test)]
mod tests;
