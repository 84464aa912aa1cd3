//! `cargo xtask bench`: connect() cost through tierlb against direct connects and kube-proxy-style iptables
//! and nftables rules, at several Service counts, in one run inside a private netns; and control-plane
//! figures (programming 10,000 Services, one change, agent memory, rule-set load times).
use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use lb_common::{Backend, FrontendKey, FrontendValue, SlotKey};
use lb_testkit::{
    manifests,
    sandbox::{Cgroup, Child, NetNs, TempDir, confine},
};
use tierlb::{
    datapath::{Desired, DesiredFrontend, Reconciler, addr, ebpf::Loaded},
    model::{ObjKey, ServicePortName},
};

/// Close with RST (SO_LINGER 0) when the socket is dropped: no TIME_WAIT on either side, so neither the
/// client's ephemeral ports nor the server's 4-tuples pile up (a server-side TIME_WAIT hit by a reused
/// client port costs the next SYN a 1 s retransmit).
fn rst_close(s: &impl std::os::fd::AsRawFd) {
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

/// What one load run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadResult {
    pub ops: u64,
    pub errors: u64,
    pub secs: f64,
    pub p50_us: f64,
    pub p99_us: f64,
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
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Rr => "rr",
        }
    }
}

/// Size of the request and of the reply in `LoadMode::Rr`.
pub const RR_BYTES: usize = 64;

/// One operation; the latency recorded is the whole of it.
fn operation(target: SocketAddr, mode: LoadMode) -> std::io::Result<()> {
    let mut s = TcpStream::connect(target)?;
    rst_close(&s);
    if mode == LoadMode::Rr {
        use std::io::{Read as _, Write as _};
        s.set_nodelay(true)?;
        s.write_all(&[b'q'; RR_BYTES])?;
        let mut reply = [0u8; RR_BYTES];
        s.read_exact(&mut reply)?;
    }
    Ok(())
}

/// `mode` operations against `target` on `threads` threads for `duration` (the load client, run confined).
pub fn load(target: SocketAddr, threads: usize, duration: Duration, mode: LoadMode) -> LoadResult {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut h =
                    hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).expect("bounds");
                let mut errors = 0u64;
                let mut in_window = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    match operation(target, mode) {
                        Ok(()) => {
                            h.saturating_record(t0.elapsed().as_nanos() as u64 / 1000 + 1);
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
    let mut all = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).expect("bounds");
    let (mut errors, mut ops) = (0, 0);
    for h in handles {
        let (hist, e, n) = h.join().expect("load thread");
        all.add(hist).expect("same bounds");
        errors += e;
        ops += n;
    }
    LoadResult {
        ops,
        errors,
        secs,
        p50_us: all.value_at_quantile(0.5) as f64,
        p99_us: all.value_at_quantile(0.99) as f64,
        per_sec: ops as f64 / secs,
        slow: all.count_between(100_000, u64::MAX),
    }
}

/// A backend on two threads: it accepts, answers a request with a reply of `RR_BYTES` (a client that sends
/// nothing and resets, as in `LoadMode::Connect`, costs it one failed read), waits for the client to close
/// and resets. Stops on drop.
struct Sink {
    stop: Arc<AtomicBool>,
    fd: i32,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Sink {
    fn start(ns: &NetNs, addr: SocketAddr) -> anyhow::Result<Self> {
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
        let threads = (0..2)
            .map(|_| {
                let (l, stop) = (listener.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((s, _)) = l.accept() {
                            rst_close(&s);
                            serve(s);
                        }
                    }
                })
            })
            .collect();
        Ok(Self { stop, fd: listener.as_raw_fd(), threads })
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

const BACKEND: &str = "10.244.0.10:8080";

/// The VIP of Service `i` (10.96.0.10 and up).
fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i as u32)
}

/// The measured Service of a set of `n`: in the middle, where a linear rule walk (iptables' KUBE-SERVICES)
/// meets it on average; hash lookups do not care.
fn target(n: usize) -> usize {
    n / 2
}

/// Service `i`'s endpoints; only the target's exists (the others are never connected to).
fn endpoints(i: usize, per: usize, n: usize) -> Vec<SocketAddr> {
    if i == target(n) {
        return vec![BACKEND.parse().expect("valid")];
    }
    (0..per).map(|e| SocketAddr::new(endpoint_ip(i, per, e).into(), 8080)).collect()
}

