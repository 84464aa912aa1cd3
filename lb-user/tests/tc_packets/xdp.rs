//! `xdp_ingress` through `BPF_PROG_TEST_RUN` with XDP contexts: what it forwards itself (byte for byte the
//! frame tc would send, checksums checked by the independent routine), and what it leaves to tc untouched.
use lb_common::{
    FLAG_EMPTY_IS_DROP, FLAG_SNAT_TO_FRONTEND, NS_TRANSLATED, NS_XDP_REDIRECT, NS_XDP_TO_TC, NS_XDP_TX,
    PROTO_TCP, PROTO_UDP,
};

use super::{
    CLIENT, CLIENT_MAC, LOCAL_POD, NEXT_HOP_MAC, NODE, NODE_MAC, REDIRECT, REMOTE_POD, SHOT,
    lab::{Lab, sa},
    pkt::{Pkt, checksums_valid, fragments, src_of},
};

/// XDP verdicts.
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

#[test]
fn xdp_forwards_a_new_snat_flow_and_its_tracked_packets_both_ways_as_tc_would() {
    let fe = format!("{NODE}:30080");
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("xdp-snat", PROTO_TCP, 30080, &backend, false);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &fe, 0x02);
    let (rc, out) = lab.run_xdp(&syn.bytes());
    assert_eq!(rc, XDP_TX, "the next hop is out of the device the SYN came in by");
    let snat = src_of(&out);
    assert_eq!(snat.ip().to_string(), NODE);
    let fwd = |p: &Pkt| Pkt { smac: NODE_MAC, dmac: NEXT_HOP_MAC, ttl: 63, ..p.to(sa(&backend)).from(snat) };
    assert_eq!(out, fwd(&syn).bytes(), "DNAT + SNAT, the FIB's MACs, TTL decremented");
    assert!(checksums_valid(&out));
    // The backend's SYN-ACK moves the flow's state with a SYN on a tracked tuple: tc's, untouched.
    let reply =
        |flags| Pkt { smac: NEXT_HOP_MAC, dmac: NODE_MAC, ..Pkt::tcp(&backend, &snat.to_string(), flags) };
    let (rc, out) = lab.run_xdp(&reply(0x12).bytes());
    assert_eq!((rc, out), (XDP_PASS, reply(0x12).bytes()), "a SYN-ACK is left to tc as it came");
    let (rc, _) = lab.run("tc_ingress", &reply(0x12).bytes());
    assert_eq!(rc, REDIRECT);
    // Then both directions' segments, FIN included, are forwarded in XDP.
    for flags in [0x10, 0x18, 0x11] {
        let data = Pkt::tcp(&format!("{CLIENT}:40000"), &fe, flags);
        let (rc, out) = lab.run_xdp(&data.bytes());
        assert_eq!((rc, out.clone()), (XDP_TX, fwd(&data).bytes()), "client's segment, flags {flags:#x}");
        assert!(checksums_valid(&out));
        let (rc, out) = lab.run_xdp(&reply(flags).bytes());
        let back = Pkt {
            smac: NODE_MAC,
            dmac: CLIENT_MAC,
            ttl: 63,
            ..reply(flags).from(sa(&fe)).to(sa(&format!("{CLIENT}:40000")))
        };
        assert_eq!((rc, out.clone()), (XDP_TX, back.bytes()), "backend's segment, flags {flags:#x}");
        assert!(checksums_valid(&out));
    }
    assert_eq!(lab.ns_counter(NS_XDP_TX), 7, "the SYN, three segments each way");
    assert_eq!(lab.ns_counter(NS_XDP_TO_TC), 1, "the SYN-ACK");
    assert_eq!(lab.ns_counter(NS_TRANSLATED), 8, "seven in XDP, the SYN-ACK in tc");
    let ct = lab.conntrack();
    assert_eq!(ct.len(), 2, "one flow: {ct:?}");
    assert!(
        ct.iter()
            .all(|(_, v)| v.flags & lb_common::CT_FIN_CLIENT != 0 && v.flags & lb_common::CT_FIN_SERVER != 0),
        "the FINs moved the flow's state in XDP as in tc: {ct:?}"
    );
}

