//! Socket churn in one process, for the reverse-translation tests: a DNS query is sent from an unconnected
//! UDP socket and a TCP connection opened through VIPs, then many short-lived sockets are made through
//! VIPs (TCP connects, connected UDP sockets, unconnected UDP sends, each socket closed at once), and only
//! then is the DNS reply read and the early TCP socket's peer asked. Translation state lost to the churn
//! shows as the backend's address in either.
use std::{
    io::Write as _,
    net::{SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::{dns, probe::errno_name};

/// What to do (`tierlb-lab churn`).
#[derive(Clone, Debug)]
pub struct Plan {
    /// A DNS server VIP: the first query goes there before the churn, its reply is read after it.
    pub dns: Option<SocketAddr>,
    /// A TCP VIP: the early connection (kept open) and the churn's TCP connects.
    pub tcp: SocketAddr,
    /// TCP connects (each closed at once).
    pub tcp_connects: usize,
    /// Connected UDP sockets to the DNS VIP (each closed at once, no datagram sent).
    pub udp_connects: usize,
    /// Unconnected UDP sockets each sending one query to the DNS VIP, then closed.
    pub udp_sends: usize,
    /// How long to wait for the first query's reply.
    pub timeout: Duration,
}

/// What happened (JSON on stdout).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// Where the first DNS reply came from, as recvfrom() reports it.
    pub reply_from: Option<String>,
    /// The address in that reply's answer.
    pub answer: Option<String>,
    /// getpeername() of the TCP socket opened before the churn, asked after it.
    pub early_peer: Option<String>,
    /// getpeername() of that socket right after its connect (before the churn).
    pub early_peer_before: Option<String>,
    /// Sockets made during the churn that failed, by errno name and step.
    pub errors: std::collections::BTreeMap<String, usize>,
    /// Sockets made during the churn.
    pub sockets: usize,
    /// Duration of the churn, in seconds.
    pub seconds: f64,
}

/// The unspecified address (port 0) of `for_addr`'s family: where a client socket binds.
pub(crate) fn unspecified(for_addr: SocketAddr) -> SocketAddr {
    if for_addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("literal")
}

/// Close with RST (SO_LINGER 0) when the socket is dropped: no TIME_WAIT on either side, so neither the
/// client's ephemeral ports nor the server's 4-tuples pile up (a server-side TIME_WAIT hit by a reused
/// client port costs the next SYN a 1 s retransmit). The churn here and the benchmark's load client use it.
pub fn rst_close(s: &impl std::os::fd::AsRawFd) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: valid socket and option buffer.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&linger).cast(),
            size_of::<libc::linger>() as u32,
        );
    }
}

/// Run the plan.
pub fn run(plan: &Plan) -> Outcome {
    let mut out = Outcome::default();
    let mut fail = |step: &str, e: &std::io::Error| {
        *out.errors.entry(format!("{step}: {}", errno_name(e))).or_default() += 1;
    };
    let first = plan.dns.and_then(|server| {
        let s = UdpSocket::bind(unspecified(server)).ok()?;
        s.set_read_timeout(Some(plan.timeout)).ok()?;
        s.send_to(&dns::query(0x5353, "cache.booking.svc.cluster.local", server.is_ipv6()), server).ok()?;
        Some(s)
    });
    let early = TcpStream::connect_timeout(&plan.tcp, plan.timeout);
    let early_peer_before = early.as_ref().ok().and_then(|s| s.peer_addr().ok()).map(|a| a.to_string());
    let t0 = Instant::now();
    for _ in 0..plan.tcp_connects {
        match TcpStream::connect_timeout(&plan.tcp, plan.timeout) {
            Ok(s) => rst_close(&s),
            Err(e) => fail("tcp connect", &e),
        }
    }
    if let Some(server) = plan.dns {
        for _ in 0..plan.udp_connects {
            match UdpSocket::bind(unspecified(server)).and_then(|s| s.connect(server)) {
                Ok(()) => {}
                Err(e) => fail("udp connect", &e),
            }
        }
        let q = dns::query(1, "cache.booking.svc.cluster.local", server.is_ipv6());
        for _ in 0..plan.udp_sends {
            if let Err(e) = UdpSocket::bind(unspecified(server)).and_then(|s| s.send_to(&q, server)) {
                fail("udp send", &e);
            }
        }
    }
    out.sockets = plan.tcp_connects + plan.udp_connects + plan.udp_sends;
    out.seconds = t0.elapsed().as_secs_f64();
    if let Some(s) = first {
        let mut buf = [0u8; 512];
        // Replies to the churn's own queries went to sockets already closed; this one is the first query's.
        match s.recv_from(&mut buf) {
            Ok((n, from)) => {
                out.reply_from = Some(from.to_string());
                out.answer = dns::parse_answer(&buf[..n], 0x5353).map(|a| a.to_string());
            }
            Err(e) => fail("first reply", &e),
        }
    }
    match early {
        Ok(mut s) => {
            out.early_peer = s.peer_addr().ok().map(|a| a.to_string());
            // Still usable: a request goes through (the server answers with its name).
            let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
        }
        Err(e) => fail("early tcp connect", &e),
    }
    out.early_peer_before = early_peer_before;
    out
}
