//! The differential: real kube-proxy v1.36.3 (iptables mode, then nftables mode) and tierlb's agents as
//! deployed, on the same four simulated nodes, reading the same API server, in front of the same pods
//! (`lb_testkit::differential`). For every node, Service port and client (a pod of the node, a process of the
//! node, a machine outside the nodes) the set of backends reached through one must equal the set reached
//! through the other. Every Service is dual-stack (`PreferDualStack`): its numbered ClusterIP ports, its
//! session-affinity ports and every outside frontend are tried over IPv6 as well.
//!
//! The differences allowed are listed in one place, `allowed` (README's "Differences from kube-proxy" says the
//! same); anything else fails the test with the Service port, the node, the client and both answers.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use lb_testkit::{
    differential::{Client, DiffLab, Via, node_ip6},
    kube_proxy::Mode,
    probe::Report,
};
use serde_json::Value;

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

/// The nodes: two in zone-a, one in zone-b, one without a zone label.
const NODES: [(&str, Option<&str>); 4] =
    [("node-1", Some("zone-a")), ("node-2", Some("zone-a")), ("node-3", Some("zone-b")), ("node-4", None)];

/// Every kind of client on every node.
const CLIENTS: [Client; 3] = [Client::Pod, Client::Node, Client::Outside];

/// The differential's pods: (name, node, Ready, terminating). p5 is never Ready; p6 is deleted with a
/// grace period and keeps serving (terminating).
const PODS: [(&str, &str, bool, bool); 6] = [
    ("p1", "node-1", true, false),
    ("p2", "node-2", true, false),
    ("p3", "node-3", true, false),
    ("p4", "node-4", true, false),
    ("p5", "node-1", false, false),
    ("p6", "node-3", true, true),
];

/// Where a Service's pods are: its selector `in-X: y` picks these (at most 4, so that every member of a
/// set shows within the attempts with the probability the test states).
const PLACEMENTS: [(&str, &[&str]); 10] = [
    ("a", &["p1", "p2", "p3"]),
    ("b", &["p1", "p3"]),
    ("c", &["p2"]),
    ("d", &["p3", "p4"]),
    ("e", &["p1", "p5"]),
    ("f", &["p2", "p6"]),
    ("g", &["p6"]),
    ("h", &["p4"]),
    ("i", &["p1", "p2", "p3", "p4"]),
    ("j", &["p5"]),
];

/// What picks the endpoints by topology: (short name, trafficDistribution, topology-mode annotation).
const DISTRIBUTIONS: [(&str, Option<&str>, bool); 5] = [
    ("none", None, false),
    ("close", Some("PreferClose"), false),
    ("zone", Some("PreferSameZone"), false),
    ("node", Some("PreferSameNode"), false),
    ("auto", None, true),
];

/// The frontends reachable from outside: (short name, Service type, with an externalIP).
const FRONTENDS: [(&str, &str, bool); 3] =
    [("np", "NodePort", false), ("lb", "LoadBalancer", false), ("xip", "ClusterIP", true)];

/// The policies of an externally reachable Service: (short name, externalTrafficPolicy,
/// internalTrafficPolicy, trafficDistribution).
const EXTERNAL: [(&str, &str, &str, Option<&str>); 4] = [
    ("cluster", "Cluster", "Cluster", None),
    ("local", "Local", "Cluster", None),
    ("local-itp", "Local", "Local", None),
    ("node", "Cluster", "Cluster", Some("PreferSameNode")),
];

/// Attempts per target: with at most 4 equally likely backends, a backend is missed with probability at
/// most 4 (3/4)^60 = 1.3e-7 per (node, client, target, proxy), 7e-4 over the whole run's 5,440 comparisons
/// per mode.
const ATTEMPTS: usize = 60;

/// How a Service port is reached.
#[derive(Clone, Copy, Debug)]
enum Frontend {
    /// Its ClusterIP (from the nodes' pods and processes).
    ClusterIp(SocketAddr),
    /// Its nodePort on the address of the client's node (from every client), the node's IPv6 address if
    /// `true`.
    NodePort(u16, bool),
    /// A load-balancer ingress IP or an externalIP (from every client; an outside client's packets for it go
    /// to its node).
    External(SocketAddr),
}

/// One Service port of the generated cluster.
struct Port {
    /// `namespace/service:port`, and for an outside frontend which one.
    name: String,
    frontend: Frontend,
    /// sessionAffinity ClientIP: each client sticks to one backend among those of port `of` (the same
    /// placement, without affinity).
    affinity_of: Option<usize>,
}

