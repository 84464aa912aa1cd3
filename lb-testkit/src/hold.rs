//! A pod's long-lived clients of Services, for tests that change the agent under them (an upgrade, a
//! rollback): TCP connections and connected UDP sockets opened once and asked again on demand, and a stream
//! of new connections on a thread of its own, every answer tallied. `tierlb-lab hold` runs `serve` inside the
//! node's network namespace and the agent's cgroup (`Hold::start`); the servers are the north-south lab's pod
//! servers (`ns_loads::pod::PodServer`: a line in, `NAME PEER` out, TCP and UDP alike).
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::sandbox::{Cgroup, NetNs, confine};

/// One held socket's answer to one round.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HeldAnswer {
    /// `tcp` or `udp`.
    pub kind: String,
    /// The Service address it was opened to.
    pub to: String,
    /// TCP: `getpeername()`; UDP: the answer's source address.
    pub peer: Option<String>,
    /// The pod that answered.
    pub pod: Option<String>,
    /// Why there was no answer.
    pub error: Option<String>,
}

/// What `hold` prints for each line it reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Round {
    /// Each held socket's answer, in the order they were given.
    pub held: Vec<HeldAnswer>,
    /// The stream's connections so far, by target, then by pod name or `error: ...`.
    pub connects: BTreeMap<String, BTreeMap<String, usize>>,
    /// The line's `connect ADDR` answer, if it asked for one.
    pub once: Option<HeldAnswer>,
}

impl Round {
    /// Failed connections of the stream, by target and error.
    pub fn failed(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (to, by) in &self.connects {
            for (what, n) in by {
                if what.starts_with("error") {
                    *out.entry(format!("{to} {what}")).or_insert(0) += n;
                }
            }
        }
        out
    }
}

fn tcp_answer(to: SocketAddr, s: &mut TcpStream) -> HeldAnswer {
    let peer = s.peer_addr().ok().map(|a| a.to_string());
    let (pod, error) = match crate::ns_loads::pod::ask(s) {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e)),
    };
    HeldAnswer { kind: "tcp".into(), to: to.to_string(), peer, pod, error }
}

fn udp_answer(to: SocketAddr, u: &UdpSocket) -> HeldAnswer {
    let mut buf = [0u8; 512];
    let r = u.send(b"hello\n").and_then(|_| u.recv_from(&mut buf));
    let (peer, pod, error) = match r {
        Ok((n, from)) => {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            (Some(from.to_string()), text.split(' ').next().map(str::to_owned), None)
        }
        Err(e) => (None, None, Some(e.to_string())),
    };
    HeldAnswer { kind: "udp".into(), to: to.to_string(), peer, pod, error }
}

/// One new connection to `to`, asked once.
fn once(to: SocketAddr) -> HeldAnswer {
    match TcpStream::connect_timeout(&to, Duration::from_millis(1500)) {
        Ok(mut s) => tcp_answer(to, &mut s),
        Err(e) => HeldAnswer {
            kind: "tcp".into(),
            to: to.to_string(),
            peer: None,
            pod: None,
            error: Some(e.to_string()),
        },
    }
}

/// `tierlb-lab hold`: open the held sockets, print `ready`, start the stream (a new connection to each of
/// `stream` every `interval`), then answer each stdin line with a `Round` as JSON (a line `connect ADDR` also
/// makes one new connection to ADDR) until stdin closes.
///
/// # Errors
/// Opening a held socket, or writing to stdout.
pub fn serve(
    tcp: &[SocketAddr],
    udp: &[SocketAddr],
    stream: &[SocketAddr],
    interval: Duration,
) -> anyhow::Result<()> {
    let mut held_tcp = Vec::new();
    for &to in tcp {
        held_tcp.push((
            to,
            TcpStream::connect_timeout(&to, Duration::from_secs(3)).with_context(|| format!("{to}"))?,
        ));
    }
    let mut held_udp = Vec::new();
    for &to in udp {
        let u = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
        u.connect(to)?;
        u.set_read_timeout(Some(Duration::from_secs(2)))?;
        held_udp.push((to, u));
    }
    let tallies: Arc<Mutex<BTreeMap<String, BTreeMap<String, usize>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let streamer = {
        let (tallies, stop, stream) = (tallies.clone(), stop.clone(), stream.to_vec());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for &to in &stream {
                    let a = once(to);
                    let what = a.pod.unwrap_or_else(|| format!("error: {}", a.error.unwrap_or_default()));
                    let mut t = tallies.lock().expect("tallies");
                    *t.entry(to.to_string()).or_default().entry(what).or_insert(0) += 1;
                }
                std::thread::sleep(interval);
            }
        })
    };
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut round = Round::default();
        if let Some(addr) = line.strip_prefix("connect ") {
            round.once = Some(once(addr.trim().parse().context("connect ADDR")?));
        }
        round.held.extend(held_tcp.iter_mut().map(|(to, s)| tcp_answer(*to, s)));
        round.held.extend(held_udp.iter().map(|(to, u)| udp_answer(*to, u)));
        round.connects = tallies.lock().expect("tallies").clone();
        writeln!(out, "{}", serde_json::to_string(&round)?)?;
        out.flush()?;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = streamer.join();
    Ok(())
}

/// A running `tierlb-lab hold`, in a node's network namespace and its agent's cgroup. Ends (stdin closed,
/// then killed) on drop.
pub struct Hold {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Hold {
    /// Start `tierlb-lab hold` in `netns` (and `cgroup`, a node agent's, for a pod's clients; none for a
    /// client outside the node), holding `tcp` and `udp` and streaming new connections to `stream` every
    /// `interval`; returns once its sockets are open.
    pub fn start(
        cgroup: Option<&Cgroup>,
        netns: &NetNs,
        tcp: &[SocketAddr],
        udp: &[SocketAddr],
        stream: &[SocketAddr],
        interval: Duration,
    ) -> anyhow::Result<Self> {
        let list = |a: &[SocketAddr]| a.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        let mut cmd = Command::new(crate::workspace_bin("tierlb-lab", "lb-lab"));
        cmd.args(["hold", "--tcp", &list(tcp), "--udp", &list(udp), "--stream", &list(stream)])
            .args(["--interval-ms", &interval.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        confine(&mut cmd, cgroup, Some(netns))?;
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("hold's stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "tierlb-lab hold did not start: {line:?}");
        Ok(Self { child, stdin, stdout })
    }

    /// Ask every held socket once (and, with `connect`, make one new connection there); the stream's
    /// tallies so far.
    pub fn round(&mut self, connect: Option<SocketAddr>) -> anyhow::Result<Round> {
        let stdin = self.stdin.as_mut().context("hold ended")?;
        match connect {
            Some(a) => writeln!(stdin, "connect {a}")?,
            None => writeln!(stdin)?,
        }
        stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        serde_json::from_str(&line).with_context(|| format!("hold's answer {line:?}"))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        drop(self.stdin.take());
        for _ in 0..50 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
