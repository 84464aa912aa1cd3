//! The demo: the incident replayed on one machine. Three simulated nodes (one agent each, own cgroup, one
//! zone without a zone label), a DaemonSet-style `nginx-cache` Service with one HTTP pod per node, and
//! booking clients on every node sending a request every 50 ms with a 5 s timeout.
//!
//! 1. `internalTrafficPolicy: Local`: the DaemonSet rolls (each node's pod terminates, is replaced, becomes
//!    ready, in turn). kube-proxy drops a node's traffic while it has no local endpoint, so clients wait their
//!    full timeout; tierlb fails those requests at once (EHOSTUNREACH) and says so.
//! 2. `trafficDistribution: PreferSameNode` (hints as the controller writes them): the same roll, no failed
//!    request; traffic leaves the node only during its window.
//! 3. The PDF-resume service: two replicas on three nodes, clients 50/30/20: each replica's measured share
//!    under PreferSameNode and with trafficDistribution unset, next to the simulator's prediction.
//! 4. DNS through a Service VIP (UDP), answered by the local resolver with the VIP as the reply's source.
//! 5. A pod crashes before the EndpointSlice says so (`crash`): passive health in each node's kernel, next to
//!    the study's prediction and to kube-proxy.
mod crash;
mod real;
pub(crate) mod timeline;

pub use real::{Pace, run as run_real};

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    probe::Report,
    sandbox::BpfFs,
};
use tierlb::{
    model::{NodeInfo, ObjKey},
    plan,
    source::manifests::ManifestDir,
};

/// The simulated nodes.
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
/// The booking clients' request timeout, in seconds.
const TIMEOUT_S: f64 = 5.0;
/// A booking client sends a request this often.
const INTERVAL: Duration = Duration::from_millis(50);
/// Each step of a node's roll (terminating, replaced but not ready, ready) lasts this long.
const STEP: Duration = Duration::from_millis(800);

/// The IP of the cache pod of `generation` on node `node`.
fn pod_ip(node: usize, generation: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, node as u8 + 1, 10 + generation))
}

/// The name of the cache pod of `generation` on node `node`.
fn pod_name(node: usize, generation: u8) -> String {
    format!("cache-{}-g{generation}", NODES[node])
}

/// The demo's clock, for its narration.
struct Elapsed(Instant);

impl Elapsed {
    /// Print `what` with the time since the demo started.
    fn say(&self, what: &str) {
        println!("   t={:>5.1} s  {what}", self.0.elapsed().as_secs_f64());
    }
}

/// A node's roll window: (node index, start s, end s), relative to the clients' start.
type RollWindow = (usize, f64, f64);

/// One roll of the DaemonSet under `svc`'s settings while clients run; returns the clients' reports.
fn roll_phase(
    c: &mut SimCluster,
    svc: &Svc,
    clock: &Elapsed,
) -> anyhow::Result<(Vec<Report>, Vec<RollWindow>)> {
    let mut generation = [0u8; 3];
    let ep = |node: usize, g: u8| Ep::ready(pod_ip(node, g), NODES[node]).prefer_same_node();
    let mut eps: Vec<Ep> = (0..3).map(|i| ep(i, 0)).collect();
    write_service(c.manifests.path(), svc, &eps)?;
    let before = c.syncs_all();
    c.wait_synced(&before.iter().map(|b| b.saturating_sub(1)).collect::<Vec<_>>())?;
    let total = STEP * 3 * 3 + Duration::from_millis(1600);
    let count = (total.as_millis() / INTERVAL.as_millis()) as usize;
    let t0 = clock.0.elapsed().as_secs_f64();
    let runs: Vec<_> = NODES
        .iter()
        .map(|n| c.start_probe_with_timeout(n, vip(), count, INTERVAL, Duration::from_secs_f64(TIMEOUT_S)))
        .collect::<Result<_, _>>()?;
    std::thread::sleep(Duration::from_millis(800));
    let mut windows = Vec::new();
    for i in 0..3 {
        let start = clock.0.elapsed().as_secs_f64() - t0;
        // Pod deletion: the endpoint turns terminating (still serving); the controller keeps its old hints.
        eps[i] = eps[i].clone().terminating();
        write_service(c.manifests.path(), svc, &eps)?;
        clock.say(&format!("{}: pod {} terminating", NODES[i], pod_name(i, generation[i])));
        std::thread::sleep(STEP);
        // The pod is gone; its replacement starts (new IP, not ready yet).
        c.stop_pod(SocketAddr::new(pod_ip(i, generation[i]), 8080));
        generation[i] += 1;
        c.add_pod(SocketAddr::new(pod_ip(i, generation[i]), 8080), &pod_name(i, generation[i]))?;
        eps[i] = Ep::ready(pod_ip(i, generation[i]), NODES[i]).not_ready();
        write_service(c.manifests.path(), svc, &eps)?;
        let kp = kube_proxy_verdict(c.manifests.path(), NODES[i]);
        clock.say(&format!("{}: replaced by {}, not ready yet; {kp}", NODES[i], pod_name(i, generation[i])));
        std::thread::sleep(STEP);
        eps[i] = ep(i, generation[i]);
        write_service(c.manifests.path(), svc, &eps)?;
        clock.say(&format!("{}: {} ready", NODES[i], pod_name(i, generation[i])));
        windows.push((i, start, clock.0.elapsed().as_secs_f64() - t0));
        std::thread::sleep(STEP);
    }
    let reports = runs.into_iter().map(lb_testkit::cluster::ProbeRun::wait).collect::<Result<Vec<_>, _>>()?;
    Ok((reports, windows))
}