/// The address of endpoint `e` of Service `i` with `per` endpoints each (10.200.0.0 and up).
fn endpoint_ip(i: usize, per: usize, e: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + (i * per + e) as u32)
}

fn desired(services: usize, per: usize) -> Desired {
    (0..services)
        .map(|i| {
            let b: Vec<_> = endpoints(i, per, services).into_iter().map(|a| addr::backend(a, 6)).collect();
            (
                addr::frontend_key(IpAddr::V4(vip(i)), 80, 6),
                DesiredFrontend {
                    name: ServicePortName::new(ObjKey::new("bench", format!("svc-{i}")), ""),
                    tiers: [Vec::new(), Vec::new(), b],
                    flags: 0,
                },
            )
        })
        .collect()
}

/// kube-proxy's iptables layout: KUBE-SERVICES -> KUBE-SVC-* (statistic random) -> KUBE-SEP-* DNAT.
pub fn iptables_rules(services: usize, per: usize) -> String {
    let mut s = String::from("*nat\n:KUBE-SERVICES - [0:0]\n");
    let mut rules = String::new();
    for i in 0..services {
        let svc = format!("KUBE-SVC-{i:012X}");
        let _ = writeln!(s, ":{svc} - [0:0]");
        let _ = writeln!(rules, "-A KUBE-SERVICES -d {}/32 -p tcp -m tcp --dport 80 -j {svc}", vip(i));
        let eps = endpoints(i, per, services);
        for (e, a) in eps.iter().enumerate() {
            let sep = format!("KUBE-SEP-{i:08X}{e:04X}");
            let _ = writeln!(s, ":{sep} - [0:0]");
            let left = eps.len() - e;
            if left > 1 {
                let p = 1.0 / left as f64;
                let _ = writeln!(rules, "-A {svc} -m statistic --mode random --probability {p:.11} -j {sep}");
            } else {
                let _ = writeln!(rules, "-A {svc} -j {sep}");
            }
            let _ = writeln!(rules, "-A {sep} -p tcp -m tcp -j DNAT --to-destination {a}");
        }
    }
    s.push_str(&rules);
    s.push_str("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n");
    s.replace("-A OUTPUT", ":OUTPUT ACCEPT [0:0]\n-A OUTPUT")
}

/// kube-proxy's nftables layout: a verdict map from VIP . port to a per-Service chain that picks an
/// endpoint with `numgen random`.
pub fn nft_rules(services: usize, per: usize) -> String {
    let mut s = String::from("table ip kube-proxy {\n");
    let mut elems = Vec::new();
    for i in 0..services {
        let eps = endpoints(i, per, services);
        let map: Vec<String> =
            eps.iter().enumerate().map(|(e, a)| format!("{e} : {} . {}", a.ip(), a.port())).collect();
        let _ = writeln!(
            s,
            "  chain svc-{i} {{\n    meta l4proto tcp dnat ip addr . port to numgen random mod {} map {{ {} }}\n  }}",
            eps.len(),
            map.join(", ")
        );
        elems.push(format!("{} . tcp . 80 : goto svc-{i}", vip(i)));
    }
    let _ = writeln!(
        s,
        "  map service-ips {{\n    type ipv4_addr . inet_proto . inet_service : verdict\n    elements = {{ {} }}\n  }}",
        elems.join(", ")
    );
    s.push_str("  chain output {\n    type nat hook output priority -100; policy accept;\n    ip daddr . meta l4proto . th dport vmap @service-ips\n  }\n}\n");
    s
}

/// Feed `input` to `cmd` and time it; `Ok(None)` if it did not finish within `limit` (it is then killed).
fn timed(cmd: &mut Command, input: &str, limit: Duration) -> anyhow::Result<Option<Duration>> {
    let t0 = Instant::now();
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let input = input.to_owned();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, input.as_bytes()));
    loop {
        if let Some(status) = child.try_wait()? {
            let _ = writer.join();
            if !status.success() {
                bail!("{cmd:?} failed ({status})");
            }
            return Ok(Some(t0.elapsed()));
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let _ = writer.join();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long a rule set may take to load before the row is reported as not loaded.
const LOAD_LIMIT: Duration = Duration::from_secs(600);

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub path: String,
    pub services: usize,
    pub mode: LoadMode,
    pub result: LoadResult,
    /// BPF run time per connect4 call (kernel.bpf_stats_enabled), tierlb rows only.
    pub bpf_ns_per_run: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub kernel: String,
    pub cpus: usize,
    pub threads: usize,
    pub seconds: f64,
    pub rows: Vec<Row>,
    pub control: Vec<(String, String)>,
}

const MODES: [LoadMode; 2] = [LoadMode::Connect, LoadMode::Rr];

/// The load side of the bench: the client binary, the namespace and the run length.
struct Loader<'a> {
    lab: &'a Path,
    ns: &'a NetNs,
    threads: usize,
    secs: f64,
}

