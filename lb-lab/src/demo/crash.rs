//! Act 5: a pod crashes before the EndpointSlice says so. Under PreferSameNode, as act 2's roll left the cache
//! (one ready pod per node), node-1's cache process is SIGKILLed while every node's booking clients keep
//! sending; its EndpointSlice keeps saying ready. Each node's kernel learns only from its own clients' connects:
//! node-1's get K refused connects, then its `sock_ops` holds the pod down and node-1's connects fall back to
//! the other nodes. The process comes back (same IP) before the hold ends; node-1's traffic returns to it when
//! the hold ends and a trial connect succeeds. What the clients measured is printed next to what `tierlb study`
//! predicts for the same setup (the same code) and next to kube-proxy, which has only the EndpointSlice.
use std::{
    net::SocketAddr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_testkit::{
    cluster::{ProbeRun, SimCluster},
    probe::Report,
};
use tierlb::study::{
    self, Crash, HealthParams, ModelResult, ProxyModel, ScChange, ScEndpoint, ScPhase, ScService, Scenario,
};

use super::{
    Elapsed, INTERVAL, NODES, TIMEOUT_S, cache_plan, own, pass, pod_ip, pod_name, study_nodes,
    timeline::{self, Act, Window},
    vip,
};

/// The clients run this long before the crash.
const CRASH_AT: Duration = Duration::from_millis(500);
/// The pod's process is down this long; no EndpointSlice ever says so.
const DOWN_FOR: Duration = Duration::from_millis(1500);
/// The clients keep running this long after the first hold would end, to see node-1 local again.
const AFTER_HOLD: Duration = Duration::from_millis(1500);
/// The generation of cache pods act 2's roll left on every node.
const GENERATION: u8 = 1;

/// What one node's clients saw, in seconds from the clients' start.
struct NodeSeen {
    failed: usize,
    /// Requests sent while the pod's process was down.
    while_down: usize,
    /// The first request served by another node after the kill.
    fallback_at: Option<f64>,
    /// The first request served by the node's own pod after the process came back.
    local_again_at: Option<f64>,
    /// Whether every request from `local_again_at` on stayed on the node.
    stayed_local: bool,
}

fn seen(i: usize, r: &Report, crash: f64, back: f64) -> NodeSeen {
    let t = |a: &lb_testkit::probe::Attempt| a.t_ms / 1e3;
    let served_by =
        |a: &lb_testkit::probe::Attempt, mine: bool| a.backend.as_deref().is_some_and(|b| own(i, b) == mine);
    let local_again = r.attempts.iter().position(|a| t(a) >= back && served_by(a, true));
    NodeSeen {
        failed: r.failures(),
        while_down: r.attempts.iter().filter(|a| (crash..back).contains(&t(a))).count(),
        fallback_at: r.attempts.iter().find(|a| t(a) >= crash && served_by(a, false)).map(t),
        local_again_at: local_again.map(|k| t(&r.attempts[k])),
        stayed_local: local_again.is_some_and(|k| r.attempts[k..].iter().all(|a| served_by(a, true))),
    }
}

/// `tierlb status -o json` of one node's agent: what its kernel's health map and counters say.
fn kernel_status(tierlb: &Path, bpffs: &Path, node: &str) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(tierlb)
        .args(["status", "-o", "json", "--instance", node, "--bpffs"])
        .arg(bpffs)
        .output()
        .context("tierlb status")?;
    anyhow::ensure!(out.status.success(), "tierlb status: {}", String::from_utf8_lossy(&out.stderr));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).context("tierlb status output")?;
    Ok(all[0].clone())
}

