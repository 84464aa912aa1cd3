//! `tierlb study`'s kube-proxy model against real kube-proxy, release by release: v1.34.4, v1.35.4, v1.36.3 and
//! v1.37.2, each built by `cargo xtask setup` from its own module version, reading one kube-apiserver v1.36.3
//! (v1.37.2 is one minor newer than the API server, outside the version-skew policy, which lets kube-proxy
//! be older, not newer; it reads only v1 Services, EndpointSlices and Nodes, which did not change).
//!
//! Every study scenario of `examples/study/` is in the cluster at once, each in a namespace of its own: its
//! nodes (names prefixed, zones as written), its Service (selector-less, its policies) and its EndpointSlice
//! as `tierlb study` models it (the controller's hints where the scenario leaves them out, the scenario's
//! own where it writes them; node names in `forNodes` prefixed too). One kube-proxy per scenario node, in a
//! namespace of its own, iptables mode. In each state of every scenario (initial, then each phase applied),
//! what kube-proxy wrote for the Service on each node is read from its rules: the endpoints its ClusterIP
//! leads to and each one's share (from the `statistic --mode random` probabilities), or REJECT (the client is
//! refused) or DROP (it hangs); the model must give the same endpoints with equal shares, or the same
//! failure.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use lb_testkit::{
    kube::{ControlPlane, Options},
    kube_proxy::{HEALTHZ_PORT, KubeProxy, Launch, METRICS_PORT, Mode, http_get},
    sandbox::NetNs,
};
use serde_json::{Value, json};
use tierlb::{
    model::NodeInfo,
    study::{
        ScEndpoint, Scenario,
        models::{CiliumSettings, Empty, ProxyModel, Route, route},
    },
};

/// The releases checked, oldest first (v1.36.3 is the control plane's own kube-proxy).
const RELEASES: [Option<&str>; 4] = [Some("v1.34.4"), Some("v1.35.4"), None, Some("v1.37.2")];

/// What kube-proxy's rules do with a Service's ClusterIP on one node.
#[derive(Clone, Debug, PartialEq)]
enum Programmed {
    /// DNAT to these endpoints, each with its share of new connections.
    Set(BTreeMap<IpAddr, f64>),
    /// REJECT: connect() is refused.
    Rejected,
    /// DROP: the client waits for its timeout.
    Dropped,
    /// No rule for the Service at all.
    Missing,
}

/// The comment's text in an `iptables-save` line (`--comment "..."` or `--comment name`).
fn comment(line: &str) -> Option<&str> {
    let rest = line.split_once("--comment ")?.1;
    match rest.strip_prefix('"') {
        Some(quoted) => quoted.split_once('"').map(|(c, _)| c),
        None => rest.split_whitespace().next(),
    }
}

/// The chain a line jumps to.
fn jump(line: &str) -> Option<&str> {
    line.split_once(" -j ")?.1.split_whitespace().next()
}

/// What `iptables-save` output `rules` does with Service `svc` (`namespace/name`, a port without a name).
fn programmed(rules: &str, svc: &str) -> Programmed {
    let mut table = "";
    let mut chain = None;
    for line in rules.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = if t == "filter" {
                "filter"
            } else if t == "nat" {
                "nat"
            } else {
                ""
            };
        }
        let c = comment(line);
        if table == "filter" && c == Some(&format!("{svc} has no endpoints")) && jump(line) == Some("REJECT")
        {
            return Programmed::Rejected;
        }
        if table == "filter"
            && c == Some(&format!("{svc} has no local endpoints"))
            && jump(line) == Some("DROP")
        {
            return Programmed::Dropped;
        }
        if table == "nat" && line.starts_with("-A KUBE-SERVICES ") && c == Some(&format!("{svc} cluster IP"))
        {
            chain = jump(line).map(str::to_owned);
        }
    }
    let Some(chain) = chain else { return Programmed::Missing };
    // The chain's DNAT jumps in order, each taken with its probability by the connects the ones before left.
    let mut shares = BTreeMap::new();
    let mut left = 1.0;
    for line in rules.lines().filter(|l| l.starts_with(&format!("-A {chain} "))) {
        let Some(to) = c_endpoint(line, svc) else { continue };
        let p = line
            .split_once("--probability ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .map_or(1.0, |p| p.parse::<f64>().unwrap());
        shares.insert(to.ip(), left * p);
        left *= 1.0 - p;
    }
    Programmed::Set(shares)
}

