//! Destroy connected UDP sockets still pointing at a backend that left their Service, so the application gets
//! an error (ECONNABORTED) and reconnects through the VIP instead of sending into the void (the stuck-socket
//! problem of cilium#27300 and calico#4509).
//!
//! The sockets come from the data path's own registry of connected UDP sockets (`CONNECTED_UDP`: socket
//! cookie, backend, network-namespace cookie; written by connect4/connect6, deleted with the socket by
//! `sock_release`, so it holds live sockets only), not from a scan of the node. aya 0.14 cannot call the `bpf_sock_destroy()` kfunc, so the agent
//! uses netlink `SOCK_DESTROY` (inet_diag), which must run inside the socket's network namespace: it finds
//! the namespace by its cookie, asks sock_diag there for the socket with that cookie (for its exact
//! 4-tuple) and destroys it.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    os::fd::{AsFd as _, AsRawFd, FromRawFd as _, OwnedFd},
    path::PathBuf,
};

use lb_common::{Backend, FAMILY_V6, FrontendKey, PROTO_UDP, ReverseKey, V4_MAPPED_WORD2};

use super::{MapWriter, Reconciler};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const SO_NETNS_COOKIE: i32 = 71;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NlMsgHdr {
    len: u32,
    ty: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct SockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    ifindex: u32,
    cookie: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DiagReq {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DiagMsg {
    family: u8,
    state: u8,
    timer: u8,
    retrans: u8,
    id: SockId,
    expires: u32,
    rqueue: u32,
    wqueue: u32,
    uid: u32,
    inode: u32,
}

const _: () = assert!(size_of::<SockId>() == 48 && size_of::<DiagReq>() == 56 && size_of::<DiagMsg>() == 72);

fn as_bytes<T>(v: &T) -> &[u8] {
    // SAFETY: T is a #[repr(C)] plain-integer struct without padding (sizes asserted above).
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), size_of::<T>()) }
}

fn netlink() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the fd is owned below.
    let fd =
        unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn send(fd: &OwnedFd, ty: u16, flags: u16, req: &DiagReq) -> std::io::Result<()> {
    let hdr =
        NlMsgHdr { len: (size_of::<NlMsgHdr>() + size_of::<DiagReq>()) as u32, ty, flags, seq: 1, pid: 0 };
    let mut buf = Vec::with_capacity(hdr.len as usize);
    buf.extend_from_slice(as_bytes(&hdr));
    buf.extend_from_slice(as_bytes(req));
    // SAFETY: buf is valid for its length; the kernel address is the zeroed default sockaddr_nl.
    let n = unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
    if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    // -1 with errno set, or the byte count.
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// The sock_diag ids of this namespace's UDP sockets with one of `cookies`.
fn find(family: u8, cookies: &BTreeSet<u64>) -> std::io::Result<Vec<SockId>> {
    let fd = netlink()?;
    let req = DiagReq { family, protocol: PROTO_UDP, states: u32::MAX, ..DiagReq::default() };
    send(&fd, SOCK_DIAG_BY_FAMILY, (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16, &req)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(&fd, &mut buf)?;
        let mut off = 0;
        while off + size_of::<NlMsgHdr>() <= n {
            // SAFETY: bounds checked; read_unaligned copes with any alignment.
            let hdr: NlMsgHdr = unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
            if hdr.len < size_of::<NlMsgHdr>() as u32 {
                return Ok(out);
            }
            match i32::from(hdr.ty) {
                libc::NLMSG_DONE => return Ok(out),
                libc::NLMSG_ERROR => return Err(std::io::Error::other("sock_diag dump failed")),
                _ => {
                    let body = off + size_of::<NlMsgHdr>();
                    if body + size_of::<DiagMsg>() <= n {
                        // SAFETY: as above.
                        let m: DiagMsg = unsafe { std::ptr::read_unaligned(buf[body..].as_ptr().cast()) };
                        let cookie = u64::from(m.id.cookie[0]) | (u64::from(m.id.cookie[1]) << 32);
                        if cookies.contains(&cookie) {
                            out.push(m.id);
                        }
                    }
                }
            }
            off += (hdr.len as usize + 3) & !3;
        }
    }
}

fn destroy(family: u8, id: SockId) -> std::io::Result<()> {
    let fd = netlink()?;
    let req = DiagReq { family, protocol: PROTO_UDP, states: u32::MAX, id, ..DiagReq::default() };
    send(&fd, SOCK_DESTROY, (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16, &req)?;
    let mut buf = [0u8; 256];
    let n = recv(&fd, &mut buf)?;
    if n >= size_of::<NlMsgHdr>() + 4 {
        let err = i32::from_ne_bytes(buf[16..20].try_into().expect("4 bytes"));
        if err != 0 {
            return Err(std::io::Error::from_raw_os_error(-err));
        }
    }
    Ok(())
}

/// A u64 socket option (SO_COOKIE, SO_NETNS_COOKIE).
fn sockopt_u64(fd: &impl AsRawFd, opt: i32) -> std::io::Result<u64> {
    let mut v: u64 = 0;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: v/len are valid for the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            std::ptr::from_mut(&mut v).cast(),
            &raw mut len,
        )
    };
    if r != 0 { Err(std::io::Error::last_os_error()) } else { Ok(v) }
}

