//! The two ends of the north-south loads: a pod's server (the same in the tests' lab and the bench's) and the
//! client's calls to it, each made from a thread in the client's namespace.
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use nix::sys::{socket, time::TimeVal};

use crate::sandbox::NetNs;

/// A pod's server, in the pod's namespace (a thread of the caller, `setns` to it): TCP answers every line
/// with `NAME PEER` (the client address it saw), UDP every datagram the same. Stops on drop.
pub struct PodServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl PodServer {
    /// Serve TCP and UDP on each of `addrs` inside `ns`, answering as `name`.
    ///
    /// # Panics
    /// When an address cannot be bound within 5 s (the lab's addresses are its own).
    #[must_use]
    pub fn start(ns: &NetNs, name: &str, addrs: &[SocketAddr]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for &addr in addrs {
            let (tx, rx) = std::sync::mpsc::channel();
            let file = ns.file().try_clone().unwrap();
            let (stop_tcp, stop_udp, name_tcp, name_udp) =
                (stop.clone(), stop.clone(), name.to_owned(), name.to_owned());
            threads.push(std::thread::spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let tcp = TcpListener::bind(addr).unwrap();
                // std listens with a backlog of 128: the packet-rate steps' bursts would overflow it, and a
                // dropped SYN is a failed connect that is the server's, not the path's.
                // SAFETY: listen(2) on our own listening socket only updates its backlog.
                unsafe { libc::listen(tcp.as_raw_fd(), 4096) };
                let udp = UdpSocket::bind(addr).unwrap();
                tx.send(()).unwrap();
                tcp.set_nonblocking(true).unwrap();
                udp.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let udp_thread = std::thread::spawn(move || {
                    let mut buf = [0u8; 512];
                    while !stop_udp.load(Ordering::Relaxed) {
                        if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                            let _ = udp.send_to(format!("{name_udp} {peer}\n").as_bytes(), peer);
                        }
                    }
                });
                while !stop_tcp.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((s, peer)) => {
                            let name = name_tcp.clone();
                            std::thread::spawn(move || answer(s, &name, peer));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
                let _ = udp_thread.join();
            }));
            rx.recv_timeout(Duration::from_secs(5)).expect("pod server listening");
        }
        Self { stop, threads }
    }
}

/// One TCP connection of the pod's server: each line answered until the client closes.
fn answer(s: TcpStream, name: &str, peer: SocketAddr) {
    let _ = s.set_nonblocking(false);
    let Ok(mut w) = s.try_clone() else { return };
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { break };
        // `big N`: N bytes and a newline (a reply larger than any MTU).
        let big = line.strip_prefix("big ").and_then(|n| n.parse::<usize>().ok());
        let answer = match big {
            Some(n) => w.write_all(&vec![b'x'; n]).and_then(|()| writeln!(w)),
            None => writeln!(w, "{name} {peer}"),
        };
        if answer.is_err() {
            break;
        }
    }
}

impl Drop for PodServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Run `f` on a thread in `ns` (the external client's namespace).
///
/// # Panics
/// When the thread cannot enter `ns`, or `f` panics.
pub fn from<T: Send + 'static>(ns: &NetNs, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = ns.file().try_clone().unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// `f(i)` for `i` in `0..n`, each on a thread of its own in `ns`.
///
/// # Panics
/// When a thread cannot enter `ns`, or `f` panics.
pub fn on_threads<T: Send>(ns: &NetNs, n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let threads: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || {
                    nix::sched::setns(ns.file(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                    f(i)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// How a client ends a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Close {
    /// close(2) after the answer: a FIN, and the client's socket in TIME_WAIT for 60 s.
    Fin,
    /// A reset after the answer (SO_LINGER 0): no TIME_WAIT on the client, whose ports then bound no rate.
    Rst,
}

/// One TCP request to `to`: the answer (`NAME PEER`), or the error.
///
/// # Errors
/// The connect's, the write's or the read's (each bounded at 1.5 s), or an answer not of that shape.
pub fn tcp_once(to: SocketAddr) -> Result<(String, String), String> {
    tcp_once_closing(to, Close::Fin)
}

/// `tcp_once`, the connection ended as `close` says.
///
/// # Errors
/// As `tcp_once`.
pub fn tcp_once_closing(to: SocketAddr, close: Close) -> Result<(String, String), String> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(1500)).map_err(|e| e.to_string())?;
    if close == Close::Rst {
        crate::churn::rst_close(&s);
    }
    s.set_read_timeout(Some(Duration::from_millis(1500))).map_err(|e| e.to_string())?;
    writeln!(s, "hello").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
    let (name, peer) = line.trim().split_once(' ').ok_or_else(|| format!("answer {line:?}"))?;
    Ok((name.to_owned(), peer.to_owned()))
}

/// One line to `s` and the first word of its answer (the pod's name).
///
/// # Errors
/// The write's or the read's (bounded at 3 s), or an empty answer.
pub fn ask(s: &mut TcpStream) -> Result<String, String> {
    s.set_read_timeout(Some(Duration::from_secs(3))).map_err(|e| e.to_string())?;
    writeln!(s, "hello").map_err(|e| format!("write: {e}"))?;
    let mut line = String::new();
    BufReader::new(&*s).read_line(&mut line).map_err(|e| format!("read: {e}"))?;
    match line.split(' ').next() {
        Some(name) if !name.trim().is_empty() => Ok(name.to_owned()),
        _ => Err(format!("answer {line:?}")),
    }
}

fn v4(a: SocketAddr) -> Result<socket::SockaddrIn, String> {
    match a {
        SocketAddr::V4(a) => Ok(socket::SockaddrIn::from(a)),
        SocketAddr::V6(_) => Err(format!("{a}: the loads are IPv4")),
    }
}

/// A TCP socket bound to `local` (any port), connecting to `to`: `nonblocking` returns at once with the SYN
/// sent, else the connect is bounded at 3 s (connect(2) is bounded by the send timeout).
///
/// # Errors
/// The socket's, the bind's or the connect's, as text.
pub fn connect_from(local: IpAddr, to: SocketAddr, nonblocking: bool) -> Result<OwnedFd, String> {
    let flags = if nonblocking { socket::SockFlag::SOCK_NONBLOCK } else { socket::SockFlag::empty() };
    let fd = socket::socket(socket::AddressFamily::Inet, socket::SockType::Stream, flags, None)
        .map_err(|e| format!("socket: {e}"))?;
    socket::setsockopt(&fd, socket::sockopt::SendTimeout, &TimeVal::new(3, 0)).map_err(|e| e.to_string())?;
    socket::bind(fd.as_raw_fd(), &v4(SocketAddr::new(local, 0))?).map_err(|e| format!("bind: {e}"))?;
    match socket::connect(fd.as_raw_fd(), &v4(to)?) {
        Ok(()) => Ok(fd),
        Err(nix::errno::Errno::EINPROGRESS) if nonblocking => Ok(fd),
        // What a blocking connect(2) returns when its send timeout ran out.
        Err(nix::errno::Errno::EINPROGRESS) => Err("connect: no answer within 3 s".to_owned()),
        Err(e) => Err(format!("connect: {e}")),
    }
}

/// Errors by their text, for the figures.
pub fn tally<'a>(errors: impl Iterator<Item = &'a String>) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for e in errors {
        *by.entry(e.clone()).or_default() += 1;
    }
    by
}