/// The endpoint of a KUBE-SEP jump (`ns/svc -> 10.244.1.21:8080`).
fn c_endpoint(line: &str, svc: &str) -> Option<SocketAddr> {
    if !jump(line)?.starts_with("KUBE-SEP-") {
        return None;
    }
    comment(line)?.strip_prefix(&format!("{svc} -> "))?.parse().ok()
}

/// The model's answer in the same terms: its endpoints with equal shares, or its failure.
fn modelled(r: &Route) -> Programmed {
    match r {
        Route::Set { ips, empty } if ips.is_empty() => match empty {
            Empty::Refused => Programmed::Rejected,
            Empty::Hang => Programmed::Dropped,
        },
        Route::Set { ips, .. } => {
            Programmed::Set(ips.iter().map(|ip| (*ip, 1.0 / ips.len() as f64)).collect())
        }
        Route::Tiers(_) => unreachable!("the kube-proxy model routes to a set"),
    }
}

/// Same endpoints, shares within a millionth (kube-proxy writes ten decimals).
fn same(a: &Programmed, b: &Programmed) -> bool {
    match (a, b) {
        (Programmed::Set(x), Programmed::Set(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((i, p), (j, q))| i == j && (p - q).abs() < 1e-6)
        }
        _ => a == b,
    }
}

/// A scenario in the cluster: its namespace and its nodes' prefixed names.
struct Placed {
    sc: Scenario,
    file: String,
    ns: String,
    states: Vec<(String, Vec<ScEndpoint>)>,
}

impl Placed {
    fn node(&self, name: &str) -> String {
        format!("{}-{name}", self.ns)
    }

    /// The EndpointSlice of state `k` (the last state once past it), as the model has it.
    fn slice(&self, k: usize) -> Value {
        let eps = &self.states[k.min(self.states.len() - 1)].1;
        let m = tierlb::study::model_of(&self.sc, eps);
        let slice = m.slices.values().next().expect("one slice");
        let endpoints: Vec<Value> = slice
            .endpoints
            .iter()
            .map(|e| {
                let mut v = json!({
                    "addresses": [e.address.expect("an address").to_string()],
                    "nodeName": self.node(e.node_name.as_deref().expect("a node")),
                    "conditions": {
                        "ready": e.conditions.ready, "serving": e.conditions.serving,
                        "terminating": e.conditions.terminating,
                    },
                });
                if let Some(z) = &e.zone {
                    v["zone"] = json!(z.as_str());
                }
                let mut hints = serde_json::Map::new();
                let for_nodes: Vec<Value> =
                    e.node_hints().iter().map(|n| json!({"name": self.node(n)})).collect();
                let for_zones: Vec<Value> =
                    e.zone_hints().iter().map(|z| json!({"name": z.as_str()})).collect();
                if !for_nodes.is_empty() {
                    hints.insert("forNodes".into(), for_nodes.into());
                }
                if !for_zones.is_empty() {
                    hints.insert("forZones".into(), for_zones.into());
                }
                if !hints.is_empty() {
                    v["hints"] = hints.into();
                }
                v
            })
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "svc-1", "namespace": self.ns, "labels": {
                "kubernetes.io/service-name": "svc",
                "endpointslice.kubernetes.io/managed-by": "tierlb.test",
            }},
            "addressType": "IPv4",
            "ports": [{"port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        })
    }
}

/// The study's scenarios, each given a namespace `s0`, `s1`, ... in file order.
fn scenarios() -> Vec<Placed> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let sc = tierlb::study::load(&f).unwrap();
            let states = tierlb::study::states(&sc).into_iter().map(|(name, _, eps)| (name, eps)).collect();
            let file = f.file_name().unwrap().to_string_lossy().into_owned();
            Placed { sc, file, ns: format!("s{i}"), states }
        })
        .collect()
}

/// The cluster: every scenario's namespace, nodes, Service and initial slice; a network namespace per node
/// linked to the API server. Returns the nodes as (scenario index, node name, namespace).
fn cluster(cp: &mut ControlPlane, placed: &[Placed]) -> Vec<(usize, String, NetNs)> {
    let mut nodes = Vec::new();
    let mut n = 0u8;
    for (i, p) in placed.iter().enumerate() {
        cp.add_namespace(&p.ns).unwrap();
        for node in &p.sc.nodes {
            n += 1;
            let name = p.node(&node.name);
            cp.add_node(&name, node.zone.as_deref(), IpAddr::V4(Ipv4Addr::new(192, 0, 2, n))).unwrap();
            let ns = NetNs::new(&format!("kpr-{n}")).unwrap();
            cp.link(&ns).unwrap();
            nodes.push((i, node.name.clone(), ns));
        }
        let itp = p.sc.service.internal_traffic_policy.as_deref().unwrap_or("Cluster");
        let mut svc = json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": p.ns},
            "spec": {"ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}], "internalTrafficPolicy": itp},
        });
        if let Some(td) = &p.sc.service.traffic_distribution {
            svc["spec"]["trafficDistribution"] = json!(td);
        }
        cp.apply(&svc.to_string()).unwrap();
        cp.apply(&p.slice(0).to_string()).unwrap();
    }
    nodes
}