/// The `nginx-cache` Service's plan for ClusterIP traffic on `node`, from the manifests as they are now: what
/// kube-proxy would program there.
fn cache_plan(dir: &Path, node: &str) -> Option<plan::TrafficPlan> {
    let loaded = ManifestDir::new(dir).load().ok()?;
    let p = plan::plan(&loaded.model, &NodeInfo::resolve(node, None, &loaded.model));
    let cache = ObjKey::new("default", "nginx-cache");
    p.services.into_iter().find(|s| s.name.service == cache).map(|s| s.internal)
}

/// What kube-proxy does on that node now, from the plan's `when_empty`.
fn kube_proxy_verdict(dir: &Path, node: &str) -> String {
    let Some(p) = cache_plan(dir, node) else { return String::new() };
    match p.when_empty {
        Some(plan::WhenEmpty::Drop) => "kube-proxy: DROP (its clients hang until their timeout)".into(),
        Some(plan::WhenEmpty::Reject) => "kube-proxy: REJECT".into(),
        None => "kube-proxy: still has an endpoint for it".into(),
    }
}

/// The `nginx-cache` Service's VIP and port.
fn vip() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 20)), 80)
}

/// Whether `backend` (a pod name) runs on node `node`.
fn own(node: usize, backend: &str) -> bool {
    backend.starts_with(&format!("cache-{}-", NODES[node]))
}

/// `own` by the node's name, as the chart's record takes it.
fn own_by_name(node: &str, backend: &str) -> bool {
    NODES.iter().position(|n| *n == node).is_some_and(|i| own(i, backend))
}

/// The simulated nodes' names, as the chart's record takes them.
fn node_names() -> Vec<String> {
    NODES.iter().map(|n| (*n).to_owned()).collect()
}

/// Per-node table of a roll phase; returns (failed, slowest failure ms, requests sent off-node).
fn roll_table(reports: &[Report]) -> (usize, f64, usize) {
    println!(
        "   {:<7} {:>8} {:>7} {:>14} {:>22}",
        "node", "requests", "failed", "slowest failure", "served by another node"
    );
    let (mut failed, mut slowest, mut remote) = (0, 0.0f64, 0);
    for (i, r) in reports.iter().enumerate() {
        let f = r.failures();
        let worst = r.attempts.iter().filter(|a| a.error.is_some()).map(|a| a.ms).fold(0.0, f64::max);
        let rem = r.attempts.iter().filter(|a| a.backend.as_deref().is_some_and(|b| !own(i, b))).count();
        println!(
            "   {:<7} {:>8} {:>7} {:>12.1} ms {:>21.0}%",
            NODES[i],
            r.attempts.len(),
            f,
            worst,
            100.0 * rem as f64 / r.attempts.len().max(1) as f64
        );
        failed += f;
        slowest = slowest.max(worst);
        remote += rem;
    }
    (failed, slowest, remote)
}

/// The roll windows as the chart shades them, one list per node.
fn shaded(windows: &[RollWindow]) -> Vec<Vec<timeline::Window>> {
    (0..NODES.len())
        .map(|i| {
            windows
                .iter()
                .filter(|w| w.0 == i)
                .map(|&(_, from, to)| timeline::Window { from, to, label: "rolling".into() })
                .collect()
        })
        .collect()
}

