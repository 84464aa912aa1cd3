//! A tenant's connects that end on its own side, to show they never hold a backend for others: each connect is
//! non-blocking, optionally with `IP_TTL` set (1: its SYN dies at the node's first forward, answered by an ICMP
//! time exceeded or, rate-limited, by nothing), then either shut down at once (`shutdown()` in `SYN_SENT`, a
//! local abort) or waited for up to a deadline and closed (the kernel's outcome: established, an errno, or
//! still in `SYN_SENT`).
use std::{net::SocketAddr, os::fd::AsRawFd as _, time::Duration};

use serde::{Deserialize, Serialize};

/// How each connect ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum End {
    /// `shutdown(SHUT_RDWR)` right after `connect()` returned `EINPROGRESS`.
    Shutdown,
    /// Wait for the outcome up to the deadline, then `close()`.
    Wait,
}

/// What each connect came to: `ok`, an errno name (`probe::errno_name`; `connect() ERRNO` when `connect()`
/// itself failed), `aborted` or `pending` (still connecting at the deadline).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Outcomes {
    /// One per connect, in order.
    pub outcomes: Vec<String>,
}

/// `count` connects to `target` ending as `end` says, `ttl` set on each if given.
pub fn run(target: SocketAddr, count: usize, ttl: Option<u32>, end: End, wait: Duration) -> Outcomes {
    let outcomes =
        (0..count).map(|_| one(target, ttl, end, wait).unwrap_or_else(|e| e.to_string())).collect();
    Outcomes { outcomes }
}

fn one(target: SocketAddr, ttl: Option<u32>, end: End, wait: Duration) -> std::io::Result<String> {
    let domain = if target.is_ipv4() { socket2::Domain::IPV4 } else { socket2::Domain::IPV6 };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    if let Some(ttl) = ttl {
        if target.is_ipv4() { s.set_ttl_v4(ttl)? } else { s.set_unicast_hops_v6(ttl)? }
    }
    s.set_nonblocking(true)?;
    match s.connect(&target.into()) {
        Ok(()) => return Ok("ok".into()),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Ok(format!("connect() {}", crate::probe::errno_name(&e))),
    }
    if end == End::Shutdown {
        s.shutdown(std::net::Shutdown::Both)?;
        return Ok("aborted".into());
    }
    let mut pfd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the call's duration.
    let n = unsafe { libc::poll(&raw mut pfd, 1, ms) };
    if n == 0 {
        return Ok("pending".into());
    }
    Ok(match s.take_error()? {
        None => "ok".into(),
        Some(e) => crate::probe::errno_name(&e),
    })
}
