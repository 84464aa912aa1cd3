//! The agent's own figures, as it runs on a node: start to ready, one EndpointSlice edit at a time, and its
//! memory, with N Services x 10 endpoints read from manifest files, from the bench's API-server stand-in
//! ([`ApiServer`]), or from the real kube-apiserver built here ([`RealApiServer`]).
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use lb_testkit::{
    manifests,
    sandbox::{Cgroup, Child, TempDir},
};

use super::{
    apiserver::ApiServer,
    figures::{AgentFigures, AgentSource, Phases, Spread},
    real_apiserver::RealApiServer,
    workloads::{EDITED, EDITED_FILE, service_docs, service_yaml, write_agent_manifests},
};

/// Edits measured per run: an endpoint leaves, then comes back.
const EDITS: usize = 20;

/// How the edits reach the agent.
enum Feed {
    Files(TempDir),
    Api(ApiServer, TempDir),
    Real(Box<RealApiServer>, TempDir),
}

impl Feed {
    fn start(source: AgentSource, services: usize, per: usize) -> anyhow::Result<Self> {
        match source {
            AgentSource::Manifests => {
                let dir = TempDir::new("bench-agent")?;
                write_agent_manifests(dir.path(), services, per)?;
                Ok(Self::Files(dir))
            }
            AgentSource::Kube => {
                let (mut svcs, mut slices) = (Vec::with_capacity(services), Vec::with_capacity(services));
                for i in 0..services {
                    let mut docs = service_docs(i, per, per).into_iter();
                    svcs.extend(docs.next());
                    slices.extend(docs);
                }
                let api = ApiServer::start(svcs, slices, vec![manifests::node("node-1", None)])?;
                let dir = TempDir::new("bench-agent-kube")?;
                std::fs::write(dir.path().join("kubeconfig"), api.kubeconfig())?;
                Ok(Self::Api(api, dir))
            }
            AgentSource::ApiServer => {
                let docs = (0..services).flat_map(|i| service_docs(i, per, per)).collect();
                Ok(Self::Real(Box::new(RealApiServer::start(docs)?), TempDir::new("bench-agent-apiserver")?))
            }
        }
    }

    fn dir(&self) -> &Path {
        match self {
            Self::Files(d) | Self::Api(_, d) | Self::Real(_, d) => d.path(),
        }
    }

    fn source_args(&self, cmd: &mut Command) -> anyhow::Result<()> {
        match self {
            Self::Files(d) => {
                cmd.arg("--manifests").arg(d.path());
            }
            Self::Api(_, d) => {
                cmd.arg("--kube").env("KUBECONFIG", d.path().join("kubeconfig"));
            }
            Self::Real(api, _) => api.agent(cmd)?,
        }
        Ok(())
    }

    /// The edited Service's EndpointSlice with `endpoints` of its `per` endpoints.
    fn edit(&self, endpoints: usize, per: usize) -> anyhow::Result<()> {
        match self {
            Self::Files(d) => {
                manifests::write_atomic(d.path(), EDITED_FILE, &service_yaml(EDITED, endpoints, per))?;
            }
            Self::Api(api, _) => {
                let slice = service_docs(EDITED, endpoints, per).into_iter().nth(1).context("a slice")?;
                api.modify_slice(slice);
            }
            Self::Real(api, _) => {
                let slice = service_docs(EDITED, endpoints, per).into_iter().nth(1).context("a slice")?;
                api.replace(&slice)?;
            }
        }
        Ok(())
    }
}

