//! Two tenants sharing a node's reverse state (`tierlb-lab flood` and `tierlb-lab keep`).
//!
//! `flood` plays a pod that churns what it can: TCP sockets that each connect to a VIP, disconnect with
//! `connect(AF_UNSPEC)` (the kernel clears the socket's peer port) and close; one TCP socket that reconnects
//! many times; one unconnected UDP socket that sends to many VIPs; and many connected UDP sockets to a VIP,
//! held open. It prints one JSON line (`Flood`) once it
//! holds them and keeps them until its stdin closes.
//!
//! `keep` plays another pod: a TCP connection and a connected UDP socket to VIPs, opened at start; each
//! line on stdin asks it to check them (`Kept`, one JSON line): `getpeername()` of the TCP socket and a DNS
//! query through the UDP socket, whose reply's source and answer it reports, or the error (a socket the
//! agent destroyed reports `ECONNABORTED`).
use std::{
    io::{BufRead as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::{churn::unspecified, dns, probe::errno_name};

/// What `flood` does.
#[derive(Clone, Debug)]
pub struct FloodPlan {
    /// The TCP VIP.
    pub tcp: SocketAddr,
    /// Sockets that each connect, disconnect with `AF_UNSPEC` and close.
    pub unspec_sockets: usize,
    /// Reconnects (connect, `AF_UNSPEC`) of one socket, which then connects a last time and stays open.
    pub reconnects: usize,
    /// The UDP VIP for `udp_hold`.
    pub dns: Option<SocketAddr>,
    /// Connected UDP sockets opened and held.
    pub udp_hold: usize,
    /// DNS servers one unconnected UDP socket sends a query to, in turn, reading each reply.
    pub send_to: Vec<SocketAddr>,
}

/// What `flood` did.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Flood {
    /// Failed steps by step and errno name.
    pub errors: std::collections::BTreeMap<String, usize>,
    /// getpeername() of the reconnecting socket after its last connect.
    pub reconnected_peer: Option<String>,
    /// Connected UDP sockets held.
    pub udp_held: usize,
    /// Each `send_to` query's reply source (recvfrom), or the error, in order.
    pub replies_from: Vec<String>,
    /// Seconds the whole flood took.
    pub seconds: f64,
}

/// Raise this process's open-file limit to at least `n` within its hard limit (a pod has no
/// CAP_SYS_RESOURCE to pass it; nextest runs each test in a process of its own, so no other test sees it).
pub fn allow_files(n: usize) {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid rlimit buffers.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut cur);
        let want = (n as libc::rlim_t).min(cur.rlim_max);
        if cur.rlim_cur < want {
            cur.rlim_cur = want;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const cur);
        }
    }
}

