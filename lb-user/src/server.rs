//! The agent's HTTP endpoints: kube-proxy-compatible `/healthz` and `/livez`, one listener per
//! `healthCheckNodePort`, and Prometheus `/metrics`.
//!
//! The requests are tiny and few (probes, scrapes), so a minimal HTTP/1.1 responder (one request per
//! connection) on tokio is enough and keeps the agent's dependencies small.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

/// kube-proxy's default: unhealthy when an update has waited longer than this (2 x its 30 s sync period).
pub const HEALTH_TIMEOUT: Duration = Duration::from_mins(1);

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
    fn json(status: u16, body: &serde_json::Value) -> Self {
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

/// Serve `handler(path)` on `listener` until the task is aborted: the one HTTP responder of the project (the
/// agent's health, metrics and health-check-node-port listeners, and the lab's pod backends).
pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send,
{
    let handler = Arc::new(handler);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { continue };
            let handler = handler.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut n = 0;
                // Read the request head (bounded); the body, if any, is ignored.
                while n < buf.len() {
                    match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[n..])).await {
                        Ok(Ok(0) | Err(_)) | Err(_) => break,
                        Ok(Ok(k)) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let head = String::from_utf8_lossy(&buf[..n]);
                let path =
                    head.split_whitespace().nth(1).unwrap_or("/").split('?').next().unwrap_or("/").to_owned();
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
            });
        }
    })
}

/// What `/healthz` and `/livez` report, updated by the agent loop.
#[derive(Debug, Default)]
pub struct Health {
    /// Time of the last successful sync.
    pub last_updated: Option<SystemTime>,
    /// Since when a change has been waiting to be applied (none: nothing pending).
    pub pending_since: Option<Instant>,
}

/// The agent loop writes it, the health listener reads it.
pub type SharedHealth = Arc<Mutex<Health>>;