impl Loader<'_> {
    fn run(&self, cg: Option<&Cgroup>, target: SocketAddr, mode: LoadMode) -> anyhow::Result<LoadResult> {
        let mut cmd = Command::new(self.lab);
        confine(&mut cmd, cg, Some(self.ns))?;
        cmd.args([
            "load",
            "--target",
            &target.to_string(),
            "--mode",
            mode.as_str(),
            "--threads",
            &self.threads.to_string(),
            "--seconds",
            &self.secs.to_string(),
        ]);
        let out = cmd.stderr(Stdio::inherit()).output()?;
        anyhow::ensure!(out.status.success(), "load client failed");
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// One row per load mode for a data path at `services` Services.
    fn rows(
        &self,
        path: &str,
        services: usize,
        cg: Option<&Cgroup>,
        target: SocketAddr,
    ) -> anyhow::Result<Vec<Row>> {
        let mut rows = Vec::new();
        for mode in MODES {
            let before = cg.and_then(|_| connect4_stats());
            let result = self.run(cg, target, mode)?;
            let after = cg.and_then(|_| connect4_stats());
            let bpf_ns_per_run = match (before, after) {
                (Some((t0, c0)), Some((t1, c1))) if c1 > c0 => Some((t1 - t0) as f64 / (c1 - c0) as f64),
                _ => None,
            };
            let r = Row { path: path.into(), services, mode, result, bpf_ns_per_run };
            eprintln!(
                "bench: {:<9} {:>6} services  {:<7}  p50 {:>6.1} us  p99 {:>7.1} us  {:>8.0} ops/s  {} errors  {} slow{}",
                r.path,
                r.services,
                r.mode.as_str(),
                r.result.p50_us,
                r.result.p99_us,
                r.result.per_sec,
                r.result.errors,
                r.result.slow,
                r.bpf_ns_per_run.map(|n| format!("  connect4 {n:.0} ns/run")).unwrap_or_default()
            );
            rows.push(r);
        }
        Ok(rows)
    }
}

fn connect4_stats() -> Option<(u64, u64)> {
    let out = Command::new("bpftool").args(["prog", "show", "name", "connect4", "--json"]).output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let items = if v.is_array() { v.as_array()?.clone() } else { vec![v] };
    items
        .iter()
        // bpftool leaves both out while they are zero.
        .map(|p| (p["run_time_ns"].as_u64().unwrap_or(0), p["run_cnt"].as_u64().unwrap_or(0)))
        .max_by_key(|x| x.1)
}

/// A kube-proxy-style rule set: how to load it and how to remove it again.
struct RuleSet {
    path: &'static str,
    tool: &'static str,
    load: &'static [&'static str],
    flush: &'static [&'static [&'static str]],
    rules: fn(usize, usize) -> String,
}

const RULE_SETS: [RuleSet; 2] = [
    RuleSet {
        path: "iptables",
        tool: "iptables-restore",
        load: &["iptables-restore", "-w"],
        flush: &[&["iptables", "-t", "nat", "-F"], &["iptables", "-t", "nat", "-X"]],
        rules: iptables_rules,
    },
    RuleSet {
        path: "nftables",
        tool: "nft -f",
        load: &["nft", "-f", "-"],
        flush: &[&["nft", "flush", "ruleset"]],
        rules: nft_rules,
    },
];

