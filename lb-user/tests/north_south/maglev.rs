//! Maglev across nodes, in the kernel: two agents (node-1's and node-2's, as the DaemonSet runs them with
//! `--lb-algorithm=maglev`) hold the same eight backends of a load-balancer IP; an outside client's UDP flows
//! (fixed source ports) go through node-1, then its route moves to node-2 (what an ECMP router does when the
//! set of next hops changes), and every flow reaches the pod it reached before. Each flow's pod is the one
//! node-1's pinned table names at the flow's bucket. After one backend leaves, new flows follow the new
//! table on both nodes, and the tables move only the buckets of the leaving backend and about 0.5% more.
use std::{
    collections::BTreeMap,
    net::{IpAddr, UdpSocket},
    time::Duration,
};

use lb_common::{MaglevKey, PROTO_UDP, TIER_CLUSTER};
use lb_testkit::manifests::{to_yaml, write_atomic};
use serde_json::{Value, json};
use tierlb::datapath::{MapReader as _, addr, ebpf::KernelMaps, maglev};

use super::lab::{
    LB_IP, Lab, NODE_1, NODE_2, POD_1, POD_1_6, POD_2, POD_2_6, PodServer, from, manifests, sa,
};

/// The extra pods: (address, node, name).
const EXTRA: [(&str, &str, &str); 6] = [
    ("10.244.1.11", "node-1", "web-1b"),
    ("10.244.1.12", "node-1", "web-1c"),
    ("10.244.2.11", "node-2", "web-2b"),
    ("10.244.2.12", "node-2", "web-2c"),
    ("10.244.2.13", "node-2", "web-2d"),
    ("10.244.2.14", "node-2", "web-2e"),
];

/// `web` with the lab's two pods and `extra` as its IPv4 endpoints (IPv6: the lab's two).
fn docs(extra: &[(&str, &str, &str)]) -> Vec<Value> {
    let eps = [(POD_1, POD_1_6, "node-1"), (POD_2, POD_2_6, "node-2")];
    let mut docs = manifests("Cluster", &eps);
    let v4 = docs.iter_mut().find(|d| d["addressType"] == "IPv4").unwrap();
    for (a, node, _) in extra {
        v4["endpoints"]
            .as_array_mut()
            .unwrap()
            .push(json!({"addresses": [a], "nodeName": node, "conditions": {"ready": true}}));
    }
    docs
}

/// One datagram from the client's `port` to the load-balancer IP's UDP port: the pod that answered.
fn ask(lab: &Lab, ports: Vec<u16>) -> Vec<Result<String, String>> {
    let to = sa(LB_IP, 53);
    from(&lab.client, move || {
        ports
            .into_iter()
            .map(|p| {
                let s = UdpSocket::bind(("192.0.2.100", p)).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
                s.send_to(b"hello\n", to).map_err(|e| e.to_string())?;
                let mut buf = [0u8; 256];
                let (n, _) = s.recv_from(&mut buf).map_err(|e| e.to_string())?;
                Ok(String::from_utf8_lossy(&buf[..n]).split(' ').next().unwrap_or_default().to_owned())
            })
            .collect()
    })
}

/// node-1's outside frontend of the load-balancer IP's UDP port: its cluster tier and that tier's table.
fn table_of(lab: &Lab) -> (Vec<lb_common::Backend>, Box<lb_common::MaglevTable>) {
    let maps = KernelMaps::open_pinned(&lab.boxed.bpffs.path().join("tierlb/node-1")).unwrap();
    let key = addr::outside_frontend_key(LB_IP.parse().unwrap(), 53, PROTO_UDP);
    let rb = tierlb::datapath::read_back(&maps).unwrap().remove(&key).expect("the LB IP's outside frontend");
    let mk =
        MaglevKey { svc_id: rb.value.svc_id, generation: rb.value.generation, tier: TIER_CLUSTER as u32 };
    let table = maps.maglev_table(mk).unwrap().expect("its cluster tier's table");
    (rb.tiers[TIER_CLUSTER].clone(), table)
}

/// The pod each flow's bucket names in `table` over `tier`, by name.
fn predicted(
    tier: &[lb_common::Backend],
    table: &lb_common::MaglevTable,
    ports: &[u16],
    names: &BTreeMap<IpAddr, String>,
) -> Vec<Result<String, String>> {
    ports
        .iter()
        .map(|p| {
            let bucket = maglev::flow_bucket(sa("192.0.2.100", *p), sa(LB_IP, 53), PROTO_UDP);
            let b = tier[usize::from(table.slots[bucket])];
            Ok(names[&addr::backend_addr(&b).ip()].clone())
        })
        .collect()
}

