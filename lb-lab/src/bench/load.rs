//! The load generator: `tierlb-lab load` runs [`load`] (confined to a cgroup and the bench's netns) against
//! a target and prints a [`LoadResult`]; [`Sink`] is the backend it talks to.
use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use lb_testkit::{churn::rst_close, sandbox::NetNs};

/// What one load run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadResult {
    /// Operations completed inside the window.
    pub ops: u64,
    /// Operations that failed (connect, send or receive), over the whole run.
    pub errors: u64,
    /// The window's length, from the threads' start to the stop signal.
    pub secs: f64,
    /// Median latency of a completed operation, in microseconds.
    pub p50_us: f64,
    /// First quartile of the latency, in microseconds (beside the median, a check that a ratio is the
    /// path's and not the share of operations in two latency modes: see [`Placement`]).
    #[serde(default)]
    pub p25_us: f64,
    /// 99th percentile latency, in microseconds.
    pub p99_us: f64,
    /// Throughput: `ops / secs`.
    pub per_sec: f64,
    /// Operations that took over 100 ms (a dropped SYN costs a 1 s retransmit).
    #[serde(default)]
    pub slow: u64,
}

/// What one operation of the load client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LoadMode {
    /// connect() then close (RST): the cost of the translation itself.
    Connect,
    /// connect(), send a 64-byte request, read the 64-byte reply, close (RST): a short RPC.
    Rr,
}

impl LoadMode {
    /// Every mode, in the order the bench runs, tabulates and charts them.
    pub const ALL: [Self; 2] = [Self::Connect, Self::Rr];

    /// The mode's name on the command line (`--mode`) and in chart file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Rr => "rr",
        }
    }

    /// What one operation is, as the report's section headings and chart captions say it.
    pub fn title(self) -> String {
        match self {
            Self::Connect => "connect() + close".into(),
            Self::Rr => format!("connect, {RR_BYTES} B request, {RR_BYTES} B reply, close"),
        }
    }
}

/// Size of the request and of the reply in `LoadMode::Rr`.
pub const RR_BYTES: usize = 64;

/// One operation; the latency recorded is the whole of it.
fn operation(target: SocketAddr, mode: LoadMode) -> std::io::Result<()> {
    // Bounded: a lost SYN or reply is an error after a few seconds, not a row that never ends.
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(3))?;
    rst_close(&s);
    if mode == LoadMode::Rr {
        use std::io::{Read as _, Write as _};
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(&[b'q'; RR_BYTES])?;
        let mut reply = [0u8; RR_BYTES];
        s.read_exact(&mut reply)?;
    }
    Ok(())
}

/// An operation at least this long (nanoseconds) is counted as slow: a SYN retransmit, a stall.
const SLOW_NS: u64 = 100_000_000;

/// A histogram of operation latencies in nanoseconds, 1 ns to 10 s, to 3 significant digits: a p50 of about
/// 10 us is read to 10 ns, so a ratio to direct's is resolved to 0.1%, not to the 10% steps whole
/// microseconds would give.
fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("bounds")
}

/// Where the bench's load runs: one client thread on one CPU, the backend's threads on another. With two
/// client threads and the backend's two sharing this VM's two CPUs, a connect's latency had two modes (about
/// 25 and 40 us) whose share moved from one second to the next, and the median sat between them: one pair's
/// ratio ranged from 0.64x to 1.67x. With one client thread it has one mode, held to CPUs or not (middle half
/// of the pairs 1.02-1.03x); holding them keeps the placement the same from run to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The CPU the load client's threads are held to.
    pub client: Option<usize>,
    /// The CPU the backend's threads are held to.
    pub backend: Option<usize>,
}

impl Placement {
    /// The first two CPUs this process may run on, the client's and the backend's; none if it has one.
    pub fn split() -> Self {
        match allowed_cpus()[..] {
            [client, backend, ..] => Self { client: Some(client), backend: Some(backend) },
            _ => Self::default(),
        }
    }

    /// Where the client and the backend ran, as BENCHMARKS.md's method sentence says it (nothing if nowhere
    /// in particular).
    pub(super) fn in_words(self) -> String {
        match (self.client, self.backend) {
            (Some(c), Some(b)) => format!(
                "; held to CPU {c} and the backend's threads to CPU {b}, because with two client threads \
                 sharing the CPUs with the backend's a connect's latency had two modes, whose share moved from \
                 second to second, and the median sat between them"
            ),
            _ => String::new(),
        }
    }
}

