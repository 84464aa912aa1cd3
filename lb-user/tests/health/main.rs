//! In-kernel tests of passive health: the `sock_ops` program sees the outcome of the connects tierlb
//! translated and holds a backend down after `--health-failures` failures in a row, before any EndpointSlice
//! says so. A crashed local pod (refused connects) and a blackholed one (SYNs dropped by a rule in the test's
//! own netns) cost exactly K failed connects; a pod that comes back gets traffic again after the hold; healthy
//! backends under load are never held. Clients of a `SimCluster` share one network namespace, so those tests
//! run with `--health-clients=1`; the tests as deployed give each pod its own and keep the default quorum
//! (2): one pod's own failures (local aborts, `IP_TTL=1`, SYNs a policy drops) hold nothing for another.
//!
//! Exactly as documented (docs/cli.md, `--health-*`): K failed connects in a row and not one fewer or more hold
//! a backend (K = 1, 3, 5 through `--health-failures`); a hold lasts `--health-hold`, each failed trial doubles
//! it up to `--health-max-hold` (the kernel's own hold lengths read back, and the trials' times measured,
//! never early, and before the next doubling would end); a success after a hold ends it and not before the hold is over; a trial that never reports
//! keeps the backend out for its 3 s window; with every backend of the tier held the panic threshold sends
//! connects to one anyway, K failures per backend first.
#[path = "../common/mod.rs"]
mod common;
mod reasons;

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use common::{cluster, eventually, nft, tierlb};
use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    probe::Report,
    sandbox::BpfFs,
};

fn vip() -> SocketAddr {
    "10.96.0.40:80".parse().unwrap()
}

fn pod(i: usize) -> SocketAddr {
    SocketAddr::new(format!("10.244.{i}.40").parse().unwrap(), 8080)
}

/// PreferSameNode web with a pod on node-1, node-2 and node-3 (zone a), node-1's agent with `extra` flags.
fn start(tag: &str, extra: &[&str]) -> (SimCluster, BpfFs, String) {
    start_with(tag, &[1, 2, 3], true, extra)
}

/// web (zone a; PreferSameNode if `topology`) with a pod on each node of `nodes`; node-1's agent with `extra`.
fn start_with(tag: &str, nodes: &[usize], topology: bool, extra: &[&str]) -> (SimCluster, BpfFs, String) {
    let mut c = cluster(tag);
    let bpffs = BpfFs::new(tag).unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let mut eps = Vec::new();
    for &i in nodes {
        let node = format!("node-{i}");
        c.add_pod(pod(i), &format!("pod-{node}")).unwrap();
        let ep = Ep::ready(pod(i).ip(), &node).zone("a");
        eps.push(if topology { ep.prefer_same_node() } else { ep });
    }
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    if topology {
        svc.traffic_distribution = Some("PreferSameNode".into());
    }
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    let mut args = vec!["--zone", "a", "--bpffs", &pin, "--health-clients=1"];
    args.extend_from_slice(extra);
    c.add_node("node-1", &args).unwrap();
    (c, bpffs, pin)
}

