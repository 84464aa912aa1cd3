//! A router on the way that answers late: it watches a node-side device for a client's TCP SYNs to one
//! address and, `delay` after each, sends the client an ICMP error quoting it (host unreachable, time
//! exceeded), from the router's own address, as a router a few hops away does. The node's own netfilter
//! answers within the sending `connect()` call, while the socket is still owned by it, so the kernel keeps
//! such an error as a soft error (`sk_err_soft`, nothing ends); a router's answer comes after `connect()` let
//! go of the socket, which the kernel ends at once with the error (`tcp_v4_err` -> `tcp_done_with_error`).
//! IPv4. Stopped (its thread joined) on drop.
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{inet::checksum, sandbox::NetNs};

/// An ICMP error as (type, code): host unreachable.
pub const HOST_UNREACHABLE: (u8, u8) = (3, 1);
/// Time exceeded in transit (a TTL that ran out on the way).
pub const TIME_EXCEEDED: (u8, u8) = (11, 0);

/// What the router answers, and to whom.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// The client whose SYNs are answered.
    pub client: Ipv4Addr,
    /// The destination of those SYNs (the backend the client's connect was translated to).
    pub to: SocketAddrV4,
    /// The ICMP error's (type, code).
    pub error: (u8, u8),
    /// The router's address, the error's source.
    pub from: Ipv4Addr,
    /// How long after the SYN the error is sent.
    pub delay: Duration,
}

/// The router's thread; stopped on drop.
pub struct LateRouter {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

/// The ICMP error `a` sends about the IPv4 packet `syn`: an IP header, then the ICMP header and the quote
/// (the packet's IP header and its first 8 bytes, as RFC 792 asks).
fn error_packet(a: &Answer, syn: &[u8]) -> Vec<u8> {
    let ihl = usize::from(syn[0] & 0x0f) * 4;
    let quote = &syn[..(ihl + 8).min(syn.len())];
    let mut icmp = vec![a.error.0, a.error.1, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(quote);
    let c = checksum(&icmp, 0);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 1, 0, 0];
    ip[2..4].copy_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&a.from.octets());
    ip.extend_from_slice(&a.client.octets());
    let c = checksum(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&icmp);
    ip
}

/// Whether the IPv4 packet `p` is a SYN (no ACK) from `a.client` to `a.to`.
fn is_syn(a: &Answer, p: &[u8]) -> bool {
    if p.len() < 20 || p[0] >> 4 != 4 || p[9] != 6 {
        return false;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    if p.len() < ihl + 14 {
        return false;
    }
    let (src, dst) = (Ipv4Addr::new(p[12], p[13], p[14], p[15]), Ipv4Addr::new(p[16], p[17], p[18], p[19]));
    let dport = u16::from_be_bytes([p[ihl + 2], p[ihl + 3]]);
    let flags = p[ihl + 13];
    src == a.client && dst == *a.to.ip() && dport == a.to.port() && flags & 0x12 == 0x02
}

fn socket(domain: i32, kind: i32, proto: i32) -> anyhow::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned by the returned value.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket");
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl LateRouter {
    /// Start watching `device` (in `node`, the device the client's packets arrive on) and answering.
    pub fn start(node: &NetNs, device: &str, answer: Answer) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let file = node.file().try_clone()?;
        let device = device.to_owned();
        let (s, n) = (stop.clone(), answered.clone());
        let thread = std::thread::spawn(move || -> anyhow::Result<()> {
            let setup = || -> anyhow::Result<(OwnedFd, OwnedFd)> {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
                // Cooked packets (no link header) of IPv4, on the one device.
                let watch = crate::capture::packet_socket(
                    &device,
                    libc::ETH_P_IP as u16,
                    Duration::from_millis(100),
                )?;
                // IPPROTO_RAW: the packet carries its own IP header.
                let send = socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW)?;
                Ok((watch, send))
            };
            let (watch, raw) = match setup() {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return Err(e);
                }
            };
            let mut buf = [0u8; 2048];
            while !s.load(Ordering::SeqCst) {
                // SAFETY: a buffer of its own length.
                let len = unsafe { libc::recv(watch.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                let Ok(len) = usize::try_from(len) else { continue };
                let syn = &buf[..len];
                if !is_syn(&answer, syn) {
                    continue;
                }
                std::thread::sleep(answer.delay);
                let packet = error_packet(&answer, syn);
                // SAFETY: an all-zero sockaddr_in is valid; its fields are set below.
                let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                to.sin_family = libc::AF_INET as u16;
                to.sin_addr.s_addr = u32::from_ne_bytes(answer.client.octets());
                // SAFETY: the packet and address buffers live for the call.
                let sent = unsafe {
                    libc::sendto(
                        raw.as_raw_fd(),
                        packet.as_ptr().cast(),
                        packet.len(),
                        0,
                        (&raw const to).cast(),
                        size_of::<libc::sockaddr_in>() as u32,
                    )
                };
                if sent < 0 {
                    return Err(std::io::Error::last_os_error()).context("sending the ICMP error");
                }
                n.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self { stop, answered, thread: Some(thread) }),
            Ok(Err(e)) => bail!("the late router could not start: {e}"),
            Err(_) => bail!("the late router's thread ended before it started"),
        }
    }

    /// SYNs answered so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

impl Drop for LateRouter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
