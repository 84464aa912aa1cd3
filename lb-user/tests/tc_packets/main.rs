//! Packet-level tests of the north-south tc programs through `BPF_PROG_TEST_RUN` (Calico's `felix/bpf/ut` is
//! the model): a crafted packet in, the rewritten packet out, compared byte for byte with the packet the test
//! builds itself, whose checksums an independent RFC 1071 routine computes. The programs run in a network
//! namespace the test made (their FIB lookups see its routes), with maps the test fills. Needs root.
mod affinity;
mod dsr;
mod fragment;
mod icmp;
mod icmp_send;
mod lab;
mod maglev;
mod pkt;
mod states;
mod xdp;

use lab::{Lab, sa};
use lb_common::{
    CT_DIR_IN, CT_DIR_OUT, FLAG_EMPTY_IS_DROP, FLAG_POLICY_LOCAL, FLAG_SNAT_TO_FRONTEND, FLAG_SOURCE_RANGES,
    NatConfig, PROTO_TCP, PROTO_UDP,
};
use pkt::{Pkt, checksums_valid, src_of};
use tierlb::datapath::addr;

/// `TC_ACT_UNSPEC`: passed on (to the next program, or the stack).
pub(crate) const PASS: u32 = u32::MAX;
pub(crate) const SHOT: u32 = 2;
pub(crate) const REDIRECT: u32 = 7;

pub(crate) const CLIENT: &str = "192.0.2.100";
pub(crate) const NODE: &str = "192.0.2.1";
pub(crate) const NEXT_HOP: &str = "192.0.2.2";
pub(crate) const NEXT_HOP_6: &str = "2001:db8::2";
pub(crate) const LOCAL_POD: &str = "10.244.1.2";
pub(crate) const REMOTE_POD: &str = "10.244.2.2";
pub(crate) const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub(crate) const NEXT_HOP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub(crate) const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];

// ---- the tests ------------------------------------------------------------------------------------------------

#[test]
fn tc_dnat_to_a_local_endpoint_keeps_the_client_and_its_reply_leaves_from_the_node_port() {
    let mut lab = Lab::with_node_port("tc-local", PROTO_TCP, 30080, &format!("{LOCAL_POD}:8080"), true);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, PASS, "a local endpoint is handed to the stack");
    assert_eq!(out, syn.to(sa(&format!("{LOCAL_POD}:8080"))).bytes(), "DNAT to the pod, client kept");
    assert!(checksums_valid(&out));
    // The pod's SYN-ACK, routed out of the uplink: its source becomes the node port again.
    let synack = Pkt::tcp(&format!("{LOCAL_POD}:8080"), &format!("{CLIENT}:40000"), 0x12);
    let (rc, out) = lab.run("tc_egress", &synack.bytes());
    assert_eq!(rc, PASS);
    assert_eq!(out, synack.from(sa(&format!("{NODE}:30080"))).bytes());
    assert!(checksums_valid(&out));
    // A retransmitted SYN and the client's ACK follow the same entry.
    let ack = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x10);
    let (rc, out) = lab.run("tc_ingress", &ack.bytes());
    assert_eq!((rc, out), (PASS, ack.to(sa(&format!("{LOCAL_POD}:8080"))).bytes()));
    let ct = lab.conntrack();
    assert_eq!(ct.len(), 2, "one forward and one reply entry: {ct:?}");
    assert!(ct.iter().any(|(k, _)| k.dir == CT_DIR_OUT), "the reply is matched on egress");
}