#[test]
fn north_south_maglev_keeps_each_flow_on_its_pod_when_ecmp_moves_it_to_another_node() {
    let mut lab = Lab::new("ns-maglev", "Cluster", true);
    let mut extra_pods = Vec::new();
    let mut names: BTreeMap<IpAddr, String> = BTreeMap::from([
        (POD_1.parse().unwrap(), "web-node-1".into()),
        (POD_2.parse().unwrap(), "web-node-2".into()),
    ]);
    for (i, (a, node, name)) in EXTRA.iter().enumerate() {
        let boxed = if *node == "node-1" { &mut lab.boxed } else { &mut lab.node_2 };
        let ns = boxed.node.add_pod(&format!("ns-mg-x{i}"), a.parse().unwrap()).unwrap();
        let server = PodServer::start(&ns, name, &[sa(a, 8080)]);
        extra_pods.push((ns, server));
        names.insert(a.parse().unwrap(), (*name).to_owned());
    }
    for m in [lab.boxed.manifests.path(), lab.node_2.manifests.path()] {
        write_atomic(m, "web.yaml", &to_yaml(&docs(&EXTRA))).unwrap();
    }
    let flags = ["--lb-algorithm=maglev"];
    let _agent_1 = lab.start_agent_with(&flags);
    let _agent_2 = lab.start_node_2_with(&flags);
    let st = lab.status();
    let outside: Vec<&Value> =
        st[0]["frontends"].as_array().unwrap().iter().filter(|f| f["scope"] == "outside").collect();
    assert!(!outside.is_empty() && outside.iter().all(|f| f["lb_algorithm"] == "maglev"), "{outside:?}");

    let ports: Vec<u16> = (41000..41060).collect();
    let via_1 = ask(&lab, ports.clone());
    let (tier, table) = table_of(&lab);
    assert_eq!(tier.len(), 8);
    assert_eq!(via_1, predicted(&tier, &table, &ports, &names), "node-1: each flow to its bucket's pod");
    let spread: std::collections::BTreeSet<&String> = via_1.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert!(spread.len() >= 6, "60 flows over the eight pods: {spread:?}");
    // The router moves the load-balancer IP's next hop to node-2: node-2 has no conntrack entry for these
    // flows, so each is a new flow there, and Maglev gives it the same pod.
    lab.client.ip(&["route", "replace", &format!("{LB_IP}/32"), "via", NODE_2]).unwrap();
    let via_2 = ask(&lab, ports.clone());
    assert_eq!(via_2, via_1, "node-2 sent every flow to the pod node-1 did");

    // One backend leaves (both nodes' sources): new flows follow the new table, on either node alike.
    let leaving = EXTRA[3];
    let rest: Vec<_> = EXTRA.iter().copied().filter(|e| e.0 != leaving.0).collect();
    for m in [lab.boxed.manifests.path(), lab.node_2.manifests.path()] {
        write_atomic(m, "web.yaml", &to_yaml(&docs(&rest))).unwrap();
    }
    let mut after = table_of(&lab);
    for _ in 0..100 {
        if after.0.len() == 7 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        after = table_of(&lab);
    }
    let (tier_after, table_after) = after;
    assert_eq!(tier_after.len(), 7, "node-1 applied the edit");
    let fresh: Vec<u16> = (42000..42060).collect();
    let want = predicted(&tier_after, &table_after, &fresh, &names);
    assert_eq!(ask(&lab, fresh.clone()), want, "node-2, after the change");
    lab.client.ip(&["route", "replace", &format!("{LB_IP}/32"), "via", NODE_1]).unwrap();
    let fresh_1: Vec<u16> = (43000..43060).collect();
    assert_eq!(
        ask(&lab, fresh_1.clone()),
        predicted(&tier_after, &table_after, &fresh_1, &names),
        "node-1, after the change"
    );
    // The tables: buckets moved between staying pods, beyond the leaving pod's own.
    let owner =
        |tier: &[lb_common::Backend], t: &lb_common::MaglevTable, i: usize| tier[usize::from(t.slots[i])];
    let gone = addr::backend(sa(leaving.0, 8080), PROTO_UDP);
    let moved = (0..lb_common::MAGLEV_M)
        .filter(|&i| {
            let (b, a) = (owner(&tier, &table, i), owner(&tier_after, &table_after, i));
            b != a && b != gone
        })
        .count();
    eprintln!(
        "maglev: 60 flows kept their pod across nodes; one of eight pods left: {moved} of {} buckets of staying pods moved ({:.2}%)",
        lb_common::MAGLEV_M,
        moved as f64 * 100.0 / lb_common::MAGLEV_M as f64
    );
    assert!(moved * 100 <= lb_common::MAGLEV_M, "at most 1% of the buckets beyond the leaving pod's");
    drop(extra_pods);
}
