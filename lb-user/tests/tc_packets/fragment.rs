//! Fragments of translated flows, IPv4 and IPv6 (a Fragment header): the later fragments take the first
//! one's translation (its ports kept for them), in both directions and through SNAT; fragments that are not a
//! translated flow's, or arrive ahead of their first fragment, and IPv6 with other extension headers pass
//! untouched and are counted.
use lb_common::{FLAG_SNAT_TO_FRONTEND, NS_PASS_FRAGMENT, PROTO_UDP};

use super::{
    CLIENT, LOCAL_POD, NEXT_HOP_MAC, NODE, NODE_MAC, PASS, REDIRECT, REMOTE_POD,
    lab::{Lab, sa},
    pkt::{Pkt, fragments, src_of},
};

/// A UDP datagram of 100 payload bytes from `client` (port 40000) to the node port 30053 of `node`.
fn datagram_of(client: &str, node: &str) -> Pkt {
    Pkt { len: 100, ..Pkt::udp(&sa_of(client, 40000), &sa_of(node, 30053)) }
}

/// `ip:port`, bracketed for IPv6.
fn sa_of(ip: &str, port: u16) -> String {
    if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") }
}

/// The IPv4 datagram, to be fragmented at 24.
fn datagram() -> Pkt {
    datagram_of(CLIENT, NODE)
}

/// The IPv6 client, node address and local pod of the lab.
const V6: (&str, &str, &str) = ("2001:db8::64", "2001:db8::1", "fd00:244:1::2");

#[test]
fn tc_fragments_of_a_datagram_to_a_local_pod_and_of_its_reply_follow_their_first_fragment() {
    for (family, (client, node, pod_ip)) in [("IPv4", (CLIENT, NODE, LOCAL_POD)), ("IPv6", V6)] {
        let mut lab = Lab::new("frag-local");
        let pod = sa_of(pod_ip, 53);
        lab.frontend(&sa_of(node, 30053), PROTO_UDP, 2, &[&pod], FLAG_SNAT_TO_FRONTEND);
        lab.local(pod_ip);
        let q = datagram_of(client, node);
        let want = fragments(&q.to(sa(&pod)), 24, 7);
        for (i, piece) in fragments(&q, 24, 7).iter().enumerate() {
            let (rc, out) = lab.run("tc_ingress", piece);
            assert_eq!(
                (rc, &out),
                (PASS, &want[i]),
                "{family} fragment {i}: DNAT to the pod (the first's UDP checksum covers both)"
            );
        }
        let reply = Pkt { len: 100, ..Pkt::udp(&pod, &sa_of(client, 40000)) };
        let want = fragments(&reply.from(sa(&sa_of(node, 30053))), 24, 7);
        for (i, piece) in fragments(&reply, 24, 7).iter().enumerate() {
            let (rc, out) = lab.run("tc_egress", piece);
            assert_eq!((rc, &out), (PASS, &want[i]), "{family} reply fragment {i}: from the node port");
        }
        assert_eq!(lab.ns_counter(NS_PASS_FRAGMENT), 0, "{family}");
    }
}

#[test]
fn tc_fragments_through_snat_take_the_first_fragments_port() {
    let mut lab = Lab::new("frag-snat");
    let backend = format!("{REMOTE_POD}:53");
    lab.frontend(&format!("{NODE}:30053"), PROTO_UDP, 2, &[&backend], FLAG_SNAT_TO_FRONTEND);
    let q = datagram();
    let [first, later] = fragments(&q, 24, 7);
    let (rc, out) = lab.run("tc_ingress", &first);
    assert_eq!(rc, REDIRECT);
    let snat = src_of(&out);
    let want = fragments(
        &Pkt { smac: NODE_MAC, dmac: NEXT_HOP_MAC, ttl: 63, ..q.to(sa(&backend)).from(snat) },
        24,
        7,
    );
    assert_eq!(out, want[0]);
    let (rc, out) = lab.run("tc_ingress", &later);
    assert_eq!(
        (rc, out),
        (REDIRECT, want[1].clone()),
        "the later fragment: same addresses, sent on the same way"
    );
}

#[test]
fn tc_fragments_not_of_a_translated_flow_or_ahead_of_their_first_pass_untouched_and_counted() {
    for (family, (client, node, pod)) in [("IPv4", (CLIENT, NODE, LOCAL_POD)), ("IPv6", V6)] {
        let mut lab = Lab::new("frag-other");
        lab.frontend(&sa_of(node, 30053), PROTO_UDP, 2, &[&sa_of(pod, 53)], FLAG_SNAT_TO_FRONTEND);
        lab.local(pod);
        // Ahead of its first fragment: no ports to translate it by.
        let [first, later] = fragments(&datagram_of(client, node), 24, 7);
        let (rc, out) = lab.run("tc_ingress", &later);
        assert_eq!((rc, &out), (PASS, &later), "{family}");
        assert_eq!(lab.ns_counter(NS_PASS_FRAGMENT), 1, "{family}: counted");
        assert_ne!(
            lab.run("tc_ingress", &first).1,
            first,
            "{family}: its first fragment is still translated"
        );
        // A datagram to a port of the node that is no frontend (another id: another datagram of the same
        // client to the same address): neither fragment is touched.
        let other = Pkt { len: 100, ..Pkt::udp(&sa_of(client, 40001), &sa_of(node, 5353)) };
        for piece in fragments(&other, 24, 8) {
            let (rc, out) = lab.run("tc_ingress", &piece);
            assert_eq!((rc, &out), (PASS, &piece), "{family}");
        }
    }
}

/// IPv6 with an extension header other than one Fragment header before UDP (hop-by-hop options): not
/// parsed, passed untouched and counted, even to a frontend; to a multicast group (MLD), not counted.
#[test]
fn tc_ipv6_with_another_extension_header_passes_untouched_and_counted() {
    let (client, node, pod) = V6;
    let mut lab = Lab::new("frag-hbh");
    lab.frontend(&sa_of(node, 30053), PROTO_UDP, 2, &[&sa_of(pod, 53)], FLAG_SNAT_TO_FRONTEND);
    lab.local(pod);
    let mut p = datagram_of(client, node).bytes();
    // Payload length + 8; next header: hop-by-hop (0), which names UDP and pads itself to 8 bytes (PadN).
    let len = u16::from_be_bytes([p[18], p[19]]) + 8;
    p[18..20].copy_from_slice(&len.to_be_bytes());
    p[20] = 0;
    p.splice(54..54, [PROTO_UDP, 0, 1, 4, 0, 0, 0, 0]);
    let (rc, out) = lab.run("tc_ingress", &p);
    assert_eq!((rc, &out), (PASS, &p));
    assert_eq!(lab.ns_counter(NS_PASS_FRAGMENT), 1, "counted");
    // To a multicast group (an MLD report has a hop-by-hop header): never a frontend's, passed uncounted.
    p[38..54].copy_from_slice(&"ff02::16".parse::<std::net::Ipv6Addr>().unwrap().octets());
    let (rc, out) = lab.run("tc_ingress", &p);
    assert_eq!((rc, &out), (PASS, &p));
    assert_eq!(lab.ns_counter(NS_PASS_FRAGMENT), 1, "a multicast packet is not counted");
}