/// Each backend's share of the connects to `target` when node i sends `weights[i]` of them.
fn shares(c: &SimCluster, weights: [usize; 3], target: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    let mut total = 0.0;
    for (i, n) in NODES.iter().enumerate() {
        let r = c.probe(n, target, weights[i], Duration::ZERO)?;
        anyhow::ensure!(r.failures() == 0, "{n}: {:?}", r.errors());
        for (b, k) in r.by_backend() {
            *counts.entry(b).or_default() += k as f64;
        }
        total += weights[i] as f64;
    }
    Ok(counts.into_iter().map(|(k, v)| (k, v / total)).collect())
}

/// Run the demo with the `tierlb` agent binary and the `lab` client binary (`tierlb-lab`), printing each
/// phase's table and verdict and writing `demo-timeline.svg` into `out_dir`, with the data it is drawn from
/// (`demo-timeline.json`, see [`timeline`]); `Ok(true)` if every verdict passed.
pub fn run(tierlb: &Path, lab: &Path, out_dir: &Path) -> anyhow::Result<bool> {
    let clock = Elapsed(Instant::now());
    println!(
        "== tierlb demo: the booking form incident, replayed in a private netns on three simulated nodes"
    );
    // Declared first, dropped last: the agents pin their maps here and `tierlb status` reads each node's kernel.
    let bpffs = BpfFs::new("demo")?;
    let mut c = SimCluster::new("demo", tierlb, lab)?;
    for i in 0..3 {
        c.add_pod(SocketAddr::new(pod_ip(i, 0), 8080), &pod_name(i, 0))?;
    }
    let mut svc = Svc::new("nginx-cache", vip().ip(), 80, 8080);
    svc.internal_traffic_policy = Some("Local");
    svc.traffic_distribution = Some("PreferSameNode".into());
    write_service(c.manifests.path(), &svc, &[])?;
    let pins = bpffs.path().to_str().context("bpffs path")?;
    // The shipped passive health: the simulated nodes' clients share one network namespace, one client whose
    // K failures hold a crashed pod for itself.
    for n in NODES {
        c.add_node(n, &["--bpffs", pins])?;
    }
    clock.say("three agents ready (node-1, node-2, node-3; one zone, no zone label)");
    let mut chart = Vec::new();
    let local = local_roll(&mut c, &svc, &clock, &mut chart)?;
    svc.internal_traffic_policy = None;
    let prefer_same_node = prefer_same_node_roll(&mut c, &svc, &clock, &mut chart)?;
    let pdf = pdf_resume(&mut c)?;
    let dns = dns_through_a_vip(&mut c)?;
    let crashed = crash::pod_crash(&mut c, bpffs.path(), &clock, &mut chart)?;
    let ok = local && prefer_same_node && pdf && dns && crashed;

    std::fs::create_dir_all(out_dir)?;
    let svg = out_dir.join("demo-timeline.svg");
    std::fs::write(&svg, timeline::timeline_chart(&chart)?)?;
    std::fs::write(out_dir.join("demo-timeline.json"), serde_json::to_string(&chart)? + "\n")?;
    drop(c);
    println!(
        "\n{} demo finished in {:.0} s; chart: {}",
        if ok { "PASS" } else { "FAIL" },
        clock.0.elapsed().as_secs_f64(),
        svg.display()
    );
    Ok(ok)
}

/// Redraw the chart from a run's recorded `demo-timeline.json` into `out_dir`; returns the chart's path.
pub fn redraw(json: &Path, out_dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let text = std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let acts: Vec<timeline::Act> = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a demo's recorded timeline", json.display()))?;
    std::fs::create_dir_all(out_dir)?;
    let svg = out_dir.join("demo-timeline.svg");
    std::fs::write(&svg, timeline::timeline_chart(&acts)?)?;
    Ok(svg)
}

