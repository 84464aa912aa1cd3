//! In-kernel tests of passive health: the `sock_ops` program sees the outcome of the connects tierlb
//! translated and holds a backend down after `--health-failures` failures in a row, before any EndpointSlice
//! says so. A crashed local pod (refused connects) and a blackholed one (SYNs dropped by a rule in the test's
//! own netns) cost at most K failed connects; a pod that comes back gets traffic again after the hold; healthy
//! backends under load are never held. Clients of a `SimCluster` share one network namespace, so those tests
//! run with `--health-clients=1`; the tests as deployed give each pod its own and keep the default quorum
//! (2): one pod's own failures (local aborts, `IP_TTL=1`, SYNs a policy drops) hold nothing for another.
mod common;

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use common::{cluster, eventually, tierlb};
use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
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
    let mut c = cluster(tag);
    let bpffs = BpfFs::new(tag).unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let mut eps = Vec::new();
    for i in 1..=3 {
        let node = format!("node-{i}");
        c.add_pod(pod(i), &format!("pod-{node}")).unwrap();
        eps.push(Ep::ready(pod(i).ip(), &node).zone("a").prefer_same_node());
    }
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameNode".into());
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
fn after_failures(r: &lb_testkit::probe::Report) -> (usize, Vec<String>) {
    let failed = r.attempts.iter().take_while(|a| a.error.is_some()).count();
    let rest =
        r.attempts[failed..].iter().map(|a| a.backend.clone().unwrap_or_else(|| "FAILED".into())).collect();
    (failed, rest)
}

#[test]
fn a_crashed_local_pod_costs_at_most_k_failed_connects_and_gets_traffic_back_after_the_hold() {
    let (mut c, _bpffs, pin) = start("health-crash", &["--health-hold", "2s"]);
    let r = c.probe("node-1", vip(), 10, Duration::ZERO).unwrap();
    assert_eq!(r.count("pod-node-1"), 10, "{:?}", r.by_backend());

    // The local pod's process dies; its EndpointSlice still says ready.
    c.stop_pod(pod(1));
    let r = c.probe("node-1", vip(), 200, Duration::ZERO).unwrap();
    let (failed, rest) = after_failures(&r);
    assert!((1..=3).contains(&failed), "{failed} failed connects before the hold: {:?}", r.errors());
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
    assert!(first.t_ms < 2_500.0, "returned {:.0} ms after the pod, hold 2 s", first.t_ms);
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
    assert!((1..=3).contains(&failed), "{failed} timed out before the hold: {:?}", r.errors());
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
    assert_eq!(st["health_transitions"], serde_json::json!({"held": 0, "healthy": 0, "panics": 0}), "{st}");
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
    assert_eq!(
        (state.as_str(), failures),
        ("failing", ttl_failures + 3),
        "3 dropped SYNs, A's alone: {}",
        t.status()
    );

    let r = t.boxed.probe(&t.b, &target, 50).unwrap();
    assert_eq!((r.count("web-1"), r.failures()), (50, 0), "{:?} {:?}", r.by_backend(), r.errors());
    let st = t.status();
    assert_eq!(st["health_transitions"]["held"], 0, "{st}");
    assert_eq!(t.web_1(), None, "B's success reset A's failures: {st}");
    eprintln!(
        "pod A: 10 shutdown-after-connect (no entry), ttl=1 {ttl:?} -> {after_ttl:?}, dropped SYNs {dropped:?} -> \
         {after_drops:?}; pod B: {} of 50 to the local web-1, 0 holds",
        r.count("web-1")
    );
}

fn nft(ns: &lb_testkit::sandbox::NetNs, rule: &str) {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(rule.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
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
