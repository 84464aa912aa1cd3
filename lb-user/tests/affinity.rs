//! In-kernel tests of `sessionAffinity: ClientIP`, decided in the data path: a client (its network namespace;
//! every client of a `SimCluster` shares one) keeps its backend while it keeps connecting, spreads again
//! once its timeout has run out since its last connect, loses a backend that leaves or is marked down without
//! a failed connect, and is held within the tier the topology rules select; as deployed, each pod is a client
//! of its own, and `--max-affinity` caps the clients remembered (an evicted client is balanced anew).
mod common;

use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use common::{cluster, eventually, tierlb};
use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
    probe::Report,
    sandbox::BpfFs,
};

fn vip() -> SocketAddr {
    "10.96.0.20:80".parse().unwrap()
}

/// web on the VIP with sessionAffinity ClientIP (`timeout` s) and a pod on each of `nodes` (10.244.<i+1>.20,
/// named pod-<node>), all in zone a; `prefer_same_node` adds the PreferSameNode hints.
fn web(c: &mut SimCluster, nodes: &[&str], timeout: u32, prefer_same_node: bool) -> (Svc, Vec<Ep>) {
    let eps = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let a = SocketAddr::new(format!("10.244.{}.20", i + 1).parse().unwrap(), 8080);
            c.add_pod(a, &format!("pod-{node}")).unwrap();
            let ep = Ep::ready(a.ip(), node).zone("a");
            if prefer_same_node { ep.prefer_same_node() } else { ep }
        })
        .collect();
    let mut svc = Svc::new("web", vip().ip(), 80, 8080);
    svc.session_affinity_timeout = Some(timeout);
    if prefer_same_node {
        svc.traffic_distribution = Some("PreferSameNode".into());
    }
    (svc, eps)
}

/// A cluster with `web` (see there) written and node-1's agent pinning under a bpffs of its own.
fn start(tag: &str, timeout: u32, prefer_same_node: bool) -> (SimCluster, BpfFs, String, Svc, Vec<Ep>) {
    let mut c = cluster(tag);
    let bpffs = BpfFs::new(tag).unwrap();
    let pin = bpffs.path().to_str().unwrap().to_owned();
    let (svc, eps) = web(&mut c, &["node-1", "node-2", "node-3"], timeout, prefer_same_node);
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    c.add_node("node-1", &["--zone", "a", "--bpffs", &pin]).unwrap();
    (c, bpffs, pin, svc, eps)
}

/// A burst of 10 connects from node-1: the one backend they all reached.
fn burst(c: &SimCluster, what: &str) -> String {
    only_backend(&c.probe("node-1", vip(), 10, Duration::ZERO).unwrap(), what)
}

/// `tierlb backend down|up ADDR` (down for a minute).
fn mark(pin: &str, how: &str, addr: &str) {
    let mut args = vec!["backend", how, addr, "--bpffs", pin];
    if how == "down" {
        args.extend(["--for", "1m"]);
    }
    let (ok, _, err) = tierlb(&args);
    assert!(ok, "{err}");
}

/// The one backend every connect of `r` reached; fails on a failed connect or a second backend.
fn only_backend(r: &Report, what: &str) -> String {
    assert_eq!(r.failures(), 0, "{what}: {:?}", r.errors());
    let backends = r.by_backend();
    assert_eq!(backends.len(), 1, "{what}: connects spread over {backends:?}");
    backends.into_keys().next().unwrap()
}

