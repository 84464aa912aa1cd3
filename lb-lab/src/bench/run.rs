//! The run: one private netns with the backend, the direct rows, the tierlb rows (the data path loaded in
//! this process, Service maps filled directly), the agent's figures, then each kube-proxy-style rule set's
//! rows; and the control-plane figures measured on the way.
use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use lb_testkit::sandbox::{Cgroup, NetNs, confine};
use tierlb::datapath::{Desired, Reconciler, addr, ebpf::Loaded};

use super::{
    agent::agent_runs,
    figures::{
        Connect4Row, ControlPlane, DataPath, Flatness, LoadTime, MapMemory, MapWrites, NsRow, Report, Row,
        RuleLoad,
    },
    load::{BACKEND, LoadMode, LoadResult, Placement, Sink},
    tracing::Tracing,
    workloads::{EDITED, RULE_SETS, desired, target, vip},
};

/// Feed `input` to `cmd` and time it; `Ok(None)` if it did not finish within `limit` (it is then killed).
pub(super) fn timed(cmd: &mut Command, input: &str, limit: Duration) -> anyhow::Result<Option<Duration>> {
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
pub(super) const LOAD_LIMIT: Duration = Duration::from_secs(90);

/// Flows from outside the node the conntrack tables are measured with.
const CONNTRACK_FLOWS: usize = 100_000;

/// The load side of the bench: the client binary, the namespace and the run length.
pub(super) struct Loader<'a> {
    /// `tierlb-lab`, whose `load` subcommand is the client.
    pub(super) lab: &'a Path,
    /// The bench's namespace, where the client runs.
    pub(super) ns: &'a NetNs,
    /// Client threads.
    pub(super) threads: usize,
    /// The CPU the client is held to.
    pub(super) cpu: Option<usize>,
    /// Seconds of load per row.
    pub(super) secs: f64,
}

