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

use crate::{
    datapath::{Desired, DesiredFrontend, Reconciler, addr, ebpf::Loaded},
    sandbox::{Cgroup, Child, NetNs, confine},
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
    /// Connects that took over 100 ms (a dropped SYN costs a 1 s retransmit).
    #[serde(default)]
    pub slow: u64,
}

/// connect()+close() to `target` on `threads` threads for `duration` (the load client, run confined).
pub fn load(target: SocketAddr, threads: usize, duration: Duration) -> LoadResult {
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
                    match TcpStream::connect(target) {
                        Ok(s) => {
                            rst_close(&s);
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

/// A backend that accepts and drops connections as fast as it can, on `threads` threads. Stops on drop.
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
                        }
                    }
                })
            })
            .collect();
        Ok(Self { stop, fd: listener.as_raw_fd(), threads })
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
    (0..per)
        .map(|e| {
            SocketAddr::new(
                Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + (i * per + e) as u32).into(),
                8080,
            )
        })
        .collect()
}

fn desired(services: usize, per: usize) -> Desired {
    (0..services)
        .map(|i| {
            let b: Vec<_> = endpoints(i, per, services).into_iter().map(|a| addr::backend(a, 6)).collect();
            (
                addr::frontend_key(IpAddr::V4(vip(i)), 80, 6),
                DesiredFrontend {
                    service: format!("bench/svc-{i}"),
                    port_name: String::new(),
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
const LOAD_LIMIT: Duration = Duration::from_secs(150);

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub path: String,
    pub services: usize,
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

fn run_load(
    lab: &Path,
    ns: &NetNs,
    cg: Option<&Cgroup>,
    target: SocketAddr,
    threads: usize,
    secs: f64,
) -> anyhow::Result<LoadResult> {
    let mut cmd = Command::new(lab);
    confine(&mut cmd, cg, Some(ns))?;
    cmd.args([
        "load",
        "--target",
        &target.to_string(),
        "--threads",
        &threads.to_string(),
        "--seconds",
        &secs.to_string(),
    ]);
    let out = cmd.stderr(Stdio::inherit()).output()?;
    anyhow::ensure!(out.status.success(), "load client failed");
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn connect4_stats() -> Option<(u64, u64)> {
    let out = Command::new("bpftool").args(["prog", "show", "name", "connect4", "--json"]).output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let items = if v.is_array() { v.as_array()?.clone() } else { vec![v] };
    items
        .iter()
        .filter_map(|p| Some((p["run_time_ns"].as_u64()?, p["run_cnt"].as_u64()?)))
        .max_by_key(|x| x.1)
}

/// Run the whole benchmark. `quick`: fewer Service counts and shorter runs.
pub fn run(lab: &Path, tierlb: &Path, quick: bool) -> anyhow::Result<Report> {
    let counts: &[usize] = if quick { &[1, 10_000] } else { &[1, 1_000, 10_000, 50_000] };
    let secs = if quick { 1.5 } else { 4.0 };
    let threads = 2;
    let per = 10;
    let ns = NetNs::new("bench")?;
    let backend: SocketAddr = BACKEND.parse()?;
    ns.add_address(backend.ip())?;
    // kube-proxy nodes route the Service range somewhere; without a route, locally generated packets to a VIP
    // fail before the nat OUTPUT chain could DNAT them. Inside this namespace only.
    ns.ip(&["route", "add", "10.96.0.0/12", "dev", "lo"])?;
    let _sink = Sink::start(&ns, backend)?;
    let mut rows = Vec::new();
    let say = |r: &Row| {
        eprintln!(
            "bench: {:<9} {:>6} services  p50 {:>6.1} us  p99 {:>7.1} us  {:>8.0} connects/s  {} errors  {} slow{}",
            r.path,
            r.services,
            r.result.p50_us,
            r.result.p99_us,
            r.result.per_sec,
            r.result.errors,
            r.result.slow,
            r.bpf_ns_per_run.map(|n| format!("  connect4 {n:.0} ns/run")).unwrap_or_default()
        );
    };
    let direct = Row {
        path: "direct".into(),
        services: 0,
        result: run_load(lab, &ns, None, backend, threads, secs)?,
        bpf_ns_per_run: None,
    };
    say(&direct);
    rows.push(direct);

    // tierlb: the data path loaded in this process, attached to a bench cgroup, maps filled directly.
    let mut control = Vec::new();
    {
        let cg = Cgroup::new("bench")?;
        let caps =
            crate::datapath::ebpf::Capacities { services: 60_000, slots: 1_200_000, ..Default::default() };
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
                    "program 10,000 Services x 10 endpoints into the maps".into(),
                    format!("{:.0} ms", took.as_secs_f64() * 1e3),
                ));
                let mut d2 = d.clone();
                let k = addr::frontend_key(IpAddr::V4(vip(1234)), 80, 6);
                d2.get_mut(&k).expect("exists").tiers[2].pop();
                let t1 = Instant::now();
                rec.apply(&d2, Instant::now());
                control.push((
                    "apply one EndpointSlice change at 10,000 Services".into(),
                    format!("{:.2} ms", t1.elapsed().as_secs_f64() * 1e3),
                ));
                rec.apply(&d, Instant::now());
            }
            let before = connect4_stats();
            let result = run_load(
                lab,
                &ns,
                Some(&cg),
                SocketAddr::new(IpAddr::V4(vip(target(n))), 80),
                threads,
                secs,
            )?;
            let after = connect4_stats();
            let bpf = match (before, after) {
                (Some((t0, c0)), Some((t1, c1))) if c1 > c0 => Some((t1 - t0) as f64 / (c1 - c0) as f64),
                _ => None,
            };
            let r = Row { path: "tierlb".into(), services: n, result, bpf_ns_per_run: bpf };
            say(&r);
            rows.push(r);
        }
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0");
        let slots: usize = rec.applied().map(|(_, _, d)| d.tiers.iter().map(Vec::len).sum::<usize>()).sum();
        let map_bytes = slots * (12 + 20 + 16) + rec.applied().count() * (20 + 24 + 16);
        control.push((
            "map memory for 50,000 Services x 10 endpoints (keys + values + hash overhead, estimate)".into(),
            format!("{:.1} MiB", map_bytes as f64 / 1048576.0),
        ));
        drop(programs);
    }

    // The agent itself with 10,000 Services from manifests: time to ready and RSS.
    if let Ok(r) = agent_figures(tierlb, per) {
        control.extend(r);
    }

    for (path, tool) in [("iptables", "iptables-restore"), ("nftables", "nft")] {
        for &n in counts {
            let rules = if path == "iptables" { iptables_rules(n, per) } else { nft_rules(n, per) };
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns.name()]);
            if path == "iptables" {
                cmd.args([tool, "-w"]);
            } else {
                cmd.args([tool, "-f", "-"]);
            }
            let took = timed(&mut cmd, &rules, LOAD_LIMIT)
                .with_context(|| format!("loading {path} rules ({tool} installed?)"))?;
            let flush: &[&str] = if path == "iptables" {
                &["iptables", "-t", "nat", "-F"]
            } else {
                &["nft", "flush", "ruleset"]
            };
            let Some(took) = took else {
                eprintln!("bench: {path} {n} services: {tool} did not load the rules within {LOAD_LIMIT:?}");
                control.push((
                    format!("load {n} Services x 10 endpoints with {tool}"),
                    format!("not done within {} s (stopped)", LOAD_LIMIT.as_secs()),
                ));
                let _ = Command::new("ip").args(["netns", "exec", ns.name()]).args(flush).status();
                continue;
            };
            if n >= 10_000 {
                control.push((
                    format!("load {n} Services x 10 endpoints with {tool}"),
                    format!("{:.2} s", took.as_secs_f64()),
                ));
            }
            let result =
                run_load(lab, &ns, None, SocketAddr::new(IpAddr::V4(vip(target(n))), 80), threads, secs)?;
            let r = Row { path: path.into(), services: n, result, bpf_ns_per_run: None };
            say(&r);
            rows.push(r);
            // Flush before the next count.
            let flush: &[&str] = if path == "iptables" {
                &["iptables", "-t", "nat", "-F"]
            } else {
                &["nft", "flush", "ruleset"]
            };
            let _ = Command::new("ip").args(["netns", "exec", ns.name()]).args(flush).status();
            if path == "iptables" {
                let _ = Command::new("ip")
                    .args(["netns", "exec", ns.name(), "iptables", "-t", "nat", "-X"])
                    .status();
            }
        }
    }
    let kernel = crate::datapath::ebpf::kernel_version().map(|k| k.2).unwrap_or_default();
    Ok(Report {
        kernel,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        threads,
        seconds: secs,
        rows,
        control,
    })
}