/// Act 1: the DaemonSet rolls under `internalTrafficPolicy: Local`; each node loses its traffic in its
/// window, and tierlb fails those requests at once where kube-proxy would drop them.
fn local_roll(
    c: &mut SimCluster,
    svc: &Svc,
    clock: &Elapsed,
    chart: &mut Vec<timeline::Act>,
) -> anyhow::Result<bool> {
    println!(
        "\n-- 1. internalTrafficPolicy: Local (+ trafficDistribution: PreferSameNode, a dead line): the DaemonSet rolls"
    );
    let (r1, windows) = roll_phase(c, svc, clock)?;
    let (failed, slowest, _) = roll_table(&r1);
    println!(
        "   kube-proxy would have DROPPED those {failed} requests: each client waits its full {TIMEOUT_S:.0} s timeout \
         ({:.0} s of waiting in all); tierlb failed each one in at most {slowest:.1} ms (EHOSTUNREACH)",
        failed as f64 * TIMEOUT_S
    );
    let v1 = failed > 0 && slowest < 100.0;
    println!(
        "   verdict: {} - a Local policy loses a node's traffic during its roll; tierlb makes the loss instant",
        pass(v1)
    );
    let verdict = format!(
        "{}: each node's requests failed in its own roll window, {failed} in all, each within {slowest:.1} ms \
         (kube-proxy: a {TIMEOUT_S:.0} s hang each)",
        pass(v1)
    );
    chart.push(timeline::record(
        "1. internalTrafficPolicy: Local",
        verdict,
        &node_names(),
        &r1,
        &shaded(&windows),
        &own_by_name,
    ));
    Ok(v1)
}

/// Act 2: the same roll under PreferSameNode: no failed request, traffic leaves a node only in its window.
fn prefer_same_node_roll(
    c: &mut SimCluster,
    svc: &Svc,
    clock: &Elapsed,
    chart: &mut Vec<timeline::Act>,
) -> anyhow::Result<bool> {
    println!("\n-- 2. trafficDistribution: PreferSameNode (internalTrafficPolicy unset): the same roll");
    for i in 0..3 {
        c.stop_pod(SocketAddr::new(pod_ip(i, 1), 8080));
        c.add_pod(SocketAddr::new(pod_ip(i, 0), 8080), &pod_name(i, 0))?;
    }
    let (r2, windows) = roll_phase(c, svc, clock)?;
    let (failed2, _, remote2) = roll_table(&r2);
    let outside_local = r2.iter().enumerate().all(|(i, r)| {
        let (_, s, e) = windows[i];
        r.attempts
            .iter()
            .filter(|a| a.t_ms / 1e3 < s - 0.1 || a.t_ms / 1e3 > e + 0.3)
            .all(|a| a.backend.as_deref().is_some_and(|b| own(i, b)))
    });
    let v2 = failed2 == 0 && outside_local && remote2 > 0;
    println!(
        "   {failed2} failed; outside its own roll window every node stayed local: {outside_local}; {remote2} requests \
         went to another node during the windows"
    );
    println!(
        "   verdict: {} - PreferSameNode falls back to the other nodes with zero failed requests",
        pass(v2)
    );
    let verdict = format!(
        "{}: {failed2} failed; {remote2} requests answered by another node, each node only in its own window",
        pass(v2)
    );
    let title = "2. trafficDistribution: PreferSameNode";
    chart.push(timeline::record(title, verdict, &node_names(), &r2, &shaded(&windows), &own_by_name));
    Ok(v2)
}

/// Act 3: the PDF-resume service, two replicas on three nodes with clients 50/30/20: measured shares next to
/// the simulator's.
fn pdf_resume(c: &mut SimCluster) -> anyhow::Result<bool> {
    println!(
        "\n-- 3. The PDF-resume service: two replicas (node-1, node-3) on three nodes, clients 50/30/20"
    );
    let pdf = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 30)), 80);
    let pdf_pods = [(0usize, "pdf-on-node-1"), (2, "pdf-on-node-3")];
    let mut pdf_eps = Vec::new();
    for (i, name) in pdf_pods {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 244, i as u8 + 1, 21));
        c.add_pod(SocketAddr::new(ip, 9000), name)?;
        pdf_eps.push(Ep::ready(ip, NODES[i]).prefer_same_node());
    }
    let mut pdf_svc = Svc::new("pdf-resume", pdf.ip(), 80, 9000);
    let predicted = tierlb::study::run(&tierlb::study::Scenario {
        name: "story".into(),
        description: String::new(),
        nodes: study_nodes([50.0, 30.0, 20.0]),
        service: tierlb::study::ScService {
            traffic_distribution: Some("PreferSameNode".into()),
            ..Default::default()
        },
        endpoints: pdf_eps.iter().map(|e| tierlb::study::ScEndpoint::new(e.ip, &e.node)).collect(),
        phases: Vec::new(),
        requests_per_second: 0.0,
        health: tierlb::study::HealthParams::default(),
        cilium: tierlb::study::CiliumSettings::default(),
    });
    let kp = &predicted.phases[0].models[0];
    println!("   {:<32} {:>14} {:>14}", "", "pdf-on-node-1", "pdf-on-node-3");
    let mut v3 = true;
    for (label, td, pred) in [
        (
            "PreferSameNode, measured",
            Some("PreferSameNode"),
            (kp.shares["10.244.1.21"], kp.shares["10.244.3.21"]),
        ),
        ("trafficDistribution unset", None, (0.5, 0.5)),
    ] {
        pdf_svc.traffic_distribution = td.map(str::to_owned);
        let eps: Vec<Ep> = if td.is_some() {
            pdf_eps.clone()
        } else {
            pdf_eps.iter().map(|e| e.clone().hints(None, None)).collect()
        };
        let before = c.syncs_all();
        write_service(c.manifests.path(), &pdf_svc, &eps)?;
        c.wait_synced(&before)?;
        let m = shares(c, [500, 300, 200], pdf)?;
        let (a, b) =
            (m.get("pdf-on-node-1").copied().unwrap_or(0.0), m.get("pdf-on-node-3").copied().unwrap_or(0.0));
        println!("   {label:<32} {:>13.1}% {:>13.1}%", a * 100.0, b * 100.0);
        println!("   {:<32} {:>13.1}% {:>13.1}%", "  simulator predicts", pred.0 * 100.0, pred.1 * 100.0);
        v3 &= (a - pred.0).abs() < 0.05 && (b - pred.1).abs() < 0.05;
    }
    println!(
        "   verdict: {} - PreferSameNode skews the two replicas (the story saw 65/35); unset spreads evenly",
        pass(v3)
    );
    Ok(v3)
}

