//! The node's shared reverse state under a pod that churns it, as deployed (`lb_testkit::deployed`: the
//! DaemonSet's capabilities and mounts, pods in network namespaces of their own behind veth pairs): pod A's
//! sockets cannot take pod B's reverse translation or socket destruction away.
use std::{net::IpAddr, path::Path, process::Command, time::Duration};

use lb_common::{
    MAP_CONNECTED_UDP, MAP_REVERSE, MAP_REVERSE_TCP, MAP_UDP_PER_NETNS, ReverseKey, ReverseValue,
    udp_per_netns,
};
use lb_testkit::{
    deployed::BoxedNode,
    dns::DnsServer,
    manifests::{Ep, Svc, write_service},
    sandbox::{NamedServer, NetNs, confine},
    tenant::Flood,
};

mod common;

use common::hash_entries;

const TIERLB: &str = common::TIERLB;
const WEB: &str = "10.96.0.10:80";
const DNS: &str = "10.96.0.53:53";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn dns_svc() -> Svc {
    let mut s = Svc::new("kube-dns", ip("10.96.0.53"), 53, 53);
    s.protocol = "UDP";
    s
}

/// A `tierlb-lab` tool in pod `ns` and the agent's cgroup, talking over stdin/stdout.
fn tool(boxed: &BoxedNode, ns: &NetNs, args: &[&str]) -> common::Piped {
    let mut cmd = Command::new(lb_testkit::workspace_bin("tierlb-lab", "lb-lab"));
    cmd.args(args);
    confine(&mut cmd, Some(&boxed.cgroup), Some(ns)).unwrap();
    common::Piped::spawn(cmd)
}

/// The agent's `/metrics`, on the port the DaemonSet passes, from the node's namespace.
fn metrics(boxed: &BoxedNode) -> String {
    let port = boxed
        .container
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-addr="))
        .and_then(|a| a.rsplit(':').next()?.parse::<u16>().ok())
        .expect("the DaemonSet sets --metrics-addr");
    common::get_in(&boxed.node.netns, port, "/metrics").1
}