/// Run the whole benchmark. `quick`: fewer Service counts and shorter runs.
pub fn run(lab: &Path, tierlb: &Path, quick: bool) -> anyhow::Result<Report> {
    let counts: &[usize] = if quick { &[1, 10_000] } else { &[1, 1_000, 10_000, 50_000] };
    let per = 10;
    let ns = NetNs::new("bench")?;
    let loader = Loader { lab, ns: &ns, threads: 2, secs: if quick { 1.5 } else { 4.0 } };
    let backend: SocketAddr = BACKEND.parse()?;
    ns.add_address(backend.ip())?;
    // kube-proxy nodes route the Service range somewhere; without a route, locally generated packets to a VIP
    // fail before the nat OUTPUT chain could DNAT them. Inside this namespace only.
    ns.ip(&["route", "add", "10.96.0.0/12", "dev", "lo"])?;
    let _sink = Sink::start(&ns, backend)?;
    let mut rows = loader.rows("direct", 0, None, backend)?;

    // tierlb: the data path loaded in this process, attached to a bench cgroup, maps filled directly.
    let mut control = Vec::new();
    {
        let cg = Cgroup::new("bench")?;
        let caps =
            tierlb::datapath::ebpf::Capacities { services: 60_000, slots: 1_200_000, ..Default::default() };
        let Loaded { mut programs, maps } = Loaded::load(caps, None)?;
        let mut rec = Reconciler::new(maps);
        programs.attach(cg.path(), None)?;
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
        for &n in counts {
            let d = desired(n, per);
            let t0 = Instant::now();
            let rep = rec.apply(&d, Instant::now());
            anyhow::ensure!(rep.errors.is_empty(), "{:?}", rep.errors.first().map(ToString::to_string));
            let took = t0.elapsed();
            if n == 10_000 {
                control.push((
                    "program 10,000 Services x 10 endpoints into the maps (from scratch)".into(),
                    format!("{:.0} ms", took.as_secs_f64() * 1e3),
                ));
                control.push(one_change_in_the_maps(&mut rec, &d)?);
            }
            rows.extend(loader.rows(
                "tierlb",
                n,
                Some(&cg),
                SocketAddr::new(IpAddr::V4(vip(target(n))), 80),
            )?);
        }
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0");
        let slots: usize = rec.applied().map(|(_, _, d)| d.tiers.iter().map(Vec::len).sum::<usize>()).sum();
        // A hash map entry is its key and value plus about 16 bytes of the kernel's element header.
        const HASH_OVERHEAD: usize = 16;
        let map_bytes = slots * (size_of::<SlotKey>() + size_of::<Backend>() + HASH_OVERHEAD)
            + rec.applied().count() * (size_of::<FrontendKey>() + size_of::<FrontendValue>() + HASH_OVERHEAD);
        control.push((
            format!(
                "map memory for {} Services x 10 endpoints (keys + values + hash overhead, estimate)",
                counts.last().copied().unwrap_or_default()
            ),
            format!("{:.1} MiB", map_bytes as f64 / 1048576.0),
        ));
        drop(programs);
    }

    // The agent itself with 10,000 Services from manifests: time to ready, one change, RSS.
    match agent_figures(tierlb, per) {
        Ok(r) => control.extend(r),
        Err(e) => eprintln!("bench: agent figures: {e:#}"),
    }

    for set in &RULE_SETS {
        for &n in counts {
            let exec = |args: &[&str]| {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", ns.name()]).args(args);
                cmd
            };
            let flush = || {
                for f in set.flush {
                    let _ = exec(f).status();
                }
            };
            let took = timed(&mut exec(set.load), &(set.rules)(n, per), LOAD_LIMIT)
                .with_context(|| format!("loading {} rules ({} installed?)", set.path, set.tool))?;
            let Some(took) = took else {
                eprintln!(
                    "bench: {} {n} services: {} did not load the rules within {LOAD_LIMIT:?}",
                    set.path, set.tool
                );
                control.push((
                    format!("load {n} Services x 10 endpoints with {}", set.tool),
                    format!("not done within {} s (stopped)", LOAD_LIMIT.as_secs()),
                ));
                flush();
                continue;
            };
            if n >= 10_000 {
                control.push((
                    format!("load {n} Services x 10 endpoints with {}", set.tool),
                    format!("{:.2} s", took.as_secs_f64()),
                ));
            }
            rows.extend(loader.rows(set.path, n, None, SocketAddr::new(IpAddr::V4(vip(target(n))), 80))?);
            flush();
        }
    }
    let kernel = tierlb::datapath::ebpf::kernel_version().map(|k| k.2).unwrap_or_default();
    Ok(Report {
        kernel,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        threads: loader.threads,
        seconds: loader.secs,
        rows,
        control,
    })
}

