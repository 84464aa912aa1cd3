//! The conntrack state machine, its tables and lifetimes, SNAT port choice and the ingress pre-filter, one
//! packet at a time: which table a flow's entries are in after each packet, their state bits, how long they
//! live (read back from the map against `CLOCK_BOOTTIME`), and what ageing an entry through the map does.
use lb_common::{
    ADDR_NODE, CT_CLOSED, CT_ESTABLISHED, CT_FIN_CLIENT, CT_FIN_SERVER, CT_SEEN_REPLY, CtKey, CtValue,
    DEFAULT_CT_TCP_CLOSE_S, DEFAULT_CT_TCP_CLOSE_WAIT_S, DEFAULT_CT_TCP_ESTABLISHED_S, DEFAULT_CT_TCP_SYN_S,
    DEFAULT_CT_UDP_S, DEFAULT_CT_UDP_STREAM_S, MAP_CT_SYN, MAP_CT_TCP, MAP_CT_UDP, NS_CT_INSERTED,
    NS_CT_REMOVED, NS_DROP_UNMATCHED, NS_ESTABLISHED, NS_PASS_NOT_SYN, NS_RST_OUTSIDE_WINDOW,
    NS_SNAT_PORT_KEPT, NS_SNAT_PORT_RETRIES, NatConfig, PROTO_TCP, PROTO_UDP, ct_evictions,
};

use super::{
    CLIENT, LOCAL_POD, NODE, PASS, REDIRECT, REMOTE_POD, SHOT,
    lab::{Lab, sa},
    pkt::{Pkt, src_of},
};

const S: u64 = 1_000_000_000;

use tierlb::datapath::marks::boottime_ns;

/// Where the flow's two entries are: (table, state bits of each, seconds each lives from now, rounded up).
fn where_(lab: &mut Lab) -> Vec<(&'static str, u16, u64)> {
    let now = boottime_ns();
    let mut out = Vec::new();
    for t in [MAP_CT_TCP, MAP_CT_SYN, MAP_CT_UDP] {
        for (_, v) in lab.table(t) {
            out.push((t, v.flags & lb_common::CT_STATE, v.expires_ns.saturating_sub(now).div_ceil(S)));
        }
    }
    out
}

/// Both entries in `table` with state `state`, living `secs` (within a second).
fn assert_both(lab: &mut Lab, table: &str, state: u16, secs: u32, what: &str) {
    let w = where_(lab);
    assert_eq!(w.len(), 2, "{what}: two entries: {w:?}");
    for (t, st, left) in &w {
        assert_eq!((*t, *st), (table, state), "{what}: {w:?}");
        assert!(
            (u64::from(secs) - 1..=u64::from(secs)).contains(left),
            "{what}: lives {left} s, want {secs}: {w:?}"
        );
    }
}

struct Conn {
    client: String,
    np: String,
    pod: String,
}

impl Conn {
    fn local(lab_tag: &str) -> (Lab, Self) {
        let lab = Lab::with_node_port(lab_tag, PROTO_TCP, 30080, &format!("{LOCAL_POD}:8080"), true);
        let c = Self {
            client: format!("{CLIENT}:40000"),
            np: format!("{NODE}:30080"),
            pod: format!("{LOCAL_POD}:8080"),
        };
        (lab, c)
    }
    /// A segment from the client (ingress), with `flags`, `seq`, `ack`.
    fn c(&self, flags: u8, seq: u32, ack: u32) -> (&'static str, Pkt) {
        ("tc_ingress", Pkt::tcp(&self.client, &self.np, flags).seq_ack(seq, ack))
    }
    /// A segment from the pod (egress).
    fn p(&self, flags: u8, seq: u32, ack: u32) -> (&'static str, Pkt) {
        ("tc_egress", Pkt::tcp(&self.pod, &self.client, flags).seq_ack(seq, ack))
    }
}

