//! IPv4 fragments of translated flows: the later fragments take the first one's translation (its ports
//! kept for them), in both directions and through SNAT; fragments that are not a translated flow's, or
//! arrive ahead of their first fragment, pass untouched and are counted.
use lb_common::{FLAG_SNAT_TO_FRONTEND, NS_PASS_FRAGMENT, PROTO_UDP};

use super::{
    CLIENT, LOCAL_POD, NEXT_HOP_MAC, NODE, NODE_MAC, PASS, REDIRECT, REMOTE_POD,
    lab::{Lab, sa},
    pkt::{Pkt, fragments, src_of},
};

/// A UDP datagram of 100 payload bytes from the client to the node port 30053, in two fragments at 24.
fn datagram() -> Pkt {
    Pkt { len: 100, ..Pkt::udp(&format!("{CLIENT}:40000"), &format!("{NODE}:30053")) }
}

#[test]
fn tc_fragments_of_a_datagram_to_a_local_pod_and_of_its_reply_follow_their_first_fragment() {
    let mut lab = Lab::new("frag-local");
    let pod = format!("{LOCAL_POD}:53");
    lab.frontend(&format!("{NODE}:30053"), PROTO_UDP, 2, &[&pod], FLAG_SNAT_TO_FRONTEND);
    lab.local(LOCAL_POD);
    let q = datagram();
    let want = fragments(&q.to(sa(&pod)), 24, 7);
    for (i, piece) in fragments(&q, 24, 7).iter().enumerate() {
        let (rc, out) = lab.run("tc_ingress", piece);
        assert_eq!(
            (rc, &out),
            (PASS, &want[i]),
            "fragment {i}: DNAT to the pod (the first's UDP checksum covers both)"
        );
    }
    let reply = Pkt { len: 100, ..Pkt::udp(&pod, &format!("{CLIENT}:40000")) };
    let want = fragments(&reply.from(sa(&format!("{NODE}:30053"))), 24, 7);
    for (i, piece) in fragments(&reply, 24, 7).iter().enumerate() {
        let (rc, out) = lab.run("tc_egress", piece);
        assert_eq!((rc, &out), (PASS, &want[i]), "reply fragment {i}: from the node port");
    }
    assert_eq!(lab.ns_counter(NS_PASS_FRAGMENT), 0);
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
    let mut lab = Lab::with_node_port("frag-other", PROTO_UDP, 30053, &format!("{LOCAL_POD}:53"), true);
    // Ahead of its first fragment: no ports to translate it by.
    let [first, later] = fragments(&datagram(), 24, 7);
    let (rc, out) = lab.run("tc_ingress", &later);
    assert_eq!((rc, &out), (PASS, &later));
    assert_eq!(lab.ns_counter(NS_PASS_FRAGMENT), 1, "counted");
    assert_ne!(lab.run("tc_ingress", &first).1, first, "its first fragment is still translated");
    // A datagram to a port of the node that is no frontend (another id: another datagram of the same client
    // to the same address): neither fragment is touched.
    let other = Pkt { len: 100, ..Pkt::udp(&format!("{CLIENT}:40001"), &format!("{NODE}:5353")) };
    for piece in fragments(&other, 24, 8) {
        let (rc, out) = lab.run("tc_ingress", &piece);
        assert_eq!((rc, &out), (PASS, &piece));
    }
}