/// One EndpointSlice change at the map level: the changed Service's frontends only (what the agent hands
/// the reconciler after an edit), then back to `d`.
fn one_change_in_the_maps(
    rec: &mut Reconciler<tierlb::datapath::ebpf::KernelMaps>,
    d: &Desired,
) -> anyhow::Result<(String, String)> {
    let k = addr::frontend_key(IpAddr::V4(vip(EDITED)), 80, 6);
    let mut want = d.get(&k).context("the edited Service is programmed")?.clone();
    want.tiers[2].pop();
    let service = want.name.service.clone();
    let one: Desired = [(k, want)].into_iter().collect();
    let t1 = Instant::now();
    let rep = rec.apply_services([&service], &one, Instant::now());
    let took = t1.elapsed();
    anyhow::ensure!(rep.updated == 1 && rep.errors.is_empty(), "one change: {rep:?}");
    rec.apply(d, Instant::now());
    Ok((
        "apply one EndpointSlice change at 10,000 Services, map writes (new slots, frontend swap)".into(),
        format!("{:.3} ms", took.as_secs_f64() * 1e3),
    ))
}

/// The Service whose EndpointSlice the one-change figures edit (in the agent's manifests, in a file of its
/// own: a changed EndpointSlice is one object).
const EDITED: usize = 1234;

fn agent_figures(tierlb: &Path, per: usize) -> anyhow::Result<Vec<(String, String)>> {
    let dir = TempDir::new("bench-agent")?;
    let service = |i: usize, endpoints: usize| {
        let svc = manifests::Svc::new(&format!("svc-{i}"), IpAddr::V4(vip(i)), 80, 8080);
        let eps: Vec<_> = (0..endpoints)
            .map(|e| {
                manifests::Ep::ready(
                    IpAddr::V4(endpoint_ip(i, per, e)),
                    if e % 3 == 0 { "node-1" } else { "node-2" },
                )
            })
            .collect();
        let mut docs = vec![svc.service()];
        docs.extend(svc.slices(&eps));
        manifests::to_yaml(&docs)
    };
    // 100 files of 100 Services, and the edited one alone.
    for f in 0..100 {
        let text: Vec<String> =
            (f * 100..(f + 1) * 100).filter(|i| *i != EDITED).map(|i| service(i, per)).collect();
        std::fs::write(dir.path().join(format!("services-{f:03}.yaml")), text.join("---\n"))?;
    }
    let edited = "edited.yaml";
    manifests::write_atomic(dir.path(), edited, &service(EDITED, per))?;
    let cg = Cgroup::new("bench-agent")?;
    let log = dir.path().join(".agent.log");
    let t0 = Instant::now();
    let mut child = Child::spawn(
        Command::new(tierlb)
            .args(["agent", "--node", "node-1", "--log-format", "json", "--manifests"])
            .arg(dir.path())
            .arg("--cgroup")
            .arg(cg.path())
            .args(["--healthz-addr", "off", "--metrics-addr", "off", "--service-health-bind", "off"])
            .env("NO_COLOR", "1")
            .stderr(std::fs::File::create(&log)?),
    )?;
    let synced = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["fields"]["message"] == "synced")
            .map(|v| v["fields"].clone())
            .collect()
    };
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("tierlb agent ready") {
        if t0.elapsed() > Duration::from_secs(120) || matches!(child.inner().try_wait(), Ok(Some(_))) {
            bail!("agent did not start: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ready = t0.elapsed();
    // One EndpointSlice edit at a time: an endpoint leaves, then comes back.
    let mut took_us = Vec::new();
    let mut wall_ms = Vec::new();
    for k in 0..20 {
        let before = synced().len();
        let t = Instant::now();
        manifests::write_atomic(
            dir.path(),
            edited,
            &service(EDITED, if k % 2 == 0 { per - 1 } else { per }),
        )?;
        let line = loop {
            if let Some(v) = synced().get(before) {
                break v.clone();
            }
            anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "the agent did not sync edit {k}");
            std::thread::sleep(Duration::from_micros(500));
        };
        wall_ms.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(line["replanned"] == 1 && line["updated"] == 1, "edit {k}: {line}");
        took_us.push(line["took_us"].as_f64().context("took_us")?);
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.pid()))?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ? kB")
        .trim_start_matches("VmRSS:")
        .trim()
        .to_owned();
    drop(child);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (took_p50, took_max) = median(&mut took_us);
    let (wall_p50, wall_max) = median(&mut wall_ms);
    Ok(vec![
        (
            "agent start to ready with 10,000 Services x 10 endpoints (parse 101 manifest files, plan, load, program)"
                .into(),
            format!("{:.2} s", ready.as_secs_f64()),
        ),
        (
            "agent: one EndpointSlice edit at 10,000 Services, from reading the change to maps written (20 edits, the agent's took_us)".into(),
            format!("median {:.2} ms, max {:.2} ms", took_p50 / 1e3, took_max / 1e3),
        ),
        (
            "agent: the same edits from the file write to the synced log line (inotify, 5 ms batching of an editor's writes, sync)".into(),
            format!("median {wall_p50:.1} ms, max {wall_max:.1} ms"),
        ),
        ("agent RSS with 10,000 Services x 10 endpoints".into(), rss),
    ])
}