fn netns_cookie_here() -> std::io::Result<u64> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").or_else(|_| std::net::UdpSocket::bind("[::1]:0"))?;
    sockopt_u64(&s, SO_NETNS_COOKIE)
}

/// Run `f` in a thread that has joined the network namespace `ns` (the caller's thread stays where it is).
fn in_netns<T: Send + 'static>(ns: &File, f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<T> {
    let ns = ns.try_clone()?;
    std::thread::spawn(move || -> std::io::Result<T> {
        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
        Ok(f())
    })
    .join()
    .map_err(|_| std::io::Error::other("netns worker panicked"))?
}

/// Can this kernel destroy sockets? Tried for real on a connected UDP socket of our own, on loopback.
pub fn probe() -> Result<(), String> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("probe socket: {e}"))?;
    sock.connect("127.0.0.1:9").map_err(|e| format!("probe socket: {e}"))?;
    netns_cookie_here().map_err(|e| format!("SO_NETNS_COOKIE (Linux >= 5.14) unavailable: {e}"))?;
    let cookie = sockopt_u64(&sock, libc::SO_COOKIE).map_err(|e| format!("SO_COOKIE: {e}"))?;
    let ids = find(libc::AF_INET as u8, &BTreeSet::from([cookie])).map_err(|e| format!("sock_diag: {e}"))?;
    let id = ids.first().ok_or("sock_diag did not list the probe socket")?;
    destroy(libc::AF_INET as u8, *id).map_err(|e| match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            "SOCK_DESTROY not supported (kernel built without CONFIG_INET_DIAG_DESTROY)".to_owned()
        }
        _ => format!("SOCK_DESTROY: {e}"),
    })
}

/// Where pods' network namespaces are found, by netns cookie (unique for the kernel's uptime, unlike an
/// inode number, which the kernel reuses: nothing is cached across passes).
///
/// In order: the bind mounts container runtimes keep for pod namespaces (`/run/netns`, `/var/run/netns`;
/// a DaemonSet mounts the host's with HostToContainer propagation, and opening them needs no ptrace access),
/// the agent's own namespace (host-network pods share the node's), then every process's `ns/net` under a
/// proc root (the host's /proc when the agent shares the host's PID namespace or has it mounted; opening
/// other users' processes' namespaces there needs CAP_SYS_PTRACE).
#[derive(Clone, Debug)]
pub struct NetnsFinder {
    /// Directories of namespace bind mounts.
    pub dirs: Vec<PathBuf>,
    /// A proc root to scan (`/proc`, or the host's mounted elsewhere); `None`: none.
    pub proc_root: Option<PathBuf>,
}

impl Default for NetnsFinder {
    fn default() -> Self {
        Self::new(Some(PathBuf::from("/proc")))
    }
}

impl NetnsFinder {
    /// The runtimes' netns directories, the agent's own namespace, and `proc_root`.
    pub fn new(proc_root: Option<PathBuf>) -> Self {
        Self { dirs: vec![PathBuf::from("/run/netns"), PathBuf::from("/var/run/netns")], proc_root }
    }