impl Loader<'_> {
    /// The load client against `target`, `secs` seconds a run, confined to `cg` and the bench's namespace.
    fn command(
        &self,
        cg: Option<&Cgroup>,
        target: SocketAddr,
        mode: LoadMode,
        secs: f64,
    ) -> anyhow::Result<Command> {
        let mut cmd = Command::new(self.lab);
        confine(&mut cmd, cg, Some(self.ns))?;
        cmd.args(["load", "--target", &target.to_string(), "--mode", mode.as_str()]).args([
            "--threads",
            &self.threads.to_string(),
            "--seconds",
            &secs.to_string(),
        ]);
        if let Some(cpu) = self.cpu {
            cmd.args(["--cpu", &cpu.to_string()]);
        }
        Ok(cmd)
    }

    /// One load run against `target`, the client confined to `cg` (tierlb's cgroup, for the tierlb rows).
    pub(super) fn run(
        &self,
        cg: Option<&Cgroup>,
        target: SocketAddr,
        mode: LoadMode,
    ) -> anyhow::Result<LoadResult> {
        self.run_for(cg, target, mode, self.secs)
    }

    /// One load run of `secs` seconds against `target`, the client confined to `cg`.
    pub(super) fn run_for(
        &self,
        cg: Option<&Cgroup>,
        target: SocketAddr,
        mode: LoadMode,
        secs: f64,
    ) -> anyhow::Result<LoadResult> {
        let out = self.command(cg, target, mode, secs)?.stderr(Stdio::inherit()).output()?;
        anyhow::ensure!(out.status.success(), "load client failed");
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// One row per load mode for a path outside tierlb's cgroup (direct, a rule set) at `services` Services.
    fn rows(&self, path: DataPath, services: usize, target: SocketAddr) -> anyhow::Result<Vec<Row>> {
        let mut rows = Vec::new();
        for mode in LoadMode::ALL {
            let result = self.run(None, target, mode)?;
            eprintln!(
                "bench: {:<9} {services:>6} services  {:<7}  p50 {:>6.1} us  p99 {:>7.1} us  {:>8.0} ops/s  {} errors  {} slow",
                path.as_str(),
                mode.as_str(),
                result.p50_us,
                result.p99_us,
                result.per_sec,
                result.errors,
                result.slow,
            );
            rows.push(Row { path, services, mode, result, bpf_ns_per_run: None, sock_ops_ns_per_run: None });
        }
        Ok(rows)
    }

    /// A paced client (see [`super::load::paced`]) against `target`, confined to `cg`: one run of `slice`
    /// seconds each time it is asked.
    fn paced(
        &self,
        cg: Option<&Cgroup>,
        target: SocketAddr,
        mode: LoadMode,
        slice: f64,
    ) -> anyhow::Result<Paced> {
        let mut cmd = self.command(cg, target, mode, slice)?;
        let mut child = cmd
            .arg("--paced")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = std::io::BufReader::new(child.stdout.take().context("stdout")?);
        Ok(Paced { child, stdin: Some(stdin), stdout })
    }

    /// tierlb at `services` Services and direct, interleaved slice by slice: two paced clients (direct
    /// outside the cgroup, which runs none of tierlb's programs; tierlb in it) take turns for `pairs` pairs
    /// of `slice` seconds, in the order A B B A A B..., so that the machine's drift lands on both sides of a
    /// ratio. Per mode: tierlb's row (the slice with the median p50; connect4's and sock_ops' cost from one
    /// more run with the kernel's statistics on) and the ratios to direct taken per pair.
    pub(super) fn interleaved(
        &self,
        path: DataPath,
        services: usize,
        cg: Option<&Cgroup>,
        target: SocketAddr,
        pairs: usize,
    ) -> anyhow::Result<(Vec<Row>, Vec<NsRow>)> {
        let backend: SocketAddr = BACKEND.parse()?;
        let (mut rows, mut ratios) = (Vec::new(), Vec::new());
        for mode in LoadMode::ALL {
            let mut a = self.paced(None, backend, mode, SLICE)?;
            let mut b = self.paced(cg, target, mode, SLICE)?;
            // One slice each first, not counted: the clients' first connects warm their caches.
            a.slice()?;
            b.slice()?;
            let (mut direct, mut tierlb) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
            for i in 0..pairs {
                if i % 2 == 0 {
                    direct.push(a.slice()?);
                    tierlb.push(b.slice()?);
                } else {
                    tierlb.push(b.slice()?);
                    direct.push(a.slice()?);
                }
            }
            drop((a, b));
            // The BPF cost per run from one more tierlb run with the kernel's statistics on: they add two
            // clock reads and a counter update to every program run (connect4, each sock_ops callback, the
            // release hook), which the rounds above, and a node, run without.
            let (before, after) = if path == DataPath::Tierlb {
                let _stats = BpfStats::on();
                let before = (prog_stats("connect4"), prog_stats("sock_ops"));
                self.run(cg, target, mode)?;
                (before, (prog_stats("connect4"), prog_stats("sock_ops")))
            } else {
                ((None, None), (None, None))
            };
            let mut by_p50: Vec<&LoadResult> = tierlb.iter().collect();
            by_p50.sort_by(|a, b| a.p50_us.total_cmp(&b.p50_us));
            let row = Row {
                path,
                services,
                mode,
                result: by_p50[by_p50.len() / 2].clone(),
                bpf_ns_per_run: per_run(before.0, after.0),
                sock_ops_ns_per_run: per_run(before.1, after.1),
            };
            let ratio = NsRow::of(path, services, mode, &tierlb, &direct, None);
            eprintln!(
                "bench: {:<9} {services:>6} services  {:<7}  p50 {:>6.1} us ({:.2}x direct, middle half {:.2}-{:.2}, {pairs} pairs of {SLICE} s)  p99 {:>7.1} us  {:>8.0} ops/s  {} errors{}",
                path.as_str(),
                mode.as_str(),
                ratio.p50_us,
                ratio.p50_ratio.median,
                ratio.p50_ratio.q1,
                ratio.p50_ratio.q3,
                ratio.p99_us,
                ratio.per_sec,
                ratio.errors,
                row.bpf_ns_per_run.map(|n| format!("  connect4 {n:.0} ns/run")).unwrap_or_default()
                    + &row
                        .sock_ops_ns_per_run
                        .map(|n| format!("  sock_ops {n:.0} ns/run"))
                        .unwrap_or_default()
            );
            rows.push(row);
            ratios.push(ratio);
        }
        Ok((rows, ratios))
    }
}