/// The data paths, in table and chart order, with their chart colours.
const PATHS: [(&str, plotters::style::RGBColor); 4] = [
    ("direct", plotters::style::RGBColor(60, 60, 60)),
    ("tierlb", plotters::style::RGBColor(31, 119, 180)),
    ("iptables", plotters::style::RGBColor(214, 39, 40)),
    ("nftables", plotters::style::RGBColor(44, 160, 44)),
];

fn row<'a>(r: &'a Report, path: &str, services: usize, mode: LoadMode) -> Option<&'a Row> {
    r.rows.iter().find(|x| x.path == path && x.mode == mode && (x.services == services || path == "direct"))
}

/// The charts `--report` writes: (file name under bench/, SVG).
pub fn charts(r: &Report) -> anyhow::Result<Vec<(String, String)>> {
    MODES.iter().map(|m| Ok((format!("latency-{}.svg", m.as_str()), latency_chart(r, *m)?))).collect()
}

fn mode_title(mode: LoadMode) -> String {
    match mode {
        LoadMode::Connect => "connect() + close".into(),
        LoadMode::Rr => format!("connect, {RR_BYTES} B request, {RR_BYTES} B reply, close"),
    }
}

/// p50 latency against the number of Services (log scale) for each data path, with direct as the floor.
fn latency_chart(r: &Report, mode: LoadMode) -> anyhow::Result<String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let of = |path: &str| -> Vec<(f64, f64)> {
            let mut v: Vec<(f64, f64)> = r
                .rows
                .iter()
                .filter(|x| x.path == path && x.mode == mode && x.services > 0)
                .map(|x| (x.services as f64, x.result.p50_us))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let ymax =
            r.rows.iter().filter(|x| x.mode == mode).map(|x| x.result.p50_us).fold(1.0, f64::max) * 1.2;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("p50 latency of {}", mode_title(mode)), ("sans-serif", 18))
            .margin(14)
            .margin_right(44)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d((1f64..100_000f64).log_scale(), 0f64..ymax)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("Services programmed (log scale)")
            .y_desc("p50 latency (us)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (path, color) in PATHS {
            let pts = if path == "direct" {
                let Some(d) = row(r, "direct", 0, mode) else { continue };
                vec![(1.0, d.result.p50_us), (100_000.0, d.result.p50_us)]
            } else {
                of(path)
            };
            let label =
                if path == "direct" { "direct (pod IP, the floor)".to_owned() } else { path.to_owned() };
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            if path != "direct" {
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(svg)
}

/// BENCHMARKS.md content.
pub fn markdown(r: &Report) -> String {
    let mut s = String::from(
        "# tierlb benchmarks\n\nGenerated by `cargo xtask bench --report` (do not edit by hand).\n\n",
    );
    let _ = writeln!(
        s,
        "Machine: {} CPUs, kernel {}.\n\nMethod: everything runs in one process tree inside a private network namespace, in one run. A backend on the pod IP accepts connections and answers a {RR_BYTES}-byte request with a {RR_BYTES}-byte reply. A load client ({} threads, each one operation at a time) runs for {:.1} s per row and records every operation's latency in an HDR histogram; throughput counts the operations completed in that window. Two operations: `connect` is connect() then close with RST (the cost of the translation itself), `rr` is connect, request, reply, close (a short RPC). Data paths: `direct` connects to the pod IP (the floor: no load balancing); `tierlb` connects to a VIP that the cgroup connect4 program rewrites, with N Services programmed (10 endpoints each; the measured one, in the middle of the set, has one); `iptables` and `nftables` are kube-proxy-style rule sets for the same N Services (KUBE-SERVICES -> KUBE-SVC-* with `statistic --mode random` -> KUBE-SEP-* DNAT, loaded with iptables-restore, which is the nf_tables backend here; a VIP . protocol . port verdict map -> per-Service chain with `numgen random`, loaded with `nft -f`). Time on a 2-core VM is noisy (about +-15% between runs); the BPF cost per connect4 call comes from `kernel.bpf_stats_enabled` (run_time_ns / run_cnt, enabled only during the tierlb rows), because `perf stat -e instructions` is not supported on this VM.\n",
        r.cpus, r.kernel, r.threads, r.seconds
    );
    s.push_str(&targets(r));
    for mode in MODES {
        let direct = row(r, "direct", 0, mode).map(|x| x.result.clone());
        let _ = write!(
            s,
            "\n## {}\n\n| path | Services | p50 (us) | p99 (us) | ops/s | p50 / direct | ops/s / direct | connect4 ns/run | errors |\n|---|---|---|---|---|---|---|---|---|\n",
            mode_title(mode)
        );
        for (path, _) in PATHS {
            for x in r.rows.iter().filter(|x| x.path == path && x.mode == mode) {
                let (rp, rt) = direct.as_ref().map_or((f64::NAN, f64::NAN), |d| {
                    (x.result.p50_us / d.p50_us, x.result.per_sec / d.per_sec)
                });
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.1} | {:.1} | {:.0} | {rp:.2}x | {rt:.2}x | {} | {} |",
                    x.path,
                    if x.path == "direct" { "-".into() } else { x.services.to_string() },
                    x.result.p50_us,
                    x.result.p99_us,
                    x.result.per_sec,
                    x.bpf_ns_per_run.map(|n| format!("{n:.0}")).unwrap_or_else(|| "-".into()),
                    x.result.errors
                );
            }
        }
        let _ = writeln!(s, "\n![p50 latency by number of Services](bench/latency-{}.svg)", mode.as_str());
    }
    s.push_str("\n## Control plane\n\n| what | figure |\n|---|---|\n");
    for (k, v) in &r.control {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    s
}