/// The cluster-internal Services: every placement x distribution x internal traffic policy (100), each with
/// a numbered and a named target port; and one sessionAffinity ClientIP Service per placement.
fn internal_services(yaml: &mut String) -> Vec<(String, &'static str, Option<&'static str>)> {
    let mut ports = Vec::new();
    for (placement, _) in PLACEMENTS {
        for (dist, td, auto) in DISTRIBUTIONS {
            for itp in ["Cluster", "Local"] {
                let name = format!("{placement}-{dist}-{}", itp.to_lowercase());
                let annotation =
                    if auto { "\n  annotations: {service.kubernetes.io/topology-mode: Auto}" } else { "" };
                let td = td.map_or(String::new(), |t| format!("\n  trafficDistribution: {t}"));
                let _ = write!(
                    yaml,
                    "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: diff{annotation}\n\
                     spec:\n  ipFamilyPolicy: PreferDualStack\n  selector: {{in-{placement}: \"y\"}}\n  internalTrafficPolicy: {itp}{td}\n  \
                     ports: [{{name: num, port: 80, targetPort: 8080}}, {{name: named, port: 81, targetPort: http}}]\n---\n"
                );
                ports.push((name.clone(), "num", None));
                ports.push((name, "named", None));
            }
        }
        let name = format!("{placement}-affinity");
        let _ = write!(
            yaml,
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: diff}}\n\
             spec:\n  ipFamilyPolicy: PreferDualStack\n  selector: {{in-{placement}: \"y\"}}\n  sessionAffinity: ClientIP\n  \
             ports: [{{name: num, port: 80, targetPort: 8080}}]\n---\n"
        );
        ports.push((name, "num", Some(placement)));
    }
    ports
}

/// The externally reachable Services: every placement x frontend x external policy (120), one port each,
/// numbered and named target ports alternating. Returns each one's name and, for a load balancer, the
/// ingress IP to give it.
fn external_services(yaml: &mut String) -> Vec<(String, Option<Ipv4Addr>)> {
    let mut made = Vec::new();
    let mut k = 0u8;
    for (placement, _) in PLACEMENTS {
        for (frontend, kind, external_ip) in FRONTENDS {
            for (policy, etp, itp, td) in EXTERNAL {
                k += 1;
                let name = format!("{placement}-{frontend}-{policy}");
                let td = td.map_or(String::new(), |t| format!("\n  trafficDistribution: {t}"));
                let xip = if external_ip {
                    format!("\n  externalIPs: [203.0.113.{k}, '2001:db8:113::{k}']")
                } else {
                    String::new()
                };
                let target = if k.is_multiple_of(2) { "8080" } else { "http" };
                let _ = write!(
                    yaml,
                    "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: diff}}\n\
                     spec:\n  type: {kind}\n  ipFamilyPolicy: PreferDualStack\n  selector: {{in-{placement}: \"y\"}}\n  externalTrafficPolicy: {etp}\n  \
                     internalTrafficPolicy: {itp}{td}{xip}\n  ports: [{{name: web, port: 80, targetPort: {target}}}]\n---\n"
                );
                made.push((name, (kind == "LoadBalancer").then(|| Ipv4Addr::new(198, 51, 100, k))));
            }
        }
    }
    made
}

/// An outside frontend's IPv6 twin of 198.51.100.k or 203.0.113.k: 2001:db8:100::k, 2001:db8:113::k.
fn ip6_of(ip: Ipv4Addr) -> Ipv6Addr {
    let [_, _, c, k] = ip.octets();
    let group = if c == 100 { 0x100 } else { 0x113 };
    // As the manifests spell it: the decimal digits of k in the last group.
    format!("2001:db8:{group:x}::{k}").parse().unwrap()
}