fn status(pin: &str) -> serde_json::Value {
    let (ok, out, err) = tierlb(&["status", "-o", "json", "--bpffs", pin]);
    assert!(ok, "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap()[0].clone()
}

/// Connects in order until the first that reached `pod-node-1` after failures; (failed, then the rest).
fn after_failures(r: &Report) -> (usize, Vec<String>) {
    let failed = r.attempts.iter().take_while(|a| a.error.is_some()).count();
    let rest =
        r.attempts[failed..].iter().map(|a| a.backend.clone().unwrap_or_else(|| "FAILED".into())).collect();
    (failed, rest)
}

#[test]
fn a_crashed_local_pod_costs_k_failed_connects_and_gets_traffic_back_after_the_hold() {
    let (mut c, _bpffs, pin) = start("health-crash", &["--health-hold", "2s"]);
    let r = c.probe("node-1", vip(), 10, Duration::ZERO).unwrap();
    assert_eq!(r.count("pod-node-1"), 10, "{:?}", r.by_backend());

    // The local pod's process dies; its EndpointSlice still says ready.
    c.stop_pod(pod(1));
    let r = c.probe("node-1", vip(), 200, Duration::ZERO).unwrap();
    let (failed, rest) = after_failures(&r);
    assert_eq!(failed, 3, "K = 3 failed connects before the hold: {:?}", r.errors());
    assert!(rest.iter().all(|b| b == "pod-node-2" || b == "pod-node-3"), "then the zone tier only: {rest:?}");
    eprintln!(
        "local pod killed: {failed} connects failed (ECONNREFUSED), then {} of {} to the zone tier",
        rest.len(),
        r.attempts.len()
    );
    let st = status(&pin);
    let h = &st["health"][0];
    assert_eq!(
        (h["backend"].as_str(), h["state"].as_str(), h["reason"].as_str()),
        (Some("10.244.1.40:8080"), Some("held"), Some("refused")),
        "{st}"
    );
    assert_eq!(st["health_transitions"]["held"], 1, "{st}");
    let manifests = c.manifests.path().to_str().unwrap().to_owned();
    let explain = ["explain", "default/web", "--node", "node-1", "--manifests", &manifests, "--bpffs", &pin];
    let (ok, out, err) = tierlb(&explain);
    assert!(ok, "{err}");
    assert!(out.contains("10.244.1.40:8080 held down by passive health (last failure: refused"), "{out}");
    let logged = || std::fs::read_to_string(&c.node("node-1").log).unwrap();
    assert!(eventually(3, || logged().contains("backend held down by passive health")), "{}", logged());

    // The process comes back: after the hold, one trial connect, and the node tier serves again.
    c.add_pod(pod(1), "pod-node-1").unwrap();
    let back = Instant::now();
    let r = c.probe("node-1", vip(), 120, Duration::from_millis(25)).unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    let first =
        r.attempts.iter().find(|a| a.backend.as_deref() == Some("pod-node-1")).expect("traffic returned");
    // Within the first hold's end and its doubled successor's (2 s, then 4 s): the first trial succeeded.
    assert!(first.t_ms < 4_000.0, "returned {:.0} ms after the pod, hold 2 s", first.t_ms);
    let last = &r.attempts[r.attempts.len() - 10..];
    assert!(last.iter().all(|a| a.backend.as_deref() == Some("pod-node-1")), "{:?}", r.by_backend());
    eprintln!("pod back: node tier again after {:.0} ms (hold 2 s), {:?} since", first.t_ms, back.elapsed());
    let st = status(&pin);
    assert_eq!(st["health_transitions"]["healthy"], 1, "{st}");
    assert!(eventually(3, || status(&pin)["health"] == serde_json::json!([])), "{}", status(&pin));
}

#[test]
fn a_blackholed_backend_is_held_after_k_syn_timeouts() {
    let (c, _bpffs, pin) = start("health-blackhole", &["--health-hold", "30s"]);
    // Drop every SYN to node-1's pod, inside the cluster's own netns.
    let rule = format!(
        "table inet tierlb_test {{\n  chain out {{\n    type filter hook output priority 0;\n    ip daddr {} tcp dport 8080 tcp flags syn drop\n  }}\n}}\n",
        pod(1).ip()
    );
    nft(&c.netns, &rule);
    // Each connect waits at most 1.5 s: its SYN's first retransmission timeout (1 s) counts as a failure.
    let r = c
        .start_probe_with_timeout("node-1", vip(), 20, Duration::ZERO, Duration::from_millis(1500))
        .unwrap()
        .wait()
        .unwrap();
    let (failed, rest) = after_failures(&r);
    assert_eq!(failed, 3, "K = 3 timed out before the hold: {:?}", r.errors());
    assert!(rest.iter().all(|b| b == "pod-node-2" || b == "pod-node-3"), "{rest:?}");
    eprintln!("blackholed: {failed} connects timed out, then {} to the zone tier", rest.len());
    let h = &status(&pin)["health"][0];
    assert_eq!((h["state"].as_str(), h["reason"].as_str()), (Some("held"), Some("timeout")), "{h}");
}

#[test]
fn healthy_backends_are_never_held_under_load() {
    let (c, _bpffs, pin) = start("health-steady", &[]);
    // Four clients at once, 25,000 connects each, to three healthy pods (node-1's tier only, by topology).
    let runs: Vec<_> =
        (0..4).map(|_| c.start_probe("node-1", vip(), 25_000, Duration::ZERO).unwrap()).collect();
    let mut total = 0;
    for run in runs {
        let r = run.wait().unwrap();
        assert_eq!(r.failures(), 0, "{:?}", r.errors());
        total += r.attempts.len();
    }
    assert_eq!(total, 100_000);
    let st = status(&pin);
    let none = serde_json::json!({"held": 0, "held_for_one_client": 0, "healthy": 0, "panics": 0});
    assert_eq!(st["health_transitions"], none, "{st}");
    assert_eq!(st["health"], serde_json::json!([]), "{st}");
    eprintln!("{total} connects to healthy backends: 0 holds");
}

#[test]
fn when_every_backend_is_held_connects_still_go_to_one_the_panic_threshold() {
    // One pod only, no topology: its tier has nothing else to fall back to.
    let mut c = cluster("health-panic");
    let bpffs = BpfFs::new("health-panic").unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    c.add_pod(pod(1), "pod-node-1").unwrap();
    let svc = Svc::new("web", vip().ip(), 80, 8080);
    write_service(c.manifests.path(), &svc, &[Ep::ready(pod(1).ip(), "node-1")]).unwrap();
    c.add_node("node-1", &["--bpffs", &pin, "--health-hold", "1m", "--health-clients=1"]).unwrap();
    c.stop_pod(pod(1));
    // K = 3 refused connects hold it.
    let r = c.probe("node-1", vip(), 3, Duration::ZERO).unwrap();
    assert_eq!(r.failures(), 3, "{:?}", r.by_backend());
    let st = status(&pin);
    assert_eq!(st["health"][0]["state"], "held", "{st}");
    // Held for a minute, and the only backend: connects are not refused by tierlb, they go to it anyway; the
    // pod is back, so the first one succeeds and makes it healthy.
    c.add_pod(pod(1), "pod-node-1").unwrap();
    let r = c.probe("node-1", vip(), 5, Duration::ZERO).unwrap();
    assert_eq!((r.failures(), r.count("pod-node-1")), (0, 5), "{:?}", r.errors());
    let t = &status(&pin)["health_transitions"];
    assert_eq!(
        (t["held"].as_u64(), t["panics"].as_u64(), t["healthy"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{t}"
    );
}

/// Two pods (own network namespaces, behind veths, as deployed) and node-1's web-1 and node-2's web-2 behind a
/// PreferSameNode Service; the agent as `deploy/` runs it with `extra` flags.
/// Fields drop in order: the agent first, the node last.
struct Tenants {
    _agent: lb_testkit::deployed::AgentBox,
    servers: Vec<lb_testkit::sandbox::NamedServer>,
    a: lb_testkit::sandbox::NetNs,
    b: lb_testkit::sandbox::NetNs,
    _pods: Vec<lb_testkit::sandbox::NetNs>,
    boxed: lb_testkit::deployed::BoxedNode,
}

const WEB_1: &str = "10.244.1.41";

impl Tenants {
    fn start(tag: &str, extra: &[&str]) -> Self {
        use lb_testkit::{deployed::BoxedNode, sandbox::NamedServer};
        let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let mut boxed = BoxedNode::new(tag, std::path::Path::new(common::TIERLB), &deploy).unwrap();
        let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
        let (mut servers, mut eps) = (Vec::new(), Vec::new());
        for (i, node) in [(1, "node-1"), (2, "node-2")] {
            let ip: std::net::IpAddr = format!("10.244.{i}.41").parse().unwrap();
            let ns = boxed.node.add_pod(&format!("web-{i}"), ip).unwrap();
            servers
                .push(NamedServer::start(&lab, &ns, SocketAddr::new(ip, 8080), &format!("web-{i}")).unwrap());
            eps.push((ns, Ep::ready(ip, node).zone("a").prefer_same_node()));
        }
        let a = boxed.node.add_pod("pod-a", "10.244.9.41".parse().unwrap()).unwrap();
        let b = boxed.node.add_pod("pod-b", "10.244.9.42".parse().unwrap()).unwrap();
        let mut svc = Svc::new("web", vip().ip(), 80, 8080);
        svc.traffic_distribution = Some("PreferSameNode".into());
        let (pods, eps): (Vec<_>, Vec<_>) = eps.into_iter().unzip();
        write_service(boxed.manifests.path(), &svc, &eps).unwrap();
        let agent = boxed.start_agent("node-1", extra).unwrap();
        Self { _agent: agent, servers, a, b, _pods: pods, boxed }
    }

    fn status(&self) -> serde_json::Value {
        status(self.boxed.bpffs.path().join("tierlb").to_str().unwrap())
    }

    /// `tierlb-lab abort` from `ns`: each connect's outcome.
    fn abort(&self, ns: &lb_testkit::sandbox::NetNs, args: &[&str]) -> Vec<String> {
        let mut cmd = std::process::Command::new(lb_testkit::workspace_bin("tierlb-lab", "lb-lab"));
        cmd.args(["abort", "--target", &vip().to_string()]).args(args);
        cmd.stdout(std::process::Stdio::piped()).stdin(std::process::Stdio::null());
        lb_testkit::sandbox::confine(&mut cmd, Some(&self.boxed.cgroup), Some(ns)).unwrap();
        let out = cmd.spawn().unwrap().wait_with_output().unwrap();
        let r: lb_testkit::abort::Outcomes = serde_json::from_slice(&out.stdout).unwrap();
        r.outcomes
    }

    /// web-1's passive health entry, if any: (state, reason, failures).
    fn web_1(&self) -> Option<(String, String, u64)> {
        let st = self.status();
        let h = st["health"].as_array()?.iter().find(|h| h["backend"] == format!("{WEB_1}:8080"))?.clone();
        Some((h["state"].as_str()?.to_owned(), h["reason"].as_str()?.to_owned(), h["failures"].as_u64()?))
    }
}

/// Pod A's own connect failures: shutdown() right after connect() (local aborts, ten times), `IP_TTL=1` (its
/// SYN dies at the node's forward: an ICMP time exceeded from the node, or nothing once the node rate-limits
/// those) and SYNs the node drops for A only (as a NetworkPolicy would). None holds web-1, which answers pod B:
/// B's 50 connects all reach it.
#[test]
fn one_pods_own_connect_failures_never_hold_a_healthy_backend_for_another_pod() {
    let t = Tenants::start("health-tenants", &["--health-hold=1m"]);
    let target = vip().to_string();
    assert_eq!(t.boxed.probe(&t.b, &target, 5).unwrap().count("web-1"), 5);

    let aborted = t.abort(&t.a, &["--count", "10", "--end", "shutdown"]);
    assert_eq!(aborted, vec!["aborted"; 10]);
    assert_eq!(t.web_1(), None, "local aborts are no failure of the backend: {}", t.status());

    let ttl = t.abort(&t.a, &["--count", "4", "--ttl", "1", "--end", "wait", "--wait-ms", "1300"]);
    assert!(ttl.iter().all(|o| o == "EHOSTUNREACH" || o == "pending"), "{ttl:?}");
    // Counted or not (the node's ICMP time exceeded comes back while connect() still owns the socket on a
    // veth: measured not counted on 6.18), never a hold: A is one client.
    let after_ttl = t.web_1();
    let ttl_failures = after_ttl.as_ref().map_or(0, |h| h.2);
    assert!(after_ttl.as_ref().is_none_or(|h| h.0 == "failing"), "{after_ttl:?}");
    assert!(ttl_failures < 3, "the SYNs the rule drops below must reach web-1: {after_ttl:?}");

    let rule = format!(
        "table inet tierlb_policy {{\n  chain forward_policy {{\n    type filter hook forward priority 0;\n    ip saddr 10.244.9.41 ip daddr {WEB_1} tcp flags & (syn|ack) == syn drop\n  }}\n}}\n"
    );
    nft(&t.boxed.node.netns, &rule);
    let dropped = t.abort(&t.a, &["--count", "3", "--end", "wait", "--wait-ms", "1300"]);
    assert_eq!(dropped, vec!["pending"; 3]);
    let after_drops = t.web_1();
    let Some((state, _, failures)) = after_drops.clone() else {
        panic!("A's failures counted: {}", t.status())
    };
    // K = 3 in a row from A alone: held for A only (its own next connects skip web-1), never for B.
    assert_eq!(
        (state.as_str(), failures),
        ("held-for-one-client", ttl_failures + 3),
        "3 dropped SYNs, A's alone: {}",
        t.status()
    );

    let r = t.boxed.probe(&t.b, &target, 50).unwrap();
    assert_eq!((r.count("web-1"), r.failures()), (50, 0), "{:?} {:?}", r.by_backend(), r.errors());
    let st = t.status();
    assert_eq!(st["health_transitions"]["held"], 0, "{st}");
    assert_eq!(st["health_transitions"]["held_for_one_client"], 1, "{st}");
    assert_eq!(t.web_1(), None, "B's success reset A's failures and A's own hold: {st}");
    eprintln!(
        "pod A: 10 shutdown-after-connect (no entry), ttl=1 {ttl:?} -> {after_ttl:?}, dropped SYNs {dropped:?} -> \
         {after_drops:?}; pod B: {} of 50 to the local web-1, 0 holds",
        r.count("web-1")
    );
}

/// As `deploy/` runs the agent (`lb_testkit::deployed`: its capabilities, read-only root, pods in network
/// namespaces of their own behind veth pairs): a killed local pod's connects are refused to two pods taking
/// turns, and the K-th refused connect (K = 3, from two clients) holds it: exactly K fail, then every connect
/// of either goes to the other endpoint.
#[test]
fn as_deployed_a_killed_pod_is_held_after_k_refused_connects_from_two_pods() {
    let mut t = Tenants::start("health-deployed", &["--health-hold=1m"]);
    let target = vip().to_string();
    assert_eq!(t.boxed.probe(&t.a, &target, 5).unwrap().count("web-1"), 5);
    // The local pod's process ends (its network namespace stays: connects to it are refused).
    drop(t.servers.remove(0));
    let mut seq = Vec::new();
    for i in 0..8 {
        let ns = if i % 2 == 0 { &t.a } else { &t.b };
        let r = t.boxed.probe(ns, &target, 1).unwrap();
        let a = &r.attempts[0];
        seq.push(a.backend.clone().or_else(|| a.error.clone()).unwrap());
    }
    assert_eq!(seq[..3], ["ECONNREFUSED"; 3], "K = 3 refused, from A, B, A: {seq:?}");
    assert!(seq[3..].iter().all(|b| b == "web-2"), "then the other endpoint only: {seq:?}");
    let st = t.status();
    assert_eq!(
        (st["health"][0]["state"].as_str(), st["health"][0]["reason"].as_str()),
        (Some("held"), Some("refused")),
        "{st}"
    );
    assert_eq!(st["health_transitions"]["held"], 1, "{st}");
    eprintln!("as deployed, two pods taking turns: {seq:?}");
}

/// With the shipped defaults (`--health-clients=2`), a lone client pod whose local backend's process died (its
/// EndpointSlice still says ready) loses exactly K = 3 connects: its K-th failure holds the backend for it
/// alone, and every later connect of it goes to the other endpoint. Another pod is not held for: its first
/// connect still tries web-1, fails, and with A's failures makes the quorum: held for every client.
#[test]
fn as_deployed_a_lone_client_loses_k_connects_and_another_pods_first_failure_holds_it_for_all() {
    let mut t = Tenants::start("health-lone", &["--health-hold=1m"]);
    let target = vip().to_string();
    assert_eq!(t.boxed.probe(&t.a, &target, 5).unwrap().count("web-1"), 5);
    drop(t.servers.remove(0));
    let seq = outcomes(&t.boxed.probe(&t.a, &target, 40).unwrap());
    assert_eq!(seq[..3], ["ECONNREFUSED"; 3], "K = 3 refused: {seq:?}");
    assert!(seq[3..].iter().all(|b| b == "web-2"), "then A goes to web-2 only: {seq:?}");
    let st = t.status();
    assert_eq!(st["health"][0]["state"].as_str(), Some("held-for-one-client"), "{st}");
    assert_eq!(
        (st["health_transitions"]["held_for_one_client"].as_u64(), st["health_transitions"]["held"].as_u64()),
        (Some(1), Some(0)),
        "{st}"
    );
    // B was held for by nobody: its first connect meets the dead web-1; with A's failures, the quorum.
    let seq_b = outcomes(&t.boxed.probe(&t.b, &target, 10).unwrap());
    assert_eq!(seq_b[0], "ECONNREFUSED", "{seq_b:?}");
    assert!(seq_b[1..].iter().all(|b| b == "web-2"), "{seq_b:?}");
    let st = t.status();
    assert_eq!(st["health"][0]["state"].as_str(), Some("held"), "{st}");
    assert_eq!(st["health_transitions"]["held"], 1, "{st}");
    eprintln!("lone client A: {} failed of {}; then B: {seq_b:?}", 3, seq.len());
}

/// Each attempt's outcome: the backend's name, or the error.
fn outcomes(r: &Report) -> Vec<String> {
    r.attempts.iter().map(|a| a.backend.clone().or_else(|| a.error.clone()).unwrap_or_default()).collect()
}

/// K = 1, 3, 5: the local pod's process ends (its EndpointSlice still says ready); connects one after the
/// other: exactly K are refused, then every one goes to the zone tier, and the backend is held once.
#[test]
fn exactly_k_failed_connects_hold_a_backend_for_k_1_3_5() {
    for k in [1_usize, 3, 5] {
        let failures = format!("--health-failures={k}");
        let (mut c, _bpffs, pin) =
            start_with(&format!("hk{k}"), &[1, 2, 3], true, &[&failures, "--health-hold=1m"]);
        assert_eq!(c.probe("node-1", vip(), 5, Duration::ZERO).unwrap().count("pod-node-1"), 5, "K={k}");
        c.stop_pod(pod(1));
        let r = c.probe("node-1", vip(), k + 20, Duration::ZERO).unwrap();
        let seq = outcomes(&r);
        assert!(seq[..k].iter().all(|o| o == "ECONNREFUSED"), "K={k}: the first {k} refused: {seq:?}");
        assert!(seq[k..].iter().all(|o| o == "pod-node-2" || o == "pod-node-3"), "K={k}: then held: {seq:?}");
        let st = status(&pin);
        assert_eq!(st["health_transitions"]["held"], 1, "K={k}: {st}");
        assert_eq!(
            (st["health"][0]["state"].as_str(), st["health"][0]["holds"].as_u64()),
            (Some("held"), Some(1))
        );
        eprintln!("K={k}: {k} refused, then {} to the zone tier", seq.len() - k);
    }
}

/// A dead backend stays dead: `--health-hold=1s`, `--health-max-hold=4s`, K = 1. After the first failure it
/// is held 1 s; the trial when the hold ends fails (the client sees it refused) and holds it 2 s, then 4 s,
/// then 4 s again (the maximum). The refused connects come at 0, 1, 3, 7, 11 s: each gap at least the hold
/// and before the next doubling would end; the kernel's last hold is exactly 4 s long.
#[test]
fn a_hold_lasts_its_length_and_doubles_to_the_max_hold() {
    let flags = ["--health-failures=1", "--health-hold=1s", "--health-max-hold=4s"];
    let (mut c, _bpffs, pin) = start_with("hold-double", &[1, 2, 3], true, &flags);
    c.stop_pod(pod(1));
    // 12.5 s of connects, one every 20 ms.
    let r = c.probe("node-1", vip(), 625, Duration::from_millis(20)).unwrap();
    let refused: Vec<f64> =
        r.attempts.iter().filter(|a| a.error.as_deref() == Some("ECONNREFUSED")).map(|a| a.t_ms).collect();
    let others =
        r.attempts.iter().filter(|a| a.error.is_none()).all(|a| a.backend.as_deref() != Some("pod-node-1"));
    assert!(others, "only refused connects reach the dead pod");
    assert_eq!(refused.len(), 5, "the failure, then a failed trial per hold: {refused:?}");
    let gaps: Vec<f64> = refused.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, hold_ms) in gaps.iter().zip([1_000.0, 2_000.0, 4_000.0, 4_000.0]) {
        assert!(
            // Never early (the kernel's own clock), and before the next doubling would have ended.
            *gap >= hold_ms - 5.0 && *gap < 2.0 * hold_ms,
            "a {hold_ms} ms hold, trial after {gap:.0} ms: {gaps:?}"
        );
    }
    let h = &status(&pin)["health"][0];
    assert_eq!((h["state"].as_str(), h["holds"].as_u64()), (Some("held"), Some(5)), "{h}");
    let length = h["held_for_seconds"].as_f64().unwrap() + h["left_seconds"].as_f64().unwrap();
    assert!((length - 4.0).abs() < 1e-6, "the fifth hold is the maximum, 4 s: {length}");
    eprintln!("refused at {refused:?} ms: gaps {gaps:?}");
}

/// A success ends a hold, but not before the hold is over: `--health-hold=2s`, the pod back at once after its
/// K = 3 failures; connects every 25 ms go to the zone tier until the hold ends, then the trial succeeds and
/// every connect after it is the pod's again. The hold's end in the probe's time: the status read says how
/// much was left (read between `before` and `after`), the probe starts after `spawned` (its own start-up, up
/// to `START_MS`, makes its clock later still).
#[test]
fn a_success_after_the_hold_ends_it_and_not_before() {
    const START_MS: f64 = 100.0;
    let (mut c, _bpffs, pin) = start_with("hold-success", &[1, 2, 3], true, &["--health-hold=2s"]);
    c.stop_pod(pod(1));
    let r = c.probe("node-1", vip(), 3, Duration::ZERO).unwrap();
    assert_eq!(outcomes(&r), ["ECONNREFUSED"; 3]);
    let before = Instant::now();
    let held = status(&pin)["health"][0].clone();
    let after = Instant::now();
    let left_ms = held["left_seconds"].as_f64().unwrap() * 1e3;
    let length = held["held_for_seconds"].as_f64().unwrap() + held["left_seconds"].as_f64().unwrap();
    assert!((length - 2.0).abs() < 1e-6, "the kernel holds it for --health-hold, 2 s: {length}");
    c.add_pod(pod(1), "pod-node-1").unwrap();
    let spawned = Instant::now();
    let r = c.probe("node-1", vip(), 120, Duration::from_millis(25)).unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    let first = r.attempts.iter().position(|a| a.backend.as_deref() == Some("pod-node-1")).expect("returned");
    let t = r.attempts[first].t_ms;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let earliest = left_ms - ms(spawned - before) - START_MS;
    // Before a doubled hold would end: the first trial took the pod back (no clock on the machine's speed).
    let latest = left_ms - ms(spawned - after) + 2_000.0;
    assert!(
        t >= earliest,
        "back at {t:.0} ms: the hold ended {earliest:.0} ms into the probe at the earliest"
    );
    assert!(t <= latest, "back at {t:.0} ms: the hold ended {latest:.0} ms into the probe at the latest");
    assert!(
        r.attempts[first..].iter().all(|a| a.backend.as_deref() == Some("pod-node-1")),
        "{:?}",
        r.by_backend()
    );
    let st = status(&pin);
    let t_ = &st["health_transitions"];
    assert_eq!((t_["held"].as_u64(), t_["healthy"].as_u64()), (Some(1), Some(1)), "{st}");
    eprintln!(
        "the hold had {left_ms:.0} ms left; the pod's first connect {t:.0} ms into the probe, in [{earliest:.0}, {latest:.0}]"
    );
}

/// The panic threshold with two backends in the only tier (no topology), both dead, K = 3: each gets exactly
/// K refused connects before it is held (6 in all), then every backend is held and connects go to one anyway
/// (refused, since both are dead, and counted as panics), never refused by tierlb itself (which would be
/// EHOSTUNREACH); one pod back: the panic connects that reach it make it healthy, and it takes every connect.
#[test]
fn the_panic_threshold_with_two_held_backends_after_k_failures_each() {
    let (mut c, _bpffs, pin) = start_with("panic-two", &[2, 3], false, &["--health-hold=1m"]);
    c.stop_pod(pod(2));
    c.stop_pod(pod(3));
    let r = c.probe("node-1", vip(), 6, Duration::ZERO).unwrap();
    assert_eq!(outcomes(&r), ["ECONNREFUSED"; 6], "3 per backend");
    let st = status(&pin);
    let states: Vec<&str> =
        st["health"].as_array().unwrap().iter().map(|h| h["state"].as_str().unwrap()).collect();
    assert_eq!((states, st["health_transitions"]["held"].as_u64()), (vec!["held", "held"], Some(2)), "{st}");
    // K per backend, not 6 in all: a backend is held at its own K-th failure and then gets no connect, so 6
    // refused connects with both held once means exactly 3 each (4 on one would leave the other at 2: unheld).
    let holds: Vec<u64> =
        st["health"].as_array().unwrap().iter().map(|h| h["holds"].as_u64().unwrap()).collect();
    assert_eq!(holds, [1, 1], "each held once: {st}");
    let r = c.probe("node-1", vip(), 4, Duration::ZERO).unwrap();
    assert_eq!(
        outcomes(&r),
        ["ECONNREFUSED"; 4],
        "sent to a held backend anyway (its RST), not refused by tierlb"
    );
    assert_eq!(status(&pin)["health_transitions"]["panics"], 4);
    c.add_pod(pod(2), "pod-node-2").unwrap();
    let r = c.probe("node-1", vip(), 40, Duration::ZERO).unwrap();
    let seq = outcomes(&r);
    let first = seq.iter().position(|o| o == "pod-node-2").expect("a panic connect reached the live pod");
    assert!(seq[first..].iter().all(|o| o == "pod-node-2"), "then it is healthy and takes them all: {seq:?}");
    assert_eq!(status(&pin)["health_transitions"]["healthy"], 1);
}

/// The trial window: a trial that never reports (its SYN dropped, the client giving up after 300 ms, before the
/// kernel's 1 s retransmission timeout: a local abort, no failure) keeps the backend out for 3 s from the trial's
/// start, then the next connect is a new trial. K = 1, `--health-hold=1s`: the first refused connect holds the
/// pod; then its SYNs are dropped. Trials (timed out) start 3 s apart, every other connect goes to the zone
/// tier, and nothing else fails.
#[test]
fn a_trial_that_never_reports_keeps_the_backend_out_for_its_3_s_window() {
    let flags = ["--health-failures=1", "--health-hold=1s", "--health-max-hold=1m"];
    let (mut c, _bpffs, _pin) = start_with("trial-window", &[1, 2, 3], true, &flags);
    c.stop_pod(pod(1));
    assert_eq!(outcomes(&c.probe("node-1", vip(), 1, Duration::ZERO).unwrap()), ["ECONNREFUSED"]);
    let rule = format!(
        "table inet tierlb_trial {{\n  chain out {{\n    type filter hook output priority 0;\n    ip daddr {} tcp dport 8080 tcp flags syn drop\n  }}\n}}\n",
        pod(1).ip()
    );
    nft(&c.netns, &rule);
    let r = c
        .start_probe_with_timeout("node-1", vip(), 400, Duration::from_millis(20), Duration::from_millis(300))
        .unwrap()
        .wait()
        .unwrap();
    let trials: Vec<f64> =
        r.attempts.iter().filter(|a| a.error.as_deref() == Some("ETIMEDOUT")).map(|a| a.t_ms).collect();
    let rest = r.attempts.iter().filter(|a| a.error.as_deref() != Some("ETIMEDOUT"));
    assert!(
        rest.clone().all(|a| matches!(a.backend.as_deref(), Some("pod-node-2" | "pod-node-3"))),
        "every other connect to the zone tier: {:?} {:?}",
        r.by_backend(),
        r.errors()
    );
    assert!(trials.len() >= 3, "a trial when the hold ends, then one per window: {trials:?}");
    let gaps: Vec<f64> = trials.windows(2).map(|w| w[1] - w[0]).collect();
    for gap in &gaps {
        // Not before the window ends, and one window, not two.
        assert!(*gap >= 3_000.0 - 5.0 && *gap < 6_000.0, "trials {gap:.0} ms apart: {trials:?}");
    }
    eprintln!("trials (never reported) at {trials:?} ms: {gaps:?} apart; {} other connects", rest.count());
}