/// The targets, judged from this run's rows.
fn targets(r: &Report) -> String {
    let mut s =
        String::from("\n## Targets (judged from this run)\n\n| target | measured | met |\n|---|---|---|\n");
    let p50 = |path: &str, n: usize| row(r, path, n, LoadMode::Connect).map(|x| x.result.p50_us);
    let verdict = |ok: bool| if ok { "yes" } else { "no" };
    let n = 10_000;
    if let (Some(d), Some(t)) = (p50("direct", 0), p50("tierlb", n)) {
        let _ = writeln!(
            s,
            "| tierlb connect() at 10,000 Services within 1.10x of direct | p50 {t:.1} us vs {d:.1} us = {:.2}x | {} |",
            t / d,
            verdict(t / d <= 1.10)
        );
        let bpf = row(r, "tierlb", n, LoadMode::Connect).and_then(|x| x.bpf_ns_per_run);
        match (p50("iptables", n), bpf) {
            (Some(i), Some(b)) => {
                let overhead = (i - d) * 1e3;
                let _ = writeln!(
                    s,
                    "| at 10,000 Services at least 5x cheaper per connect than iptables | iptables adds {:.1} us over direct (p50), tierlb's connect4 costs {:.2} us per call: {:.0}x; whole p50 {i:.1} vs {t:.1} us = {:.1}x | {} |",
                    overhead / 1e3,
                    b / 1e3,
                    overhead / b,
                    i / t,
                    verdict(overhead / b >= 5.0)
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "| at 10,000 Services at least 5x cheaper per connect than iptables | no iptables row at 10,000 | no |"
                );
            }
        }
        if let Some(f) = p50("nftables", n) {
            let _ = writeln!(
                s,
                "| at 10,000 Services no slower than nftables | p50 {t:.1} us vs nftables {f:.1} us | {} |",
                verdict(t <= f * 1.05)
            );
        }
    }
    for (what, target_ms, key) in [
        ("10,000 Services programmed in under 2 s", 2000.0, "program 10,000 Services"),
        (
            "one change applied in under 5 ms (agent, reading the change to maps written)",
            5.0,
            "agent: one EndpointSlice edit",
        ),
    ] {
        if let Some((_, v)) = r.control.iter().find(|(k, _)| k.starts_with(key)) {
            let ms = leading_number(v.trim_start_matches("median "))
                .map(|x| if v.contains(" s") && !v.contains("ms") { x * 1e3 } else { x });
            let _ = writeln!(s, "| {what} | {v} | {} |", verdict(ms.is_some_and(|m| m < target_ms)));
        }
    }
    if let Some((_, v)) = r.control.iter().find(|(k, _)| k.starts_with("agent RSS")) {
        let mib = leading_number(v).map(|kb| kb / 1024.0);
        let _ = writeln!(
            s,
            "| agent RSS under 100 MiB | {} | {} |",
            mib.map_or_else(|| v.clone(), |m| format!("{m:.0} MiB")),
            verdict(mib.is_some_and(|m| m < 100.0))
        );
    }
    s
}