/// The length of one slice of a paced client, seconds: short enough that a pair's two slices see the same
/// state of the machine, long enough for thousands of operations (a connect takes 10-40 us here).
pub(super) const SLICE: f64 = 0.2;

/// A running paced load client; ended on drop by closing its stdin (it finishes its slice and exits).
struct Paced {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Paced {
    /// One slice: ask for it, wait for its result.
    fn slice(&mut self) -> anyhow::Result<LoadResult> {
        use std::io::{BufRead as _, Write as _};
        let stdin = self.stdin.as_mut().context("the client's stdin is closed")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        anyhow::ensure!(!line.is_empty(), "the paced load client ended");
        Ok(serde_json::from_str(&line)?)
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// `kernel.bpf_stats_enabled` on while it lives, then back to what it was. Only around the runs that read
/// programs' run times: with it on, every BPF program run also reads the clock twice and updates a per-CPU
/// counter, a cost of the measurement that a node does not pay.
pub(super) struct BpfStats {
    before: Option<String>,
}

impl BpfStats {
    pub(super) fn on() -> Self {
        let before = std::fs::read_to_string(BPF_STATS_SYSCTL).ok();
        // An interrupted run exits without running this guard's drop.
        lb_testkit::interrupt::restore_on_interrupt(
            Path::new(BPF_STATS_SYSCTL),
            before.as_deref().unwrap_or("0"),
        );
        let _ = std::fs::write(BPF_STATS_SYSCTL, "1");
        Self { before }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS_SYSCTL, self.before.as_deref().unwrap_or("0"));
    }
}

const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Run time per call between two `prog_stats` readings, if the program ran in between.
fn per_run(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    match (before, after) {
        (Some((t0, c0)), Some((t1, c1))) if c1 > c0 => Some((t1 - t0) as f64 / (c1 - c0) as f64),
        _ => None,
    }
}

/// A program's (run_time_ns, run_cnt) from bpftool (the instance with the most runs), if bpftool has them.
pub(super) fn prog_stats(name: &str) -> Option<(u64, u64)> {
    bpftool_stats(&["name", name])
}

/// `prog_stats` of the program with kernel id `id`.
pub(super) fn prog_stats_id(id: u32) -> Option<(u64, u64)> {
    bpftool_stats(&["id", &id.to_string()])
}

fn bpftool_stats(which: &[&str]) -> Option<(u64, u64)> {
    let out = Command::new("bpftool").args(["prog", "show"]).args(which).arg("--json").output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let items = if v.is_array() { v.as_array()?.clone() } else { vec![v] };
    items
        .iter()
        // bpftool leaves both out while they are zero.
        .map(|p| (p["run_time_ns"].as_u64().unwrap_or(0), p["run_cnt"].as_u64().unwrap_or(0)))
        .max_by_key(|x| x.1)
}

/// What the on-node section measured: tierlb's rows, their interleaved ratios to direct, the map writes and
/// the maps' memory at the largest count.
struct OnNode {
    rows: Vec<Row>,
    connect4: Vec<Connect4Row>,
    flatness: Option<Flatness>,
    east_west: Vec<NsRow>,
    map_writes: Vec<MapWrites>,
    map_memory: MapMemory,
}

/// The bench's namespace with the backend on the pod IP and a route for the Service range.
fn bench_ns() -> anyhow::Result<NetNs> {
    let ns = NetNs::new("bench")?;
    let backend: SocketAddr = BACKEND.parse()?;
    ns.add_address(backend.ip())?;
    // kube-proxy nodes route the Service range somewhere; without a route, locally generated packets to a VIP
    // fail before the nat OUTPUT chain could DNAT them. Inside this namespace only.
    ns.ip(&["route", "add", "10.96.0.0/12", "dev", "lo"])?;
    // The shaped Service's endpoints (connect4's rows): every address of the range is this namespace's own.
    ns.ip(&["route", "add", "local", super::connect4::SHAPED_NET, "dev", "lo"])?;
    Ok(ns)
}

/// Run the whole benchmark. `quick`: fewer Service counts and shorter runs. `trace`: the tierlb rows run with
/// `tierlb trace` consuming every decision (connect4's cost with tracing on).
pub fn run(lab: &Path, tierlb: &Path, quick: bool, trace: bool) -> anyhow::Result<Report> {
    let counts: &[usize] = if quick { &[1, 10_000] } else { &[1, 1_000, 10_000, 50_000, 100_000] };
    let per = 10;
    let ns = bench_ns()?;
    let cpus = Placement::split();
    let loader = Loader { lab, ns: &ns, threads: 1, cpu: cpus.client, secs: if quick { 1.5 } else { 4.0 } };
    let backend: SocketAddr = BACKEND.parse()?;
    let _sink = Sink::start(&ns, backend, cpus.backend)?;
    let mut rows = loader.rows(DataPath::Direct, 0, backend)?;
    let rounds = if quick { 3 } else { 5 };
    let on_node = on_node(&loader, tierlb, counts, per, rounds, trace)?;
    rows.extend(on_node.rows);

    // The agent itself, from manifests and from the API server: time to ready, one change, RSS.
    let agent = agent_runs(tierlb, counts, per);
    let rule_loads = rule_set_rows(&loader, counts, per, &mut rows)?;
    // Real kube-proxy from the API server, at up to 10,000 Services, interleaved against direct.
    let kp_counts: Vec<usize> =
        super::kube_proxy::COUNTS.into_iter().filter(|n| !quick || *n != 1_000).collect();
    let kube_proxy = super::kube_proxy::measure(&loader, &kp_counts, per, pairs_for(rounds, loader.secs))?;
    rows.extend(kube_proxy.rows);
    let mut east_west = on_node.east_west;
    east_west.extend(kube_proxy.ratios);
    // From outside the node: at 1 and 10,000 Services, interleaved rounds.
    // Real kube-proxy's too, from the real API server (where its first sync finished on the node).
    let north_south =
        super::north_south::rows(lab, &[1, 10_000], rounds, loader.secs / 2.0, Some(&kube_proxy.syncs))?;
    let conntrack = super::conntrack::memory(CONNTRACK_FLOWS)?;
    let snat = Some(super::north_south_snat::measure(lab, quick)?);
    let xdp = Some(super::xdp::measure(lab, quick)?);
    let kernel = tierlb::datapath::ebpf::kernel_version().map(|k| k.2).unwrap_or_default();
    Ok(Report {
        kernel,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        threads: loader.threads,
        placement: cpus,
        seconds: loader.secs,
        rows,
        east_west,
        north_south,
        snat,
        xdp,
        conntrack,
        kube_proxy: kube_proxy.syncs,
        control: ControlPlane { maps: on_node.map_writes, map_memory: on_node.map_memory, agent, rule_loads },
        connect4: on_node.connect4,
        flatness: on_node.flatness,
    })
}

/// As many pairs of slices as `rounds` runs of `secs` seconds would take.
fn pairs_for(rounds: usize, secs: f64) -> usize {
    #[expect(
        clippy::cast_sign_loss,
        clippy::cast_possible_truncation,
        reason = "at least 1.0, a few hundred"
    )]
    let pairs = (rounds as f64 * secs / SLICE).round().max(1.0) as usize;
    pairs
}