/// A segment and the program it goes through.
type Segment = (&'static str, Pkt);
/// A step of a case: its name, the segment, the state both entries have after it and their lifetime.
type Step = (&'static str, fn(&Conn) -> Segment, u16, u32);

const SYN: u8 = 0x02;
const SYN_ACK: u8 = 0x12;
const ACK: u8 = 0x10;
const FIN_ACK: u8 = 0x11;
const RST: u8 = 0x04;
const RST_ACK: u8 = 0x14;

fn send(lab: &mut Lab, (prog, p): (&str, Pkt)) -> u32 {
    lab.run(prog, &p.bytes()).0
}

/// The handshake: the SYN-ACK alone leaves the flow half-open (netfilter waits for the client's ACK), and so
/// does an ACK that does not acknowledge the SYN-ACK; the client's ACK establishes it and moves both entries
/// to the established table.
#[test]
fn tc_tcp_is_established_by_the_clients_ack_not_by_the_syn_ack() {
    let (mut lab, c) = Conn::local("tc-st-hs");
    let steps: [(&str, Segment, &str, u16, u32); 4] = [
        ("SYN", c.c(SYN, 1000, 0), MAP_CT_SYN, 0, DEFAULT_CT_TCP_SYN_S),
        ("SYN-ACK", c.p(SYN_ACK, 5000, 1001), MAP_CT_SYN, CT_SEEN_REPLY, DEFAULT_CT_TCP_SYN_S),
        // A blind ACK (a spoofed source does not see the SYN-ACK): its number is not the SYN-ACK's + 1.
        ("blind ACK", c.c(ACK, 1001, 7777), MAP_CT_SYN, CT_SEEN_REPLY, DEFAULT_CT_TCP_SYN_S),
        (
            "ACK",
            c.c(ACK, 1001, 5001),
            MAP_CT_TCP,
            CT_SEEN_REPLY | CT_ESTABLISHED,
            DEFAULT_CT_TCP_ESTABLISHED_S,
        ),
    ];
    for (what, p, table, state, secs) in steps {
        assert_eq!(send(&mut lab, p), PASS, "{what}");
        assert_both(&mut lab, table, state, secs, &format!("after the {what}"));
    }
    assert_eq!(lab.ns_counter(NS_ESTABLISHED), 1);
    // Data both ways keeps it there.
    assert_eq!(send(&mut lab, c.p(0x18, 5001, 1001)), PASS);
    assert_both(&mut lab, MAP_CT_TCP, CT_SEEN_REPLY | CT_ESTABLISHED, DEFAULT_CT_TCP_ESTABLISHED_S, "data");
}

/// A client that sends SYNs and drops the SYN-ACKs: its half-open flow dies after the SYN timeout (aged
/// through the map), and a later stray ACK is not taken for it.
#[test]
fn tc_a_half_open_flow_expires_on_the_syn_timeout() {
    let (mut lab, c) = Conn::local("tc-st-half");
    assert_eq!(send(&mut lab, c.c(SYN, 1000, 0)), PASS);
    assert_eq!(send(&mut lab, c.p(SYN_ACK, 5000, 1001)), PASS);
    lab.age(u64::from(DEFAULT_CT_TCP_SYN_S) * S);
    let ack = Pkt::tcp(&c.client, &c.np, ACK).seq_ack(1001, 5001);
    let (rc, out) = lab.run("tc_ingress", &ack.bytes());
    assert_eq!((rc, out), (PASS, ack.bytes()), "no live flow: passed untranslated");
    assert_eq!(lab.ns_counter(NS_PASS_NOT_SYN), 1);
    assert_eq!(lab.ns_counter(NS_ESTABLISHED), 0);
}

/// FIN from one side half-closes (kube-proxy's raised CLOSE_WAIT); FIN from the other closes; so does a RST
/// inside the window, while one outside it is passed on and changes nothing.
#[test]
fn tc_fin_and_rst_move_the_state_of_both_entries() {
    let established = CT_SEEN_REPLY | CT_ESTABLISHED;
    let cases: [(&str, &[Step]); 4] = [
        (
            "client FIN, then the pod's",
            &[
                ("client FIN", |c| c.c(FIN_ACK, 1001, 5001), CT_FIN_CLIENT, DEFAULT_CT_TCP_CLOSE_WAIT_S),
                (
                    "pod FIN",
                    |c| c.p(FIN_ACK, 5001, 1002),
                    CT_FIN_CLIENT | CT_FIN_SERVER | CT_CLOSED,
                    DEFAULT_CT_TCP_CLOSE_S,
                ),
            ],
        ),
        (
            "pod FIN only",
            &[("pod FIN", |c| c.p(FIN_ACK, 5001, 1001), CT_FIN_SERVER, DEFAULT_CT_TCP_CLOSE_WAIT_S)],
        ),
        (
            "the client's RST at the acknowledged number",
            &[("RST", |c| c.c(RST, 1001, 0), CT_CLOSED, DEFAULT_CT_TCP_CLOSE_S)],
        ),
        (
            "the pod's RST after data in flight",
            &[("RST", |c| c.p(RST_ACK, 9000, 1001), CT_CLOSED, DEFAULT_CT_TCP_CLOSE_S)],
        ),
    ];
    for (i, (name, steps)) in cases.iter().enumerate() {
        let (mut lab, c) = Conn::local(&format!("tc-st-fin{i}"));
        for p in [c.c(SYN, 1000, 0), c.p(SYN_ACK, 5000, 1001), c.c(ACK, 1001, 5001)] {
            assert_eq!(send(&mut lab, p), PASS);
        }
        for (what, step, state, secs) in *steps {
            assert_eq!(send(&mut lab, step(&c)), PASS, "{name}: {what}");
            assert_both(&mut lab, MAP_CT_TCP, established | state, *secs, &format!("{name}: after {what}"));
        }
        assert_eq!(lab.ns_counter(NS_RST_OUTSIDE_WINDOW), 0, "{name}");
    }
    // Out of the window: a blind RST (a guess far from the sequence numbers) from either side.
    for (i, blind) in [("client", 0), ("pod", 1)].iter().enumerate() {
        let (mut lab, c) = Conn::local(&format!("tc-st-blind{i}"));
        for p in [c.c(SYN, 1000, 0), c.p(SYN_ACK, 5000, 1001), c.c(ACK, 1001, 5001)] {
            assert_eq!(send(&mut lab, p), PASS);
        }
        let rst = if blind.1 == 0 { c.c(RST, 2_000_000_000, 0) } else { c.p(RST, 2_000_000_000, 0) };
        let (prog, p) = rst;
        let (rc, out) = lab.run(prog, &p.bytes());
        let translated = if blind.1 == 0 { p.to(sa(&c.pod)) } else { p.from(sa(&c.np)) };
        assert_eq!((rc, out), (PASS, translated.bytes()), "{}: passed on translated", blind.0);
        assert_eq!(lab.ns_counter(NS_RST_OUTSIDE_WINDOW), 1, "{}", blind.0);
        assert_both(&mut lab, MAP_CT_TCP, established, DEFAULT_CT_TCP_ESTABLISHED_S, blind.0);
    }
}

/// UDP flows are in a table of their own; one exchange lives netfilter's UDP timeout, a stream (the
/// client again after a reply) its stream timeout.
#[test]
fn tc_udp_flows_live_apart_with_netfilters_timeouts() {
    let mut lab = Lab::with_node_port("tc-st-udp", PROTO_UDP, 30053, &format!("{LOCAL_POD}:53"), true);
    let (client, np, pod) = (format!("{CLIENT}:40000"), format!("{NODE}:30053"), format!("{LOCAL_POD}:53"));
    assert_eq!(lab.run("tc_ingress", &Pkt::udp(&client, &np).bytes()).0, PASS);
    assert_both(&mut lab, MAP_CT_UDP, 0, DEFAULT_CT_UDP_S, "the query");
    assert_eq!(lab.run("tc_egress", &Pkt::udp(&pod, &client).bytes()).0, PASS);
    assert_both(&mut lab, MAP_CT_UDP, CT_SEEN_REPLY, DEFAULT_CT_UDP_S, "the answer");
    assert_eq!(lab.run("tc_ingress", &Pkt::udp(&client, &np).bytes()).0, PASS);
    assert_both(&mut lab, MAP_CT_UDP, CT_SEEN_REPLY | CT_ESTABLISHED, DEFAULT_CT_UDP_STREAM_S, "a stream");
}

/// A full half-open table evicts half-open flows only: an established flow outlives a SYN flood many times
/// the table's size.
#[test]
fn tc_a_syn_flood_evicts_half_open_flows_only() {
    let mut lab = Lab::sized("tc-st-flood", &[(MAP_CT_SYN, 64)]);
    lab.frontend(
        &format!("{NODE}:30080"),
        PROTO_TCP,
        2,
        &[&format!("{LOCAL_POD}:8080")],
        lb_common::FLAG_SNAT_TO_FRONTEND,
    );
    lab.local(LOCAL_POD);
    let c = Conn {
        client: format!("{CLIENT}:40000"),
        np: format!("{NODE}:30080"),
        pod: format!("{LOCAL_POD}:8080"),
    };
    for p in [c.c(SYN, 1000, 0), c.p(SYN_ACK, 5000, 1001), c.c(ACK, 1001, 5001)] {
        assert_eq!(send(&mut lab, p), PASS);
    }
    for port in 0..1_000u16 {
        let syn = Pkt::tcp(&format!("192.0.2.77:{}", 10_000 + port), &c.np, SYN);
        assert_eq!(lab.run("tc_ingress", &syn.bytes()).0, PASS);
    }
    assert!(lab.table(MAP_CT_SYN).len() <= 64);
    let data = Pkt::tcp(&c.client, &c.np, 0x18).seq_ack(1001, 5001);
    let (rc, out) = lab.run("tc_ingress", &data.bytes());
    assert_eq!((rc, out), (PASS, data.to(sa(&c.pod)).bytes()), "the established flow is still translated");
    assert_eq!(lab.table(MAP_CT_TCP).len(), 2);
    // The evictions, as status and /metrics derive them: the half-open table's are the flood's 2,000 entries
    // (two a flow) less the 64 or fewer it holds; none in the established table.
    let evicted = |lab: &mut Lab, table: u32, name: &str| {
        let entries = lab.table(name).len() as u64;
        let (inserted, removed) =
            (lab.ns_counter(NS_CT_INSERTED + table), lab.ns_counter(NS_CT_REMOVED + table));
        (inserted, removed, ct_evictions(inserted, removed, entries))
    };
    let (inserted, removed, syn_evicted) = evicted(&mut lab, 1, MAP_CT_SYN);
    assert_eq!(
        (inserted, removed),
        (2 + 2_000, 2),
        "the handshake's two entries moved out, the flood's written"
    );
    assert!((2_000 - 64..=2_000).contains(&syn_evicted), "{syn_evicted} evicted from the half-open table");
    assert_eq!(
        evicted(&mut lab, 0, MAP_CT_TCP),
        (2, 0, 0),
        "the established flow's two entries, none evicted"
    );
}

/// SNAT keeps the client's port when it is one of the SNAT ports and the (backend, node address, port)
/// tuple is free; a second client on the same port gets another; a port in the node's ephemeral range is
/// never kept.
#[test]
fn tc_snat_keeps_the_clients_port_when_the_tuple_is_free() {
    let mut lab = Lab::with_node_port("tc-st-port", PROTO_TCP, 30080, &format!("{REMOTE_POD}:8080"), false);
    let ports = NatConfig::default().snat_ports();
    let np = format!("{NODE}:30080");
    let cases = [
        ("a free port among the SNAT ports", "192.0.2.100:5353", Some(5353)),
        ("the same port from another client", "192.0.2.101:5353", None),
        ("a port of the node's ephemeral range", "192.0.2.102:40000", None),
        ("a node port", "192.0.2.103:30080", None),
    ];
    for (what, client, kept) in cases {
        let (rc, out) = lab.run("tc_ingress", &Pkt::tcp(client, &np, SYN).bytes());
        assert_eq!(rc, REDIRECT, "{what}");
        let got = src_of(&out).port();
        assert!(ports.contains(got), "{what}: {got} is an SNAT port");
        match kept {
            Some(p) => assert_eq!(got, p, "{what}"),
            None => assert_ne!(got, sa(client).port(), "{what}"),
        }
    }
    assert_eq!(lab.ns_counter(NS_SNAT_PORT_KEPT), 1);
    assert!(lab.ns_counter(NS_SNAT_PORT_RETRIES) >= 1, "the second client's own port was taken");
}

/// The pre-filter and load-balancer IPs on no interface of the node: a packet to one that matches no flow
/// and starts none is dropped (the stack would route it back to the router); the node's own addresses and
/// addresses the agent did not write are passed on untouched.
#[test]
fn tc_unmatched_packets_to_a_load_balancer_ip_are_dropped_not_routed_back() {
    let mut lab = Lab::new("tc-st-lbip");
    let lb = "198.51.100.10";
    lab.frontend(&format!("{lb}:80"), PROTO_TCP, 2, &[&format!("{LOCAL_POD}:8080")], 0);
    lab.local(LOCAL_POD);
    let cases = [
        (
            "a SYN to the LB IP's port",
            Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{lb}:80"), SYN),
            PASS,
            0,
        ),
        (
            "an ACK of no flow to the LB IP",
            Pkt::tcp(&format!("{CLIENT}:40001"), &format!("{lb}:80"), ACK),
            SHOT,
            1,
        ),
        (
            "a SYN to a port of the LB IP no Service has",
            Pkt::tcp(&format!("{CLIENT}:40002"), &format!("{lb}:81"), SYN),
            SHOT,
            2,
        ),
        ("UDP to the LB IP", Pkt::udp(&format!("{CLIENT}:40003"), &format!("{lb}:53")), SHOT, 3),
        (
            "an ACK of no flow to the node",
            Pkt::tcp(&format!("{CLIENT}:40004"), &format!("{NODE}:22"), ACK),
            PASS,
            3,
        ),
        (
            "to an address not in the pre-filter",
            Pkt::tcp(&format!("{CLIENT}:40005"), "203.0.113.9:80", ACK),
            PASS,
            3,
        ),
    ];
    for (what, p, verdict, dropped) in cases {
        let (rc, out) = lab.run("tc_ingress", &p.bytes());
        assert_eq!(rc, verdict, "{what}");
        if verdict == PASS && !what.starts_with("a SYN") {
            assert_eq!(out, p.bytes(), "{what}: untouched");
        }
        assert_eq!(lab.ns_counter(NS_DROP_UNMATCHED), dropped, "{what}");
    }
    // The LB IP marked as the node's (kube-vip puts it on an interface): what is not translated is the stack's.
    lab.addr(lb, ADDR_NODE);
    let p = Pkt::tcp(&format!("{CLIENT}:40006"), &format!("{lb}:81"), SYN);
    assert_eq!(lab.run("tc_ingress", &p.bytes()), (PASS, p.bytes()));
    let ct: Vec<(CtKey, CtValue)> = lab.conntrack();
    assert_eq!(ct.len(), 2, "only the first SYN's flow: {ct:?}");
}