/// Pod A: 50,000 TCP sockets that each connect to a VIP, disconnect with `connect(AF_UNSPEC)` (which clears
/// the socket's peer port) and close; one socket reconnected 50,000 times; 300,000 connected UDP sockets to
/// the DNS VIP, held. Pod B, which connected its sockets in between: its TCP socket's getpeername() and its
/// DNS reply's source stay the VIPs, and when its resolver leaves the agent destroys its UDP socket.
/// Afterwards the TCP reverse state (slots and LRU) holds one entry per live TCP socket (A's 50,000 closed
/// ones left none; the reconnected one has one), and A registered no more than its share of the connected-UDP registry
/// (1/16 of 262,144), so B's socket was registered.
#[test]
fn one_pods_reconnects_and_300000_udp_sockets_leave_another_pods_reverse_state_and_destruction() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut boxed = BoxedNode::new("tenants", Path::new(TIERLB), &deploy).unwrap();
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let web_ns = boxed.node.add_pod("web", ip("10.244.1.10")).unwrap();
    let _web = NamedServer::start(&lab, &web_ns, "10.244.1.10:8080".parse().unwrap(), "web-1").unwrap();
    let dns_ns = boxed.node.add_pod("dns", ip("10.244.1.53")).unwrap();
    let _dns = DnsServer::start(&dns_ns, "10.244.1.53:53".parse().unwrap(), ip("10.0.1.1")).unwrap();
    let a = boxed.node.add_pod("pod-a", ip("10.244.1.100")).unwrap();
    let b = boxed.node.add_pod("pod-b", ip("10.244.1.101")).unwrap();
    write_service(
        boxed.manifests.path(),
        &Svc::new("web", ip("10.96.0.10"), 80, 8080),
        &[Ep::ready(ip("10.244.1.10"), "node-1")],
    )
    .unwrap();
    write_service(boxed.manifests.path(), &dns_svc(), &[Ep::ready(ip("10.244.1.53"), "node-1")]).unwrap();
    let _agent = boxed.start_agent("node-1", &[]).unwrap();
    let pins = boxed.bpffs.path().join("tierlb").join("node-1");
    assert!(pins.join(MAP_REVERSE).exists(), "maps pinned in {}", pins.display());

    // A churns TCP sockets, then holds 300,000 connected UDP sockets (16 processes of 18,750: one process
    // may open 20,000 files here), more than the whole registry.
    let mut flood = vec![tool(
        &boxed,
        &a,
        &["flood", "--tcp", WEB, "--unspec-sockets", "50000", "--reconnects", "50000"],
    )];
    let tcp: Flood = flood[0].line();
    eprintln!("pod A, TCP: {tcp:?}");
    assert!(tcp.errors.is_empty(), "{:?}", tcp.errors);
    assert_eq!(tcp.reconnected_peer.as_deref(), Some(WEB));
    for _ in 0..16 {
        flood.push(tool(&boxed, &a, &["flood", "--tcp", WEB, "--dns", DNS, "--udp-hold", "18750"]));
    }
    let mut held = 0;
    for t in &mut flood[1..] {
        let f: Flood = t.line();
        assert!(f.errors.is_empty(), "{:?}", f.errors);
        held += f.udp_held;
    }
    assert_eq!(held, 300_000, "connected UDP sockets pod A holds");
    let share = udp_per_netns(lb_common::DEFAULT_MAX_REVERSE) as usize;
    let registered = hash_entries::<ReverseKey, ReverseValue>(&pins.join(MAP_CONNECTED_UDP)).len();
    let counts = hash_entries::<u64, u32>(&pins.join(MAP_UDP_PER_NETNS));
    eprintln!("registry: {registered} sockets; per namespace: {counts:?}");
    // The count takes no lock: A's processes registering at once may pass the share by one socket per
    // program run in flight that read the count just below it (one per CPU, or two where a run was
    // preempted inside that window).
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(
        (share..=share + 2 * cpus).contains(&registered),
        "A holds its share of the registry: {registered}"
    );
    assert_eq!(counts.iter().map(|(_, n)| *n as usize).collect::<Vec<_>>(), [registered]);
    // Each socket over the share is counted by the kernel, on the metrics port the DaemonSet passes.
    let metrics = metrics(&boxed);
    let unrecorded = format!("tierlb_reverse_unrecorded_total {}", 300_000 - registered);
    assert!(metrics.lines().any(|l| l == unrecorded), "{unrecorded:?} not in:\n{metrics}");

    // B's sockets, opened after A's flood: the reverse view and a registration of their own.
    let mut keep = tool(&boxed, &b, &["keep", "--tcp", WEB, "--dns", DNS]);
    let k = keep.check();
    assert_eq!(
        (k.tcp_peer.as_deref(), k.reply_from.as_deref(), k.answer.as_deref()),
        (Some(WEB), Some(DNS), Some("10.0.1.1")),
        "{k:?}"
    );
    let lru = hash_entries::<ReverseKey, ReverseValue>(&pins.join(MAP_REVERSE));
    let tcp_in_lru = lru.iter().filter(|(k, _)| k.backend.proto == lb_common::PROTO_TCP).count();
    let slots = common::tcp_slots_held(&pins.join(MAP_REVERSE_TCP)).len();
    eprintln!("reverse LRU: {} entries, {tcp_in_lru} of TCP sockets; TCP slots held: {slots}", lru.len());
    assert_eq!(
        tcp_in_lru + slots,
        2,
        "A's reconnected socket and B's: A's 50,000 closed sockets left nothing (in a slot or, if another \
         socket held it, in the LRU; not which socket has which: a slot shared by both is a 1 in 65,536 case)"
    );
    assert_eq!(hash_entries::<ReverseKey, ReverseValue>(&pins.join(MAP_CONNECTED_UDP)).len(), registered + 1);

    // B's resolver leaves: the agent destroys B's socket (and A's registered ones).
    write_service(boxed.manifests.path(), &dns_svc(), &[]).unwrap();
    let mut ended = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let k = keep.check();
        if k.udp_error.is_some() {
            ended = k.udp_error;
            break;
        }
    }
    // The kernel reports the abort to a pending receive (ECONNABORTED); a send after it finds the socket
    // disconnected (EDESTADDRREQ), which a connected socket never reports otherwise.
    assert!(
        matches!(ended.as_deref(), Some("ECONNABORTED" | "EDESTADDRREQ")),
        "B's connected UDP socket was destroyed: {ended:?}"
    );
    assert_eq!(keep.check().tcp_peer.as_deref(), Some(WEB), "B's TCP socket still shows the VIP");

    // A closes everything: its namespace's count and every entry of its sockets go.
    drop(flood);
    drop(keep);
    std::thread::sleep(Duration::from_millis(500));
    let left = (
        hash_entries::<ReverseKey, ReverseValue>(&pins.join(MAP_REVERSE)).len(),
        hash_entries::<ReverseKey, ReverseValue>(&pins.join(MAP_CONNECTED_UDP)).len(),
        hash_entries::<u64, u32>(&pins.join(MAP_UDP_PER_NETNS)).len(),
        common::tcp_slots_held(&pins.join(MAP_REVERSE_TCP)).len(),
    );
    assert_eq!(
        left,
        (0, 0, 0, 0),
        "(reverse LRU, registry, namespace counts, TCP slots) after both pods closed"
    );
}

