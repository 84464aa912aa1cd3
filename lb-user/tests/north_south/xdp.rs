//! `--xdp=native` on node-1's uplink (a veth, native XDP): the cluster-policy traffic of `main.rs` again, its
//! SNAT flows forwarded by `xdp_ingress` itself (XDP_TX back onto the LAN) and its local ones handed to tc;
//! what status and `/metrics` say; XDP forwarding with no agent running, the next agent's program swapped
//! into the same link, and `--xdp=off` taking it away while tc goes on translating.
use std::net::SocketAddr;

use serde_json::json;

use super::lab::{
    CLIENT, CLIENT_6, Lab, NODE_1, NODE_1_6, TIERLB, from, http_body, ip, names, sa, udp_flows, ways_in,
};

#[test]
fn north_south_xdp_forwards_snat_flows_before_tc_and_leaves_local_ones_to_it() {
    let lab = Lab::with_xdp("ns-xdp", "Cluster", true, Some("native"));
    let agent = lab.start_agent();
    let st = lab.status();
    assert_eq!(st[0]["north_south"]["xdp"], json!({"uplink": "native"}), "{}", st[0]["north_south"]);
    for (to, what) in ways_in() {
        let r = lab.tcp(to, 40);
        let by = names(&r);
        let counters = &lab.status()[0]["north_south"]["counters"];
        if r.iter().any(Result::is_err) {
            // Where they went: each end's TCP counters that are not zero (retransmissions, PAWS, challenges).
            for (name, ns) in [("client", &lab.client), ("pod-2", &lab.pods[1].0)] {
                let text = from(ns, || std::fs::read_to_string("/proc/thread-self/net/netstat").unwrap());
                let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
                let nonzero: Vec<String> = lines[0]
                    .split(' ')
                    .zip(lines[1].split(' '))
                    .skip(1)
                    .filter(|(_, v)| *v != "0")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                eprintln!("{name}: {nonzero:?}");
            }
        }
        assert!(r.iter().all(Result::is_ok), "{what}: every connect answered: {by:?}; counters {counters}");
        assert!(by.len() == 2, "{what}: both pods: {by:?}");
        for (name, peer) in r.iter().flatten() {
            let peer: SocketAddr = peer.parse().unwrap();
            let (client, node) = if to.is_ipv4() { (CLIENT, NODE_1) } else { (CLIENT_6, NODE_1_6) };
            let want = if name == "web-node-1" { client } else { node };
            assert_eq!(peer.ip(), ip(want), "{what}: {name} sees the client, or node-1 with SNAT");
        }
    }
    let to = sa(NODE_1, 30053);
    let r = from(&lab.client, move || udp_flows(to, 30));
    assert!(r.iter().all(|a| a.as_ref().is_ok_and(|(_, src)| *src == to)), "UDP from the node port: {r:?}");
    let counters = lab.status()[0]["north_south"]["counters"].clone();
    let n = |k: &str| counters[k].as_u64().unwrap_or(0);
    eprintln!("counters with XDP: {counters}");
    let snat_flows = n("new_snat");
    assert!(snat_flows > 0, "{counters}");
    // Per SNAT TCP flow at least the client's ACK, request and FIN and the backend's answer and FIN go
    // through XDP; a UDP flow's request and answer.
    assert!(n("xdp_tx") >= 2 * snat_flows, "SNAT flows' packets sent by XDP: {counters}");
    assert!(n("xdp_to_tc") > 0, "local flows and SYN-ACKs are tc's: {counters}");
    assert_eq!(n("xdp_redirect"), 0, "one uplink: every forward goes back out of it");
    let metrics = from(&lab.boxed.node.netns, || http_body(sa("127.0.0.1", 10249), "/metrics")).unwrap();
    assert!(
        metrics.lines().any(|l| l == "tierlb_xdp_attached{device=\"uplink\",mode=\"native\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tierlb_external_packets_total{result=\"xdp_tx\"}"), "{metrics}");
    // The agent stops: its XDP link stays (as tc's do) and goes on forwarding with no agent running.
    let pins = lab.boxed.bpffs.path().join("tierlb");
    let pin = pins.join("node-1").join("link_xdp_native@uplink");
    let link = || {
        let l = aya::programs::links::FdLink::from(aya::programs::links::PinnedLink::from_pin(&pin).unwrap());
        let info = l.info().unwrap();
        (info.id(), info.program_id())
    };
    let (link_id, program_id) = link();
    agent.stop();
    assert_eq!(lab.status()[0]["north_south"]["xdp"], json!({"uplink": "native"}), "XDP stays at exit");
    let xdp_tx = || lab.status()[0]["north_south"]["counters"]["xdp_tx"].as_u64().unwrap();
    let before = xdp_tx();
    let r = lab.tcp(sa(NODE_1, 30080), 20);
    assert!(r.iter().all(Result::is_ok) && names(&r).len() == 2, "no agent running: {r:?}");
    assert!(xdp_tx() > before, "forwarded by XDP with no agent running");
    // The next agent swaps its program into the same link (no detach: a NIC's driver is not reconfigured).
    let agent = lab.start_agent();
    let (link_now, program_now) = link();
    assert_eq!(link_now, link_id, "the same link");
    assert_ne!(program_now, program_id, "the new agent's program in it");
    agent.stop();
    // `--xdp=off`: the link goes, and tc alone translates.
    let _agent = lab.boxed.start_agent("node-1", &["--xdp", "off"]).unwrap();
    assert_eq!(lab.status()[0]["north_south"]["xdp"], json!({}), "{}", lab.status()[0]["north_south"]);
    assert!(!pin.exists(), "no XDP pin left");
    let before = xdp_tx();
    let r = lab.tcp(sa(NODE_1, 30080), 20);
    assert!(r.iter().all(Result::is_ok), "tc alone: {r:?}");
    assert_eq!(names(&r).len(), 2, "both pods through tc");
    assert_eq!(xdp_tx(), before, "nothing through XDP once it is gone");
    let table = std::process::Command::new(TIERLB)
        .args(["status", "--bpffs", pins.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("tc on uplink;"), "no XDP in the table");
}
