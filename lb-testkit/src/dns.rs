//! A minimal DNS server and resolver client (RFC 1035 wire format, A and AAAA questions) for testing UDP
//! through a Service VIP. Each server answers with its own address, so the client can tell which backend
//! answered; the client records the address the reply came from and, for connected sockets, the peer that
//! getpeername() reports.
use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    os::fd::AsFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::sandbox::NetNs;

/// Build a query for `name` (type A, or AAAA when `v6`).
pub fn query(id: u16, name: &str, v6: bool) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend(id.to_be_bytes());
    q.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend(label.as_bytes());
    }
    q.push(0);
    q.extend(if v6 { [0, 28] } else { [0, 1] });
    q.extend([0, 1]); // IN
    q
}

/// Answer a query with one record holding `answer`; `None` if it is not a well-formed question.
pub fn answer(q: &[u8], answer: IpAddr) -> Option<Vec<u8>> {
    if q.len() < 12 || q[4..6] != [0, 1] {
        return None;
    }
    let mut i = 12;
    while *q.get(i)? != 0 {
        i += 1 + usize::from(q[i]);
    }
    let question_end = i + 5;
    let mut r = q.get(..question_end)?.to_vec();
    r[2] = 0x81; // QR, RD
    r[3] = 0x80; // RA, NOERROR
    r[6..8].copy_from_slice(&[0, 1]); // one answer
    r.extend([0xc0, 0x0c]); // name: pointer to the question
    let (ty, data): ([u8; 2], Vec<u8>) = match answer {
        IpAddr::V4(a) => ([0, 1], a.octets().to_vec()),
        IpAddr::V6(a) => ([0, 28], a.octets().to_vec()),
    };
    r.extend(ty);
    r.extend([0, 1, 0, 0, 0, 30]); // IN, TTL 30
    r.extend((data.len() as u16).to_be_bytes());
    r.extend(data);
    Some(r)
}

/// The address in the first answer of a response to query `id`.
pub fn parse_answer(r: &[u8], id: u16) -> Option<IpAddr> {
    if r.len() < 12 || r[..2] != id.to_be_bytes() || r[2] & 0x80 == 0 || r[6..8] == [0, 0] {
        return None;
    }
    let mut i = 12;
    while *r.get(i)? != 0 {
        i += 1 + usize::from(r[i]);
    }
    i += 5 + 2; // end of question, then the name pointer
    let ty = u16::from_be_bytes([*r.get(i)?, *r.get(i + 1)?]);
    let len = usize::from(u16::from_be_bytes([*r.get(i + 8)?, *r.get(i + 9)?]));
    let data = r.get(i + 10..i + 10 + len)?;
    match (ty, len) {
        (1, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(data).ok()?)),
        (28, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(data).ok()?)),
        _ => None,
    }
}

/// A DNS server on an address inside a netns, answering every query with `answer`. Stops on drop.
pub struct DnsServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Where it listens (a pod's address in the netns).
    pub addr: SocketAddr,
}

impl DnsServer {
    /// Bind `addr` inside `netns` and serve from a thread; returns once the socket is bound.
    pub fn start(netns: &NetNs, addr: SocketAddr, answer_with: IpAddr) -> anyhow::Result<Self> {
        let ns = netns.file().try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let setup = || -> anyhow::Result<UdpSocket> {
                nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
                let s = UdpSocket::bind(addr)?;
                s.set_read_timeout(Some(Duration::from_millis(20)))?;
                Ok(s)
            };
            let sock = match setup() {
                Ok(s) => {
                    let _ = tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let mut buf = [0u8; 512];
            while !stop2.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf)
                    && let Some(r) = answer(&buf[..n], answer_with)
                {
                    let _ = sock.send_to(&r, from);
                }
            }
        });
        rx.recv().context("DNS server thread died")??;
        Ok(Self { stop, thread: Some(thread), addr })
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One resolution through a (VIP) server address.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lookup {
    /// The address in the reply's answer record (none: no reply, or one without an answer for this query).
    pub answer: Option<String>,
    /// Where the reply came from, as recvfrom() reports it.
    pub reply_from: Option<String>,
    /// getpeername() of a connected socket.
    pub peer: Option<String>,
    /// The errno name of the step that failed (bind, connect, send, receive).
    pub error: Option<String>,
    /// Time from the socket's creation to the reply or the error, in milliseconds.
    pub ms: f64,
}