#[test]
fn the_study_kube_proxy_model_matches_real_kube_proxy_of_every_release_in_every_scenario() {
    let placed = scenarios();
    let mut cp = ControlPlane::start("kp-rel", Options::default()).unwrap();
    let nodes = cluster(&mut cp, &placed);
    let states = placed.iter().map(|p| p.states.len()).max().unwrap();
    let mut differences = Vec::new();
    let (mut compared, mut zone_misses) = (0, 0);
    for release in RELEASES {
        let name = release.unwrap_or("v1.36.3");
        for p in &placed {
            cp.apply(&p.slice(0).to_string()).unwrap();
        }
        let started: Vec<(KubeProxy, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = nodes
                .iter()
                .map(|(i, node, ns)| {
                    let (cp, name) = (&cp, placed[*i].node(node));
                    let zoned = placed[*i].sc.nodes.iter().any(|n| &n.name == node && n.zone.is_some());
                    s.spawn(move || {
                        let how = Launch {
                            mode: Mode::Iptables,
                            healthz: SocketAddr::from(([127, 0, 0, 1], HEALTHZ_PORT)),
                            metrics: SocketAddr::from(([127, 0, 0, 1], METRICS_PORT)),
                            limit: Duration::from_mins(2),
                            release: release.map(str::to_owned),
                            verbosity: 4,
                        };
                        if zoned {
                            KubeProxy::launch_zoned(cp, &name, ns, &how).unwrap()
                        } else {
                            (KubeProxy::launch(cp, &name, ns, &how).unwrap(), 0)
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        zone_misses += started.iter().map(|(_, m)| m).sum::<usize>();
        let proxies: Vec<KubeProxy> = started.into_iter().map(|(p, _)| p).collect();
        first_syncs(&cp, &proxies, &nodes, &placed);
        for k in 0..states {
            if k > 0 {
                let before: Vec<f64> = proxies
                    .iter()
                    .zip(&nodes)
                    .map(|(px, (_, _, ns))| px.endpoint_changes(ns).unwrap())
                    .collect();
                let mut changed = 0.0;
                for p in placed.iter().filter(|p| p.states.len() > k) {
                    let slice = p.slice(k);
                    if slice != p.slice(k - 1) {
                        cp.apply(&slice.to_string()).unwrap();
                        changed += 1.0;
                    }
                }
                // Every kube-proxy sees every slice change: wait until each has counted them all and written
                // them.
                cp.wait_for(Duration::from_mins(1), "every kube-proxy's sync", |_| {
                    Ok(proxies
                        .iter()
                        .zip(&nodes)
                        .zip(&before)
                        .all(|((px, (_, _, ns)), b)| px.synced_past(ns, b + changed).unwrap_or(false)))
                })
                .unwrap();
            }
            for (px, (i, node, _)) in proxies.iter().zip(&nodes) {
                let p = &placed[*i];
                if p.states.len() <= k && k > 0 {
                    continue;
                }
                let (state, eps) = &p.states[k];
                let m = tierlb::study::model_of(&p.sc, eps);
                let info = NodeInfo::new(
                    node.clone(),
                    p.sc.nodes.iter().find(|n| &n.name == node).unwrap().zone.clone(),
                );
                let want = modelled(&route(ProxyModel::KubeProxy, &m, &info, CiliumSettings::default()));
                let got = programmed(&px.rules().unwrap(), &format!("{}/svc", p.ns));
                compared += 1;
                if !same(&want, &got) {
                    differences.push(format!(
                        "kube-proxy {name}, {} ({}), state {state}, {node}: the model {want:?}, kube-proxy {got:?}",
                        p.file, p.sc.name
                    ));
                }
            }
        }
        drop(proxies);
    }
    eprintln!(
        "{compared} (release, scenario, state, node) answers of {} releases compared: {} differences; \
         {zone_misses} kube-proxy starts never took their Node's zone and were started again",
        RELEASES.len(),
        differences.len()
    );
    assert!(differences.is_empty(), "{} differences:\n{}", differences.len(), differences.join("\n"));
    let each: usize = placed.iter().map(|p| p.sc.nodes.len() * p.states.len()).sum();
    assert_eq!(compared, RELEASES.len() * each, "every (release, scenario, state, node) compared");
}

#[test]
fn the_rules_reader_takes_shares_rejects_and_drops_from_iptables_save() {
    let rules = "*filter\n-A KUBE-SERVICES -d 10.96.0.9/32 -p tcp -m comment --comment \"s1/svc has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable\n\
                 -A KUBE-SERVICES -d 10.96.0.8/32 -p tcp -m comment --comment \"s2/svc has no local endpoints\" -m tcp --dport 80 -j DROP\nCOMMIT\n\
                 *nat\n-A KUBE-SERVICES -d 10.96.0.7/32 -p tcp -m comment --comment \"s0/svc cluster IP\" -m tcp --dport 80 -j KUBE-SVC-A\n\
                 -A KUBE-SVC-A ! -s 10.244.0.0/16 -d 10.96.0.7/32 -p tcp -m comment --comment \"s0/svc cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n\
                 -A KUBE-SVC-A -m comment --comment \"s0/svc -> 10.244.1.2:8080\" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-1\n\
                 -A KUBE-SVC-A -m comment --comment \"s0/svc -> 10.244.2.2:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-2\n\
                 -A KUBE-SVC-A -m comment --comment \"s0/svc -> 10.244.3.2:8080\" -j KUBE-SEP-3\nCOMMIT\n";
    let Programmed::Set(shares) = programmed(rules, "s0/svc") else {
        panic!("{:?}", programmed(rules, "s0/svc"))
    };
    assert_eq!(shares.len(), 3);
    assert!(shares.values().all(|s| (s - 1.0 / 3.0).abs() < 1e-6), "{shares:?}");
    assert_eq!(programmed(rules, "s1/svc"), Programmed::Rejected);
    assert_eq!(programmed(rules, "s2/svc"), Programmed::Dropped);
    assert_eq!(programmed(rules, "s3/svc"), Programmed::Missing);
}

/// kube-proxy's first sync waits for Services and EndpointSlices, not for its Node: until its Node's labels
/// (its zone) reach its proxier it programs no topology. Wait until each knows its Node (`nodeEligible` on its
/// /healthz), has written its rules since its proxier took the Node's zone (its log at -v=4; seen missing
/// twice under load with /healthz alone) and every sync queued.
fn first_syncs(
    cp: &ControlPlane,
    proxies: &[KubeProxy],
    nodes: &[(usize, String, NetNs)],
    placed: &[Placed],
) {
    let waiting = || -> Vec<String> {
        proxies
            .iter()
            .zip(nodes)
            .filter_map(|(px, (i, node, ns))| {
                let zoned = placed[*i].sc.nodes.iter().any(|n| &n.name == node && n.zone.is_some());
                let at = SocketAddr::from(([127, 0, 0, 1], HEALTHZ_PORT));
                let eligible = http_get(ns, at, "/healthz")
                    .ok()
                    .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
                    .is_some_and(|v| v["nodeEligible"] == true);
                let topology = !zoned || px.synced_topology(ns).unwrap_or(false);
                let synced = px.synced_past(ns, 0.0).unwrap_or(false);
                (!(eligible && topology && synced)).then(|| {
                    let log = px.log_text();
                    let lines: Vec<&str> = log
                        .lines()
                        .filter(|l| l.contains("topology") || l.contains("SyncProxyRules complete"))
                        .collect();
                    let metrics = px.metrics_text(ns).unwrap_or_default();
                    let last: Vec<&str> =
                        metrics.lines().filter(|l| l.starts_with("kubeproxy_sync_proxy_rules_last")).collect();
                    format!(
                        "{} (node eligible {eligible}, synced since its zone {topology}, every sync written {synced}):\n{}\n{}",
                        placed[*i].node(node),
                        lines.join("\n"),
                        last.join("\n")
                    )
                })
            })
            .collect()
    };
    let settled = cp.wait_for(Duration::from_mins(1), "every kube-proxy's Node and its sync", |_| {
        Ok(waiting().is_empty())
    });
    assert!(settled.is_ok(), "{settled:?}: {:#?}", waiting());
}
