//! Direct server return (`--dsr`): on the ingress node a remote backend's flow leaves with the client's
//! address and its frontend in an IPv4 option (byte for byte, the option written here from its definition);
//! on the backend's node the option becomes the reply entry that gives the backend's reply the frontend's
//! address; where DSR cannot apply (IPv6, no room), SNAT or no option, counted.
use lb_common::{
    CT_DSR, CT_FORWARD, FLAG_DSR, FLAG_SNAT_TO_FRONTEND, LOCAL_DSR, LOCAL_ENDPOINT, MAP_CT_SYN, MAP_CT_TCP,
    MAP_CT_UDP, NS_DROP_FRAG_NEEDED, NS_DSR_LEARNED, NS_DSR_NO_ROOM, NS_DSR_SNAT, NS_ICMP_SENT, NS_NEW_DSR,
    NS_NEW_SNAT, PROTO_TCP, PROTO_UDP,
};

use super::{
    CLIENT, LOCAL_POD, NEXT_HOP_MAC, NODE, NODE_MAC, PASS, REDIRECT, REMOTE_POD,
    lab::{Lab, sa},
    pkt::{IcmpError, Pkt, checksums_valid, dsr_option, src_of},
};

/// An ingress node's lab: the node port `NODE:port` over `proto` with DSR, its one backend on another node.
fn ingress(tag: &str, proto: u8, port: u16) -> Lab {
    let mut lab = Lab::new(tag);
    lab.frontend(
        &format!("{NODE}:{port}"),
        proto,
        2,
        &[&format!("{REMOTE_POD}:8080")],
        FLAG_SNAT_TO_FRONTEND | FLAG_DSR,
    );
    lab
}

/// `p` as the ingress node sends it to the backend: to `REMOTE_POD:8080`, the client kept, the option of
/// the frontend it was sent to, the next hop's MACs, its TTL decremented.
fn sent_on(p: Pkt) -> Pkt {
    Pkt {
        smac: NODE_MAC,
        dmac: NEXT_HOP_MAC,
        ttl: p.ttl - 1,
        ip_options: Some(dsr_option(&p.dst.to_string())),
        ..p.to(sa(&format!("{REMOTE_POD}:8080")))
    }
}

#[test]
fn tc_dsr_sends_a_remote_flow_with_the_client_kept_and_its_frontend_in_an_option() {
    let mut lab = ingress("tc-dsr", PROTO_TCP, 30080);
    let (client, np) = (format!("{CLIENT}:40000"), format!("{NODE}:30080"));
    let syn = Pkt::tcp(&client, &np, 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT, "sent out by the program, to the backend's node");
    assert_eq!(out, sent_on(syn).bytes(), "DNAT, no SNAT, the option after the base header");
    assert!(checksums_valid(&out), "the header's checksum covers the option");
    let ct = lab.conntrack();
    assert_eq!(ct.len(), 1, "a forward entry only: the replies do not come back here: {ct:?}");
    assert_eq!(ct[0].1.flags & (CT_FORWARD | CT_DSR), CT_FORWARD | CT_DSR);
    assert_eq!((lab.ns_counter(NS_NEW_DSR), lab.ns_counter(NS_NEW_SNAT)), (1, 0));
    // The client's ACK (it saw the backend's SYN-ACK, which never came here) completes the handshake as far
    // as this node can tell: the flow moves to the established table. Every packet carries the option.
    let ack = Pkt { len: 100, ..Pkt::tcp(&client, &np, 0x10).seq_ack(1001, 5001) };
    let (rc, out) = lab.run("tc_ingress", &ack.bytes());
    assert_eq!((rc, out), (REDIRECT, sent_on(ack).bytes()));
    assert_eq!((lab.table(MAP_CT_SYN).len(), lab.table(MAP_CT_TCP).len()), (0, 1), "established");
    // UDP: the same, each datagram with the option.
    let mut lab = ingress("tc-dsr-udp", PROTO_UDP, 30053);
    let dgram = Pkt::udp(&client, &format!("{NODE}:30053"));
    for _ in 0..2 {
        let (rc, out) = lab.run("tc_ingress", &dgram.bytes());
        assert_eq!((rc, out.clone()), (REDIRECT, sent_on(dgram).bytes()));
        assert!(checksums_valid(&out));
    }
    assert_eq!(lab.table(MAP_CT_UDP).len(), 1);
    assert_eq!(lab.ns_counter(NS_NEW_DSR), 1);
}