/// The generated cluster: 230 Services, all dual-stack. IPv4: 330 Service ports (200 ClusterIP ports of 100
/// Services, 10 with session affinity, 120 reachable from outside: 40 NodePorts, 40 load balancers, 40
/// externalIPs). IPv6: the 100 numbered ClusterIP ports, the 10 with session affinity and the 120 outside
/// frontends again (230).
fn differential_services(lab: &DiffLab) -> Vec<Port> {
    let mut yaml = String::new();
    let internal = internal_services(&mut yaml);
    let external = external_services(&mut yaml);
    lab.cp.apply(&yaml).unwrap();
    for (name, ingress) in &external {
        if let Some(ip) = ingress {
            let ip6 = ip6_of(*ip);
            let status = format!(
                r#"{{"status":{{"loadBalancer":{{"ingress":[{{"ip":"{ip}"}},{{"ip":"{ip6}"}}]}}}}}}"#
            );
            lab.cp
                .kubectl(&[
                    "-n",
                    "diff",
                    "patch",
                    "svc",
                    name,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &status,
                ])
                .unwrap();
        }
    }
    let all: Value =
        serde_json::from_str(&lab.cp.kubectl(&["-n", "diff", "get", "svc", "-o", "json"]).unwrap()).unwrap();
    let specs: BTreeMap<String, &Value> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["metadata"]["name"].as_str().unwrap().to_owned(), &s["spec"]))
        .collect();
    let cluster_ip = |name: &str, v6: bool| -> IpAddr {
        let ip: IpAddr = specs[name]["clusterIPs"][usize::from(v6)].as_str().unwrap().parse().unwrap();
        assert_eq!(ip.is_ipv6(), v6, "{name}'s ClusterIPs, IPv4 first: {:?}", specs[name]["clusterIPs"]);
        ip
    };
    let mut ports: Vec<Port> = Vec::new();
    for v6 in [false, true] {
        let family = if v6 { " (IPv6)" } else { "" };
        for (name, port, affinity) in &internal {
            if v6 && *port != "num" {
                continue;
            }
            let number = if *port == "num" { 80 } else { 81 };
            let affinity_of = affinity.map(|placement| {
                let of = format!("diff/{placement}-none-cluster:num{family}");
                ports.iter().position(|p| p.name == of).unwrap()
            });
            let frontend = Frontend::ClusterIp(SocketAddr::new(cluster_ip(name, v6), number));
            ports.push(Port { name: format!("diff/{name}:{port}{family}"), frontend, affinity_of });
        }
        for (name, ingress) in &external {
            let spec = specs[name];
            let node_port = spec["ports"][0]["nodePort"].as_u64().map(|p| u16::try_from(p).unwrap());
            let external_ip = spec["externalIPs"][usize::from(v6)].as_str();
            let frontend = match (ingress, external_ip) {
                (Some(ip), _) if v6 => Frontend::External(SocketAddr::new(ip6_of(*ip).into(), 80)),
                (Some(ip), _) => Frontend::External(SocketAddr::new((*ip).into(), 80)),
                (None, Some(ip)) => Frontend::External(SocketAddr::new(ip.parse().unwrap(), 80)),
                (None, None) => Frontend::NodePort(node_port.unwrap(), v6),
            };
            ports.push(Port { name: format!("diff/{name}:web{family}"), frontend, affinity_of: None });
        }
    }
    ports
}

/// The ports a `client` of the `i`-th node tries, and the address it dials for each.
fn targets(ports: &[Port], i: usize, client: Client) -> Vec<(usize, SocketAddr)> {
    let node_ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, u8::try_from(i + 1).unwrap()));
    ports
        .iter()
        .enumerate()
        .filter_map(|(k, p)| match p.frontend {
            Frontend::ClusterIp(_) if client == Client::Outside => None,
            Frontend::ClusterIp(a) | Frontend::External(a) => Some((k, a)),
            Frontend::NodePort(port, false) => Some((k, SocketAddr::new(node_ip, port))),
            Frontend::NodePort(port, true) => Some((k, SocketAddr::new(node_ip6(i).into(), port))),
        })
        .collect()
}

/// Every node's answers for one client kind, by port index.
type Answers<'a> = BTreeMap<(&'a str, Client), BTreeMap<usize, Report>>;