#[test]
fn xdp_forwards_udp_and_ipv6_and_redirects_to_another_device() {
    let mut lab = Lab::new("xdp-udp6");
    // A second device with its own next hop: the backend's route leaves by it (XDP_REDIRECT, not XDP_TX).
    lab.ip(&["link", "add", "eth2", "address", "02:00:00:00:00:11", "type", "veth", "peer", "name", "wire2"]);
    lab.ip(&["link", "set", "wire2", "address", "02:00:00:00:00:12"]);
    lab.ip(&["-6", "addr", "add", "2001:db8:2::1/64", "dev", "eth2", "nodad"]);
    lab.ip(&["link", "set", "eth2", "up"]);
    lab.ip(&["link", "set", "wire2", "up"]);
    lab.ip(&["-6", "route", "add", "fd00:244:3::/64", "via", "2001:db8:2::2"]);
    lab.ip(&[
        "-6",
        "neigh",
        "replace",
        "2001:db8:2::2",
        "lladdr",
        "02:00:00:00:00:12",
        "dev",
        "eth2",
        "nud",
        "permanent",
    ]);
    lab.ip(&[
        "-6",
        "neigh",
        "replace",
        "2001:db8::64",
        "lladdr",
        "02:00:00:00:00:64",
        "dev",
        "eth",
        "nud",
        "permanent",
    ]);
    lab.frontend("[2001:db8::1]:30053", PROTO_UDP, 2, &["[fd00:244:3::2]:53"], FLAG_SNAT_TO_FRONTEND);
    let q = Pkt::udp("[2001:db8::64]:40000", "[2001:db8::1]:30053");
    let (rc, out) = lab.run_xdp(&q.bytes());
    assert_eq!(rc, XDP_REDIRECT);
    let snat = src_of(&out);
    assert_eq!(snat.ip().to_string(), "2001:db8::1");
    let want = Pkt {
        smac: [0x02, 0, 0, 0, 0, 0x11],
        dmac: [0x02, 0, 0, 0, 0, 0x12],
        ttl: 63,
        ..q.to(sa("[fd00:244:3::2]:53")).from(snat)
    };
    assert_eq!(out, want.bytes(), "IPv6 DNAT + SNAT, the hop limit decremented, out of eth2");
    assert!(checksums_valid(&out));
    // The answer comes back in by eth (the test runs every frame as eth's): out of eth to the client, XDP_TX.
    let a = Pkt { smac: NEXT_HOP_MAC, dmac: NODE_MAC, ..Pkt::udp("[fd00:244:3::2]:53", &snat.to_string()) };
    let (rc, out) = lab.run_xdp(&a.bytes());
    let back = Pkt {
        smac: NODE_MAC,
        dmac: CLIENT_MAC,
        ttl: 63,
        ..a.from(sa("[2001:db8::1]:30053")).to(sa("[2001:db8::64]:40000"))
    };
    assert_eq!((rc, out.clone()), (XDP_TX, back.bytes()));
    assert!(checksums_valid(&out));
    // UDP over IPv4 without a checksum keeps none; with one, it stays right.
    for no_udp_csum in [false, true] {
        let port = if no_udp_csum { 30054 } else { 30055 };
        lab.frontend(
            &format!("{NODE}:{port}"),
            PROTO_UDP,
            2,
            &[&format!("{REMOTE_POD}:53")],
            FLAG_SNAT_TO_FRONTEND,
        );
        let q = Pkt { no_udp_csum, ..Pkt::udp(&format!("{CLIENT}:40000"), &format!("{NODE}:{port}")) };
        let (rc, out) = lab.run_xdp(&q.bytes());
        assert_eq!(rc, XDP_TX);
        let snat = src_of(&out);
        let want = Pkt {
            smac: NODE_MAC,
            dmac: NEXT_HOP_MAC,
            ttl: 63,
            ..q.to(sa(&format!("{REMOTE_POD}:53"))).from(snat)
        };
        assert_eq!(out, want.bytes(), "no UDP checksum: {no_udp_csum}");
        assert!(checksums_valid(&out));
    }
    assert_eq!(lab.ns_counter(NS_XDP_REDIRECT), 1);
    assert_eq!(lab.ns_counter(NS_XDP_TX), 3);
}