/// Only real kube-proxy's rows (`bench --kube-proxy`): its syncs and its connects against direct at each of
/// `counts`, printed as measured.
pub fn kube_proxy_only(lab: &Path, counts: &[usize], rounds: usize, secs: f64) -> anyhow::Result<()> {
    let ns = bench_ns()?;
    let cpus = Placement::split();
    let loader = Loader { lab, ns: &ns, threads: 1, cpu: cpus.client, secs };
    let _sink = Sink::start(&ns, BACKEND.parse()?, cpus.backend)?;
    let measured = super::kube_proxy::measure(&loader, counts, 10, pairs_for(rounds, secs))?;
    // From outside the node too (the north-south lab without tierlb's programs).
    let lab_ns = super::north_south::Lab::new()?;
    let outside = Loader { lab, ns: &lab_ns.ext, threads: 1, cpu: lab_ns.cpus.client, secs: secs / 2.0 };
    for &n in counts {
        super::north_south_kube_proxy::rows(&lab_ns, &outside, n, 10, rounds, &measured.syncs)?;
    }
    Ok(())
}

/// Only the on-node connect path, for profiling and for comparing two builds of the data path: tierlb
/// against direct in `rounds` interleaved rounds of `secs` seconds at each of `counts` Services (and the
/// maps programmed from scratch at 10,000 and more), printed as measured.
pub fn on_node_only(
    lab: &Path,
    tierlb: &Path,
    counts: &[usize],
    rounds: usize,
    secs: f64,
) -> anyhow::Result<()> {
    let ns = bench_ns()?;
    let cpus = Placement::split();
    let loader = Loader { lab, ns: &ns, threads: 1, cpu: cpus.client, secs };
    let _sink = Sink::start(&ns, BACKEND.parse()?, cpus.backend)?;
    on_node(&loader, tierlb, counts, 10, rounds, false).map(drop)
}

