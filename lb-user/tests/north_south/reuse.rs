//! A client port reused after a node-port connection ended, as deployed: the client talks to node-1's node
//! port (externalTrafficPolicy Local: node-1's pod, the client's address kept), resets, then connects from
//! the same port straight to the pod. The closed flow's conntrack entries must not touch the new
//! connection (they did: the reply entry outlived the RST and rewrote the pod's SYN-ACK to the node port).
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, SocketAddrV4, TcpStream},
    os::fd::AsRawFd as _,
};

use nix::sys::{socket, time::TimeVal};

use super::lab::{CLIENT, Lab, NODE_1, POD_1, from, sa};

/// A TCP connection from `local` (bound, address reuse on) to `to`, its connect bounded at 2 s; one request
/// and its answer (`NAME PEER`); then an RST.
fn ask_from(local: SocketAddr, to: SocketAddr) -> Result<String, String> {
    let v4 = |a: SocketAddr| match a {
        SocketAddr::V4(a) => socket::SockaddrIn::from(a),
        SocketAddr::V6(_) => unreachable!("IPv4 here"),
    };
    let fd = socket::socket(
        socket::AddressFamily::Inet,
        socket::SockType::Stream,
        socket::SockFlag::empty(),
        None,
    )
    .map_err(|e| e.to_string())?;
    socket::setsockopt(&fd, socket::sockopt::ReuseAddr, &true).map_err(|e| e.to_string())?;
    // connect(2) is bounded by the send timeout.
    socket::setsockopt(&fd, socket::sockopt::SendTimeout, &TimeVal::new(2, 0)).map_err(|e| e.to_string())?;
    socket::bind(fd.as_raw_fd(), &v4(local)).map_err(|e| format!("bind {local}: {e}"))?;
    socket::connect(fd.as_raw_fd(), &v4(to)).map_err(|e| format!("connect {to}: {e}"))?;
    let mut s = TcpStream::from(fd);
    s.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
    writeln!(s, "hello").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
    lb_testkit::churn::rst_close(&s);
    Ok(line.trim().to_owned())
}

#[test]
fn north_south_a_client_port_reused_after_a_node_port_connection_reaches_the_pod_directly() {
    let lab = Lab::new("ns-reuse", "Local", true);
    let _agent = lab.start_agent();
    lab.client.ip(&["route", "add", "10.244.1.0/24", "via", NODE_1]).unwrap();
    let local = SocketAddr::V4(SocketAddrV4::new(CLIENT.parse().unwrap(), 45_000));
    let via_node_port = from(&lab.client, move || ask_from(local, sa(NODE_1, 30080)));
    assert_eq!(via_node_port, Ok(format!("web-node-1 {local}")), "the node port, the client kept");
    let direct = from(&lab.client, move || ask_from(local, sa(POD_1, 8080)));
    assert_eq!(direct, Ok(format!("web-node-1 {local}")), "the same client port straight to the pod");
}