/// The agent reading `services` Services x `per` endpoints from `source`: time to ready, [`EDITS`] single
/// EndpointSlice edits, and its RSS after them.
fn agent_figures(
    tierlb: &Path,
    source: AgentSource,
    services: usize,
    per: usize,
) -> anyhow::Result<AgentFigures> {
    let feed = Feed::start(source, services, per)?;
    let cg = Cgroup::new("bench-agent")?;
    let log = feed.dir().join(".agent.log");
    let mut cmd = Command::new(tierlb);
    cmd.args(["agent", "--node", "node-1", "--log-format", "json"]);
    feed.source_args(&mut cmd)?;
    let entries = services * lb_common::slot_blocks(per);
    if services > lb_common::DEFAULT_MAX_FRONTENDS as usize * 3 / 4
        || entries > lb_common::DEFAULT_MAX_SLOTS as usize * 3 / 4
        || services * per > lb_common::DEFAULT_MAX_BACKENDS as usize * 3 / 4
    {
        // Past the default capacities (65,536 Services, 1,048,576 slot entries, 262,144 backends): sized as
        // an operator would.
        let svcs = (services + services / 5).to_string();
        let slots = (entries * 6 / 5).max(lb_common::DEFAULT_MAX_SLOTS as usize).to_string();
        let backends = (services * per * 6 / 5).to_string();
        cmd.args(["--max-services", &svcs, "--max-slots", &slots, "--max-backends", &backends]);
    }
    cmd.arg("--cgroup")
        .arg(cg.path())
        .args(["--healthz-addr", "off", "--metrics-addr", "off", "--service-health-bind", "off"])
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log)?);
    let t0 = Instant::now();
    let mut child = Child::spawn(&mut cmd)?;
    let synced = || log_fields(&log, "synced");
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("tierlb agent ready") {
        if t0.elapsed() > Duration::from_mins(3) || matches!(child.inner().try_wait(), Ok(Some(_))) {
            bail!("agent did not start: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ready = t0.elapsed();
    let phases = log_fields(&log, "tierlb agent ready")
        .first()
        .and_then(Phases::of_ready_line)
        .context("the agent's ready line without its phases")?;
    // Let the start settle (a source may sync more than once while its watches start) before editing.
    let mut seen = synced().len();
    let mut quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(50));
        let now = synced().len();
        if now != seen {
            (seen, quiet) = (now, Instant::now());
        }
    }
    let mut took_us = Vec::new();
    let mut parts = [("read_us", Vec::new()), ("plan_us", Vec::new()), ("program_us", Vec::new())];
    let mut wall_ms = Vec::new();
    for k in 0..EDITS {
        let before = synced().len();
        let t = Instant::now();
        feed.edit(if k % 2 == 0 { per - 1 } else { per }, per)?;
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
        for (k, v) in &mut parts {
            v.push(line[*k].as_f64().unwrap_or_default() / 1e3);
        }
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.pid()))?;
    let rss_kib =
        status_kib(&status, "VmRSS:").with_context(|| format!("no VmRSS in the agent's status: {status}"))?;
    // Its peak (the start's first list and plan), what a memory limit must hold: deploy/README.md's sizing.
    let peak_kib = status_kib(&status, "VmHWM:").unwrap_or_default();
    drop(child);
    no_errors(&log)?;
    if let Feed::Api(api, _) = &feed {
        let unknown = api.unknown.load(std::sync::atomic::Ordering::Relaxed);
        anyhow::ensure!(unknown == 0, "the agent made {unknown} requests the stand-in does not serve");
    }
    let figures = AgentFigures {
        source,
        services,
        ready,
        edit_took: Spread::of(took_us.iter().map(|us| us / 1e3).collect()),
        edit_wall: Spread::of(wall_ms),
        rss_bytes: rss_kib * 1024,
        phases,
    };
    eprintln!(
        "bench: agent ({}) {services} services: ready {:.2} s, one edit median {:.3} ms (wall {:.1} ms), RSS {} MiB (peak {:.1} MiB)",
        source.as_str(),
        ready.as_secs_f64(),
        figures.edit_took.median_ms,
        figures.edit_wall.median_ms,
        figures.rss_bytes >> 20,
        peak_kib as f64 / 1024.0
    );
    eprintln!("bench: agent ({}) {services} services: start by phase {}", source.as_str(), phases.describe());
    let [read, plan, program] = parts.map(|(_, v)| Spread::of(v).median_ms);
    eprintln!(
        "bench: agent ({}) {services} services: one edit by phase (medians) read {read:.3} ms, plan {plan:.3} ms, program {program:.3} ms",
        source.as_str()
    );
    Ok(figures)
}

/// Figures of an agent that failed to write part of its state are not figures of the agent at work: its log
/// must hold no error.
fn no_errors(log: &Path) -> anyhow::Result<()> {
    let errors: Vec<String> = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["level"] == "ERROR"))
        .take(3)
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(errors.is_empty(), "the agent logged errors during the run:\n{}", errors.join("\n"));
    Ok(())
}

/// A `/proc/PID/status` field in KiB: "VmRSS:     81704 kB" (the kernel's kB are KiB); a zombie has none.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(field))?.trim().strip_suffix(" kB")?.trim().parse().ok()
}

/// The fields of the agent's JSON log lines with `message`, in order.
fn log_fields(log: &Path, message: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .map(|v| v["fields"].clone())
        .collect()
}

/// The agent's figures alone, from each source at `services` Services x 10 endpoints (any count: for the
/// sizing table in deploy/README.md), each printed as it is measured; a source that fails says why.
pub fn agent_only(tierlb: &Path, services: usize) -> Vec<AgentFigures> {
    from_sources(tierlb, &AgentSource::ALL, services, 10)
}

fn from_sources(tierlb: &Path, sources: &[AgentSource], n: usize, per: usize) -> Vec<AgentFigures> {
    let mut agent = Vec::new();
    for &source in sources {
        match agent_figures(tierlb, source, n, per) {
            Ok(a) => agent.push(a),
            Err(e) => eprintln!("bench: agent figures ({}, {n} services): {e:#}", source.as_str()),
        }
    }
    agent
}

/// The most Services the bench creates through the real API server: 10,000 Services and their slices took
/// 43 s to create here; 100,000 had not finished after 24 minutes (the API server at two CPUs' worth
/// throughout), past any bench's time.
const REAL_MAX_SERVICES: usize = 10_000;

/// The agent's figures from each source at 10,000 and 100,000 Services (those of `counts`), the real API
/// server's up to [`REAL_MAX_SERVICES`]; a run that fails is left out, with the reason on stderr.
pub(super) fn agent_runs(tierlb: &Path, counts: &[usize], per: usize) -> Vec<AgentFigures> {
    let mut out = Vec::new();
    for &n in counts.iter().filter(|n| **n == 10_000 || **n == 100_000) {
        let sources: Vec<AgentSource> = AgentSource::ALL
            .into_iter()
            .filter(|s| *s != AgentSource::ApiServer || n <= REAL_MAX_SERVICES)
            .collect();
        if sources.len() < AgentSource::ALL.len() {
            eprintln!(
                "bench: agent (kube-apiserver) at {n} services: not run, creating its objects takes longer than the \
                 bench (`tierlb-lab bench --agent-only {n}` runs it)"
            );
        }
        out.extend(from_sources(tierlb, &sources, n, per));
    }
    out
}