fn frontend_status(pin: &str) -> serde_json::Value {
    let (ok, out, err) = tierlb(&["status", "-o", "json", "--bpffs", pin]);
    assert!(ok, "{err}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    st[0]["frontends"][0].clone()
}

#[test]
fn a_client_keeps_its_backend_while_it_connects_and_spreads_again_once_the_timeout_ran_out() {
    let (c, _bpffs, pin, _, _) = start("aff-timeout", 1, false);

    // The timeout runs from the last connect: a connect every 0.4 s for 3.2 s never lets it (1 s) run out.
    let r = c.probe("node-1", vip(), 9, Duration::from_millis(400)).unwrap();
    only_backend(&r, "connects 0.4 s apart with a 1 s timeout");

    // Bursts 1.3 s apart: each burst sticks to one backend, and the bursts spread (with 3 backends, 10 bursts
    // all on one backend would happen with probability 3^-9).
    let mut chosen = BTreeSet::new();
    for round in 0..10 {
        std::thread::sleep(Duration::from_millis(1300));
        let r = c.probe("node-1", vip(), 20, Duration::ZERO).unwrap();
        chosen.insert(only_backend(&r, &format!("burst {round}")));
    }
    assert!(chosen.len() >= 2, "10 bursts after the timeout all went to {chosen:?}");
    eprintln!("10 bursts of 20 connects 1.3 s apart: each on one backend, together on {chosen:?}");

    let f = frontend_status(&pin);
    assert_eq!(f["session_affinity"]["timeout_seconds"], 1, "{f}");
    assert_eq!(f["session_affinity"]["clients"], 1, "one client (the cluster's netns) remembered: {f}");
    // Every connect but the first of each burst (and of the paced run) went to the remembered backend.
    let sticky = f["connections"]["affinity"].as_u64().unwrap();
    assert_eq!(sticky, 8 + 10 * 19, "{f}");
    let (_, table, _) = tierlb(&["status", "--bpffs", &pin]);
    assert!(table.contains("sessionAffinity ClientIP 1 s: 1 clients remembered"), "{table}");
}

#[test]
fn the_sticky_backend_marked_down_or_leaving_costs_no_failed_connect() {
    let (c, _bpffs, pin, svc, eps) = start("aff-leave", 600, false);
    let first = burst(&c, "first burst");
    let addr_of = |pod: &str| {
        let i = ["pod-node-1", "pod-node-2", "pod-node-3"].iter().position(|p| *p == pod).unwrap();
        format!("10.244.{}.20:8080", i + 1)
    };

    // Marked down: the client moves to another backend at once and sticks to it.
    mark(&pin, "down", &addr_of(&first));
    let second = burst(&c, "while the sticky backend is marked down");
    assert_ne!(second, first);
    // The mark lifted: the client stays where it is now (its entry names a live member).
    mark(&pin, "up", &addr_of(&first));
    assert_eq!(burst(&c, "after the mark was lifted"), second);

    // The sticky backend leaves the EndpointSlice while the client connects every 5 ms: no connect fails.
    let probe = c.start_probe("node-1", vip(), 300, Duration::from_millis(5)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = c.syncs_all();
    let kept: Vec<Ep> =
        eps.iter().filter(|e| addr_of(&second) != format!("{}:8080", e.ip)).cloned().collect();
    write_service(c.manifests.path(), &svc, &kept).unwrap();
    c.wait_synced(&before).unwrap();
    let r = probe.wait().unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.errors());
    let third = r.attempts.last().and_then(|a| a.backend.clone()).unwrap();
    assert_ne!(third, second, "the departed backend is not used: {:?}", r.by_backend());
    assert_eq!(r.by_backend().len(), 2, "one backend before, one after: {:?}", r.by_backend());
    assert_eq!(burst(&c, "after the backend left"), third);
    eprintln!("{first} marked down -> {second}; {second} left during 300 connects: 0 failed, then {third}");
}

#[test]
fn affinity_holds_within_the_tier_topology_selects() {
    let (c, _bpffs, pin, _, _) = start("aff-tier", 600, true);
    assert_eq!(burst(&c, "node tier"), "pod-node-1");

    // The node tier's backend is marked down: the zone tier serves, and the client sticks within it.
    mark(&pin, "down", "10.244.1.20:8080");
    let fallback = burst(&c, "zone tier");
    assert_ne!(fallback, "pod-node-1");
    // Back up: topology comes first, so the client returns to the node tier although its entry names a live
    // zone backend.
    mark(&pin, "up", "10.244.1.20:8080");
    assert!(eventually(2, || burst(&c, "node tier again") == "pod-node-1"));
    let f = frontend_status(&pin);
    assert_eq!(f["connections"]["affinity"].as_u64().unwrap(), 9 + 9 + 9, "{f}");
}

#[test]
fn udp_clients_stick_too_through_sendmsg_and_connect_in_both_families() {
    for (family, vip, pods) in [
        ("IPv4", "10.96.0.54", ["10.244.1.54", "10.244.2.54", "10.244.3.54"]),
        ("IPv6", "fd00:96::54", ["fd00:244:1::54", "fd00:244:2::54", "fd00:244:3::54"]),
    ] {
        let mut c = cluster("aff-udp");
        let vip = SocketAddr::new(vip.parse().unwrap(), 53);
        let mut eps = Vec::new();
        for (i, pod) in pods.iter().enumerate() {
            let ip: std::net::IpAddr = pod.parse().unwrap();
            // Each resolver answers with its own address, so the answer names the backend.
            c.add_dns_pod(SocketAddr::new(ip, 53), ip).unwrap();
            eps.push(Ep::ready(ip, &format!("node-{}", i + 1)));
        }
        let mut svc = Svc::new("kube-dns", vip.ip(), 53, 53);
        svc.protocol = "UDP";
        svc.session_affinity_timeout = Some(600);
        write_service(c.manifests.path(), &svc, &eps).unwrap();
        c.add_node("node-1", &[]).unwrap();
        // Each lookup is a new socket: unconnected (sendmsg), then connected (connect), 20 each.
        let mut answers = BTreeSet::new();
        for connected in [false, true] {
            for l in c.dns("node-1", vip, 20, connected).unwrap() {
                assert_eq!(l.error, None, "{family} connected={connected}: {l:?}");
                answers.insert(l.answer.unwrap());
            }
        }
        assert_eq!(answers.len(), 1, "{family}: 40 lookups from one client spread over {answers:?}");
    }
}

/// A node run as `deploy/` runs the agent (`lb_testkit::deployed`): web (affinity timeout 600 s) on three
/// backend pods of node-1, `clients` client pods, each in its own network namespace and cgroup (below the
/// agent's, as the kubelet makes them), and the agent started with `extra` flags.
struct DeployedWeb {
    /// Before `boxed`: fields drop in order, and these cgroups sit in the agent's.
    client_cgroups: Vec<lb_testkit::sandbox::Cgroup>,
    boxed: lb_testkit::deployed::BoxedNode,
    clients: Vec<lb_testkit::sandbox::NetNs>,
    _servers: Vec<(lb_testkit::sandbox::NamedServer, lb_testkit::sandbox::NetNs)>,
    _agent: lb_testkit::deployed::AgentBox,
}

impl Drop for DeployedWeb {
    /// The clients' cgroups, last first: the first one made `kubepods` above them all and removes it, which
    /// it can only once the others are gone (in field order the agent's cgroup would then stay too).
    fn drop(&mut self) {
        while self.client_cgroups.pop().is_some() {}
    }
}

impl DeployedWeb {
    fn start(tag: &str, clients: usize, extra: &[&str]) -> Self {
        use lb_testkit::{deployed::BoxedNode, sandbox::NamedServer};
        let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let binary = std::path::Path::new(common::TIERLB);
        let mut boxed = BoxedNode::new(tag, binary, &deploy).unwrap();
        let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
        let mut eps = Vec::new();
        let mut servers = Vec::new();
        for i in 1..=3 {
            let ip: std::net::IpAddr = format!("10.244.{i}.30").parse().unwrap();
            let ns = boxed.node.add_pod(&format!("web-{i}"), ip).unwrap();
            servers.push((
                NamedServer::start(&lab, &ns, SocketAddr::new(ip, 8080), &format!("web-{i}")).unwrap(),
                ns,
            ));
            eps.push(Ep::ready(ip, "node-1"));
        }
        let clients: Vec<_> = (1..=clients)
            .map(|i| {
                let ip = format!("10.244.{}.{}", 9 + i / 250, i % 250 + 1).parse().unwrap();
                boxed.node.add_pod(&format!("client-{i}"), ip).unwrap()
            })
            .collect();
        let client_cgroups = (1..=clients.len())
            .map(|i| lb_testkit::sandbox::Cgroup::nested(&boxed.cgroup, &format!("kubepods/podclient{i}")))
            .collect::<anyhow::Result<_>>()
            .unwrap();
        let mut svc = Svc::new("web", vip().ip(), 80, 8080);
        svc.session_affinity_timeout = Some(600);
        write_service(boxed.manifests.path(), &svc, &eps).unwrap();
        let agent = boxed.start_agent("node-1", extra).unwrap();
        Self { client_cgroups, boxed, clients, _servers: servers, _agent: agent }
    }

    /// The backend all `n` connects of the pod in `ns` reached: a client pod's from its cgroup, the node's
    /// own from the agent's.
    fn connect(&self, ns: &lb_testkit::sandbox::NetNs, n: usize, what: &str) -> String {
        let cgroup = match self.clients.iter().position(|c| std::ptr::eq(c, ns)) {
            Some(i) => &self.client_cgroups[i],
            None => &self.boxed.cgroup,
        };
        only_backend(&self.boxed.probe_in(cgroup, ns, &vip().to_string(), n).unwrap(), what)
    }

    /// web's frontend in `tierlb status` (the DaemonSet pins under the node's /sys/fs/bpf/tierlb).
    fn frontend(&self) -> serde_json::Value {
        frontend_status(self.boxed.bpffs.path().join("tierlb").to_str().unwrap())
    }
}

/// As `deploy/` runs the agent, with every pod in its own network namespace: each pod is a client of its
/// own, and the node's own processes are one more.
#[test]
fn as_deployed_each_pod_keeps_its_own_backend() {
    let web = DeployedWeb::start("aff-deployed", 10, &[]);
    let mut chosen = BTreeSet::new();
    for (i, ns) in web.clients.iter().chain([&web.boxed.node.netns]).enumerate() {
        let first = web.connect(ns, 10, &format!("client {i}"));
        assert_eq!(web.connect(ns, 10, &format!("client {i} again")), first);
        chosen.insert(first);
    }
    // 11 clients choosing among 3 backends at random all chose one with probability 3^-10.
    assert!(chosen.len() >= 2, "every client got {chosen:?}: the clients are not told apart");
    eprintln!(
        "11 clients (10 pods, the node), 20 connects each: each on one backend, together on {chosen:?}"
    );
    assert_eq!(web.frontend()["session_affinity"]["clients"], 11);
}

/// `--max-affinity 8`, as deployed: 24 pods connect, the LRU remembers at most 8 of them, and the first
/// pod, whose entry the 23 after it pushed out, is balanced anew on its next connect (no affinity hit, no
/// failed connect) while the last pod's next connect goes to its remembered backend.
#[test]
fn as_deployed_max_affinity_caps_the_clients_remembered_and_an_evicted_client_is_balanced_anew() {
    let web = DeployedWeb::start("aff-max", 24, &["--max-affinity", "8"]);
    for (i, ns) in web.clients.iter().enumerate() {
        web.connect(ns, 2, &format!("client {i}"));
    }
    let hits = |f: &serde_json::Value| f["connections"]["affinity"].as_u64().unwrap();
    let before = web.frontend();
    let remembered = before["session_affinity"]["clients"].as_u64().unwrap();
    assert!((1..=8).contains(&remembered), "24 clients, capacity 8: {remembered} remembered");
    // Each pod's second connect went to its remembered backend: 24 hits.
    assert_eq!(hits(&before), 24, "{before}");
    web.connect(&web.clients[0], 1, "the first client again");
    let after_first = web.frontend();
    assert_eq!(hits(&after_first), hits(&before), "the first client's entry was evicted: balanced anew");
    web.connect(&web.clients[23], 1, "the last client again");
    assert_eq!(hits(&web.frontend()), hits(&after_first) + 1, "the last client is still remembered");
}

/// A pod allowed to make network namespaces (`unshare(CLONE_NEWNET)`) is one client per namespace, but its
/// namespaces compete only with each other: as deployed with `--max-affinity 8`, a victim pod is remembered,
/// then an attacker pod (its own container cgroup, as the kubelet makes one per container) connects from
/// its own namespace and from 40 namespaces it made. The victim's next connect still goes to its remembered
/// backend; the attacker's pod namespace is still remembered too, and the 40 took at most 8 entries of their
/// own (`NESTED_AFFINITY`), counted as clients.
#[test]
fn as_deployed_namespaces_a_pod_makes_evict_only_each_other_never_another_pods_affinity() {
    use std::process::{Command, Stdio};
    let mut web = DeployedWeb::start("aff-nested", 1, &["--max-affinity", "8"]);
    let attacker_ns = web.boxed.node.add_pod("attacker", "10.244.20.1".parse().unwrap()).unwrap();
    let attacker_cg =
        lb_testkit::sandbox::Cgroup::nested(&web.boxed.cgroup, "kubepods/podattacker/ctr").unwrap();
    let hits = |f: &serde_json::Value| f["connections"]["affinity"].as_u64().unwrap();
    let victim = &web.clients[0];
    let first = web.connect(victim, 2, "the victim");
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let probe_args = ["probe", "--target", "10.96.0.20:80", "--count", "1", "--interval-ms", "0"];
    let run = |cmd: &mut Command| {
        cmd.stdout(Stdio::piped()).stderr(Stdio::null()).stdin(Stdio::null());
        lb_testkit::sandbox::confine(cmd, Some(&attacker_cg), Some(&attacker_ns)).unwrap();
        let out = cmd.spawn().unwrap().wait_with_output().unwrap();
        serde_json::from_slice::<Report>(&out.stdout).expect("probe output")
    };
    // The attacker's pod namespace first (its cgroup's first connect), remembered on its second connect.
    for _ in 0..2 {
        let r = run(Command::new(&lab).args(probe_args));
        only_backend(&r, "the attacker from its pod's namespace");
    }
    let before = hits(&web.frontend());
    // 40 namespaces of its own: only loopback in each, so every connect fails after connect4 chose (and
    // remembered) a backend.
    for _ in 0..40 {
        run(Command::new("unshare").arg("--net").arg(&lab).args(probe_args));
    }
    let status = web.frontend();
    let clients = status["session_affinity"]["clients"].as_u64().unwrap();
    assert!((3..=10).contains(&clients), "2 pods and at most 8 made namespaces remembered: {clients}");
    assert_eq!(web.connect(victim, 1, "the victim again"), first, "the victim lost its backend");
    let after = hits(&web.frontend());
    assert_eq!(after, before + 1, "the victim's connect was balanced anew: its entry was evicted");
    only_backend(&run(Command::new(&lab).args(probe_args)), "the attacker's pod again");
    assert_eq!(hits(&web.frontend()), after + 1, "the attacker's pod namespace lost its entry");
    eprintln!(
        "40 namespaces made in one pod, capacity 8: {clients} clients remembered, both pods kept theirs"
    );
}