/// tierlb on the node: the data path loaded in this process, attached to a bench cgroup, maps filled
/// directly (from scratch at 10,000 Services and more, timed, then one change), and at each count the
/// interleaved rounds against direct.
fn on_node(
    loader: &Loader,
    tierlb: &Path,
    counts: &[usize],
    per: usize,
    rounds: usize,
    trace: bool,
) -> anyhow::Result<OnNode> {
    let mut map_writes = Vec::new();
    let (mut rows, mut east_west) = (Vec::new(), Vec::new());
    let cg = Cgroup::new("bench")?;
    // `slots` counts entries of 8 slots (and members) since the slot map was packed; 1,200,000 as when it
    // counted slots, so that the maps' memory rows (buckets by capacity) compare across runs.
    let caps =
        tierlb::datapath::ebpf::Capacities { services: 120_000, slots: 1_200_000, ..Default::default() };
    let tracing = trace.then(Tracing::new).transpose()?;
    let Loaded { mut programs, maps, .. } = Loaded::load(caps, tracing.as_ref().map(Tracing::pins))?;
    let mut rec = Reconciler::new(maps);
    // As the agent runs by default: passive health on (connect4 consults it, sock_ops follows connects).
    let health = tierlb::datapath::health::HealthSettings::default().config();
    tierlb::datapath::MapWriter::set_health_config(rec.writer_mut(), health)?;
    // As the agent's first sweep does: the health lookups gated off while the map is empty.
    tierlb::datapath::health::gate(rec.writer_mut())?;
    programs.attach(cg.path(), None)?;
    let ids = super::connect4::Ids::of(&mut programs)?;
    // The shaped Service's endpoints: one listener on every address of their range.
    let shaped = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), super::connect4::SHAPED_PORT);
    let _shaped_sink = Sink::start(loader.ns, shaped, Placement::split().backend)?;
    let mut connect4 = Vec::new();
    let _tracer = tracing.as_ref().map(|t| t.start(tierlb)).transpose()?;
    for &n in counts {
        let d = desired(n, per);
        if n >= 10_000 {
            // From scratch: the maps emptied first, then every Service written. What the emptying buried is
            // collected first, as the agent's timer does within milliseconds (else the first apply after it
            // pays for deleting the old slots: the tens of ms the one change once measured).
            rec.apply(&Desired::default(), Instant::now());
            rec.collect_garbage(Instant::now());
        }
        let t0 = Instant::now();
        let rep = rec.apply(&d, Instant::now());
        anyhow::ensure!(rep.errors.is_empty(), "{:?}", rep.errors.first().map(ToString::to_string));
        let took = t0.elapsed();
        if n >= 10_000 {
            let one_change = one_change_in_the_maps(&mut rec, &d)?;
            eprintln!("bench: maps {n} services: programmed in {took:.2?}, one change {one_change:.2?}");
            map_writes.push(MapWrites { services: n, program: took, one_change });
        }
        let pairs = pairs_for(rounds, loader.secs);
        let (tierlb, ratios) = loader.interleaved(
            DataPath::Tierlb,
            n,
            Some(&cg),
            SocketAddr::new(IpAddr::V4(vip(target(n))), 80),
            pairs,
        )?;
        rows.extend(tierlb);
        east_west.extend(ratios);
        connect4.extend(super::connect4::shapes(loader, &mut rec, &cg, &ids, &d, n, rounds)?);
    }
    let maps = rec.writer().service_memory().into_iter().filter_map(|(m, b)| Some((m.into(), b?))).collect();
    let map_memory = MapMemory { services: counts.last().copied().unwrap_or_default(), maps };
    // At the largest count against 1 Service, the statistics runs alternating between the two.
    let flatness = match counts.iter().copied().max() {
        Some(n) if n > 1 => Some(super::connect4::flatness(loader, &mut rec, &cg, &ids, n, per, 2 * rounds)?),
        _ => None,
    };
    drop(programs);
    Ok(OnNode { rows, connect4, flatness, east_west, map_writes, map_memory })
}

