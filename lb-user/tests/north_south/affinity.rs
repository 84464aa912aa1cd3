//! sessionAffinity ClientIP for clients outside the node, in the kernel: three external clients each make
//! 20 connections to the node port and the load-balancer IP of a Service with `sessionAffinity: ClientIP`;
//! every connection of a client reaches the pod its first one did (local or through SNAT), as kube-proxy's
//! `recent` match keeps it per source address. Without affinity the same client is balanced.
use std::collections::BTreeMap;

use lb_testkit::{
    manifests::{to_yaml, write_atomic},
    sandbox::NetNs,
};
use serde_json::json;

use super::lab::{
    LB_IP, Lab, NODE_1, NODE_1_6, POD_1, POD_1_6, POD_2, POD_2_6, from, manifests, names, sa, tcp_once,
};

#[test]
fn north_south_session_affinity_keeps_each_outside_client_on_one_pod() {
    let lab = Lab::new("ns-aff", "Cluster", true);
    let mut clients = vec![];
    for (i, (v4, v6)) in
        [("192.0.2.200", "2001:db8:1::200"), ("192.0.2.201", "2001:db8:1::201")].iter().enumerate()
    {
        let ns = NetNs::new(&format!("ns-aff-ext{}", i + 2)).unwrap();
        lab.client_on_lan(&ns, &format!("p{}", i + 4), v4, v6);
        ns.ip(&["route", "add", &format!("{LB_IP}/32"), "via", NODE_1]).unwrap();
        clients.push(ns);
    }
    // Balanced first (no affinity), then with it.
    let _agent = lab.start_agent();
    let by = names(&lab.tcp(sa(NODE_1, 30080), 30));
    assert_eq!(by.len(), 2, "without affinity one client reaches both pods: {by:?}");
    let eps = [(POD_1, POD_1_6, "node-1"), (POD_2, POD_2_6, "node-2")];
    let mut docs = manifests("Cluster", &eps);
    docs[0]["spec"]["sessionAffinity"] = json!("ClientIP");
    docs[0]["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 600}});
    write_atomic(lab.boxed.manifests.path(), "web.yaml", &to_yaml(&docs)).unwrap();
    // The agent applies the edit within moments: wait until every outside frontend has affinity.
    let settled = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let st = lab.status();
        let fes = st[0]["frontends"].as_array().cloned().unwrap_or_default();
        let outside: Vec<_> =
            fes.iter().filter(|f| f["scope"] == "outside" && f["protocol"] == "TCP").collect();
        !outside.is_empty() && outside.iter().all(|f| f["session_affinity"]["timeout_seconds"] == 600)
    });
    assert!(settled, "the outside frontends got sessionAffinity: {}", lab.status());
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for to in [sa(NODE_1, 30080), sa(LB_IP, 80), sa(NODE_1_6, 30080)] {
        let mut each = vec![names(&lab.tcp(to, 20))];
        for ns in &clients {
            if to.is_ipv4() {
                each.push(names(&from(ns, move || (0..20).map(|_| tcp_once(to)).collect::<Vec<_>>())));
            }
        }
        for by in each {
            assert_eq!(by.len(), 1, "{to}: every connection of a client to one pod: {by:?}");
            assert_eq!(by.values().sum::<usize>(), 20, "{to}: all answered: {by:?}");
            for (name, n) in by {
                *seen.entry(name).or_default() += n;
            }
        }
    }
    eprintln!("connections by pod over the clients and frontends: {seen:?}");
    // What an operator sees: the node port's outside frontend remembers the three clients.
    let st = lab.status();
    let fes = st[0]["frontends"].as_array().unwrap();
    let np = fes.iter().find(|f| f["scope"] == "outside" && f["frontend"] == "192.0.2.1:30080").unwrap();
    assert_eq!(np["session_affinity"]["clients"], 3, "{np}");
}