/// The CPUs this process may run on (its affinity), in order; none if it cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else { return Vec::new() };
    (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect()
}

/// Hold the calling thread to `cpu` (nothing if `None`).
fn pin(cpu: Option<usize>) -> std::io::Result<()> {
    let Some(cpu) = cpu else { return Ok(()) };
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)).map_err(
        |e| {
            std::io::Error::other(format!(
                "cannot hold a thread to CPU {cpu} (allowed: {:?}): {e}",
                allowed_cpus()
            ))
        },
    )
}

/// `mode` operations against `target` on `threads` threads, held to `cpu` if given, for `duration` (the load
/// client, run confined).
pub fn load(
    target: SocketAddr,
    threads: usize,
    cpu: Option<usize>,
    duration: Duration,
    mode: LoadMode,
) -> std::io::Result<LoadResult> {
    pin(cpu)?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    // Threads inherit the creating thread's CPUs.
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut h = histogram();
                let mut errors = 0u64;
                let mut in_window = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    match operation(target, mode) {
                        Ok(()) => {
                            h.saturating_record((t0.elapsed().as_nanos() as u64).max(1));
                            if !stop.load(Ordering::Relaxed) {
                                in_window += 1;
                            }
                        }
                        Err(e) => {
                            errors += 1;
                            if errors == 1 {
                                eprintln!("load: first error: {e}");
                            }
                        }
                    }
                }
                (h, errors, in_window)
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    // Throughput counts what completed inside the window; a straggler stuck in a SYN retransmit past the end
    // shows in `slow` and the tail, not as a longer window.
    let secs = start.elapsed().as_secs_f64();
    let mut all = histogram();
    let (mut errors, mut ops) = (0, 0);
    for h in handles {
        let (hist, e, n) = h.join().expect("load thread");
        all.add(hist).expect("same bounds");
        errors += e;
        ops += n;
    }
    Ok(LoadResult {
        ops,
        errors,
        secs,
        p50_us: all.value_at_quantile(0.5) as f64 / 1e3,
        p25_us: all.value_at_quantile(0.25) as f64 / 1e3,
        p99_us: all.value_at_quantile(0.99) as f64 / 1e3,
        per_sec: ops as f64 / secs,
        slow: all.count_between(SLOW_NS, u64::MAX),
    })
}

/// The paced load client (`tierlb-lab load --paced`): one run of `slice` per line read on stdin, each run's
/// result printed as a line of JSON as it ends, until stdin closes. The bench keeps two of these (direct and
/// tierlb) and alternates them slice by slice, so the two sides of a ratio are measured within a fraction of
/// a second of each other.
pub fn paced(
    target: SocketAddr,
    threads: usize,
    cpu: Option<usize>,
    slice: Duration,
    mode: LoadMode,
) -> std::io::Result<()> {
    use std::io::{BufRead as _, Write as _};
    let mut out = std::io::stdout().lock();
    // Once: each slice's threads inherit this thread's CPUs.
    pin(cpu)?;
    for line in std::io::stdin().lock().lines() {
        line?;
        let r = load(target, threads, None, slice, mode)?;
        writeln!(out, "{}", serde_json::to_string(&r).map_err(std::io::Error::other)?)?;
        out.flush()?;
    }
    Ok(())
}