/// As deployed, one Service over a per-Service limit (5,000 externalIPs, over the default 1,024) is refused:
/// `/healthz` (on the port the DaemonSet's probe uses) stays 200 and names it with the limit and the flag,
/// `tierlb_services_unprogrammed` counts it, and another Service's edit in the same sync is served to a pod.
#[test]
fn as_deployed_a_service_over_its_limits_is_named_on_healthz_and_metrics_while_another_is_served() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut boxed = BoxedNode::new("limits", Path::new(TIERLB), &deploy).unwrap();
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let mut servers = Vec::new();
    let mut pods = Vec::new();
    for (i, addr) in ["10.244.1.10", "10.244.1.11"].iter().enumerate() {
        let ns = boxed.node.add_pod(&format!("web-{i}"), ip(addr)).unwrap();
        let at = std::net::SocketAddr::new(ip(addr), 8080);
        servers.push(NamedServer::start(&lab, &ns, at, &format!("web-{}", i + 1)).unwrap());
        pods.push(ns);
    }
    let client = boxed.node.add_pod("client", ip("10.244.1.100")).unwrap();
    let web = Svc::new("web", ip("10.96.0.10"), 80, 8080);
    write_service(boxed.manifests.path(), &web, &[Ep::ready(ip("10.244.1.10"), "node-1")]).unwrap();
    let mut ips = Svc::new("ips", ip("10.96.0.11"), 80, 8080).service();
    let many: Vec<String> = (0..5_000).map(|i| format!("198.18.{}.{}", i / 250, i % 250 + 1)).collect();
    ips["spec"]["externalIPs"] = serde_json::json!(many);
    let slices =
        Svc::new("ips", ip("10.96.0.11"), 80, 8080).slices(&[Ep::ready(ip("10.244.1.10"), "node-1")]);
    let docs: Vec<String> = std::iter::once(ips).chain(slices).map(|d| d.to_string()).collect();
    lb_testkit::manifests::write_atomic(boxed.manifests.path(), "ips.yaml", &docs.join("\n---\n")).unwrap();
    let _agent = boxed.start_agent("node-1", &[]).unwrap();
    // The edit after the refusal: web gets its second endpoint, ips stays over its limit.
    write_service(
        boxed.manifests.path(),
        &web,
        &[Ep::ready(ip("10.244.1.10"), "node-1"), Ep::ready(ip("10.244.1.11"), "node-1")],
    )
    .unwrap();
    let both = common::eventually(10, || {
        let r = boxed.probe(&client, WEB, 20).unwrap();
        r.count("web-1") > 0 && r.count("web-2") > 0 && r.failures() == 0
    });
    assert!(both, "web's edit is served");
    let healthz = boxed.container.probes.iter().find(|(p, _)| p == "/healthz").expect("a /healthz probe").1;
    let (code, body) = common::get_in(&boxed.node.netns, healthz, "/healthz");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(code, 200, "{body}");
    let refused = body["unprogrammedServices"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{body}");
    assert_eq!(refused[0]["service"], "default/ips", "{body}");
    let reasons = refused[0]["reasons"].to_string();
    assert!(
        reasons.contains("over its limit: 5000 externalIPs")
            && reasons.contains("--max-external-ips-per-service 1024"),
        "{reasons}"
    );
    let metrics = metrics(&boxed);
    assert!(metrics.lines().any(|l| l == "tierlb_services_unprogrammed 1"), "{metrics}");
    drop((servers, pods));
}