#[test]
fn tc_dsr_without_room_answers_tcp_with_8_bytes_less_and_sends_udp_on_without_the_option() {
    let mut lab = ingress("tc-dsr-mtu", PROTO_TCP, 30080);
    let (client, np) = (format!("{CLIENT}:40000"), format!("{NODE}:30080"));
    assert_eq!(lab.run("tc_ingress", &Pkt::tcp(&client, &np, 0x02).bytes()).0, REDIRECT);
    // 1,500 bytes: the device's MTU, 8 too many with the option.
    let full = Pkt { len: 1460, ..Pkt::tcp(&client, &np, 0x10) };
    let (rc, out) = lab.run("tc_ingress", &full.bytes());
    let want = IcmpError {
        quote_len: Some(28),
        smac: full.dmac,
        dmac: full.smac,
        from_node: true,
        ..IcmpError::new(NODE, CLIENT, 3, 4, 1492, full)
    };
    assert_eq!((rc, out), (REDIRECT, want.bytes()), "fragmentation needed, next-hop MTU 1,492");
    assert_eq!((lab.ns_counter(NS_DROP_FRAG_NEEDED), lab.ns_counter(NS_ICMP_SENT)), (1, 1));
    let fits = Pkt { len: 1452, ..full };
    let (rc, out) = lab.run("tc_ingress", &fits.bytes());
    assert_eq!((rc, out), (REDIRECT, sent_on(fits).bytes()), "1,492 bytes and the option: 1,500");
    // UDP: a flow whose first datagram has room is DSR; a later one without room goes as it is, DNAT only.
    let mut lab = ingress("tc-dsr-mtu-udp", PROTO_UDP, 30053);
    let to = format!("{NODE}:30053");
    let small = Pkt::udp(&client, &to);
    assert_eq!(lab.run("tc_ingress", &small.bytes()).0, REDIRECT);
    let full = Pkt { len: 1472, ..small };
    let (rc, out) = lab.run("tc_ingress", &full.bytes());
    assert_eq!((rc, out), (REDIRECT, Pkt { ip_options: None, ..sent_on(full) }.bytes()));
    assert_eq!((lab.ns_counter(NS_DSR_NO_ROOM), lab.ns_counter(NS_DROP_FRAG_NEEDED)), (1, 0));
    // A flow whose first datagram has no room takes SNAT.
    let other = Pkt { len: 1472, ..Pkt::udp(&format!("{CLIENT}:40001"), &to) };
    let (rc, out) = lab.run("tc_ingress", &other.bytes());
    assert_eq!(rc, REDIRECT);
    assert_eq!(src_of(&out).ip().to_string(), NODE, "SNAT");
    assert_eq!((lab.ns_counter(NS_DSR_SNAT), lab.ns_counter(NS_NEW_DSR)), (1, 1));
}

#[test]
fn tc_dsr_ipv6_takes_snat_and_counts_it() {
    let mut lab = Lab::new("tc-dsr-v6");
    let flags = FLAG_SNAT_TO_FRONTEND | FLAG_DSR;
    lab.frontend("[2001:db8::1]:30080", PROTO_TCP, 2, &["[fd00:244:2::2]:8080"], flags);
    let syn = Pkt::tcp("[2001:db8::64]:40000", "[2001:db8::1]:30080", 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT);
    assert_eq!(src_of(&out).ip().to_string(), "2001:db8::1", "the node's address: SNAT");
    assert_eq!(
        (lab.ns_counter(NS_DSR_SNAT), lab.ns_counter(NS_NEW_SNAT), lab.ns_counter(NS_NEW_DSR)),
        (1, 1, 0)
    );
}

