//! In-kernel tests of the topology metrics with a running agent: `tierlb_service_topology` and
//! `tierlb_service_ready_endpoints` parsed strictly from its `/metrics` for each case (node hints applied,
//! zone hints off by the all-or-nothing rule so cluster, a Local policy, the annotation overriding the field),
//! and a real Prometheus (Debian's, with deploy/monitoring's rules loaded) scraping the agent on the test
//! netns' loopback: a PromQL query sees the applied tier flip from node to cluster when the local endpoint
//! goes. The agent and Prometheus both run inside the test's network namespace.
mod common;

use std::{process::Command, time::Duration};

use common::{OwnAgent, cluster, eventually, exposition, get_in};
use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, node, to_yaml, write_atomic, write_service},
    sandbox::{Child, TempDir, confine},
};
use serde_json::{Value, json};

/// The agent's metrics port inside the test netns (private: nothing else listens there).
const METRICS: u16 = 9100;
/// Prometheus' port inside the test netns.
const PROMETHEUS: u16 = 9090;

/// An endpoint (no server: only web's are connected to, `the_cluster` starts those).
fn ep(addr: &str, node: &str, zone: &str) -> Ep {
    let a: std::net::SocketAddr = addr.parse().unwrap();
    Ep::ready(a.ip(), node).zone(zone)
}

/// web's endpoints: node hints and zone hints as the controller writes them for PreferSameNode.
fn web(c: &SimCluster, with_local: bool) {
    let mut eps = vec![ep("10.244.2.10:8080", "node-2", "b").hints(Some(&["node-2"]), Some(&["b"]))];
    if with_local {
        eps.push(ep("10.244.1.10:8080", "node-1", "a").hints(Some(&["node-1"]), Some(&["a"])));
    }
    let mut svc = Svc::new("web", "10.96.0.10".parse().unwrap(), 80, 8080);
    svc.traffic_distribution = Some("PreferSameNode".into());
    write_service(c.manifests.path(), &svc, &eps).unwrap();
}

/// node-1 in zone a, node-2 in zone b; web (PreferSameNode, an endpoint on each node); db (PreferSameZone,
/// one of its two endpoints without a zone hint: zone hints off for the whole Service); cache
/// (internalTrafficPolicy Local, its endpoint on node-1); auto (the topology-mode annotation beside
/// trafficDistribution PreferSameNode: the annotation wins, and the controller writes zone hints only).
fn the_cluster(c: &mut SimCluster) {
    for pod in ["10.244.1.10:8080", "10.244.2.10:8080"] {
        c.add_pod(pod.parse().unwrap(), pod).unwrap();
    }
    write_atomic(
        c.manifests.path(),
        "nodes.yaml",
        &to_yaml(&[node("node-1", Some("a")), node("node-2", Some("b"))]),
    )
    .unwrap();
    web(c, true);
    let mut db = Svc::new("db", "10.96.0.11".parse().unwrap(), 80, 8080);
    db.traffic_distribution = Some("PreferSameZone".into());
    let eps = [
        ep("10.244.1.11:8080", "node-1", "a").hints(None, Some(&["a"])),
        ep("10.244.2.11:8080", "node-2", "b"),
    ];
    write_service(c.manifests.path(), &db, &eps).unwrap();
    let mut cache = Svc::new("cache", "10.96.0.12".parse().unwrap(), 80, 8080);
    cache.internal_traffic_policy = Some("Local");
    write_service(c.manifests.path(), &cache, &[ep("10.244.1.12:8080", "node-1", "a")]).unwrap();
    let mut auto = Svc::new("auto", "10.96.0.13".parse().unwrap(), 80, 8080);
    auto.traffic_distribution = Some("PreferSameNode".into());
    let mut doc = auto.service();
    doc["metadata"]["annotations"] = json!({"service.kubernetes.io/topology-mode": "Auto"});
    let eps = [
        ep("10.244.1.13:8080", "node-1", "a").hints(None, Some(&["a"])),
        ep("10.244.2.13:8080", "node-2", "b").hints(None, Some(&["b"])),
    ];
    let mut docs = vec![doc];
    docs.extend(auto.slices(&eps));
    write_atomic(c.manifests.path(), "auto.yaml", &to_yaml(&docs)).unwrap();
}

/// The one `tierlb_service_topology` series of `service`: (requested, applied, reason).
fn topology(text: &str, service: &str) -> (String, String, String) {
    let families = exposition::parse(text);
    let f = &families["tierlb_service_topology"];
    assert_eq!(f.kind, "gauge");
    let rows: Vec<_> = f.samples.iter().filter(|s| s.labels["service"] == service).collect();
    assert_eq!(rows.len(), 1, "one series per Service port and family: {rows:?}");
    let l = &rows[0].labels;
    assert_eq!((l["port"].as_str(), l["family"].as_str(), rows[0].value), ("main", "IPv4", 1.0), "{l:?}");
    assert_eq!(l.len(), 6, "service, port, family, requested, applied, reason: {l:?}");
    (l["requested"].clone(), l["applied"].clone(), l["reason"].clone())
}