/// `connect(fd, AF_UNSPEC)`: disconnect a TCP socket (a reset if it was connected), leaving it reusable.
fn disconnect(fd: i32) -> std::io::Result<()> {
    // SAFETY: an all-zero sockaddr is a valid AF_UNSPEC address.
    let addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    // SAFETY: valid socket and address buffer of the given length.
    let r = unsafe { libc::connect(fd, &raw const addr, size_of::<libc::sockaddr>() as u32) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

fn tcp_socket(to: SocketAddr) -> std::io::Result<socket2::Socket> {
    socket2::Socket::new(
        socket2::Domain::for_address(to),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
}

/// Run `plan`, print `Flood` once the sockets are held, hold them until stdin closes.
pub fn flood(plan: &FloodPlan) -> Flood {
    allow_files(plan.udp_hold + 1024);
    let mut out = Flood::default();
    let mut fail = |step: &str, e: &std::io::Error| {
        *out.errors.entry(format!("{step}: {}", errno_name(e))).or_default() += 1;
    };
    let t0 = Instant::now();
    let to = socket2::SockAddr::from(plan.tcp);
    for _ in 0..plan.unspec_sockets {
        match tcp_socket(plan.tcp).and_then(|s| s.connect(&to).map(|()| s)) {
            Ok(s) => {
                if let Err(e) = disconnect(s.as_raw_fd()) {
                    fail("disconnect", &e);
                }
            }
            Err(e) => fail("tcp connect", &e),
        }
    }
    let mut reconnecting = None;
    if plan.reconnects > 0 {
        match tcp_socket(plan.tcp) {
            Ok(s) => {
                for _ in 0..plan.reconnects {
                    if let Err(e) = s.connect(&to).and_then(|()| disconnect(s.as_raw_fd())) {
                        fail("reconnect", &e);
                    }
                }
                match s.connect(&to) {
                    Ok(()) => {
                        out.reconnected_peer =
                            s.peer_addr().ok().and_then(|a| a.as_socket()).map(|a| a.to_string());
                    }
                    Err(e) => fail("last connect", &e),
                }
                reconnecting = Some(s);
            }
            Err(e) => fail("tcp socket", &e),
        }
    }
    if let Some(first) = plan.send_to.first() {
        out.replies_from = send_each(*first, &plan.send_to);
    }
    let mut held = Vec::with_capacity(plan.udp_hold);
    if let Some(server) = plan.dns {
        let any = unspecified(server);
        let domain = socket2::Domain::for_address(server);
        // SO_REUSEADDR: more sockets than ephemeral ports (28,232) may share the ports.
        let one = || -> std::io::Result<socket2::Socket> {
            let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
            s.set_reuse_address(true)?;
            s.bind(&any.into())?;
            s.connect(&server.into())?;
            Ok(s)
        };
        for _ in 0..plan.udp_hold {
            match one() {
                Ok(s) => held.push(s),
                Err(e) => fail("udp connect", &e),
            }
        }
    }
    out.udp_held = held.len();
    out.seconds = t0.elapsed().as_secs_f64();
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", serde_json::to_string(&out).expect("serialises"));
    let _ = stdout.flush();
    drop(stdout);
    // Hold until the test is done with the other pod.
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    drop((held, reconnecting));
    out
}

/// One unconnected UDP socket (of `first`'s family) sends a query to each of `servers` and reads its reply.
fn send_each(first: SocketAddr, servers: &[SocketAddr]) -> Vec<String> {
    let any = unspecified(first);
    let s = match UdpSocket::bind(any)
        .and_then(|s| s.set_read_timeout(Some(Duration::from_secs(2))).map(|()| s))
    {
        Ok(s) => s,
        Err(e) => return vec![errno_name(&e)],
    };
    let mut buf = [0u8; 512];
    servers
        .iter()
        .enumerate()
        .map(|(i, server)| {
            let q = dns::query(0x100 + i as u16, "cache.booking.svc.cluster.local", server.is_ipv6());
            match s.send_to(&q, server).and_then(|_| s.recv_from(&mut buf)) {
                Ok((_, from)) => from.to_string(),
                Err(e) => errno_name(&e),
            }
        })
        .collect()
}

/// One check of `keep`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Kept {
    /// getpeername() of the TCP socket.
    pub tcp_peer: Option<String>,
    /// The DNS reply's source (recvfrom) through the connected UDP socket.
    pub reply_from: Option<String>,
    /// The address in that reply.
    pub answer: Option<String>,
    /// The UDP socket's error, as an errno name, if the query or its reply failed.
    pub udp_error: Option<String>,
}

/// Open a TCP connection to `tcp` and a connected UDP socket to `dns`; print `Kept` for each stdin line.
pub fn keep(tcp: SocketAddr, dns_vip: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    let t = TcpStream::connect_timeout(&tcp, timeout)?;
    let any = unspecified(dns_vip);
    let u = UdpSocket::bind(any)?;
    u.connect(dns_vip)?;
    u.set_read_timeout(Some(timeout))?;
    let mut stdout = std::io::stdout();
    for (id, line) in std::io::stdin().lock().lines().enumerate() {
        line?;
        let id = 0x4000 + id as u16;
        let mut k = Kept { tcp_peer: t.peer_addr().ok().map(|a| a.to_string()), ..Kept::default() };
        let query = dns::query(id, "cache.booking.svc.cluster.local", dns_vip.is_ipv6());
        let mut buf = [0u8; 512];
        match u.send(&query).and_then(|_| u.recv_from(&mut buf)) {
            Ok((n, from)) => {
                k.reply_from = Some(from.to_string());
                k.answer = dns::parse_answer(&buf[..n], id).map(|a| a.to_string());
            }
            Err(e) => k.udp_error = Some(errno_name(&e)),
        }
        writeln!(stdout, "{}", serde_json::to_string(&k).expect("serialises"))?;
        stdout.flush()?;
    }
    Ok(())
}
