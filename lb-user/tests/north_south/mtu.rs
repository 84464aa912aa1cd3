//! A smaller MTU on the way to a remote backend (an overlay, a tunnel): node-1 reaches node-2's pods over a
//! link of MTU 1280 while the client's side has 1500. The SNAT path forwards past the stack, so the stack
//! never answers the client's full-size segments with "fragmentation needed"; the tc program does
//! (`icmp_send`), the client's kernel lowers its path MTU to the node port and retransmits. Before, the
//! segments were dropped and counted, and the connection hung once its data exceeded one small segment.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpStream,
    time::Duration,
};

use super::lab::{Lab, NODE_1, from, ns_run, sa};

#[test]
fn north_south_a_smaller_mtu_toward_the_backend_is_learned_by_the_client() {
    let lab = Lab::new("ns-mtu", "Cluster", false);
    let (node_1, node_2) = (&lab.boxed.node.netns, &lab.node_2.node.netns);
    node_1
        .ip(&[
            "link",
            "add",
            "bh1",
            "mtu",
            "1280",
            "type",
            "veth",
            "peer",
            "name",
            "bh2",
            "netns",
            node_2.name(),
        ])
        .unwrap();
    node_1.ip(&["addr", "add", "10.99.0.1/30", "dev", "bh1"]).unwrap();
    node_2.ip(&["addr", "add", "10.99.0.2/30", "dev", "bh2"]).unwrap();
    node_2.ip(&["link", "set", "bh2", "mtu", "1280", "up"]).unwrap();
    node_1.ip(&["link", "set", "bh1", "up"]).unwrap();
    node_1.ip(&["route", "replace", "10.244.2.0/24", "via", "10.99.0.2", "dev", "bh1"]).unwrap();
    // Node-2 answers node-1's SNAT address over the LAN, so what arrives by the link is asymmetric.
    for conf in ["all", "bh2"] {
        ns_run(node_2, &["sysctl", "-qw", &format!("net.ipv4.conf.{conf}.rp_filter=0")]);
    }
    // With XDP (`TIERLB_TEST_XDP`), node-1's SNAT path redirects out of bh1: its peer needs the program.
    lab.wire(node_2, false, &[(node_2, "bh2")]);
    let _agent = lab.start_agent();
    let to = sa(NODE_1, 30080);
    // 20,000 bytes in one line: full-size segments from the client (MSS 1460), answered once all arrived.
    let answer = from(&lab.client, move || -> Result<String, String> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&vec![b'x'; 20_000]).and_then(|()| writeln!(s)).map_err(|e| format!("write: {e}"))?;
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).map_err(|e| format!("read: {e}"))?;
        Ok(line)
    });
    let status = lab.status();
    let counters = &status[0]["north_south"]["counters"];
    let figures = format!("answer {answer:?}; north-south counters {counters}");
    let answer = answer.unwrap_or_else(|e| panic!("the upload hung: {figures}; {e}"));
    assert!(answer.starts_with("web-node-2 "), "{figures}");
    assert!(answer.contains(NODE_1), "through SNAT (node-2's pod saw node-1): {figures}");
    assert!(counters["icmp_sent"].as_u64().unwrap_or(0) >= 1, "the program answered: {figures}");
    let learned = from(&lab.client, || {
        std::process::Command::new("ip").args(["route", "get", NODE_1]).output().unwrap().stdout
    });
    let learned = String::from_utf8_lossy(&learned);
    assert!(learned.contains("mtu 1280"), "the client's path MTU to the node port: {learned}; {figures}");
}