/// What `tierlb study` predicts for this act: three nodes with one client each (a request per `INTERVAL`),
/// one cache pod per node under PreferSameNode, node-1's process crashed for `down_s` seconds.
fn predict(down_s: f64, dead: SocketAddr) -> study::StudyResult {
    study::run(&Scenario {
        name: "pod crash".into(),
        description: String::new(),
        nodes: study_nodes([1.0; 3]),
        service: ScService { traffic_distribution: Some("PreferSameNode".into()), ..Default::default() },
        endpoints: (0..3).map(|i| ScEndpoint::new(pod_ip(i, GENERATION), NODES[i])).collect(),
        phases: vec![ScPhase {
            name: "node-1's process crashed".into(),
            duration: Some(down_s),
            reset: false,
            set: vec![ScChange { crash: Some(Crash::Process), ..ScChange::new(dead.ip()) }],
        }],
        requests_per_second: NODES.len() as f64 / INTERVAL.as_secs_f64(),
        health: HealthParams::default(),
        cilium: study::CiliumSettings::default(),
    })
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// What the act's run produced; times in seconds from the clients' start.
struct Run {
    reports: Vec<Report>,
    /// When node-1's process was killed.
    crash: f64,
    /// When it was running again.
    back: f64,
    /// When node-1's kernel said its hold would end.
    hold_ends: Option<f64>,
    /// node-1's passive health transitions (held, healthy) during the act, from its kernel's counters.
    transitions: (u64, u64),
}

/// node-1's kernel counters of holds and recoveries (`tierlb status`), since its maps were made.
fn transitions(status: &serde_json::Value) -> (u64, u64) {
    let t = &status["health_transitions"];
    (t["held"].as_u64().unwrap_or(0), t["healthy"].as_u64().unwrap_or(0))
}

/// The clients run while node-1's process is killed and started again; node-1's kernel is asked in between.
fn replay(c: &mut SimCluster, bpffs: &Path, clock: &Elapsed, hold: Duration) -> anyhow::Result<Run> {
    let dead = SocketAddr::new(pod_ip(0, GENERATION), 8080);
    let total = CRASH_AT + hold + AFTER_HOLD;
    let count = (total.as_millis() / INTERVAL.as_millis()) as usize;
    let before = transitions(&kernel_status(&c.tierlb, bpffs, NODES[0])?);
    let start = Instant::now();
    let runs: Vec<ProbeRun> = NODES
        .iter()
        .map(|n| c.start_probe_with_timeout(n, vip(), count, INTERVAL, Duration::from_secs_f64(TIMEOUT_S)))
        .collect::<Result<_, _>>()?;
    sleep_until(start + CRASH_AT);
    c.kill_pod(dead);
    let crash = start.elapsed().as_secs_f64();
    clock.say(&format!("node-1: {} SIGKILLed; its EndpointSlice still says ready", pod_name(0, GENERATION)));
    sleep_until(start + CRASH_AT + DOWN_FOR / 2);
    let mid = kernel_status(&c.tierlb, bpffs, NODES[0])?;
    let asked = start.elapsed().as_secs_f64();
    let entry = mid["health"]
        .as_array()
        .and_then(|all| all.iter().find(|h| h["backend"].as_str() == Some(&dead.to_string())))
        .cloned()
        .unwrap_or_default();
    let hold_ends = entry["left_seconds"].as_f64().map(|left| asked + left);
    clock.say(&format!(
        "node-1's kernel: {} {} ({}){}",
        entry["backend"].as_str().unwrap_or("no backend"),
        entry["state"].as_str().unwrap_or("followed"),
        entry["reason"].as_str().unwrap_or("-"),
        hold_ends.map_or_else(String::new, |t| format!(", {:.1} s left", t - asked)),
    ));
    sleep_until(start + CRASH_AT + DOWN_FOR);
    c.add_pod(dead, &pod_name(0, GENERATION))?;
    let back = start.elapsed().as_secs_f64();
    clock.say(&format!(
        "node-1: {} running again (same IP); no EndpointSlice changed at any point",
        pod_name(0, GENERATION)
    ));
    let reports = runs.into_iter().map(ProbeRun::wait).collect::<Result<Vec<_>, _>>()?;
    let after = transitions(&kernel_status(&c.tierlb, bpffs, NODES[0])?);
    let transitions = (after.0.saturating_sub(before.0), after.1.saturating_sub(before.1));
    Ok(Run { reports, crash, back, hold_ends, transitions })
}

/// node-1's windows on the chart: its process down, then held by its kernel after it came back.
fn windows(run: &Run) -> Vec<Window> {
    let mut w = vec![Window { from: run.crash, to: run.back, label: "down".into() }];
    if let Some(end) = run.hold_ends.filter(|end| *end > run.back) {
        w.push(Window { from: run.back, to: end, label: "held".into() });
    }
    w
}

fn secs(t: Option<f64>, from: f64) -> String {
    t.map_or_else(|| "-".to_owned(), |t| format!("{:.2} s", t - from))
}

/// The study's prediction for the run and kube-proxy's behaviour, printed next to what was measured.
fn compare(c: &SimCluster, run: &Run, seen: &[NodeSeen]) {
    let down_s = run.back - run.crash;
    let predicted = predict(down_s, SocketAddr::new(pod_ip(0, GENERATION), 8080));
    let phase = &predicted.phases[1];
    let requests = phase.requests.unwrap_or(0.0);
    let model = |m: ProxyModel| phase.models.iter().find(|r| r.model == m).expect("every model");
    let lost = |r: &ModelResult| r.failed * requests;
    let tierlb = model(ProxyModel::Tierlb);
    let per_node = NODES
        .iter()
        .map(|n| {
            tierlb.detections.iter().find(|d| d.node == *n).map_or_else(
                || format!("{n} 0"),
                |d| format!("{n} {:.0} refused, held at {}", d.failed_before_hold, secs(d.held_at_s, 0.0)),
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    println!(
        "   the study, same setup ({:.0} requests/s, {down_s:.1} s down, {}): {per_node}; {:.0} of {requests:.0} \
         requests lost",
        predicted.requests_per_second,
        tierlb.label,
        lost(tierlb),
    );
    println!(
        "   measured in the kernel: {} lost ({}); node-1 fell back {} after the kill",
        seen.iter().map(|s| s.failed).sum::<usize>(),
        NODES.iter().zip(seen).map(|(n, s)| format!("{n} {}", s.failed)).collect::<Vec<_>>().join(", "),
        secs(seen[0].fallback_at, run.crash),
    );
    let endpoints = cache_plan(c.manifests.path(), NODES[0]).map(|p| p.endpoints).unwrap_or_default();
    println!(
        "   kube-proxy: node-1's endpoints are [{}], the dead pod, from an EndpointSlice that still says ready; it \
         keeps sending node-1's traffic there until the EndpointSlice changes (for a container that exits, once \
         the kubelet has seen it and the controller has written the slice, seconds; for a process that hangs, \
         once its readiness probe fails, failureThreshold x periodSeconds, 30 s by default): all {} node-1 \
         requests sent while the process was down would have failed (the study's kube-proxy model: {:.0} of {requests:.0})",
        endpoints.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        seen[0].while_down,
        lost(model(ProxyModel::KubeProxy)),
    );
    println!(
        "   return: the process was back {down_s:.2} s after the kill; node-1's kernel held it until {} after the \
         kill, then a trial connect found it up: local again {} after the return; its kernel's transitions in \
         this act: held {}, healthy {}",
        secs(run.hold_ends, run.crash),
        secs(seen[0].local_again_at, run.back),
        run.transitions.0,
        run.transitions.1,
    );
}

/// Act 5; `bpffs` is the agents' `--bpffs`, where `tierlb status` reads each node's kernel.
pub(super) fn pod_crash(
    c: &mut SimCluster,
    bpffs: &Path,
    clock: &Elapsed,
    chart: &mut Vec<Act>,
) -> anyhow::Result<bool> {
    println!(
        "\n-- 5. A pod crashes before the EndpointSlice says so: PreferSameNode, node-1's cache process SIGKILLed"
    );
    // The demo's agents run with the default flags.
    let params = HealthParams::default();
    let run = replay(c, bpffs, clock, Duration::from_secs_f64(params.hold_s))?;
    println!(
        "   {:<7} {:>8} {:>7} {:>18} {:>17} {:>24}",
        "node", "requests", "failed", "sent while down", "fell back after", "local again after return"
    );
    let seen: Vec<NodeSeen> =
        run.reports.iter().enumerate().map(|(i, r)| seen(i, r, run.crash, run.back)).collect();
    for (i, s) in seen.iter().enumerate() {
        println!(
            "   {:<7} {:>8} {:>7} {:>18} {:>17} {:>24}",
            NODES[i],
            run.reports[i].attempts.len(),
            s.failed,
            s.while_down,
            secs(s.fallback_at, run.crash),
            if i == 0 { secs(s.local_again_at, run.back) } else { "-".into() },
        );
    }
    compare(c, &run, &seen);
    let returned_after_hold = match (seen[0].local_again_at, run.hold_ends) {
        (Some(t), Some(end)) => t >= end - 0.1 && seen[0].stayed_local,
        _ => false,
    };
    let k = params.failures as usize;
    let ok = (1..=k).contains(&seen[0].failed)
        && seen[1..].iter().all(|s| s.failed == 0)
        && seen[0].fallback_at.is_some_and(|t| t - run.crash < 1.0)
        && returned_after_hold
        && run.transitions == (1, 1);
    println!(
        "   verdict: {} - a crashed pod costs its node at most K={k} failed requests, not every request until the \
         EndpointSlice changes; traffic returns after the hold",
        pass(ok)
    );
    let verdict = format!(
        "{}: node-1 lost {} requests (K={k}), then went to the other nodes until its kernel's hold ended \
         (kube-proxy would lose all {} sent while the pod was down)",
        pass(ok),
        seen[0].failed,
        seen[0].while_down,
    );
    let title = "5. A pod crashes (PreferSameNode, no EndpointSlice change)";
    chart.push(timeline::record(
        title,
        verdict,
        &super::node_names(),
        &run.reports,
        &[windows(&run)],
        &super::own_by_name,
    ));
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use lb_testkit::probe::Attempt;

    use super::*;

    /// node-1's clients as the act should see them: local until the kill at 0.5 s, three refused connects, the
    /// other nodes until 5.2 s (the process back at 2.0 s, the hold over at 5.15 s), local again.
    fn node_1() -> Report {
        let attempts = (0..140)
            .map(|k| {
                let t_ms = 50.0 * f64::from(k);
                let (backend, error) = match t_ms {
                    t if t < 500.0 => (Some(pod_name(0, GENERATION)), None),
                    t if t < 650.0 => (None, Some("ECONNREFUSED".to_owned())),
                    t if t < 5200.0 => (Some(pod_name(1 + usize::from(k % 2 == 1), GENERATION)), None),
                    _ => (Some(pod_name(0, GENERATION)), None),
                };
                Attempt { t_ms, ms: 0.3, backend, error, peer: None }
            })
            .collect();
        Report { target: vip().to_string(), attempts }
    }

    #[test]
    fn what_a_node_saw_fallback_and_return_from_its_clients_attempts() {
        let s = seen(0, &node_1(), 0.5, 2.0);
        assert_eq!((s.failed, s.while_down), (3, 30));
        assert!(
            (s.fallback_at.unwrap() - 0.65).abs() < 1e-9 && (s.local_again_at.unwrap() - 5.2).abs() < 1e-9
        );
        assert!(s.stayed_local);
        // Seen from node-2 the same attempts never reached its own pod after the return.
        let other = seen(1, &node_1(), 0.5, 2.0);
        assert!(other.local_again_at.is_some_and(|t| t < 5.2) && !other.stayed_local);
    }
}