fn rfc3339(t: SystemTime) -> String {
    // Seconds since the epoch formatted as UTC, without pulling in a date crate.
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil from days (Howard Hinnant's algorithm). u64 seconds make fewer than 2^48 days: no wrap.
    let z = days.cast_signed() + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

/// kube-proxy's proxier health: healthy once the first sync is done and no change has waited longer than
/// `HEALTH_TIMEOUT`.
pub fn health_response(h: &Health, now: Instant) -> Response {
    let healthy =
        h.last_updated.is_some() && h.pending_since.is_none_or(|p| now.duration_since(p) < HEALTH_TIMEOUT);
    let body = serde_json::json!({
        "lastUpdated": h.last_updated.map(rfc3339).unwrap_or_default(),
        "currentTime": rfc3339(SystemTime::now()),
        "nodeEligible": true,
    });
    Response::json(if healthy { 200 } else { 503 }, &body)
}

/// Serve `/healthz` and `/livez` from `health` on `listener`.
pub fn start_health(listener: TcpListener, health: SharedHealth) -> JoinHandle<()> {
    serve(listener, move |path| {
        let health = health.clone();
        async move {
            match path.as_str() {
                "/healthz" | "/livez" => {
                    health_response(&health.lock().expect("health lock"), Instant::now())
                }
                _ => Response::text(404, "not found\n"),
            }
        }
    })
}

/// A metrics scrape: the agent loop (which owns the maps) answers with the encoded text.
pub type MetricsRequest = oneshot::Sender<String>;

/// Serve `/metrics` on `listener`, each scrape a request to the agent loop (10 s to answer, else 503).
pub fn start_metrics(listener: TcpListener, requests: mpsc::Sender<MetricsRequest>) -> JoinHandle<()> {
    serve(listener, move |path| {
        let requests = requests.clone();
        async move {
            if path != "/metrics" {
                return Response::text(404, "not found\n");
            }
            let (tx, rx) = oneshot::channel();
            if requests.send(tx).await.is_err() {
                return Response::text(503, "agent stopping\n");
            }
            match tokio::time::timeout(Duration::from_secs(10), rx).await {
                Ok(Ok(text)) => Response {
                    status: 200,
                    content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    headers: Vec::new(),
                    body: text,
                },
                _ => Response::text(503, "metrics not available\n"),
            }
        }
    })
}

/// One Service's health for its `healthCheckNodePort`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    /// The Service's namespace, echoed in the body.
    pub namespace: String,
    /// The Service's name, echoed in the body.
    pub name: String,
    /// Ready endpoints on this node: 0 makes the port answer 503.
    pub local_endpoints: usize,
}

/// kube-proxy's answer on a `healthCheckNodePort`, so cloud load balancers skip nodes without endpoints.
pub fn service_health_response(s: &ServiceHealth) -> Response {
    // kube-proxy's service health server: 200 with local endpoints, else 503, and the count in a header
    // load balancers use as a weight.
    let mut r = Response::json(
        if s.local_endpoints > 0 { 200 } else { 503 },
        &serde_json::json!({
            "service": {"namespace": s.namespace, "name": s.name},
            "localEndpoints": s.local_endpoints,
            "serviceProxyHealthy": true,
        }),
    );
    r.headers.push(("X-Content-Type-Options", "nosniff".into()));
    r.headers.push(("X-Load-Balancing-Endpoint-Weight", s.local_endpoints.to_string()));
    r
}

/// One listener per `healthCheckNodePort`, opened and closed as Services come and go.
pub struct ServiceHealthServers {
    bind: IpAddr,
    listeners: BTreeMap<u16, (JoinHandle<()>, Arc<Mutex<ServiceHealth>>)>,
}

impl ServiceHealthServers {
    /// No listeners yet; they will bind on `bind`.
    pub fn new(bind: IpAddr) -> Self {
        Self { bind, listeners: BTreeMap::new() }
    }

    /// Bring the listeners in line with `want` (port -> health). Returns the ports that could not be bound.
    pub async fn sync(&mut self, want: &BTreeMap<u16, ServiceHealth>) -> Vec<(u16, std::io::Error)> {
        self.listeners.retain(|port, (task, _)| {
            let keep = want.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        let mut failed = Vec::new();
        for (port, h) in want {
            if let Some((_, cur)) = self.listeners.get(port) {
                *cur.lock().expect("health lock") = h.clone();
                continue;
            }
            match TcpListener::bind(SocketAddr::new(self.bind, *port)).await {
                Ok(l) => {
                    let state = Arc::new(Mutex::new(h.clone()));
                    let s2 = state.clone();
                    let task = serve(l, move |_path| {
                        let s = s2.clone();
                        async move { service_health_response(&s.lock().expect("health lock")) }
                    });
                    self.listeners.insert(*port, (task, state));
                }
                Err(e) => failed.push((*port, e)),
            }
        }
        failed
    }
}

impl Drop for ServiceHealthServers {
    fn drop(&mut self) {
        for (task, _) in self.listeners.values() {
            task.abort();
        }
    }
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
mod tests {
    use super::*;

    #[test]
    fn health_follows_kube_proxy() {
        let now = Instant::now();
        let mut h = Health::default();
        assert_eq!(health_response(&h, now).status, 503, "no sync yet");
        h.last_updated = Some(SystemTime::now());
        assert_eq!(health_response(&h, now).status, 200);
        h.pending_since = Some(now);
        assert_eq!(health_response(&h, now + Duration::from_secs(5)).status, 200, "a fresh pending change");
        assert_eq!(health_response(&h, now + HEALTH_TIMEOUT).status, 503, "a change stuck too long");
        let body: serde_json::Value = serde_json::from_str(&health_response(&h, now).body).unwrap();
        assert!(body["lastUpdated"].as_str().unwrap().ends_with('Z'));
        assert_eq!(body["nodeEligible"], true);
    }

    #[test]
    fn service_health_reports_local_endpoints() {
        let s = ServiceHealth { namespace: "ns".into(), name: "lb".into(), local_endpoints: 2 };
        let r = service_health_response(&s);
        assert_eq!(r.status, 200);
        assert!(r.headers.contains(&("X-Load-Balancing-Endpoint-Weight", "2".into())));
        let none = service_health_response(&ServiceHealth { local_endpoints: 0, ..s });
        assert_eq!(none.status, 503);
        assert!(none.body.contains("\"localEndpoints\":0"));
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            "2023-11-14T22:13:20Z"
        );
    }

    #[test]
    fn off_turns_a_listener_off() {
        assert_eq!(parse_addr("off"), Ok(None));
        assert_eq!(parse_addr("0.0.0.0:10256"), Ok(Some("0.0.0.0:10256".parse().unwrap())));
        assert!(parse_addr("nope").is_err());
    }
}