/// `tierlb_service_ready_endpoints` of `service`: (with node hint, without, with zone hint, without).
fn hinted(text: &str, service: &str) -> [String; 4] {
    let families = exposition::parse(text);
    let f = &families["tierlb_service_ready_endpoints"];
    let v = |hint, hinted| {
        f.value("tierlb_service_ready_endpoints", &[("service", service), ("hint", hint), ("hinted", hinted)])
    };
    [v("node", "true"), v("node", "false"), v("zone", "true"), v("zone", "false")].map(|n| n.to_string())
}

#[test]
fn topology_metrics_name_what_each_service_asks_for_what_the_node_applies_and_why() {
    let mut c = cluster("topo-metrics");
    the_cluster(&mut c);
    let agent = OwnAgent::start_in_netns(&c, &["--metrics-addr", &format!("127.0.0.1:{METRICS}")]);
    let text = get_in(&c.netns, METRICS, "/metrics").1;
    let t = |svc: &str| topology(&text, svc);
    let own = |a: &str, b: &str, r: &str| (a.to_owned(), b.to_owned(), r.to_owned());
    assert_eq!(t("default/web"), own("PreferSameNode", "node", "node_hint_names_this_node"));
    assert_eq!(t("default/db"), own("PreferSameZone", "cluster", "endpoint_without_zone_hint"));
    assert_eq!(t("default/cache"), own("Local", "local", "local_policy"));
    assert_eq!(t("default/auto"), own("Auto", "zone", "zone_hint_names_this_zone"));
    assert_eq!(hinted(&text, "default/web"), ["2", "0", "2", "0"]);
    assert_eq!(hinted(&text, "default/db"), ["0", "2", "1", "1"]);
    assert_eq!(hinted(&text, "default/cache"), ["0", "1", "0", "1"]);
    // What the metrics say is what the kernel does: a connect to web from node-1 gets its local endpoint.
    let r = agent.probe(&c, "10.96.0.10:80".parse().unwrap(), 10, Duration::from_secs(1));
    assert_eq!(r.count("10.244.1.10:8080"), 10, "{:?}", r.by_backend());

    // The local endpoint goes: node-2's endpoint names node-2 and zone b, so nothing is left for node-1 but
    // the cluster.
    // The snapshot scrapes read follows the sync that took the edit.
    web(&c, false);
    let flipped = || topology(&get_in(&c.netns, METRICS, "/metrics").1, "default/web").1 == "cluster";
    assert!(eventually(5, flipped), "{}", agent.log());
    let text = get_in(&c.netns, METRICS, "/metrics").1;
    assert_eq!(
        topology(&text, "default/web"),
        own("PreferSameNode", "cluster", "no_node_hint_names_this_node")
    );
    assert_eq!(hinted(&text, "default/web"), ["1", "0", "1", "0"]);
}

/// A PromQL instant query against the test's Prometheus: the result vector.
fn query(c: &SimCluster, promql: &str) -> Vec<Value> {
    let q: String = form_urlencoded::Serializer::new(String::new()).append_pair("query", promql).finish();
    let (status, body) = get_in(&c.netns, PROMETHEUS, &format!("/api/v1/query?{q}"));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{body}");
    v["data"]["result"].as_array().unwrap().clone()
}

#[test]
fn prometheus_scraping_the_agent_sees_the_applied_tier_flip_from_node_to_cluster() {
    let mut c = cluster("topo-prom");
    the_cluster(&mut c);
    let agent = OwnAgent::start_in_netns(&c, &["--metrics-addr", &format!("127.0.0.1:{METRICS}")]);
    let dir = TempDir::new("topo-prom-data").unwrap();
    let rules =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/tierlb.rules.yaml");
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{rules:?}]\nscrape_configs:\n  - \
         job_name: tierlb\n    static_configs: [{{targets: ['127.0.0.1:{METRICS}'], labels: {{instance: node-1}}}}]\n"
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let log = dir.path().join("prometheus.log");
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{PROMETHEUS}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    confine(&mut cmd, None, Some(&c.netns)).unwrap();
    let mut prom = Child::spawn(&mut cmd).expect("prometheus (Debian's package, from cargo xtask setup)");
    prom.wait_for_log(&log, 0, "Server is ready to receive web requests", Duration::from_secs(30)).unwrap();
    let applied = |c: &SimCluster| -> Vec<String> {
        query(c, r#"tierlb_service_topology{service="default/web"}"#)
            .iter()
            .map(|s| s["metric"]["applied"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        eventually(15, || applied(&c) == ["node"]),
        "{:?}\n{}",
        applied(&c),
        std::fs::read_to_string(&log).unwrap()
    );
    // The shipped recording rule, evaluated by the real server: one node applies web's node tier.
    assert!(eventually(10, || {
        let r = query(&c, r#"tierlb:service_topology_nodes:count{service="default/web"}"#);
        r.len() == 1 && r[0]["metric"]["applied"] == "node" && r[0]["value"][1] == "1"
    }));

    let before = agent.syncs();
    web(&c, false);
    assert!(eventually(5, || agent.syncs() > before));
    // The old series is marked stale at the next scrape: the query returns only the new one.
    assert!(eventually(15, || applied(&c) == ["cluster"]), "{:?}", applied(&c));
    let r = query(&c, r#"tierlb_service_topology{service="default/web"}"#);
    assert_eq!(r[0]["metric"]["reason"], "no_node_hint_names_this_node", "{r:?}");
    assert_eq!(r[0]["metric"]["instance"], "node-1", "{r:?}");
    drop(prom);
}
