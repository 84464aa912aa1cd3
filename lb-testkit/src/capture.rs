//! A packet capture on one device of a test's namespace: every IPv4 packet that arrives on it or leaves by it
//! (an `AF_PACKET` socket of `ETH_P_ALL`: incoming packets as the wire delivered them, before tc; outgoing
//! ones as they leave, after), summarised. What a test asserts a node never saw, it asserts over this.
//! Stopped (its thread joined) by `stop` or on drop.
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::{Context as _, bail};

use crate::sandbox::NetNs;

/// One IPv4 TCP or UDP packet the capture saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// It left by the device (else it arrived on it).
    pub outgoing: bool,
    /// Its source address and port.
    pub src: SocketAddrV4,
    /// Its destination address and port.
    pub dst: SocketAddrV4,
    /// 6 (TCP) or 17 (UDP).
    pub proto: u8,
    /// The IPv4 options after the base header (empty: none).
    pub options: Vec<u8>,
}

/// A running capture.
pub struct Capture {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    thread: Option<JoinHandle<()>>,
}

/// An `AF_PACKET` socket of cooked packets (no link header) of ethertype `proto` (host order; `ETH_P_ALL`:
/// every one, both directions) on `device` of the calling thread's namespace, its reads timing out after
/// `timeout`.
pub(crate) fn packet_socket(
    device: &str,
    proto: u16,
    timeout: std::time::Duration,
) -> anyhow::Result<OwnedFd> {
    let proto = proto.to_be();
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd =
        unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, i32::from(proto)) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket(AF_PACKET)");
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(device)?;
    // SAFETY: a valid C string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        bail!("no device {device}");
    }
    // SAFETY: an all-zero sockaddr_ll is valid; its fields are set below.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    ll.sll_family = libc::AF_PACKET as u16;
    ll.sll_protocol = proto;
    ll.sll_ifindex = ifindex.cast_signed();
    // SAFETY: a sockaddr_ll of its own size.
    let rc = unsafe {
        libc::bind(sock.as_raw_fd(), (&raw const ll).cast(), size_of::<libc::sockaddr_ll>() as u32)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("bind AF_PACKET");
    }
    let tv = libc::timeval {
        tv_sec: timeout.as_secs().cast_signed(),
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
    };
    // SAFETY: a timeval of its own size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as u32,
        );
    }
    Ok(sock)
}

/// The summary of the IPv4 packet `p` (no link header), if it is TCP or UDP.
fn summary(p: &[u8], outgoing: bool) -> Option<Seen> {
    if p.len() < 20 || p[0] >> 4 != 4 || !matches!(p[9], 6 | 17) {
        return None;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    if ihl < 20 || p.len() < ihl + 4 {
        return None;
    }
    let port = |at: usize| u16::from_be_bytes([p[at], p[at + 1]]);
    Some(Seen {
        outgoing,
        src: SocketAddrV4::new(Ipv4Addr::new(p[12], p[13], p[14], p[15]), port(ihl)),
        dst: SocketAddrV4::new(Ipv4Addr::new(p[16], p[17], p[18], p[19]), port(ihl + 2)),
        proto: p[9],
        options: p[20..ihl].to_vec(),
    })
}

impl Capture {
    /// Start capturing on `device` in `ns`; returns once the socket is bound (nothing before it is seen).
    pub fn start(ns: &NetNs, device: &str) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let file = ns.file().try_clone()?;
        let device = device.to_owned();
        let (s, out) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let setup = || -> anyhow::Result<OwnedFd> {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
                packet_socket(&device, libc::ETH_P_ALL as u16, std::time::Duration::from_millis(50))
            };
            let sock = match setup() {
                Ok(sock) => {
                    let _ = ready_tx.send(Ok(()));
                    sock
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return;
                }
            };
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::SeqCst) {
                // SAFETY: an all-zero sockaddr_ll is valid for recvfrom to fill.
                let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut from_len = size_of::<libc::sockaddr_ll>() as u32;
                // SAFETY: a buffer and an address of their own lengths.
                let len = unsafe {
                    libc::recvfrom(
                        sock.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                        (&raw mut from).cast(),
                        &raw mut from_len,
                    )
                };
                let Ok(len) = usize::try_from(len) else { continue };
                if from.sll_protocol != (libc::ETH_P_IP as u16).to_be() {
                    continue;
                }
                let outgoing = from.sll_pkttype == libc::PACKET_OUTGOING;
                if let Some(p) = summary(&buf[..len], outgoing) {
                    out.lock().unwrap().push(p);
                }
            }
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self { stop, seen, thread: Some(thread) }),
            Ok(Err(e)) => bail!("the capture could not start: {e}"),
            Err(_) => bail!("the capture's thread ended before it started"),
        }
    }

    /// Stop and return every packet seen, in order.
    #[must_use]
    pub fn stop(mut self) -> Vec<Seen> {
        self.halt();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_is_summarised_with_its_options() {
        let mut p = vec![0x47, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 192, 0, 2, 100, 10, 244, 2, 10];
        p.extend_from_slice(&[0x9e, 8, 0x75, 0x80, 192, 0, 2, 1]);
        p.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90]);
        let s = summary(&p, true).unwrap();
        assert_eq!(s.src, "192.0.2.100:40000".parse().unwrap());
        assert_eq!(s.dst, "10.244.2.10:8080".parse().unwrap());
        assert_eq!(s.options, vec![0x9e, 8, 0x75, 0x80, 192, 0, 2, 1]);
        assert!(s.outgoing);
        p[9] = 1;
        assert_eq!(summary(&p, false), None, "ICMP is not summarised");
    }
}