#[test]
fn tc_dsr_option_becomes_the_reply_entry_on_the_backends_node_only_under_dsr() {
    let lb = "198.51.100.10:80";
    let (client, pod) = (format!("{CLIENT}:40000"), format!("{LOCAL_POD}:8080"));
    let arriving = |flags: u8, option: [u8; 8]| Pkt {
        smac: NEXT_HOP_MAC,
        ttl: 63,
        ip_options: Some(option),
        ..Pkt::tcp(&client, &pod, flags)
    };
    let synack = Pkt::tcp(&pod, &client, 0x12);
    let mut other_type = dsr_option(lb);
    other_type[0] = 0x9a;
    // (case, the endpoint's value, the option, whether the reply leaves from the frontend)
    let cases = [
        ("under --dsr", LOCAL_ENDPOINT | LOCAL_DSR, dsr_option(lb), true),
        ("without --dsr", LOCAL_ENDPOINT, dsr_option(lb), false),
        ("another option", LOCAL_ENDPOINT | LOCAL_DSR, other_type, false),
    ];
    for (i, (case, value, option, learned)) in cases.into_iter().enumerate() {
        let mut lab = Lab::new(&format!("tc-dsr-learn-{i}"));
        lab.local_as(LOCAL_POD, value);
        let syn = arriving(0x02, option);
        let (rc, out) = lab.run("tc_ingress", &syn.bytes());
        assert_eq!((rc, out), (PASS, syn.bytes()), "{case}: delivered as it came, the option with it");
        let (rc, out) = lab.run("tc_egress", &synack.bytes());
        let want = if learned { synack.from(sa(lb)) } else { synack };
        assert_eq!((rc, out.clone()), (PASS, want.bytes()), "{case}: the pod's SYN-ACK");
        assert!(checksums_valid(&out));
        assert_eq!(lab.ns_counter(NS_DSR_LEARNED), u64::from(learned), "{case}");
        if learned {
            // The client's ACK, with the option: the entry moves to the established table.
            let ack = arriving(0x10, option);
            assert_eq!(lab.run("tc_ingress", &ack.bytes()).0, PASS);
            assert_eq!((lab.table(MAP_CT_SYN).len(), lab.table(MAP_CT_TCP).len()), (0, 1), "{case}");
            // Its entry lost (expired), the next packet's option writes it again, established.
            lab.age(u64::MAX / 2);
            let data = Pkt { len: 200, ..arriving(0x18, option) };
            assert_eq!(lab.run("tc_ingress", &data.bytes()).0, PASS);
            let reply = Pkt { len: 50, ..Pkt::tcp(&pod, &client, 0x18) };
            assert_eq!(lab.run("tc_egress", &reply.bytes()), (PASS, reply.from(sa(lb)).bytes()), "{case}");
            assert_eq!(lab.ns_counter(NS_DSR_LEARNED), 2, "{case}");
        } else {
            assert!(lab.conntrack().is_empty(), "{case}: {:?}", lab.conntrack());
        }
    }
}

#[test]
fn xdp_dsr_grows_the_frame_itself_and_leaves_what_does_not_fit_to_tc() {
    const XDP_PASS: u32 = 2;
    const XDP_TX: u32 = 3;
    let mut lab = ingress("xdp-dsr", PROTO_TCP, 30080);
    let (client, np) = (format!("{CLIENT}:40000"), format!("{NODE}:30080"));
    let syn = Pkt::tcp(&client, &np, 0x02);
    let (rc, out) = lab.run_xdp(&syn.bytes());
    assert_eq!((rc, out.clone()), (XDP_TX, sent_on(syn).bytes()), "the option written in XDP, out of eth");
    assert!(checksums_valid(&out));
    let ack = Pkt { len: 100, ..Pkt::tcp(&client, &np, 0x10).seq_ack(1001, 5001) };
    let (rc, out) = lab.run_xdp(&ack.bytes());
    assert_eq!((rc, out), (XDP_TX, sent_on(ack).bytes()));
    assert_eq!((lab.table(MAP_CT_SYN).len(), lab.table(MAP_CT_TCP).len()), (0, 1), "established, as in tc");
    assert_eq!((lab.ns_counter(lb_common::NS_XDP_TX), lab.ns_counter(NS_NEW_DSR)), (2, 1));
    // No room for the option: tc's, untouched (tc answers it with fragmentation needed).
    let full = Pkt { len: 1460, ..Pkt::tcp(&client, &np, 0x10) };
    let (rc, out) = lab.run_xdp(&full.bytes());
    assert_eq!((rc, out), (XDP_PASS, full.bytes()));
    assert_eq!(lab.ns_counter(lb_common::NS_XDP_TO_TC), 1);
}