/// Reports of every node's clients of every kind going `via` one proxy, all at once (mostly waiting on
/// connects).
fn reach_all<'a>(lab: &DiffLab, ports: &[Port], via: Via) -> Answers<'a> {
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, &(node, _)) in NODES.iter().enumerate() {
            for client in CLIENTS {
                handles.push(s.spawn(move || {
                    let t = targets(ports, i, client);
                    let addrs: Vec<SocketAddr> = t.iter().map(|(_, a)| *a).collect();
                    let reports = lab.reach(node, client, via, &addrs, ATTEMPTS, 300).unwrap();
                    assert_eq!(reports.len(), t.len(), "a report per target");
                    ((node, client), t.iter().map(|(k, _)| *k).zip(reports).collect())
                }));
            }
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn kube_proxy_and_tierlb_reach_the_same_backends_for_every_service_shape_node_and_client() {
    let lab_bin = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut lab = DiffLab::new("kp-diff", Path::new(TIERLB), &lab_bin, &deploy, &NODES).unwrap();
    lab.cp.add_namespace("diff").unwrap();
    for (pod, node, ready, _) in PODS {
        let labels: Vec<(String, &str)> = PLACEMENTS
            .iter()
            .filter(|(_, pods)| pods.contains(&pod))
            .map(|(p, _)| (format!("in-{p}"), "y"))
            .collect();
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        lab.add_pod("diff", pod, node, &labels, ready).unwrap();
    }
    for (pod, _, _, terminating) in PODS {
        if terminating {
            lab.cp.delete_pod_gracefully("diff", pod, 3600).unwrap();
        }
    }
    let ports = differential_services(&lab);
    // The controller has written every slice (each Service's with its placement's pods, p6 terminating).
    lab.cp
        .wait_for(Duration::from_mins(1), "the controller's slices", |cp| {
            let all = cp.kubectl(&["-n", "diff", "get", "endpointslices", "-o", "json"])?;
            let v: Value = serde_json::from_str(&all)?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            let terminating = items
                .iter()
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .filter(|e| e["conditions"]["terminating"] == true)
                .count();
            // 460 slices (one per family); p6 is in f and g, 23 Services each, in both families.
            Ok(items.len() == 460 && terminating == 92)
        })
        .unwrap();
    lab.start_agents().unwrap();
    let tierlb = reach_all(&lab, &ports, Via::Tierlb);
    // tierlb's tc programs would see outside packets before kube-proxy's rules: gone before kube-proxy runs.
    lab.stop_agents(Path::new(TIERLB)).unwrap();
    for mode in [Mode::Iptables, Mode::Nftables] {
        lab.start_proxies(mode).unwrap();
        eprintln!(
            "kube-proxy in {} mode started; {} starts so far never took their Node's zone and were started again",
            mode.as_str(),
            lab.zone_misses
        );
        if mode == Mode::Nftables {
            // Started in nftables mode, kube-proxy removes what iptables mode wrote: nothing of it is left to
            // answer in its place.
            for save in ["iptables-save", "ip6tables-save"] {
                let mut cmd = std::process::Command::new("ip");
                cmd.args(["netns", "exec", lab.nodes[0].boxed.node.netns.name(), save]);
                let out = cmd.output().unwrap();
                assert!(out.status.success(), "{save}: {}", String::from_utf8_lossy(&out.stderr));
                let rules = String::from_utf8_lossy(&out.stdout);
                assert!(!rules.contains("KUBE-SVC-"), "iptables mode's rules left behind ({save}):\n{rules}");
            }
        }
        let kube_proxy = reach_all(&lab, &ports, Via::KubeProxy);
        compare(mode, &ports, &kube_proxy, &tierlb);
    }
}

/// One side's answer for a target: the backends reached, and how the failures failed.
fn outcome(r: &Report) -> (BTreeSet<String>, BTreeSet<String>) {
    (r.by_backend().into_keys().collect(), r.errors().into_keys().collect())
}

/// A connect that waited for its timeout: the packet was dropped.
fn dropped(errors: &BTreeSet<String>) -> bool {
    errors.iter().any(|e| e.contains("ETIMEDOUT") || e.contains("EAGAIN"))
}

/// The differences allowed between kube-proxy's answer and tierlb's, both reaching no backend: every one of
/// them, here and in README.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Allowed {
    /// A node's pod or process, a Local policy with endpoints on other nodes only: kube-proxy drops (the
    /// client waits for its timeout), tierlb's socket hooks refuse at once.
    RefusedAtOnce,
    /// A client outside the nodes, a frontend whose Service has no usable endpoint at all: kube-proxy rejects
    /// (ICMP port unreachable, which the kernel rate-limits, so some of its attempts time out too), tierlb's tc
    /// program drops (the client waits for its timeout).
    DroppedFromOutside,
}

/// Which allowed difference kube-proxy's failures `kp` and tierlb's `tl` are, if any.
fn allowed(client: Client, kp: &BTreeSet<String>, tl: &BTreeSet<String>) -> Option<Allowed> {
    let refused =
        |e: &BTreeSet<String>| e.iter().any(|e| e.contains("ECONNREFUSED") || e.contains("EHOSTUNREACH"));
    match client {
        Client::Pod | Client::Node if dropped(kp) && !dropped(tl) => Some(Allowed::RefusedAtOnce),
        Client::Outside if refused(kp) && dropped(tl) && !refused(tl) => Some(Allowed::DroppedFromOutside),
        _ => None,
    }
}

/// A connect lost now and then on this loaded 2-CPU machine (a SYN not answered within 300 ms) is not a
/// difference in what a proxy chooses; an endpoint chosen and dead would fail a share of the attempts, far
/// above one in ten.
fn rare(r: &Report) -> bool {
    r.failures() * 10 < r.attempts.len()
}