fn leading_number(s: &str) -> Option<f64> {
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    s[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(p50: f64) -> LoadResult {
        LoadResult {
            ops: 1000,
            errors: 0,
            secs: 1.0,
            p50_us: p50,
            p99_us: p50 * 2.0,
            per_sec: 1e6 / p50,
            slow: 0,
        }
    }

    fn report() -> Report {
        let mut rows = Vec::new();
        for mode in MODES {
            let extra = if mode == LoadMode::Rr { 10.0 } else { 0.0 };
            rows.push(Row {
                path: "direct".into(),
                services: 0,
                mode,
                result: result(17.0 + extra),
                bpf_ns_per_run: None,
            });
            for (n, t, i, f) in [(1, 17.0, 26.0, 29.0), (10_000, 18.0, 85.0, 24.0)] {
                rows.push(Row {
                    path: "tierlb".into(),
                    services: n,
                    mode,
                    result: result(t + extra),
                    bpf_ns_per_run: Some(1500.0),
                });
                rows.push(Row {
                    path: "iptables".into(),
                    services: n,
                    mode,
                    result: result(i + extra),
                    bpf_ns_per_run: None,
                });
                rows.push(Row {
                    path: "nftables".into(),
                    services: n,
                    mode,
                    result: result(f + extra),
                    bpf_ns_per_run: None,
                });
            }
        }
        Report {
            kernel: "6.18".into(),
            cpus: 2,
            threads: 2,
            seconds: 1.5,
            rows,
            control: vec![
                (
                    "program 10,000 Services x 10 endpoints into the maps (from scratch)".into(),
                    "181 ms".into(),
                ),
                (
                    "agent: one EndpointSlice edit at 10,000 Services, ...".into(),
                    "median 0.90 ms, max 1.40 ms".into(),
                ),
                ("agent RSS with 10,000 Services x 10 endpoints".into(), "94208 kB".into()),
            ],
        }
    }

    /// The load tool and the backend speak both modes: every operation completes, none fails. (Runs as
    /// root, in a private netns with only `lo`.)
    #[test]
    fn the_load_tool_completes_both_modes_against_the_backend() {
        let ns = NetNs::new("bench-test").unwrap();
        let backend: SocketAddr = BACKEND.parse().unwrap();
        ns.add_address(backend.ip()).unwrap();
        let _sink = Sink::start(&ns, backend).unwrap();
        for mode in MODES {
            let file = ns.file().try_clone().unwrap();
            // Threads inherit the network namespace of the thread that creates them.
            let r = std::thread::spawn(move || {
                nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap();
                load(backend, 2, Duration::from_millis(300), mode)
            })
            .join()
            .unwrap();
            assert!(r.ops > 50 && r.errors == 0, "{mode:?}: {r:?}");
            assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{mode:?}: {r:?}");
        }
    }

    #[test]
    fn the_report_judges_the_targets_from_the_rows_and_charts_every_path() {
        let r = report();
        let md = markdown(&r);
        for want in [
            "| tierlb connect() at 10,000 Services within 1.10x of direct | p50 18.0 us vs 17.0 us = 1.06x | yes |",
            "iptables adds 68.0 us over direct (p50), tierlb's connect4 costs 1.50 us per call: 45x",
            "| at 10,000 Services no slower than nftables | p50 18.0 us vs nftables 24.0 us | yes |",
            "| 10,000 Services programmed in under 2 s | 181 ms | yes |",
            "| one change applied in under 5 ms (agent, reading the change to maps written) | median 0.90 ms, max 1.40 ms | yes |",
            "| agent RSS under 100 MiB | 92 MiB | yes |",
            "| tierlb | 10000 | 28.0 |",
            "![p50 latency by number of Services](bench/latency-rr.svg)",
        ] {
            assert!(md.contains(want), "missing {want:?} in\n{md}");
        }
        let charts = charts(&r).unwrap();
        assert_eq!(charts.len(), 2);
        for (name, svg) in &charts {
            assert!(svg.contains("<svg"), "{name}");
            for label in ["tierlb", "iptables", "nftables", "direct (pod IP, the floor)", "10000"] {
                assert!(svg.contains(label), "{name} lacks {label}");
            }
        }
    }
}
