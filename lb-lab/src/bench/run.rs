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
use serde::Serialize;

use lb_common::{Backend, FrontendKey, FrontendValue, SlotKey};
use lb_testkit::{
    manifests,
    sandbox::{Cgroup, Child, NetNs, TempDir, confine},
};
use tierlb::datapath::{Desired, Reconciler, addr, ebpf::Loaded};

use super::{
    load::{BACKEND, LoadMode, LoadResult, Sink},
    workloads::{EDITED, EDITED_FILE, RULE_SETS, desired, service_yaml, target, vip, write_agent_manifests},
};

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

/// The data paths, in table and chart order.
pub const PATHS: [&str; 4] = ["direct", "tierlb", "iptables", "nftables"];

/// One measured row: a data path at a Service count under one load mode.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub path: String,
    pub services: usize,
    pub mode: LoadMode,
    pub result: LoadResult,
    /// BPF run time per connect4 call (kernel.bpf_stats_enabled), tierlb rows only.
    pub bpf_ns_per_run: Option<f64>,
}

/// What a whole run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub kernel: String,
    pub cpus: usize,
    pub threads: usize,
    pub seconds: f64,
    pub rows: Vec<Row>,
    pub control: Vec<(String, String)>,
}

impl Report {
    /// The row of `path` at `services` Services under `mode` (direct has one per mode, whatever `services`).
    pub fn row(&self, path: &str, services: usize, mode: LoadMode) -> Option<&Row> {
        self.rows
            .iter()
            .find(|x| x.path == path && x.mode == mode && (x.services == services || path == "direct"))
    }
}

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
        for mode in LoadMode::ALL {
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
    let service = want.service.clone();
    let one: Desired = [(k, want)].into_iter().collect();
    let t1 = Instant::now();
    let rep = rec.apply_services([service.as_str()], &one, Instant::now());
    let took = t1.elapsed();
    anyhow::ensure!(rep.updated == 1 && rep.errors.is_empty(), "one change: {rep:?}");
    rec.apply(d, Instant::now());
    Ok((
        "apply one EndpointSlice change at 10,000 Services, map writes (new slots, frontend swap)".into(),
        format!("{:.3} ms", took.as_secs_f64() * 1e3),
    ))
}

fn agent_figures(tierlb: &Path, per: usize) -> anyhow::Result<Vec<(String, String)>> {
    let dir = TempDir::new("bench-agent")?;
    write_agent_manifests(dir.path(), per)?;
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
            EDITED_FILE,
            &service_yaml(EDITED, if k % 2 == 0 { per - 1 } else { per }, per),
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