    /// Every candidate namespace file, in search order (not yet deduplicated).
    fn candidates(&self) -> impl Iterator<Item = PathBuf> + '_ {
        let files = |d: &PathBuf| std::fs::read_dir(d).into_iter().flatten().flatten().map(|e| e.path());
        let procs = self.proc_root.iter().flat_map(|p| {
            std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
                .map(|e| e.path().join("ns/net"))
        });
        self.dirs.iter().flat_map(files).chain([PathBuf::from("/proc/self/ns/net")]).chain(procs)
    }

    /// How many distinct network namespaces the agent can see (by inode, without entering them): 1 means
    /// only its own, so sockets in pods cannot be reached.
    pub fn visible(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        for path in self.candidates() {
            if let Ok(m) = std::fs::metadata(&path) {
                seen.insert((
                    std::os::unix::fs::MetadataExt::dev(&m),
                    std::os::unix::fs::MetadataExt::ino(&m),
                ));
            }
        }
        seen.len()
    }

    /// Open handles on the network namespaces with these cookies, as far as they can be found; each
    /// namespace is entered once per call to read its cookie.
    pub fn find_all(&self, wanted: &BTreeSet<u64>) -> BTreeMap<u64, File> {
        let mut found = BTreeMap::new();
        if wanted.is_empty() {
            return found;
        }
        let mut seen = std::collections::HashSet::new();
        for path in self.candidates() {
            if found.len() == wanted.len() {
                break;
            }
            let Ok(m) = std::fs::metadata(&path) else { continue };
            if !seen
                .insert((std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m)))
            {
                continue;
            }
            let Ok(f) = File::open(&path) else { continue };
            let Ok(Ok(cookie)) = in_netns(&f, netns_cookie_here) else { continue };
            if wanted.contains(&cookie) {
                found.insert(cookie, f);
            }
        }
        found
    }
}

/// What one destruction pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DestroyReport {
    /// Sockets destroyed.
    pub destroyed: usize,
    /// Registrations dropped because their network namespace was not found: the pod is gone, or the agent
    /// cannot see its namespace (see `NetnsFinder`).
    pub netns_not_found: usize,
    /// What went wrong (deduplicated), for the log.
    pub errors: Vec<String>,
}

/// Destroy connected UDP sockets whose backend is no longer in any tier of their frontend (or is marked
/// down): after a sync that updated or removed frontends, and after `tierlb backend down`.
pub fn destroy_departed<W: MapWriter>(rec: &mut Reconciler<W>, finder: &NetnsFinder) -> DestroyReport {
    // Only UDP frontends have sockets to end (and building sets for every TCP one cost milliseconds per change
    // at 10,000 Services).
    let current: BTreeMap<FrontendKey, BTreeSet<Backend>> = rec
        .applied()
        .filter(|(k, _, _)| k.proto == PROTO_UDP)
        .map(|(k, _, d)| (*k, d.slots.iter().copied().collect()))
        .collect();
    let down: BTreeSet<Backend> = rec.writer().backends_down().unwrap_or_default().into_iter().collect();
    destroy_udp_sockets(rec.writer_mut(), finder, |fe, b| {
        down.contains(b) || !current.get(fe).is_some_and(|set| set.contains(b))
    })
}

