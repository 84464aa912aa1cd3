//! Real kube-proxy v1.36.3 (built here from Kubernetes' code, `lb_testkit::kube_proxy`) beside tierlb, on the
//! cluster in a box: the program tierlb replaces, run in a network namespace the test made, in iptables
//! mode and in nftables mode, reading the same API server as tierlb's agent.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    time::Duration,
};

use lb_testkit::{
    differential::{Client, DiffLab, Via},
    kube::{KubeCluster, Options},
    kube_proxy::{HEALTHZ_PORT, KubeProxy, METRICS_PORT, Mode, http_get},
};
use serde_json::Value;

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

/// tierlb's `/healthz` beside kube-proxy's (which has 10256) in the one namespace.
const TIERLB_HEALTHZ: &str = "127.0.0.1:10257";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// `/healthz` of kube-proxy and of tierlb: (status, body) each.
fn both_healthz(c: &KubeCluster) -> [(u16, Value); 2] {
    let kube_proxy = SocketAddr::new([127, 0, 0, 1].into(), HEALTHZ_PORT);
    [kube_proxy, addr(TIERLB_HEALTHZ)].map(|at| {
        let (code, body) = http_get(&c.sim.netns, at, "/healthz").unwrap();
        (code, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{at}: {e}: {body:?}")))
    })
}

/// Wait until kube-proxy's and tierlb's `/healthz` both answer `code` with `nodeEligible` `eligible`.
fn healthz_agree(c: &KubeCluster, code: u16, eligible: bool, what: &str) {
    c.cp.wait_for(Duration::from_secs(15), what, |c2| {
        let _ = c2;
        Ok(both_healthz(c).iter().all(|(s, body)| *s == code && body["nodeEligible"] == eligible))
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", both_healthz(c)));
}

#[test]
fn kube_proxy_in_iptables_and_nftables_mode_programs_the_cluster_and_its_healthz_agrees_with_tierlbs() {
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut c =
        KubeCluster::start("kp-health", Path::new(TIERLB), &lab, &deploy, Options::default()).unwrap();
    c.add_node("node-1", Some("zone-a"), &["--healthz-addr", TIERLB_HEALTHZ]).unwrap();
    c.cp.add_namespace("booking").unwrap();
    c.start_pod("booking", "web-1", "node-1", &[("app", "web")], addr("10.244.1.10:8080")).unwrap();
    c.cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: booking}\n\
         spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n",
    )
    .unwrap();
    let healthz = SocketAddr::new([127, 0, 0, 1].into(), HEALTHZ_PORT);
    let metrics = SocketAddr::new([127, 0, 0, 1].into(), METRICS_PORT);

    // iptables mode: its rules name the Service and the pod; both say 200, the node eligible.
    let mut proxy =
        KubeProxy::start(&c.cp, "node-1", &c.sim.netns, Mode::Iptables, healthz, metrics).unwrap();
    c.cp.wait_for(Duration::from_secs(15), "kube-proxy's iptables rules for booking/web", |_| {
        let rules = proxy.rules()?;
        Ok(rules.contains("booking/web:http") && rules.contains("10.244.1.10:8080"))
    })
    .unwrap();
    healthz_agree(&c, 200, true, "both healthy");
    for (code, body) in both_healthz(&c) {
        for field in ["lastUpdated", "currentTime"] {
            assert!(body[field].as_str().is_some_and(|t| t.ends_with('Z')), "{code} {body}");
        }
    }
    // The cluster autoscaler's taint: kube-proxy (1.31+) fails /healthz so that load balancers drain the
    // node; so does tierlb. Removed: both healthy again.
    let taint = "ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule";
    c.cp.kubectl(&["taint", "node", "node-1", taint]).unwrap();
    healthz_agree(&c, 503, false, "both draining the tainted node");
    c.cp.kubectl(&["taint", "node", "node-1", &format!("{taint}-")]).unwrap();
    healthz_agree(&c, 200, true, "both healthy once the taint is gone");
    proxy.stop(Duration::from_secs(10));

    // nftables mode, the same namespace: its table names the Service; a Node being deleted (held by a
    // finalizer) fails both; once it is gone, neither has a Node: both still fail.
    let proxy = KubeProxy::start(&c.cp, "node-1", &c.sim.netns, Mode::Nftables, healthz, metrics).unwrap();
    c.cp.wait_for(Duration::from_secs(15), "kube-proxy's nftables rules for booking/web", |_| {
        let rules = proxy.rules()?;
        Ok(rules.contains("booking/web/tcp/http") && rules.contains("10.244.1.10"))
    })
    .unwrap_or_else(|e| panic!("{e}: {}", proxy.rules().unwrap_or_default()));
    healthz_agree(&c, 200, true, "both healthy under nftables");
    c.cp.kubectl(&["patch", "node", "node-1", "-p", r#"{"metadata":{"finalizers":["tierlb.test/hold"]}}"#])
        .unwrap();
    c.cp.kubectl(&["delete", "node", "node-1", "--wait=false"]).unwrap();
    healthz_agree(&c, 503, false, "both draining the node being deleted");
    c.cp.kubectl(&[
        "patch",
        "node",
        "node-1",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .unwrap();
    c.cp.wait_for(Duration::from_secs(15), "node-1 gone", |cp| {
        Ok(cp.kubectl(&["get", "node", "node-1"]).is_err())
    })
    .unwrap();
    healthz_agree(&c, 503, false, "both without a Node");
}

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

/// Attempts per target: with at most 4 equally likely backends, a backend is missed with probability at
/// most 4 (3/4)^60 = 1.3e-7 per (node, client, target, proxy), 2e-4 over the whole run's 1,600 comparisons
/// (4 nodes, 2 client kinds, 200 targets).
const ATTEMPTS: usize = 60;

/// The generated cluster: 100 Services (every placement x distribution x internal traffic policy), each
/// with a numbered and a named target port: 200 Service ports. Returns each Service port's name and VIP.
fn differential_services(lab: &DiffLab) -> Vec<(String, SocketAddr)> {
    let mut yaml = String::new();
    let mut names = Vec::new();
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
                     spec:\n  selector: {{in-{placement}: \"y\"}}\n  internalTrafficPolicy: {itp}{td}\n  \
                     ports: [{{name: num, port: 80, targetPort: 8080}}, {{name: named, port: 81, targetPort: http}}]\n---\n"
                );
                names.push(name);
            }
        }
    }
    lab.cp.apply(&yaml).unwrap();
    let mut ports = Vec::new();
    for name in names {
        let ip =
            lab.cp.kubectl(&["-n", "diff", "get", "svc", &name, "-o", "jsonpath={.spec.clusterIP}"]).unwrap();
        let ip: std::net::IpAddr = ip.trim().parse().unwrap();
        ports.push((format!("diff/{name}:num"), SocketAddr::new(ip, 80)));
        ports.push((format!("diff/{name}:named"), SocketAddr::new(ip, 81)));
    }
    ports
}

/// One side's answer for a target: the backends reached, and how the failures failed.
fn outcome(r: &lb_testkit::probe::Report) -> (BTreeSet<String>, BTreeSet<String>) {
    (r.by_backend().into_keys().collect(), r.errors().into_keys().collect())
}

/// A connect that waited for its timeout: the packet was dropped.
fn dropped(errors: &BTreeSet<String>) -> bool {
    errors.iter().any(|e| e.contains("ETIMEDOUT") || e.contains("EAGAIN"))
}

#[test]
fn kube_proxy_and_tierlb_reach_the_same_backends_for_every_service_shape_node_and_client() {
    let lab_bin = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let nodes = [
        ("node-1", Some("zone-a")),
        ("node-2", Some("zone-a")),
        ("node-3", Some("zone-b")),
        ("node-4", None),
    ];
    let mut lab = DiffLab::new("kp-diff", Path::new(TIERLB), &lab_bin, &deploy, &nodes).unwrap();
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
            // 100 slices; p6 is in f and g, 10 Services each.
            Ok(items.len() == 100 && terminating == 20)
        })
        .unwrap();
    lab.start_agents().unwrap();
    let targets: Vec<SocketAddr> = ports.iter().map(|(_, t)| *t).collect();
    let tierlb = reach_all(&lab, &nodes, Via::Tierlb, &targets);
    for mode in [Mode::Iptables, Mode::Nftables] {
        lab.start_proxies(mode).unwrap();
        if mode == Mode::Nftables {
            // Started in nftables mode, kube-proxy removes what iptables mode wrote: nothing of it is left to
            // answer in its place.
            let mut save = std::process::Command::new("ip");
            save.args(["netns", "exec", lab.nodes[0].boxed.node.netns.name(), "iptables-save"]);
            let out = save.output().unwrap();
            assert!(out.status.success(), "iptables-save: {}", String::from_utf8_lossy(&out.stderr));
            let rules = String::from_utf8_lossy(&out.stdout);
            assert!(!rules.contains("KUBE-SVC-"), "iptables mode's rules left behind:\n{rules}");
        }
        let kube_proxy = reach_all(&lab, &nodes, Via::KubeProxy, &targets);
        compare(mode, &nodes, &ports, &kube_proxy, &tierlb);
    }
}

/// Reports of every node's two client kinds going `via` one proxy, all at once (mostly waiting on connects).
fn reach_all<'a>(
    lab: &DiffLab,
    nodes: &[(&'a str, Option<&str>)],
    via: Via,
    targets: &[SocketAddr],
) -> BTreeMap<(&'a str, Client), Vec<lb_testkit::probe::Report>> {
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for &(node, _) in nodes {
            for client in [Client::Pod, Client::Node] {
                handles.push(s.spawn(move || {
                    ((node, client), lab.reach(node, client, via, targets, ATTEMPTS, 300).unwrap())
                }));
            }
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// kube-proxy's answers (in `mode`) against tierlb's, target by target: equal sets, or both reaching nothing
/// where kube-proxy drops and tierlb refuses at once (the one difference allowed).
fn compare(
    mode: Mode,
    nodes: &[(&str, Option<&str>)],
    ports: &[(String, SocketAddr)],
    kube_proxy: &BTreeMap<(&str, Client), Vec<lb_testkit::probe::Report>>,
    tierlb: &BTreeMap<(&str, Client), Vec<lb_testkit::probe::Report>>,
) {
    let mut differences = Vec::new();
    let (mut allowed, mut reached, mut lost) = (0, 0, 0);
    let mut seen = BTreeSet::new();
    // A connect lost now and then on this loaded 2-CPU machine (a SYN not answered within 300 ms, seen on
    // kube-proxy's side in a run where tierlb's clients had gone before) is not a difference in what a proxy
    // chooses; an endpoint chosen and dead would fail a share of the attempts, far above one in ten.
    let rare = |r: &lb_testkit::probe::Report| r.failures() * 10 < r.attempts.len();
    for &(node, _) in nodes {
        for client in [Client::Pod, Client::Node] {
            let (kp, tl) = (&kube_proxy[&(node, client)], &tierlb[&(node, client)]);
            for (i, (name, _)) in ports.iter().enumerate() {
                let ((kp_set, kp_err), (tl_set, tl_err)) = (outcome(&kp[i]), outcome(&tl[i]));
                reached += usize::from(!kp_set.is_empty() && kp_set == tl_set);
                seen.extend(tl_set.iter().cloned());
                if !kp_set.is_empty() && kp_set == tl_set && rare(&kp[i]) && rare(&tl[i]) {
                    lost += kp[i].failures() + tl[i].failures();
                    continue;
                }
                if kp_set.is_empty() && tl_set.is_empty() {
                    // Both reach nothing: the one allowed difference is kube-proxy dropping (the client waits
                    // for its timeout) where tierlb refuses at once.
                    if kp_err != tl_err {
                        if dropped(&kp_err) && !dropped(&tl_err) {
                            allowed += 1;
                        } else {
                            differences.push(format!(
                                "{name} from {node}'s {client:?}: both reach nothing, kube-proxy {kp_err:?}, \
                                 tierlb {tl_err:?}"
                            ));
                        }
                    }
                    continue;
                }
                differences.push(format!(
                    "{name} from {node}'s {client:?}: kube-proxy {kp_set:?} {kp_err:?}, tierlb {tl_set:?} {tl_err:?}"
                ));
            }
        }
    }
    eprintln!(
        "kube-proxy in {} mode: {} Service ports x {} nodes x 2 clients compared: {} differences; {reached} where \
         both reach the same backends ({lost} connects lost among them), {allowed} where kube-proxy drops and \
         tierlb refuses at once; backends seen: {seen:?}",
        mode.as_str(),
        ports.len(),
        nodes.len(),
        differences.len()
    );
    assert!(
        differences.is_empty(),
        "kube-proxy in {} mode: {} differences:\n{}",
        mode.as_str(),
        differences.len(),
        differences.join("\n")
    );
    // Not a comparison of two failures: most answers reach backends, and every serving pod answers some.
    assert!(reached >= 800, "only {reached} of 1,600 comparisons reached a backend");
    assert_eq!(seen, ["p1", "p2", "p3", "p4", "p6"].map(String::from).into(), "p5 is never Ready");
}