/// The demo's nodes as a study scenario's, with these shares of the clients (one zone, unlabelled).
fn study_nodes(clients: [f64; 3]) -> Vec<tierlb::study::ScNode> {
    NODES
        .iter()
        .zip(clients)
        .map(|(n, w)| tierlb::study::ScNode {
            name: (*n).into(),
            zone: None,
            clients: w,
            cpu: 4000,
            client_pods: 1,
        })
        .collect()
}

/// Act 4: DNS over UDP through a Service VIP, answered by the node's resolver with the VIP as the source.
fn dns_through_a_vip(c: &mut SimCluster) -> anyhow::Result<bool> {
    println!(
        "\n-- 4. DNS through a Service VIP (UDP): kube-dns with resolvers on node-1 and node-3, PreferSameNode"
    );
    let dns_vip = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)), 53);
    let mut dns = Svc::new("kube-dns", dns_vip.ip(), 53, 53);
    dns.protocol = "UDP";
    dns.traffic_distribution = Some("PreferSameNode".into());
    let mut dns_eps = Vec::new();
    for i in [0usize, 2] {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 244, i as u8 + 1, 53));
        c.add_dns_pod(SocketAddr::new(ip, 53), IpAddr::V4(Ipv4Addr::new(10, 0, i as u8 + 1, 1)))?;
        dns_eps.push(Ep::ready(ip, NODES[i]).prefer_same_node());
    }
    let before = c.syncs_all();
    write_service(c.manifests.path(), &dns, &dns_eps)?;
    c.wait_synced(&before)?;
    let mut v4 = true;
    for n in NODES {
        let lookups = c.dns(n, dns_vip, 10, false)?;
        let answers: std::collections::BTreeSet<String> =
            lookups.iter().filter_map(|l| l.answer.clone()).collect();
        let sources: std::collections::BTreeSet<String> =
            lookups.iter().filter_map(|l| l.reply_from.clone()).collect();
        let failed = lookups.iter().filter(|l| l.error.is_some()).count();
        // Each resolver answers with 10.0.<its node number>.1, so the answer says which one replied.
        let by: Vec<String> = answers
            .iter()
            .map(|a| format!("node-{}", a.split('.').nth(2).unwrap_or("?")))
            .map(|r| if r == n { format!("{r} (local)") } else { r })
            .collect();
        println!(
            "   {n:<7} cache.booking.svc.cluster.local -> {} from the resolver on {}; reply source {}; failed {failed}",
            answers.iter().cloned().collect::<Vec<_>>().join(","),
            by.join(" and "),
            sources.iter().cloned().collect::<Vec<_>>().join(",")
        );
        v4 &= failed == 0 && sources.len() == 1 && sources.contains(&dns_vip.to_string());
    }
    println!("   verdict: {} - UDP through the VIP, replies carry the VIP as their source", pass(v4));
    Ok(v4)
}

/// A verdict as the demo prints it.
fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}