/// Destroy the connected UDP sockets whose registration points at a backend for which `gone(frontend,
/// backend)` is true, and drop those registrations.
pub fn destroy_udp_sockets(
    maps: &mut impl MapWriter,
    finder: &NetnsFinder,
    gone: impl Fn(&FrontendKey, &Backend) -> bool,
) -> DestroyReport {
    let mut report = DestroyReport::default();
    let entries = match maps.connected_udp() {
        Ok(e) => e,
        Err(e) => {
            report.errors.push(e.to_string());
            return report;
        }
    };
    // netns cookie -> (family, backend) -> reverse keys
    let mut work: BTreeMap<u64, Vec<ReverseKey>> = BTreeMap::new();
    for (k, v) in entries {
        if k.backend.proto != PROTO_UDP {
            continue;
        }
        let fe = FrontendKey { addr: v.vip, port: v.port, proto: PROTO_UDP, family: v.family };
        if gone(&fe, &k.backend) {
            work.entry(v.netns_cookie).or_default().push(k);
        }
    }
    // The common case after a sync: no connected UDP socket talks to a departed backend; list no namespace.
    if work.is_empty() {
        return report;
    }
    let namespaces = finder.find_all(&work.keys().copied().collect());
    for (netns, keys) in work {
        let Some(ns) = namespaces.get(&netns) else {
            report.netns_not_found += keys.len();
            for k in &keys {
                let _ = maps.forget_connected_udp(k);
            }
            continue;
        };
        let cookies: BTreeSet<u64> = keys.iter().map(|k| k.cookie).collect();
        let targets: Vec<(u64, Backend)> = keys.iter().map(|k| (k.cookie, k.backend)).collect();
        let result = in_netns(ns, move || -> std::io::Result<(usize, Vec<String>)> {
            let mut destroyed = 0;
            let mut errors = Vec::new();
            for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
                for id in find(family, &cookies)? {
                    let cookie = u64::from(id.cookie[0]) | (u64::from(id.cookie[1]) << 32);
                    // Only a socket connected to that backend: an unconnected one picks a backend per sendmsg.
                    let connected_to = targets.iter().any(|(c, b)| {
                        *c == cookie && id.dport == b.port && {
                            if b.family == FAMILY_V6 || family == libc::AF_INET6 as u8 {
                                id.dst == b.addr
                                    || (id.dst[..3] == [0, 0, V4_MAPPED_WORD2] && id.dst[3] == b.addr[0])
                            } else {
                                id.dst[0] == b.addr[0]
                            }
                        }
                    });
                    if !connected_to {
                        continue;
                    }
                    match destroy(family, id) {
                        Ok(()) => destroyed += 1,
                        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => errors.push(
                            "SOCK_DESTROY is not supported by this kernel (CONFIG_INET_DIAG_DESTROY): connected UDP \
                             sockets to removed backends are left alone"
                                .to_owned(),
                        ),
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        Err(e) => errors.push(format!("SOCK_DESTROY: {e}")),
                    }
                }
            }
            Ok((destroyed, errors))
        });
        match result {
            Ok(Ok((d, errs))) => {
                report.destroyed += d;
                report.errors.extend(errs);
            }
            Ok(Err(e)) | Err(e) => report.errors.push(format!("sock_diag in netns {netns}: {e}")),
        }
        for k in &keys {
            let _ = maps.forget_connected_udp(k);
        }
    }
    report.errors.dedup();
    report
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// What README.md promises of a destroyed connected UDP socket: a `recv()` blocked on it returns
    /// ECONNABORTED, the next `send()` EDESTADDRREQ (the kernel's `udp_abort` sets the error and disconnects
    /// it). On loopback in the test's own namespace; needs CAP_NET_ADMIN, as the agent does.
    #[test]
    fn the_kernel_can_destroy_our_own_udp_socket() {
        assert!(nix::unistd::geteuid().is_root(), "SOCK_DESTROY needs CAP_NET_ADMIN: run the suite as root");
        super::probe().unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.connect("127.0.0.1:9").unwrap();
        let cookie = super::sockopt_u64(&sock, libc::SO_COOKIE).unwrap();
        let reader = sock.try_clone().unwrap();
        // Bounded, so a socket that is not destroyed fails the test (EAGAIN) instead of hanging it.
        reader.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let blocked = std::thread::spawn(move || reader.recv(&mut [0u8; 16]));
        // The reader is blocked in recv() (nothing will ever arrive) by the time the socket is destroyed, or
        // it finds the error already set: either way it must return ECONNABORTED, not block.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let ids = super::find(libc::AF_INET as u8, &BTreeSet::from([cookie])).unwrap();
        assert_eq!(ids.len(), 1, "sock_diag lists the socket once");
        super::destroy(libc::AF_INET as u8, ids[0]).unwrap();
        let err = blocked.join().unwrap().expect_err("recv on a destroyed socket");
        assert_eq!(err.raw_os_error(), Some(libc::ECONNABORTED), "{err}");
        let err = sock.send(b"x").expect_err("send on a destroyed socket");
        assert_eq!(err.raw_os_error(), Some(libc::EDESTADDRREQ), "{err}");
    }
}
