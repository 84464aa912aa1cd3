//! Direct server return between two nodes (`--dsr` on both agents, as a DaemonSet runs them): the client
//! reaches node-1's node port and load-balancer IP, the Service's one pod is on node-2, and node-2's pod
//! answers the client straight from node-2 with the Service's address as the source. A capture on node-1's
//! link sees the client's packets come in and leave for node-2 with the option, and none of the replies.
//! IPv6 (no option) takes SNAT, counted.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use lb_testkit::{
    capture::Capture,
    manifests::{to_yaml, write_atomic},
};

use super::lab::{
    CLIENT, LB_IP, Lab, NODE_1, NODE_1_6, POD_2, POD_2_6, from, manifests, sa, status_of, udp_flows,
};

/// A north-south counter of `node`'s agent.
fn counter(st: &serde_json::Value, name: &str) -> u64 {
    st[0]["north_south"]["counters"][name].as_u64().unwrap_or_else(|| panic!("counter {name}: {st}"))
}

/// One connection to `to` that sends a line of `up` bytes and asks for `down` bytes back: the pod's answer
/// to the line (its name and the client it saw) and the length of what came back.
fn bulk(to: SocketAddr, up: usize, down: usize) -> Result<(String, usize), String> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut line = vec![b'y'; up];
    line.push(b'\n');
    s.write_all(&line).map_err(|e| e.to_string())?;
    writeln!(s, "big {down}").map_err(|e| e.to_string())?;
    let mut r = BufReader::new(&s);
    let (mut answer, mut big) = (String::new(), String::new());
    r.read_line(&mut answer).map_err(|e| e.to_string())?;
    r.read_line(&mut big).map_err(|e| e.to_string())?;
    Ok((answer.trim().to_owned(), big.trim_end().len()))
}

#[test]
fn north_south_dsr_replies_reach_the_client_from_the_backends_node_with_the_service_address() {
    let lab = Lab::new("ns-dsr", "Cluster", false);
    let eps = [(POD_2, POD_2_6, "node-2")];
    write_atomic(lab.node_2.manifests.path(), "web.yaml", &to_yaml(&manifests("Cluster", &eps))).unwrap();
    let _agent_1 = lab.start_agent_with(&["--dsr"]);
    let _agent_2 = lab.start_node_2_with(&["--dsr"]);
    // On the LAN's side of node-1's link (bridge port p1): what it sends node-1 leaves by it, what node-1 sends
    // arrives on it. There, not on node-1's uplink: frames node-1's XDP sends back out (`XDP_TX`) pass no
    // packet socket of the uplink, and neither does what it receives and sends on before the stack.
    let capture = Capture::start(&lab.lan, "p1").unwrap();
    for to in [sa(NODE_1, 30080), sa(LB_IP, 80)] {
        for r in lab.tcp(to, 10) {
            let (name, peer) = r.unwrap_or_else(|e| panic!("{to}: {e}"));
            assert_eq!(name, "web-node-2", "{to}");
            // The client's connect completed: the SYN-ACK it accepted came from `to` itself.
            assert_eq!(peer.parse::<SocketAddr>().unwrap().ip().to_string(), CLIENT, "{to}: the client kept");
        }
    }
    // Segments larger than the option leaves room for (the client's, up; the pod's, down).
    let (answer, down) = from(&lab.client, || bulk(sa(NODE_1, 30080), 300_000, 200_000)).expect("bulk");
    assert!(answer.starts_with("web-node-2 "), "{answer}");
    assert_eq!(down, 200_000);
    let udp = from(&lab.client, || [udp_flows(sa(NODE_1, 30053), 5), udp_flows(sa(LB_IP, 53), 5)].concat());
    for r in udp {
        let (text, src) = r.expect("a UDP answer");
        assert!(text.starts_with(&format!("web-node-2 {CLIENT}:")), "{text}");
        assert!([sa(NODE_1, 30053), sa(LB_IP, 53)].contains(&src), "from the frontend: {src}");
    }
    let v6: Vec<_> =
        lab.tcp(sa(NODE_1_6, 30080), 3).into_iter().map(|r| r.expect("IPv6 through SNAT")).collect();
    assert!(v6.iter().all(|(_, peer)| peer.contains(NODE_1_6)), "IPv6 takes SNAT: {v6:?}");
    let seen = capture.stop();
    let replies: Vec<_> = seen
        .iter()
        .filter(|p| p.outgoing && (p.src.ip().to_string() == POD_2 || p.dst.ip().to_string() == CLIENT))
        .collect();
    assert!(
        replies.is_empty(),
        "node-1 saw {} replies: {:?}",
        replies.len(),
        &replies[..replies.len().min(5)]
    );
    let to_pod: Vec<_> = seen.iter().filter(|p| !p.outgoing && p.dst.ip().to_string() == POD_2).collect();
    assert!(to_pod.len() > 20, "node-1 sent the client's packets on to node-2: {}", to_pod.len());
    for p in &to_pod {
        let fe: SocketAddr = match p.proto {
            6 if p.options.get(2..4) == Some(&30080u16.to_be_bytes()) => sa(NODE_1, 30080),
            6 => sa(LB_IP, 80),
            _ if p.options.get(2..4) == Some(&30053u16.to_be_bytes()) => sa(NODE_1, 30053),
            _ => sa(LB_IP, 53),
        };
        let std::net::IpAddr::V4(a) = fe.ip() else { unreachable!() };
        let [p0, p1] = fe.port().to_be_bytes();
        let [a0, a1, a2, a3] = a.octets();
        assert_eq!(
            p.options,
            [0x9e, 8, p0, p1, a0, a1, a2, a3],
            "{p:?}: the client kept, the frontend in the option"
        );
        assert_eq!(p.src.ip().to_string(), CLIENT, "{p:?}");
    }
    let (n1, n2) = (lab.status(), status_of(&lab.node_2));
    assert_eq!(counter(&n1, "new_dsr"), 20 + 1 + 10, "every IPv4 flow: {n1}");
    assert_eq!((counter(&n1, "new_snat"), counter(&n1, "dsr_snat")), (3, 3), "the IPv6 flows");
    assert!(counter(&n2, "dsr_learned") >= 31, "node-2 learned every flow: {n2}");
    if lab.xdp.is_some() {
        // With XDP on node-1's uplink, XDP grows and sends the client's packets itself (out of the device they
        // came in by).
        assert!(counter(&n1, "xdp_tx") > 20, "XDP forwarded the DSR flows: {n1}");
    }
    let fes = n1[0]["frontends"].as_array().unwrap();
    assert!(
        fes.iter().filter(|f| f["scope"] == "outside").all(|f| f["dsr"] == true),
        "status says DSR: {fes:?}"
    );
}