fn agent_figures(tierlb: &Path, per: usize) -> anyhow::Result<Vec<(String, String)>> {
    let dir = super::cluster::TempDir::new("bench-agent")?;
    let mut text = String::new();
    for i in 0..10_000 {
        let svc = super::manifests::Svc::new(&format!("svc-{i}"), IpAddr::V4(vip(i)), 80, 8080);
        let eps: Vec<_> = endpoints(i, per, 10_000)
            .into_iter()
            .map(|a| super::manifests::Ep::ready(a.ip(), "node-2"))
            .collect();
        let mut docs = vec![svc.service()];
        docs.extend(svc.slices(&eps));
        text.push_str(&super::manifests::to_yaml(&docs));
        text.push_str("---\n");
    }
    std::fs::write(dir.path().join("services.yaml"), text)?;
    let cg = Cgroup::new("bench-agent")?;
    let log = dir.path().join(".agent.log");
    let t0 = Instant::now();
    let mut child = Child::spawn(
        Command::new(tierlb)
            .args(["agent", "--node", "node-1", "--manifests"])
            .arg(dir.path())
            .arg("--cgroup")
            .arg(cg.path())
            .args(["--healthz-addr", "off", "--metrics-addr", "off", "--service-health-bind", "off"])
            .env("NO_COLOR", "1")
            .stderr(std::fs::File::create(&log)?),
    )?;
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("tierlb agent ready") {
        if t0.elapsed() > Duration::from_secs(120) || matches!(child.inner().try_wait(), Ok(Some(_))) {
            bail!("agent did not start: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ready = t0.elapsed();
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.pid()))?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ? kB")
        .trim_start_matches("VmRSS:")
        .trim()
        .to_owned();
    drop(child);
    Ok(vec![
        ("agent start to ready with 10,000 Services x 10 endpoints (parse 10,000 manifests, plan, load, program)".into(), format!("{:.2} s", ready.as_secs_f64())),
        ("agent RSS with 10,000 Services x 10 endpoints".into(), rss),
    ])
}

/// BENCHMARKS.md content.
pub fn markdown(r: &Report, chart: &str) -> String {
    let mut s = String::from(
        "# tierlb benchmarks\n\nGenerated by `cargo xtask bench --report` (do not edit by hand).\n\n",
    );
    let _ = writeln!(
        s,
        "Machine: {} CPUs, kernel {}. Method: inside a private network namespace, a backend accepts and drops connections; a load client ({} threads) does connect() + close (RST) in a loop for {:.1} s per row and records per-connect latency in an HDR histogram. `direct` connects to the pod IP; `tierlb` connects to a VIP translated by the cgroup connect4 program with N Services programmed (10 endpoints each; the measured one, in the middle of the set, has 1); `iptables` and `nftables` use kube-proxy-style rule sets for the same N Services (KUBE-SERVICES -> KUBE-SVC (statistic random) -> KUBE-SEP DNAT; a VIP . port verdict map with numgen random), all in the same run. Time-based figures on a 2-core VM are noisy; the BPF run time per connect4 call comes from `kernel.bpf_stats_enabled` (enabled only during the run).\n",
        r.cpus, r.kernel, r.threads, r.seconds
    );
    let direct = r.rows.iter().find(|x| x.path == "direct").map(|x| x.result.clone());
    s.push_str("\n## connect() latency and throughput\n\n| path | Services | p50 (us) | p99 (us) | connects/s | p50 / direct | connects/s / direct | connect4 ns/run |\n|---|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        let (rp, rt) = direct
            .as_ref()
            .map_or((f64::NAN, f64::NAN), |d| (row.result.p50_us / d.p50_us, row.result.per_sec / d.per_sec));
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {:.0} | {rp:.2}x | {rt:.2}x | {} |",
            row.path,
            row.services,
            row.result.p50_us,
            row.result.p99_us,
            row.result.per_sec,
            row.bpf_ns_per_run.map(|n| format!("{n:.0}")).unwrap_or_else(|| "-".into())
        );
    }
    s.push_str("\n![p50 connect latency by number of Services](bench/latency.svg)\n\n## Control plane\n\n| what | figure |\n|---|---|\n");
    for (k, v) in &r.control {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = chart;
    s
}

/// p50 latency vs Services for each data path (x: index of the Service count).
pub fn chart(r: &Report) -> String {
    let counts: Vec<usize> = {
        let mut c: Vec<usize> = r.rows.iter().filter(|x| x.path == "tierlb").map(|x| x.services).collect();
        c.dedup();
        c
    };
    let max = r.rows.iter().map(|x| x.result.p50_us).fold(1.0, f64::max);
    let series: Vec<(String, Vec<(f64, f64)>)> = ["direct", "tierlb", "iptables", "nftables"]
        .iter()
        .map(|p| {
            let pts = counts
                .iter()
                .enumerate()
                .filter_map(|(i, n)| {
                    r.rows
                        .iter()
                        .find(|x| x.path == *p && (x.services == *n || x.path == "direct"))
                        .map(|x| (i as f64, x.result.p50_us / max))
                })
                .collect();
            (format!("{p} (p50, fraction of {max:.0} us)"), pts)
        })
        .collect();
    let labels: Vec<String> = counts.iter().map(ToString::to_string).collect();
    crate::svg::line_chart(
        &format!("p50 connect latency vs Services ({})", labels.join(", ")),
        &series,
        "Service count (index)",
        "p50 / max p50",
    )
}
