//! ICMP errors about translated flows, in both directions and both families, with SNAT and without: the
//! error that leaves must be the one the test builds from scratch (outer and quoted headers translated,
//! every checksum right), so the sender's socket gets it (port unreachable, path MTU).
use std::net::SocketAddr;

use lb_common::{FLAG_SNAT_TO_FRONTEND, PROTO_TCP, PROTO_UDP};

use super::{
    CLIENT, CLIENT_MAC, LOCAL_POD, NEXT_HOP, NEXT_HOP_MAC, NODE, NODE_MAC, PASS, REDIRECT, REMOTE_POD,
    lab::{Lab, sa},
    pkt::{IcmpError, Pkt, checksum, src_of, sum16},
};

/// ICMP destination unreachable, its codes port unreachable and fragmentation needed; ICMPv6 packet too big.
const UNREACHABLE: u8 = 3;
const PORT_UNREACHABLE: u8 = 3;
const FRAG_NEEDED: u8 = 4;
const PACKET_TOO_BIG: u8 = 2;
/// A router between the node and the client or the backend.
const ROUTER: &str = "192.0.2.254";

/// Whether the outer IPv4 header, the ICMP message and the quoted IPv4 header of the error `p` verify.
fn icmp_checksums_valid(p: &[u8]) -> bool {
    if u16::from_be_bytes([p[12], p[13]]) != 0x0800 {
        let len = p.len() - 54;
        let mut pseudo = p[22..54].to_vec();
        pseudo.extend_from_slice(&(len as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        return checksum(&p[54..], sum16(&pseudo, 0)) == 0;
    }
    checksum(&p[14..34], 0) == 0 && checksum(&p[34..], 0) == 0 && checksum(&p[42..62], 0) == 0
}

#[test]
fn tc_icmp_port_unreachable_from_a_local_pod_reaches_the_client_from_the_node_port() {
    let pod = format!("{LOCAL_POD}:53");
    let mut lab = Lab::with_node_port("icmp-local-pu", PROTO_UDP, 30053, &pod, true);
    for no_udp_csum in [false, true] {
        let port = if no_udp_csum { 40001 } else { 40000 };
        let client = format!("{CLIENT}:{port}");
        let q = Pkt { no_udp_csum, ..Pkt::udp(&client, &format!("{NODE}:30053")) };
        assert_eq!(lab.run("tc_ingress", &q.bytes()).0, PASS);
        // The pod has nothing on 53: its kernel answers the DNATed datagram, which it saw from the client.
        let err = IcmpError::new(LOCAL_POD, CLIENT, UNREACHABLE, PORT_UNREACHABLE, 0, q.to(sa(&pod)));
        let (rc, out) = lab.run("tc_egress", &err.bytes());
        assert_eq!(rc, PASS, "on its way out already");
        let want = IcmpError { src: NODE.parse().unwrap(), quote: q, ..err };
        assert_eq!(
            out,
            want.bytes(),
            "from the node port's address, quoting what the client sent ({no_udp_csum})"
        );
        assert!(icmp_checksums_valid(&out));
    }
}

#[test]
fn tc_icmp_frag_needed_about_a_reply_reaches_the_local_pod_whole_quote_or_eight_bytes() {
    let pod = format!("{LOCAL_POD}:8080");
    let mut lab = Lab::with_node_port("icmp-local-fn", PROTO_TCP, 30080, &pod, true);
    let client = format!("{CLIENT}:40000");
    let syn = Pkt::tcp(&client, &format!("{NODE}:30080"), 0x02);
    assert_eq!(lab.run("tc_ingress", &syn.bytes()).0, PASS);
    let synack = Pkt::tcp(&pod, &client, 0x12);
    assert_eq!(lab.run("tc_egress", &synack.bytes()).0, PASS);
    // A router toward the client cannot forward a reply: it quotes the reply as it left the node.
    let left = synack.from(sa(&format!("{NODE}:30080")));
    for quote_len in [None, Some(28)] {
        let err =
            IcmpError { quote_len, ..IcmpError::new(ROUTER, NODE, UNREACHABLE, FRAG_NEEDED, 1400, left) };
        let (rc, out) = lab.run("tc_ingress", &err.bytes());
        assert_eq!(rc, PASS, "to a local pod: the stack delivers it");
        let want = IcmpError { dst: LOCAL_POD.parse().unwrap(), quote: synack, ..err };
        assert_eq!(out, want.bytes(), "to the pod, quoting its own reply (quote of {quote_len:?} bytes)");
        assert!(icmp_checksums_valid(&out));
    }
}

#[test]
fn tc_icmp_frag_needed_on_the_snat_path_reaches_the_client() {
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("icmp-snat-fn", PROTO_TCP, 30080, &backend, false);
    let client = format!("{CLIENT}:40000");
    let syn = Pkt::tcp(&client, &format!("{NODE}:30080"), 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT);
    let snat = src_of(&out);
    // A router toward the backend cannot forward the client's segment as the node sent it.
    let sent = Pkt { ttl: 63, ..syn.to(sa(&backend)).from(snat) };
    let err = IcmpError {
        smac: NEXT_HOP_MAC,
        ..IcmpError::new(NEXT_HOP, NODE, UNREACHABLE, FRAG_NEEDED, 1400, sent)
    };
    let (rc, out) = lab.run("tc_ingress", &err.bytes());
    assert_eq!(rc, REDIRECT, "sent to the client by the program (its source is the node's)");
    let want = IcmpError {
        src: NODE.parse().unwrap(),
        dst: CLIENT.parse().unwrap(),
        quote: Pkt { ttl: 63, ..syn },
        ttl: 63,
        smac: NODE_MAC,
        dmac: CLIENT_MAC,
        ..err
    };
    assert_eq!(out, want.bytes(), "the client learns the path MTU of the segment it sent to the node port");
    assert!(icmp_checksums_valid(&out));
}

#[test]
fn tc_icmp_port_unreachable_from_the_client_about_an_snat_reply_reaches_the_backend() {
    let backend = format!("{REMOTE_POD}:53");
    let mut lab = Lab::with_node_port("icmp-snat-pu", PROTO_UDP, 30053, &backend, false);
    let client = format!("{CLIENT}:40000");
    let q = Pkt::udp(&client, &format!("{NODE}:30053"));
    let (rc, out) = lab.run("tc_ingress", &q.bytes());
    assert_eq!(rc, REDIRECT);
    let snat: SocketAddr = src_of(&out);
    let answer = Pkt { smac: NEXT_HOP_MAC, ..Pkt::udp(&backend, &snat.to_string()) };
    assert_eq!(lab.run("tc_ingress", &answer.bytes()).0, REDIRECT);
    // The client's socket is gone: its kernel answers the reply as it arrived, from the node port.
    let arrived = Pkt { ttl: 63, ..answer.from(sa(&format!("{NODE}:30053"))).to(sa(&client)) };
    let err = IcmpError::new(CLIENT, NODE, UNREACHABLE, PORT_UNREACHABLE, 0, arrived);
    let (rc, out) = lab.run("tc_ingress", &err.bytes());
    assert_eq!(rc, REDIRECT);
    let want = IcmpError {
        src: NODE.parse().unwrap(),
        dst: REMOTE_POD.parse().unwrap(),
        quote: Pkt { ttl: 63, ..answer },
        ttl: 63,
        smac: NODE_MAC,
        dmac: NEXT_HOP_MAC,
        ..err
    };
    assert_eq!(out, want.bytes(), "the backend gets it about the datagram it sent to the SNAT port");
    assert!(icmp_checksums_valid(&out));
}

#[test]
fn tc_icmpv6_packet_too_big_about_a_reply_reaches_the_local_pod() {
    let pod = "[fd00:244:1::2]:8080";
    let mut lab = Lab::new("icmp-v6");
    lab.frontend("[2001:db8::1]:30080", PROTO_TCP, 2, &[pod], FLAG_SNAT_TO_FRONTEND);
    lab.local("fd00:244:1::2");
    let client = "[2001:db8::64]:40000";
    let syn = Pkt::tcp(client, "[2001:db8::1]:30080", 0x02);
    assert_eq!(lab.run("tc_ingress", &syn.bytes()).0, PASS);
    let synack = Pkt::tcp(pod, client, 0x12);
    assert_eq!(lab.run("tc_egress", &synack.bytes()).0, PASS);
    let left = synack.from(sa("[2001:db8::1]:30080"));
    let err = IcmpError::new("2001:db8::fe", "2001:db8::1", PACKET_TOO_BIG, 0, 1280, left);
    let (rc, out) = lab.run("tc_ingress", &err.bytes());
    assert_eq!(rc, PASS);
    let want = IcmpError { dst: "fd00:244:1::2".parse().unwrap(), quote: synack, ..err };
    assert_eq!(out, want.bytes(), "ICMPv6's checksum covers the new destination through its pseudo-header");
    assert!(icmp_checksums_valid(&out));
    // And the pod's own port unreachable about a DNATed datagram would leave from the node port: covered
    // for IPv4 above; here the reverse direction of the same flow.
    let err = IcmpError::new("fd00:244:1::2", "2001:db8::64", 1, 4, 0, syn.to(sa(pod)));
    let (rc, out) = lab.run("tc_egress", &err.bytes());
    assert_eq!(rc, PASS);
    let want = IcmpError { src: "2001:db8::1".parse().unwrap(), quote: syn, ..err };
    assert_eq!(out, want.bytes());
    assert!(icmp_checksums_valid(&out));
}

/// A router's packet too big about the first fragment of a pod's fragmented IPv6 reply (UDP, a Fragment
/// header in the quote) reaches the pod, the quote as the pod sent it.
#[test]
fn tc_icmpv6_packet_too_big_about_a_reply_fragment_reaches_the_local_pod() {
    let pod = "[fd00:244:1::2]:53";
    let mut lab = Lab::new("icmp-v6-frag");
    lab.frontend("[2001:db8::1]:30053", PROTO_UDP, 2, &[pod], FLAG_SNAT_TO_FRONTEND);
    lab.local("fd00:244:1::2");
    let client = "[2001:db8::64]:40000";
    let q = Pkt::udp(client, "[2001:db8::1]:30053");
    assert_eq!(lab.run("tc_ingress", &q.bytes()).0, PASS);
    let reply = Pkt { len: 1600, ..Pkt::udp(pod, client) };
    let left = reply.from(sa("[2001:db8::1]:30053"));
    let err = IcmpError {
        quote_first_fragment: Some((1200, 9)),
        ..IcmpError::new("2001:db8::fe", "2001:db8::1", PACKET_TOO_BIG, 0, 1280, left)
    };
    let (rc, out) = lab.run("tc_ingress", &err.bytes());
    assert_eq!(rc, PASS);
    let want = IcmpError { dst: "fd00:244:1::2".parse().unwrap(), quote: reply, ..err };
    assert_eq!(out, want.bytes(), "to the pod, its fragment quoted as it left the pod");
    assert!(icmp_checksums_valid(&out));
}

#[test]
fn tc_icmp_that_is_no_error_about_a_tracked_flow_passes_untouched() {
    let pod = format!("{LOCAL_POD}:53");
    let mut lab = Lab::with_node_port("icmp-other", PROTO_UDP, 30053, &pod, true);
    let q = Pkt::udp(&format!("{CLIENT}:40000"), &format!("{NODE}:30053"));
    assert_eq!(lab.run("tc_ingress", &q.bytes()).0, PASS);
    let echo = IcmpError::new(CLIENT, NODE, 8, 0, 0x0001_0001, q);
    let untracked = IcmpError::new(
        LOCAL_POD,
        CLIENT,
        UNREACHABLE,
        PORT_UNREACHABLE,
        0,
        Pkt::udp(&format!("{CLIENT}:40009"), &pod),
    );
    let mut later_fragment = untracked.bytes();
    later_fragment[42 + 6] = 0x00; // the quote's fragment offset: 8 bytes in
    later_fragment[42 + 7] = 0x01;
    let cases = [
        ("an echo request carrying a tracked flow's bytes", echo.bytes()),
        ("an error about a flow that is not tracked", untracked.bytes()),
        ("an error quoting a later fragment (no ports)", later_fragment),
        (
            "an error about a tracked flow seen in the other direction",
            IcmpError::new(LOCAL_POD, CLIENT, UNREACHABLE, PORT_UNREACHABLE, 0, q.to(sa(&pod))).bytes(),
        ),
    ];
    for (i, (what, p)) in cases.iter().enumerate() {
        let prog = if i == 3 { "tc_ingress" } else { "tc_egress" };
        let (rc, out) = lab.run(prog, p);
        assert_eq!((rc, &out), (PASS, p), "{what} on {prog}");
        if i < 2 {
            let (rc, out) = lab.run("tc_ingress", p);
            assert_eq!((rc, &out), (PASS, p), "{what} on tc_ingress");
        }
    }
}

/// An error is about a flow only if it goes to the sender of the packet it quotes (netfilter's outer/inner
/// check): a forged one, or one about a packet another host sent, is passed on untouched and translates
/// nothing, in either direction. The quotes are of packets the flows really carried, so only the check
/// stands between them and a translation.
#[test]
fn tc_icmp_error_not_sent_to_the_quoted_packets_sender_passes_untouched() {
    // Egress: a local pod's error about the datagram it received, sent to another host than the client.
    let pod = format!("{LOCAL_POD}:53");
    let mut lab = Lab::with_node_port("icmp-mismatch", PROTO_UDP, 30053, &pod, true);
    let q = Pkt::udp(&format!("{CLIENT}:40000"), &format!("{NODE}:30053"));
    assert_eq!(lab.run("tc_ingress", &q.bytes()).0, PASS);
    let err = IcmpError::new(LOCAL_POD, "192.0.2.77", UNREACHABLE, PORT_UNREACHABLE, 0, q.to(sa(&pod)));
    let (rc, out) = lab.run("tc_egress", &err.bytes());
    assert_eq!((rc, out), (PASS, err.bytes()), "egress: not to the quoted datagram's sender");
    // Ingress: an SNAT flow; a router's error about the translated packet (node:port -> backend), addressed
    // to the client instead of the node that sent it.
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("icmp-mismatch-snat", PROTO_TCP, 30080, &backend, false);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT);
    let sent = syn.to(sa(&backend)).from(src_of(&out));
    let good = IcmpError::new(ROUTER, NODE, UNREACHABLE, FRAG_NEEDED, 1400, sent);
    let forged = IcmpError::new(ROUTER, CLIENT, UNREACHABLE, FRAG_NEEDED, 1400, sent);
    lab.addr(CLIENT, lb_common::ADDR_NODE);
    let (rc, out) = lab.run("tc_ingress", &forged.bytes());
    assert_eq!((rc, out), (PASS, forged.bytes()), "ingress: to the client, not to the node that sent it");
    assert_eq!(lab.ns_counter(lb_common::NS_ICMP_TRANSLATED), 0);
    // The same error to the node is the flow's (the check does not refuse what it should take).
    assert_eq!(lab.run("tc_ingress", &good.bytes()).0, REDIRECT);
    assert_eq!(lab.ns_counter(lb_common::NS_ICMP_TRANSLATED), 1);
}