/// One EndpointSlice change at the map level: the changed Service's frontends only (what the agent hands
/// the reconciler after an edit), then back to `d`.
fn one_change_in_the_maps(
    rec: &mut Reconciler<tierlb::datapath::ebpf::KernelMaps>,
    d: &Desired,
) -> anyhow::Result<Duration> {
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
    Ok(took)
}

/// Each kube-proxy-style rule set at each count: its load time (or that it was stopped at the limit, and
/// then not tried at larger counts) and, when loaded, its rows.
fn rule_set_rows(
    loader: &Loader,
    counts: &[usize],
    per: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<Vec<RuleLoad>> {
    let ns = loader.ns;
    let mut rule_loads = Vec::new();
    for set in &RULE_SETS {
        for &n in counts {
            // A rule set that did not load within the limit at a smaller count will not at a larger one.
            if rule_loads
                .iter()
                .any(|l: &RuleLoad| l.tool == set.tool && matches!(l.took, LoadTime::Stopped { .. }))
            {
                eprintln!(
                    "bench: {} {n} services: not loaded (it did not load within {LOAD_LIMIT:?} at fewer)",
                    set.tool
                );
                rule_loads.push(RuleLoad {
                    tool: set.tool,
                    services: n,
                    took: LoadTime::Stopped { limit: LOAD_LIMIT },
                });
                continue;
            }
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
                .with_context(|| format!("loading {} rules ({} installed?)", set.path.as_str(), set.tool))?;
            let Some(took) = took else {
                eprintln!(
                    "bench: {} {n} services: {} did not load the rules within {LOAD_LIMIT:?}",
                    set.path.as_str(),
                    set.tool
                );
                rule_loads.push(RuleLoad {
                    tool: set.tool,
                    services: n,
                    took: LoadTime::Stopped { limit: LOAD_LIMIT },
                });
                flush();
                continue;
            };
            rule_loads.push(RuleLoad { tool: set.tool, services: n, took: LoadTime::Done(took) });
            rows.extend(loader.rows(set.path, n, SocketAddr::new(IpAddr::V4(vip(target(n))), 80))?);
            flush();
        }
    }
    Ok(rule_loads)
}