fn errno(e: &std::io::Error) -> String {
    crate::probe::errno_name(e)
}

/// Resolve `name` through `server`, `count` times, each on a new socket (connected or not).
pub fn resolve(
    server: SocketAddr,
    name: &str,
    count: usize,
    connected: bool,
    timeout: Duration,
) -> Vec<Lookup> {
    (0..count)
        .map(|i| {
            let t0 = Instant::now();
            let mut l = Lookup { answer: None, reply_from: None, peer: None, error: None, ms: 0.0 };
            let r = (|| -> Result<(), String> {
                let bind: SocketAddr = if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
                let s = UdpSocket::bind(bind).map_err(|e| errno(&e))?;
                s.set_read_timeout(Some(timeout)).map_err(|e| errno(&e))?;
                let id = 0x1000 + i as u16;
                let q = query(id, name, server.is_ipv6());
                if connected {
                    s.connect(server).map_err(|e| errno(&e))?;
                    l.peer = Some(s.peer_addr().map_err(|e| errno(&e))?.to_string());
                    s.send(&q).map_err(|e| errno(&e))?;
                } else {
                    s.send_to(&q, server).map_err(|e| errno(&e))?;
                }
                let mut buf = [0u8; 512];
                let (n, from) = s.recv_from(&mut buf).map_err(|e| errno(&e))?;
                l.reply_from = Some(from.to_string());
                l.answer = parse_answer(&buf[..n], id).map(|a| a.to_string());
                Ok(())
            })();
            l.error = r.err();
            l.ms = t0.elapsed().as_secs_f64() * 1e3;
            l
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_answer_round_trip() {
        for (v6, ip) in [(false, "10.0.0.7"), (true, "fd00::7")] {
            let q = query(42, "cache.booking.svc.cluster.local", v6);
            let r = answer(&q, ip.parse().unwrap()).unwrap();
            assert_eq!(parse_answer(&r, 42), Some(ip.parse().unwrap()));
            assert_eq!(parse_answer(&r, 43), None, "another query's answer");
        }
        assert_eq!(answer(&[1, 2, 3], "10.0.0.1".parse().unwrap()), None);
    }
}

/// One step of `stream`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamStep {
    /// Milliseconds since the Unix epoch (comparable across processes).
    pub at_ms: f64,
    /// The answer's address, as in [`Lookup::answer`].
    pub answer: Option<String>,
    /// The errno name of the step that failed; the socket is then replaced.
    pub error: Option<String>,
    /// A new socket was opened before this step (after an error).
    pub new_socket: bool,
}

/// Milliseconds since the Unix epoch, comparable across processes (a client's steps and a test's edits).
pub fn epoch_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// A long-lived connected UDP socket querying `server` every `interval` for `duration`, as a resolver with a
/// cached connected socket does; after an error it opens a new socket (through the VIP again).
pub fn stream(
    server: SocketAddr,
    duration: Duration,
    interval: Duration,
    timeout: Duration,
) -> Vec<StreamStep> {
    let start = Instant::now();
    let mut steps = Vec::new();
    let mut sock: Option<UdpSocket> = None;
    let mut id: u16 = 1;
    while start.elapsed() < duration {
        let new_socket = sock.is_none();
        let step = (|| -> Result<Option<String>, String> {
            if sock.is_none() {
                let bind: SocketAddr = if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
                let s = UdpSocket::bind(bind).map_err(|e| errno(&e))?;
                s.set_read_timeout(Some(timeout)).map_err(|e| errno(&e))?;
                s.connect(server).map_err(|e| errno(&e))?;
                sock = Some(s);
            }
            let s = sock.as_ref().expect("just set");
            id = id.wrapping_add(1);
            s.send(&query(id, "cache.booking.svc.cluster.local", server.is_ipv6())).map_err(|e| errno(&e))?;
            let mut buf = [0u8; 512];
            let n = s.recv(&mut buf).map_err(|e| errno(&e))?;
            Ok(parse_answer(&buf[..n], id).map(|a| a.to_string()))
        })();
        let (answer, error) = match step {
            Ok(a) => (a, None),
            Err(e) => {
                sock = None;
                (None, Some(e))
            }
        };
        steps.push(StreamStep { at_ms: epoch_ms(), answer, error, new_socket });
        std::thread::sleep(interval);
    }
    steps
}
