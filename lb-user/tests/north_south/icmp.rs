//! ICMP errors about flows from outside, with real sockets: a closed port's ICMP port unreachable reaches the
//! client's connected UDP socket as ECONNREFUSED (from a local pod, and from node-2's pod through SNAT), and
//! path MTU discovery works through the SNAT path: a router's "fragmentation needed" about a large reply
//! reaches the pod that sent it, so the reply arrives whole instead of stalling.
use std::{
    io::{BufRead as _, BufReader, ErrorKind, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use super::lab::{Lab, NODE_1, NODE_1_6, from, ns_run, sa};

/// A datagram from a connected UDP socket to `to`, where nothing listens: what its receive returns.
fn udp_to_closed(to: SocketAddr) -> ErrorKind {
    let s = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).unwrap();
    s.connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.send(b"hello").unwrap();
    let mut buf = [0u8; 64];
    match s.recv(&mut buf) {
        Ok(n) => panic!("{to} answered {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) => e.kind(),
    }
}

/// `tierlb status -o json`'s tc counter `name` of the boxed agent.
fn ns_counter(lab: &Lab, name: &str) -> u64 {
    let st = lab.status();
    st[0]["north_south"]["counters"][name].as_u64().unwrap_or_else(|| panic!("{name} in {st}"))
}

#[test]
fn north_south_icmp_port_unreachable_reaches_the_client_from_a_local_pod_and_through_snat() {
    // Local: externalTrafficPolicy Local, node-1's pod (no SNAT: the error leaves on egress). Cluster with
    // only node-2's pod: SNAT (the error arrives at node-1 from node-2 and is sent on to the client).
    for (etp, pod_1, path) in [("Local", true, "local pod"), ("Cluster", false, "node-2's pod through SNAT")]
    {
        let lab = Lab::new(&format!("ns-pu-{}", etp.to_lowercase()), etp, pod_1);
        let _agent = lab.start_agent();
        for to in [sa(NODE_1, 30054), sa(NODE_1_6, 30054)] {
            let kind = from(&lab.client, move || udp_to_closed(to));
            assert_eq!(
                kind,
                ErrorKind::ConnectionRefused,
                "{path}: {to}'s closed target port, refused at once"
            );
        }
        assert!(ns_counter(&lab, "icmp_translated") >= 2, "{path}: both errors translated");
    }
}

#[test]
fn north_south_path_mtu_discovery_through_the_snat_path_a_large_reply_arrives_whole() {
    let lab = Lab::new("ns-pmtu", "Cluster", false);
    let _agent = lab.start_agent();
    // The client moves behind a router (the LAN's namespace) whose link to it has an MTU of 1400, smaller
    // than every other link and than the client's own device: neither end's MSS knows it, so only the
    // router's "fragmentation needed" about node-2's pod's reply segments can tell the pod.
    for args in [
        &["link", "set", "p3", "nomaster"][..],
        &["addr", "add", "203.0.113.1/24", "dev", "p3"],
        &["addr", "add", "192.0.2.254/24", "dev", "br0"],
        &["link", "set", "p3", "mtu", "1400"],
    ] {
        lab.lan.ip(args).unwrap();
    }
    ns_run(&lab.lan, &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
    lab.client.ip(&["-4", "addr", "flush", "dev", "uplink"]).unwrap();
    lab.client.ip(&["addr", "add", "203.0.113.100/24", "dev", "uplink"]).unwrap();
    lab.client.ip(&["route", "add", "default", "via", "203.0.113.1"]).unwrap();
    lab.boxed.node.netns.ip(&["route", "add", "203.0.113.0/24", "via", "192.0.2.254"]).unwrap();
    let before = ns_counter(&lab, "icmp_translated");
    let to = sa(NODE_1, 30080);
    let got = from(&lab.client, move || -> Result<usize, String> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        writeln!(s, "big 300000").map_err(|e| e.to_string())?;
        let mut line = Vec::new();
        match BufReader::new(&s).read_until(b'\n', &mut line) {
            Ok(_) => Ok(line.len().saturating_sub(1)),
            Err(e) => Err(format!("after {} bytes: {e}", line.len())),
        }
    });
    assert_eq!(got, Ok(300_000), "the whole reply, its segments resized after the router's error");
    assert!(ns_counter(&lab, "icmp_translated") > before, "the router's error was translated to the pod");
}
