//! ICMP errors the SNAT path sends itself, where the stack's forwarding would have (it forwards past the
//! stack): time exceeded for a TTL or hop limit that would run out, "fragmentation needed" / "packet too
//! big" for a packet larger than the next hop's MTU, in both directions and both families, each compared
//! byte for byte with the error the test builds from scratch; none about an ICMP error; a rate.
use lb_common::{FLAG_SNAT_TO_FRONTEND, NS_DROP_FRAG_NEEDED, NS_ICMP_RATE_LIMITED, NS_ICMP_SENT, PROTO_TCP};

use super::{
    CLIENT, NEXT_HOP, NEXT_HOP_MAC, NODE, REDIRECT, REMOTE_POD, SHOT,
    lab::{Lab, sa},
    pkt::{IcmpError, Pkt, src_of},
};

/// The error the node sends about `about` (as it arrived from `smac`): from `src` to `dst`, back to the
/// MAC it came from, the IP header and 8 bytes quoted (48 bytes for IPv6).
fn answer(src: &str, dst: &str, kind: u8, code: u8, mtu: u32, about: Pkt) -> Vec<u8> {
    let quote_len = if about.src.is_ipv4() { 28 } else { 48 };
    IcmpError {
        quote_len: Some(quote_len),
        smac: about.dmac,
        dmac: about.smac,
        from_node: true,
        ..IcmpError::new(src, dst, kind, code, mtu, about)
    }
    .bytes()
}

#[test]
fn tc_snat_packet_larger_than_the_next_hops_mtu_is_answered_with_fragmentation_needed() {
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("tc-mtu", PROTO_TCP, 30080, &backend, false);
    lab.ip(&["link", "set", "eth", "mtu", "1280"]);
    let (client, np) = (format!("{CLIENT}:40000"), format!("{NODE}:30080"));
    assert_eq!(lab.run("tc_ingress", &Pkt::tcp(&client, &np, 0x02).bytes()).0, REDIRECT);
    let big = Pkt { len: 1400, ..Pkt::tcp(&client, &np, 0x10) };
    let (rc, out) = lab.run("tc_ingress", &big.bytes());
    assert_eq!(rc, REDIRECT, "answered, back out of the device it came in by");
    assert_eq!(
        out,
        answer(NODE, CLIENT, 3, 4, 1280, big),
        "from the node port's address, the next hop's MTU, quoting what the client sent"
    );
    assert_eq!((lab.ns_counter(NS_DROP_FRAG_NEEDED), lab.ns_counter(NS_ICMP_SENT)), (1, 1));
    // The client's next segments, sized to the MTU, are forwarded.
    let fits = Pkt { len: 1200, ..Pkt::tcp(&client, &np, 0x10) };
    let (rc, out) = lab.run("tc_ingress", &fits.bytes());
    assert_eq!(rc, REDIRECT);
    assert_eq!(src_of(&out).ip().to_string(), NODE, "translated as before");
    // A route's MTU counts where the stack's forwarding counts it (locked, or `ip_forward_use_pmtu`), the
    // device's MTU being larger.
    lab.ip(&["link", "set", "eth", "mtu", "1500"]);
    lab.ip(&["route", "replace", "10.244.2.0/24", "via", NEXT_HOP, "mtu", "lock", "1400"]);
    let (rc, out) = lab.run("tc_ingress", &big.bytes());
    assert_eq!((rc, out), (REDIRECT, answer(NODE, CLIENT, 3, 4, 1400, big)), "the route's MTU");
}

#[test]
fn tc_snat_ttl_running_out_is_answered_with_time_exceeded_in_both_directions() {
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("tc-ttl", PROTO_TCP, 30080, &backend, false);
    let (client, np) = (format!("{CLIENT}:40000"), format!("{NODE}:30080"));
    let syn = Pkt::tcp(&client, &np, 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT);
    let snat = src_of(&out);
    // The client's retransmitted SYN with TTL 1 (a traceroute to the node port).
    let last_hop = Pkt { ttl: 1, ..syn };
    let (rc, out) = lab.run("tc_ingress", &last_hop.bytes());
    assert_eq!((rc, out), (REDIRECT, answer(NODE, CLIENT, 11, 0, 0, last_hop)), "to the client");
    // The backend's SYN-ACK to the SNAT port with TTL 1: answered to the backend, from the SNAT address.
    let reply = Pkt { ttl: 1, smac: NEXT_HOP_MAC, ..Pkt::tcp(&backend, &snat.to_string(), 0x12) };
    let (rc, out) = lab.run("tc_ingress", &reply.bytes());
    assert_eq!((rc, out), (REDIRECT, answer(NODE, REMOTE_POD, 11, 0, 0, reply)), "to the backend");
    assert_eq!(lab.ns_counter(NS_ICMP_SENT), 2);
}