#[test]
fn tc_snat_to_a_remote_endpoint_and_its_reply_is_translated_back() {
    let mut lab = Lab::with_node_port("tc-snat", PROTO_TCP, 30080, &format!("{REMOTE_POD}:8080"), false);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT, "an SNAT packet is sent out of the uplink by the program itself");
    let snat = src_of(&out);
    assert_eq!(snat.ip().to_string(), NODE, "the source is the node port's address");
    assert!(
        NatConfig::default().snat_ports().contains(snat.port()),
        "an SNAT port outside the ephemeral and NodePort ranges (the client's 40000 is inside the first): {snat}"
    );
    let want = Pkt {
        smac: NODE_MAC,
        dmac: NEXT_HOP_MAC,
        ttl: 63,
        ..syn.to(sa(&format!("{REMOTE_POD}:8080"))).from(snat)
    };
    assert_eq!(out, want.bytes(), "DNAT + SNAT, MACs of the FIB's next hop, TTL decremented");
    assert!(checksums_valid(&out));
    // The backend's reply arrives addressed to the node's SNAT port.
    let reply = Pkt {
        smac: NEXT_HOP_MAC,
        dmac: NODE_MAC,
        ..Pkt::tcp(&format!("{REMOTE_POD}:8080"), &snat.to_string(), 0x12)
    };
    let (rc, out) = lab.run("tc_ingress", &reply.bytes());
    assert_eq!(rc, REDIRECT);
    let want = Pkt {
        smac: NODE_MAC,
        dmac: CLIENT_MAC,
        ttl: 63,
        ..reply.from(sa(&format!("{NODE}:30080"))).to(sa(&format!("{CLIENT}:40000")))
    };
    assert_eq!(out, want.bytes(), "the client sees the node port as the source");
    assert!(checksums_valid(&out));
    let ct = lab.conntrack();
    assert_eq!(ct.len(), 2, "{ct:?}");
    assert!(ct.iter().all(|(k, _)| k.dir == CT_DIR_IN), "both directions are matched on ingress with SNAT");
}

#[test]
fn tc_udp_node_port_translates_with_and_without_a_checksum() {
    let mut lab = Lab::with_node_port("tc-udp", PROTO_UDP, 30053, &format!("{LOCAL_POD}:53"), true);
    for no_udp_csum in [false, true] {
        let port = if no_udp_csum { 40001 } else { 40000 };
        let q = Pkt { no_udp_csum, ..Pkt::udp(&format!("{CLIENT}:{port}"), &format!("{NODE}:30053")) };
        let (rc, out) = lab.run("tc_ingress", &q.bytes());
        assert_eq!(rc, PASS);
        assert_eq!(
            out,
            q.to(sa(&format!("{LOCAL_POD}:53"))).bytes(),
            "no checksum stays none: {no_udp_csum}"
        );
        assert!(checksums_valid(&out));
        let a = Pkt { no_udp_csum, ..Pkt::udp(&format!("{LOCAL_POD}:53"), &format!("{CLIENT}:{port}")) };
        let (rc, out) = lab.run("tc_egress", &a.bytes());
        assert_eq!(rc, PASS);
        assert_eq!(out, a.from(sa(&format!("{NODE}:30053"))).bytes(), "the reply comes from nodeIP:nodePort");
    }
}

#[test]
fn tc_ipv6_node_port_dnat_and_reply() {
    let mut lab = Lab::new("tc-v6");
    lab.frontend("[2001:db8::1]:30080", PROTO_TCP, 2, &["[fd00:244:1::2]:8080"], FLAG_SNAT_TO_FRONTEND);
    lab.local("fd00:244:1::2");
    let syn = Pkt::tcp("[2001:db8::64]:40000", "[2001:db8::1]:30080", 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, PASS);
    assert_eq!(out, syn.to(sa("[fd00:244:1::2]:8080")).bytes());
    assert!(checksums_valid(&out));
    let synack = Pkt::tcp("[fd00:244:1::2]:8080", "[2001:db8::64]:40000", 0x12);
    let (rc, out) = lab.run("tc_egress", &synack.bytes());
    assert_eq!((rc, out.clone()), (PASS, synack.from(sa("[2001:db8::1]:30080")).bytes()));
    assert!(checksums_valid(&out));
}

#[test]
fn tc_leaves_other_packets_alone() {
    let mut lab = Lab::with_node_port("tc-other", PROTO_TCP, 30080, &format!("{LOCAL_POD}:8080"), false);
    let cases = [
        ("another port", Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:22"), 0x02)),
        ("UDP to a TCP node port", Pkt::udp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"))),
        // A reply to a node socket that uses the node port's number: SYN-ACK, not a new flow.
        ("a SYN-ACK to the node port", Pkt::tcp(&format!("{CLIENT}:443"), &format!("{NODE}:30080"), 0x12)),
        ("an ACK without a flow", Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x10)),
    ];
    for (what, p) in cases {
        for prog in ["tc_ingress", "tc_egress"] {
            let (rc, out) = lab.run(prog, &p.bytes());
            assert_eq!((rc, out), (PASS, p.bytes()), "{what} on {prog}");
        }
    }
    assert!(lab.conntrack().is_empty(), "no state for packets that are not ours");
}

#[test]
fn tc_etp_local_without_a_local_endpoint_drops() {
    let mut lab = Lab::new("tc-drop");
    lab.frontend(&format!("{NODE}:30080"), PROTO_TCP, 0, &[], FLAG_POLICY_LOCAL | FLAG_EMPTY_IS_DROP);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    let (rc, _) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, SHOT, "kube-proxy's DROP: the balancer's health check already says 503");
    assert!(lab.conntrack().is_empty());
}

