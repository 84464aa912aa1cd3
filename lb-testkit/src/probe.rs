//! A client that sends an HTTP request to an address again and again and records, for each one, which
//! backend answered (a `NamedServer` answers with its name) or which errno the connect failed with, and how long it took.
use std::{
    io::Read as _,
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

/// One request of a probe.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attempt {
    /// Start of the attempt, milliseconds since the probe started.
    pub t_ms: f64,
    /// How long the attempt took (connect and reading the name).
    pub ms: f64,
    /// The name the backend answered with (none: the attempt failed).
    pub backend: Option<String>,
    /// The errno name of the failed connect or read (see [`errno_name`]).
    pub error: Option<String>,
    /// getpeername() of the connected socket.
    #[serde(default)]
    pub peer: Option<String>,
}

/// A probe's output (JSON on the client's stdout).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// The address probed (a Service VIP and port).
    pub target: String,
    /// Every request, in order.
    pub attempts: Vec<Attempt>,
}

impl Report {
    /// Attempts that failed.
    pub fn failures(&self) -> usize {
        self.attempts.iter().filter(|a| a.error.is_some()).count()
    }
    /// Attempts `backend` answered.
    pub fn count(&self, backend: &str) -> usize {
        self.attempts.iter().filter(|a| a.backend.as_deref() == Some(backend)).count()
    }
    /// Backends and how often each answered, sorted by name.
    pub fn by_backend(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for a in &self.attempts {
            if let Some(b) = &a.backend {
                *m.entry(b.clone()).or_insert(0) += 1;
            }
        }
        m
    }
    /// Errno names and how often each ended an attempt, sorted by name.
    pub fn errors(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for a in &self.attempts {
            if let Some(e) = &a.error {
                *m.entry(e.clone()).or_insert(0) += 1;
            }
        }
        m
    }
}

/// The symbolic name of an I/O error's errno (what the README documents), else its text.
pub fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".into(),
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH".into(),
        Some(libc::ENETUNREACH) => "ENETUNREACH".into(),
        Some(libc::ETIMEDOUT) => "ETIMEDOUT".into(),
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ECONNRESET) => "ECONNRESET".into(),
        Some(libc::ECONNABORTED) => "ECONNABORTED".into(),
        Some(libc::EDESTADDRREQ) => "EDESTADDRREQ".into(),
        Some(libc::EAGAIN) => "EAGAIN (timed out)".into(),
        _ if e.kind() == std::io::ErrorKind::TimedOut => "ETIMEDOUT".into(),
        _ => e.to_string(),
    }
}

/// One connect: the backend's name and the peer address, or the errno name.
pub fn attempt(target: SocketAddr, timeout: Duration) -> Result<(String, Option<String>), String> {
    let mut s = TcpStream::connect_timeout(&target, timeout).map_err(|e| errno_name(&e))?;
    let peer = s.peer_addr().ok().map(|a| a.to_string());
    s.set_read_timeout(Some(timeout)).map_err(|e| errno_name(&e))?;
    std::io::Write::write_all(&mut s, b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n")
        .map_err(|e| errno_name(&e))?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|e| errno_name(&e))?;
    let body = buf.split_once("\r\n\r\n").map_or(buf.as_str(), |(_, b)| b);
    let name = body.trim().to_owned();
    if name.is_empty() { Err("empty reply".into()) } else { Ok((name, peer)) }
}

/// One attempt on `target`, timed: its start relative to `start` and how long it took.
fn timed(target: SocketAddr, timeout: Duration, start: Instant) -> Attempt {
    let t0 = Instant::now();
    let r = attempt(target, timeout);
    let (ms, t_ms) = (t0.elapsed().as_secs_f64() * 1e3, t0.duration_since(start).as_secs_f64() * 1e3);
    let (backend, error, peer) = match r {
        Ok((b, p)) => (Some(b), None, p),
        Err(e) => (None, Some(e), None),
    };
    Attempt { t_ms, ms, backend, error, peer }
}

/// Sleep until the `i`-th of attempts `interval` apart from `start` is due.
fn wait_due(start: Instant, interval: Duration, i: usize) {
    let due = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
    if let Some(wait) = due.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

/// Up to `count` attempts on `target`, back to back, stopping after `give_up` failures in a row.
pub fn spread(target: SocketAddr, count: usize, timeout: Duration, give_up: usize) -> Report {
    let start = Instant::now();
    let mut attempts: Vec<Attempt> = Vec::with_capacity(count);
    for _ in 0..count {
        attempts.push(timed(target, timeout, start));
        if attempts.len() >= give_up && attempts.iter().rev().take(give_up).all(|a| a.error.is_some()) {
            break;
        }
    }
    Report { target: target.to_string(), attempts }
}

/// `count` attempts, `interval` apart, each started at its time on a thread of its own whether the ones
/// before it have ended or not (an open-loop client: a booking form's users do not wait for each other, and a
/// request that hangs does not hold back the next); in order of their start.
pub fn run_open(target: SocketAddr, count: usize, interval: Duration, timeout: Duration) -> Report {
    let start = Instant::now();
    let running: Vec<_> = (0..count)
        .map(|i| {
            wait_due(start, interval, i);
            std::thread::spawn(move || timed(target, timeout, start))
        })
        .collect();
    let attempts = running.into_iter().map(|t| t.join().expect("an attempt's thread")).collect();
    Report { target: target.to_string(), attempts }
}

/// `count` attempts, `interval` apart (measured from start to start).
pub fn run(target: SocketAddr, count: usize, interval: Duration, timeout: Duration) -> Report {
    let start = Instant::now();
    let attempts = (0..count)
        .map(|i| {
            wait_due(start, interval, i);
            timed(target, timeout, start)
        })
        .collect();
    Report { target: target.to_string(), attempts }
}