#[test]
fn tc_snat_ipv6_hop_limit_and_packet_too_big_are_answered() {
    let mut lab = Lab::new("tc-icmp6-send");
    lab.frontend("[2001:db8::1]:30080", PROTO_TCP, 2, &["[fd00:244:2::2]:8080"], FLAG_SNAT_TO_FRONTEND);
    let (client, np) = ("[2001:db8::64]:40000", "[2001:db8::1]:30080");
    assert_eq!(lab.run("tc_ingress", &Pkt::tcp(client, np, 0x02).bytes()).0, REDIRECT, "forwarded at 1500");
    let last_hop = Pkt { ttl: 1, ..Pkt::tcp(client, np, 0x10) };
    let (rc, out) = lab.run("tc_ingress", &last_hop.bytes());
    assert_eq!((rc, out), (REDIRECT, answer("2001:db8::1", "2001:db8::64", 3, 0, 0, last_hop)));
    lab.ip(&["link", "set", "eth", "mtu", "1280"]);
    let big = Pkt { len: 1400, ..Pkt::tcp(client, np, 0x10) };
    let (rc, out) = lab.run("tc_ingress", &big.bytes());
    assert_eq!(
        (rc, out),
        (REDIRECT, answer("2001:db8::1", "2001:db8::64", 2, 0, 1280, big)),
        "packet too big"
    );
}

#[test]
fn tc_snat_no_error_is_sent_about_an_icmp_error() {
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("tc-icmp-icmp", PROTO_TCP, 30080, &backend, false);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT);
    let snat = src_of(&out);
    // A router toward the backend reports the segment, its error arriving with TTL 1.
    let sent = Pkt { ttl: 63, ..syn.to(sa(&backend)).from(snat) };
    let err = IcmpError { ttl: 1, smac: NEXT_HOP_MAC, ..IcmpError::new(NEXT_HOP, NODE, 3, 4, 1400, sent) };
    assert_eq!(lab.run("tc_ingress", &err.bytes()).0, SHOT, "dropped, not answered");
    assert_eq!(lab.ns_counter(NS_ICMP_SENT), 0);
}

#[test]
fn tc_snat_errors_are_rate_limited() {
    const N: u64 = 1_000;
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("tc-icmp-rate", PROTO_TCP, 30080, &backend, false);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    assert_eq!(lab.run("tc_ingress", &syn.bytes()).0, REDIRECT);
    // 1,000 packets with TTL 1 in far less than the second the bucket takes to earn 1,000 tokens (the burst
    // is 50, then one a millisecond): most are dropped uncounted as sent.
    let last_hop = Pkt { ttl: 1, ..syn };
    let verdicts: Vec<u32> = (0..N).map(|_| lab.run("tc_ingress", &last_hop.bytes()).0).collect();
    let (sent, limited) = (lab.ns_counter(NS_ICMP_SENT), lab.ns_counter(NS_ICMP_RATE_LIMITED));
    assert_eq!(sent + limited, N, "each answered or counted");
    assert!(sent >= 50, "the burst is answered: {sent}");
    assert!(limited > 0, "the rest is over the rate: {sent} sent");
    assert_eq!(verdicts.iter().filter(|v| **v == SHOT).count() as u64, limited);
    // "Packet too big" is never limited (the kernel does not limit it: path MTU discovery must work).
    lab.ip(&["link", "set", "eth", "mtu", "1280"]);
    let big = Pkt { len: 1400, ..Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x10) };
    let (rc, out) = lab.run("tc_ingress", &big.bytes());
    assert_eq!((rc, out), (REDIRECT, answer(NODE, CLIENT, 3, 4, 1280, big)), "with the bucket empty");
}

#[test]
fn tc_snat_no_error_goes_to_a_multicast_broadcast_or_loopback_source() {
    let backend = format!("{REMOTE_POD}:8080");
    let mut lab = Lab::with_node_port("tc-icmp-src", PROTO_TCP, 30080, &backend, false);
    for source in ["224.0.0.5:40000", "255.255.255.255:40000", "0.0.0.0:40000", "127.0.0.1:40000"] {
        let last_hop = Pkt { ttl: 1, ..Pkt::tcp(source, &format!("{NODE}:30080"), 0x02) };
        assert_eq!(lab.run("tc_ingress", &last_hop.bytes()).0, SHOT, "{source}");
    }
    assert_eq!(lab.ns_counter(NS_ICMP_SENT), 0);
}