/// What the comparison found, for the summary line and the assertions.
#[derive(Default)]
struct Tally {
    differences: Vec<String>,
    /// Both reach the same non-empty set.
    reached: usize,
    /// Connects lost among those.
    lost: usize,
    /// kube-proxy drops, tierlb refuses at once (`Allowed::RefusedAtOnce`).
    allowed: usize,
    /// kube-proxy rejects an outside client, tierlb drops (`Allowed::DroppedFromOutside`).
    outside_dropped: usize,
    /// Both drop (an outside client under externalTrafficPolicy Local, no endpoint on the node).
    both_drop: usize,
    /// Both refuse (no usable endpoint anywhere).
    both_refuse: usize,
    /// Affinity ports where each side stuck to one backend of the port's set.
    stuck: usize,
    seen: BTreeSet<String>,
}

/// kube-proxy's answers (in `mode`) against tierlb's, target by target: equal sets, or both reaching nothing
/// in the same way or as one of the `Allowed` differences; under session affinity, one backend each, among the set of the same placement without affinity.
fn compare(mode: Mode, ports: &[Port], kube_proxy: &Answers<'_>, tierlb: &Answers<'_>) {
    let mut t = Tally::default();
    for ((node, client), kp_all) in kube_proxy {
        let tl_all = &tierlb[&(*node, *client)];
        for (k, kp) in kp_all {
            let (tl, name) = (&tl_all[k], &ports[*k].name);
            let ((kp_set, kp_err), (tl_set, tl_err)) = (outcome(kp), outcome(tl));
            t.seen.extend(tl_set.iter().cloned());
            let at = format!("{name} from {node}'s {client:?}");
            if let Some(of) = ports[*k].affinity_of.filter(|_| !kp_set.is_empty() || !tl_set.is_empty()) {
                let (kp_of, tl_of) = (outcome(&kp_all[&of]).0, outcome(&tl_all[&of]).0);
                if kp_set.len() == 1
                    && tl_set.len() == 1
                    && kp_set.is_subset(&kp_of)
                    && tl_set.is_subset(&tl_of)
                {
                    t.stuck += 1;
                } else {
                    t.differences.push(format!(
                        "{at} (session affinity): kube-proxy {kp_set:?} of {kp_of:?}, tierlb {tl_set:?} of {tl_of:?}"
                    ));
                }
                continue;
            }
            if !kp_set.is_empty() && kp_set == tl_set {
                t.reached += 1;
                if rare(kp) && rare(tl) {
                    t.lost += kp.failures() + tl.failures();
                    continue;
                }
            }
            if kp_set.is_empty() && tl_set.is_empty() {
                if kp_err == tl_err {
                    if dropped(&kp_err) {
                        t.both_drop += 1;
                    } else {
                        t.both_refuse += 1;
                    }
                    continue;
                }
                match allowed(*client, &kp_err, &tl_err) {
                    Some(Allowed::RefusedAtOnce) => {
                        t.allowed += 1;
                        continue;
                    }
                    Some(Allowed::DroppedFromOutside) => {
                        t.outside_dropped += 1;
                        continue;
                    }
                    None => {}
                }
            }
            t.differences.push(format!(
                "{at}: kube-proxy {kp_set:?} {kp_err:?} ({} failed), tierlb {tl_set:?} {tl_err:?} ({} failed)",
                kp.failures(),
                tl.failures()
            ));
        }
    }
    let compared: usize = kube_proxy.values().map(BTreeMap::len).sum();
    eprintln!(
        "kube-proxy in {} mode: {} Service ports, {compared} (node, client, port) answers compared: {} \
         differences; {} where both reach the same backends ({} connects lost among them), {} session-affinity \
         answers stuck to one backend each, {} where both drop, {} where both refuse, {} where kube-proxy drops and tierlb refuses at \
         once, {} where kube-proxy rejects an outside client and tierlb drops; backends seen: {:?}",
        mode.as_str(),
        ports.len(),
        t.differences.len(),
        t.reached,
        t.lost,
        t.stuck,
        t.both_drop,
        t.both_refuse,
        t.allowed,
        t.outside_dropped,
        t.seen
    );
    assert!(
        t.differences.is_empty(),
        "kube-proxy in {} mode: {} differences:\n{}",
        mode.as_str(),
        t.differences.len(),
        t.differences.join("\n")
    );
    // Not a comparison of failures: most answers reach backends, and every serving pod answers some.
    assert!(t.reached * 2 >= compared, "only {} of {compared} answers reached a backend", t.reached);
    assert!(t.stuck >= 60, "only {} session-affinity answers", t.stuck);
    assert_eq!(t.seen, ["p1", "p2", "p3", "p4", "p6"].map(String::from).into(), "p5 is never Ready");
}