/// A backend on two threads (held to one CPU if given): it accepts, answers a request with a reply of
/// `RR_BYTES` (a client that sends nothing and resets, as in `LoadMode::Connect`, costs it one failed read),
/// waits for the client to close and resets. Stops on drop.
pub(super) struct Sink {
    /// Tells the accept loops to end.
    stop: Arc<AtomicBool>,
    /// The listening socket, shut down on drop to wake the blocked accept() calls.
    fd: i32,
    /// The accept loops.
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Sink {
    /// Listen on `addr` inside `ns` and start serving, on `cpu` if given.
    pub(super) fn start(ns: &NetNs, addr: SocketAddr, cpu: Option<usize>) -> anyhow::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let file = ns.file().try_clone()?;
        std::thread::spawn(move || {
            let r = nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(anyhow::Error::from)
                .and_then(|()| TcpListener::bind(addr).map_err(anyhow::Error::from));
            let _ = tx.send(r);
        });
        let listener = Arc::new(rx.recv()??);
        // std listens with a backlog of 128; a deeper queue keeps bursts from dropping SYNs.
        // SAFETY: listen(2) on our own listening socket only updates its backlog.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        let stop = Arc::new(AtomicBool::new(false));
        let (pinned_tx, pinned) = std::sync::mpsc::channel();
        let threads = (0..2)
            .map(|_| {
                let (l, stop, pinned_tx) = (listener.clone(), stop.clone(), pinned_tx.clone());
                std::thread::spawn(move || {
                    let held = pin(cpu);
                    let failed = held.is_err();
                    let _ = pinned_tx.send(held);
                    while !failed && !stop.load(Ordering::Relaxed) {
                        if let Ok((s, _)) = l.accept() {
                            rst_close(&s);
                            serve(s);
                        }
                    }
                })
            })
            .collect();
        let sink = Self { stop, fd: listener.as_raw_fd(), threads };
        // Not measured on other CPUs than the report says: a thread that could not be held ends the run.
        for _ in 0..sink.threads.len() {
            pinned.recv()?.context("the backend's threads")?;
        }
        Ok(sink)
    }
}

/// One connection of the sink: reply to a request, then wait for the client's close.
fn serve(mut s: TcpStream) {
    use std::io::{Read as _, Write as _};
    // A client that vanished must not hold a sink thread.
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_nodelay(true);
    let mut request = [0u8; RR_BYTES];
    if s.read_exact(&mut request).is_ok() && s.write_all(&[b'r'; RR_BYTES]).is_ok() {
        let _ = s.read(&mut request);
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // SAFETY: wakes the blocked accept() calls; the listener lives until the threads end.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Where the backend listens: the pod IP of the measured Service's one endpoint.
pub(super) const BACKEND: &str = "10.244.0.10:8080";

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's and the backend's CPUs are two different ones this process may run on (on a machine of
    /// one CPU, neither is held).
    #[test]
    fn the_client_and_the_backend_get_two_allowed_cpus() {
        let allowed = allowed_cpus();
        let p = Placement::split();
        match (p.client, p.backend) {
            (Some(c), Some(b)) => {
                assert!(c != b, "{p:?}");
                assert!(allowed.contains(&c) && allowed.contains(&b), "{p:?} of {allowed:?}");
            }
            _ => assert_eq!((allowed.len(), p), (1, Placement::default())),
        }
    }

    /// A backend whose threads cannot be held to the CPU asked for does not start (the report would name a
    /// placement the run did not have), and ends the threads it started.
    #[test]
    fn a_backend_that_cannot_be_held_to_its_cpu_does_not_start() {
        let ns = NetNs::new("bench-test").unwrap();
        let backend: SocketAddr = BACKEND.parse().unwrap();
        ns.add_address(backend.ip()).unwrap();
        let err = Sink::start(&ns, backend, Some(nix::sched::CpuSet::count())).map(drop).unwrap_err();
        assert!(format!("{err:#}").contains("the backend's threads: cannot hold a thread to CPU"), "{err:#}");
        // The address is free again: the failed backend's listener is closed.
        drop(Sink::start(&ns, backend, Placement::split().backend).unwrap());
    }

    /// The load tool and the backend speak both modes: every operation completes, none fails. (Runs as
    /// root, in a private netns with only `lo`.)
    #[test]
    fn the_load_tool_completes_both_modes_against_the_backend() {
        let ns = NetNs::new("bench-test").unwrap();
        let backend: SocketAddr = BACKEND.parse().unwrap();
        ns.add_address(backend.ip()).unwrap();
        let cpus = Placement::split();
        let _sink = Sink::start(&ns, backend, cpus.backend).unwrap();
        for mode in LoadMode::ALL {
            let file = ns.file().try_clone().unwrap();
            // Threads inherit the network namespace of the thread that creates them.
            let r = std::thread::spawn(move || {
                nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap();
                load(backend, 2, cpus.client, Duration::from_millis(300), mode).unwrap()
            })
            .join()
            .unwrap();
            assert!(r.ops > 50 && r.errors == 0, "{mode:?}: {r:?}");
            assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{mode:?}: {r:?}");
        }
    }
}