/// A load-balancer IP's SNAT flow leaves from the source the node's route to the backend gives
/// (`BPF_FIB_LOOKUP_SRC`), as the stack's forwarding and MASQUERADE would: the route's `src`, else the
/// egress device's address; not the configured first NodePort address (`snat_v4`, the fallback on kernels
/// before 6.8), which may be a shared or NATed address the backend cannot answer.
#[test]
fn tc_load_balancer_ip_snats_to_the_source_its_route_gives() {
    let mut lab = Lab::new("tc-lb");
    lab.frontend("203.0.113.10:80", PROTO_TCP, 2, &[&format!("{REMOTE_POD}:8080")], 0);
    lab.config(NatConfig { snat_v4: addr::words("192.0.2.9".parse().unwrap())[0], ..NatConfig::default() });
    lab.ip(&["addr", "add", "192.0.2.5/24", "dev", "eth"]);
    lab.addr("192.0.2.5", lb_common::ADDR_NODE);
    let cases = [
        (
            "the route's preferred source",
            vec!["route", "replace", "10.244.2.0/24", "via", NEXT_HOP, "src", "192.0.2.5"],
            "192.0.2.5",
            40_000,
        ),
        (
            "the egress device's primary address",
            vec!["route", "replace", "10.244.2.0/24", "via", NEXT_HOP],
            NODE,
            40_001,
        ),
    ];
    // A kernel without `BPF_FIB_LOOKUP_SRC` (6.8 upstream) refuses the flag: the configured address,
    // whatever the route says. A distribution's older kernel may carry it back (Debian 12's 6.1.192 does):
    // from 6.8 the route's source is required; below, the first case says which the kernel does, and every
    // case must then agree.
    let upstream_has_src =
        aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 8, 0));
    let mut has_src = None;
    for (what, route, want, port) in cases {
        lab.ip(&route);
        let syn = Pkt::tcp(&format!("{CLIENT}:{port}"), "203.0.113.10:80", 0x02);
        let (rc, out) = lab.run("tc_ingress", &syn.bytes());
        assert_eq!(rc, REDIRECT, "{what}");
        let got = src_of(&out).ip().to_string();
        let has = *has_src.get_or_insert(upstream_has_src || got == want);
        let want = if has { want } else { "192.0.2.9" };
        assert_eq!(got, want, "{what}");
        assert!(checksums_valid(&out));
        // The reply, to that address and port, is the flow's.
        let reply = Pkt::tcp(&format!("{REMOTE_POD}:8080"), &src_of(&out).to_string(), 0x12);
        let (rc, out) = lab.run("tc_ingress", &reply.bytes());
        assert_eq!(rc, REDIRECT, "{what}: the reply");
        assert_eq!(src_of(&out).to_string(), "203.0.113.10:80", "{what}: the client sees the LB IP");
    }
}

#[test]
fn tc_load_balancer_source_ranges_admit_only_their_clients() {
    let mut lab = Lab::new("tc-ranges");
    lab.local(LOCAL_POD);
    lab.frontend("203.0.113.10:80", PROTO_TCP, 2, &[&format!("{LOCAL_POD}:8080")], FLAG_SOURCE_RANGES);
    lab.source_range("203.0.113.10:80", PROTO_TCP, "192.0.2.96/28");
    let inside = Pkt::tcp(&format!("{CLIENT}:40000"), "203.0.113.10:80", 0x02);
    let (rc, out) = lab.run("tc_ingress", &inside.bytes());
    assert_eq!(
        (rc, out),
        (PASS, inside.to(sa(&format!("{LOCAL_POD}:8080"))).bytes()),
        "192.0.2.100 is in the range"
    );
    let outside = Pkt::tcp("192.0.2.200:40000", "203.0.113.10:80", 0x02);
    let (rc, _) = lab.run("tc_ingress", &outside.bytes());
    assert_eq!(rc, SHOT, "192.0.2.200 is not: dropped, as kube-proxy's KUBE-FW chain drops it");
    assert_eq!(lab.conntrack().len(), 2, "only the admitted client's flow is tracked");
}