#[test]
fn xdp_leaves_to_tc_what_it_does_not_finish_and_drops_what_tc_would_drop() {
    let mut lab = Lab::with_node_port("xdp-pass", PROTO_TCP, 30080, &format!("{LOCAL_POD}:8080"), true);
    // A local backend: the entries are written in XDP, the frame passed untouched, and tc's translation
    // finds them.
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    let (rc, out) = lab.run_xdp(&syn.bytes());
    assert_eq!((rc, out), (XDP_PASS, syn.bytes()));
    assert_eq!(lab.conntrack().len(), 2, "the flow is tracked");
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!((rc, out), (super::PASS, syn.to(sa(&format!("{LOCAL_POD}:8080"))).bytes()));
    let ack = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x10);
    assert_eq!(lab.run_xdp(&ack.bytes()), (XDP_PASS, ack.bytes()), "a local flow's packets are tc's");
    assert_eq!(lab.ns_counter(NS_XDP_TO_TC), 2);
    // Not ours: another port of the node, a non-SYN without a flow, a RST, fragments: passed, uncounted.
    lab.frontend(
        &format!("{NODE}:30081"),
        PROTO_TCP,
        2,
        &[&format!("{REMOTE_POD}:8080")],
        FLAG_SNAT_TO_FRONTEND,
    );
    let others = [
        Pkt::tcp(&format!("{CLIENT}:40001"), &format!("{NODE}:22"), 0x02),
        Pkt::tcp(&format!("{CLIENT}:40001"), &format!("{NODE}:30081"), 0x10),
        Pkt::tcp(&format!("{CLIENT}:40001"), &format!("{NODE}:30081"), 0x04),
    ];
    for p in &others {
        assert_eq!(lab.run_xdp(&p.bytes()), (XDP_PASS, p.bytes()), "{} flags {:#x}", p.dst, p.flags);
    }
    let big = Pkt { len: 1200, ..Pkt::udp(&format!("{CLIENT}:40002"), &format!("{NODE}:30081")) };
    for frag in fragments(&big, 600, 7) {
        assert_eq!(lab.run_xdp(&frag), (XDP_PASS, frag.clone()), "fragments are tc's");
    }
    assert_eq!(lab.ns_counter(NS_XDP_TO_TC), 2, "none of them counted as ours");
    // A TTL that runs out: tc answers it with ICMP, so XDP leaves the packet as it came.
    let dying = Pkt { ttl: 1, ..Pkt::tcp(&format!("{CLIENT}:40003"), &format!("{NODE}:30081"), 0x02) };
    assert_eq!(lab.run_xdp(&dying.bytes()), (XDP_PASS, dying.bytes()));
    // A frontend with no endpoint that drops (externalTrafficPolicy Local without a local one): dropped here.
    lab.frontend(&format!("{NODE}:30082"), PROTO_TCP, 0, &[], FLAG_SNAT_TO_FRONTEND | FLAG_EMPTY_IS_DROP);
    let none = Pkt::tcp(&format!("{CLIENT}:40004"), &format!("{NODE}:30082"), 0x02);
    assert_eq!(lab.run_xdp(&none.bytes()).0, XDP_DROP);
    assert_eq!(lab.run("tc_ingress", &none.bytes()).0, SHOT, "as tc drops it");
}