#[test]
fn tc_an_rst_closes_both_entries_and_a_reused_client_port_is_a_new_connection() {
    let mut lab = Lab::with_node_port("tc-reuse", PROTO_TCP, 30080, &format!("{LOCAL_POD}:8080"), true);
    let client = format!("{CLIENT}:40000");
    let np = format!("{NODE}:30080");
    let pod = format!("{LOCAL_POD}:8080");
    for (prog, p) in [
        ("tc_ingress", Pkt::tcp(&client, &np, 0x02)),
        ("tc_egress", Pkt::tcp(&pod, &client, 0x12)),
        ("tc_ingress", Pkt::tcp(&client, &np, 0x10)),
        ("tc_ingress", Pkt::tcp(&client, &np, 0x14)),
    ] {
        assert_eq!(lab.run(prog, &p.bytes()).0, PASS);
    }
    let ct = lab.conntrack();
    assert_eq!(ct.len(), 2);
    assert!(
        ct.iter().all(|(_, v)| v.flags & lb_common::CT_CLOSED != 0),
        "the client's RST closes the reply entry too (it would otherwise live the established timeout): {ct:?}"
    );
    // The same client port, now straight to the pod: its SYN-ACK is not the closed flow's reply.
    let direct = Pkt::tcp(&pod, &client, 0x12);
    let (rc, out) = lab.run("tc_egress", &direct.bytes());
    assert_eq!((rc, out), (PASS, direct.bytes()), "left alone, not rewritten to the node port");
    let data = Pkt::tcp(&pod, &client, 0x18);
    let (rc, out) = lab.run("tc_egress", &data.bytes());
    assert_eq!((rc, out), (PASS, data.bytes()), "and so is the rest of that connection");
    // And a new connection to the node port from that port is a new flow.
    let syn = Pkt::tcp(&client, &np, 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!((rc, out), (PASS, syn.to(sa(&pod)).bytes()));
    let ct = lab.conntrack();
    assert!(ct.iter().all(|(_, v)| v.flags & lb_common::CT_CLOSED == 0), "fresh entries: {ct:?}");
}

/// `tc_egress_l3`, the egress program of an L3 device (WireGuard, tun, IPIP: no Ethernet header), translates
/// a local backend's reply as `tc_egress` does on an Ethernet device. PROG_TEST_RUN takes its data for an
/// Ethernet frame and gives the skb the protocol in bytes 12-13 (`eth_type_trans`), so the pods' addresses
/// here put the ethertype there: an IPv4 source 8.0.x.x (bytes 12-13 of the header are its first two:
/// 0x0800), an IPv6 source fd00:244:86dd:: (bytes 12-13 are its fifth and sixth: 0x86dd).
#[test]
fn tc_egress_l3_translates_a_local_backends_reply_without_an_ethernet_header() {
    let mut lab = Lab::new("tc-l3");
    let cases = [
        (format!("{NODE}:30080"), "8.0.1.2:8080", format!("{CLIENT}:40000")),
        ("[2001:db8::1]:30080".to_owned(), "[fd00:244:86dd::2]:8080", "[2001:db8::64]:40000".to_owned()),
    ];
    for (np, pod, client) in cases {
        lab.frontend(&np, PROTO_TCP, 2, &[pod], FLAG_SNAT_TO_FRONTEND);
        lab.local(&sa(pod).ip().to_string());
        let syn = Pkt::tcp(&client, &np, 0x02);
        assert_eq!(lab.run("tc_ingress", &syn.bytes()), (PASS, syn.to(sa(pod)).bytes()), "{np}");
        let synack = Pkt::tcp(pod, &client, 0x12);
        let (rc, out) = lab.run("tc_egress_l3", &synack.bytes()[14..]);
        assert_eq!(rc, PASS, "{np}");
        assert_eq!(
            out,
            synack.from(sa(&np)).bytes()[14..],
            "{np}: the source is the node port, no header added"
        );
        assert!(checksums_valid(&[&[0u8; 12][..], &synack.bytes()[12..14], &out].concat()), "{np}");
    }
}
