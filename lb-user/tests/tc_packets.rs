//! Packet-level tests of the north-south tc programs through `BPF_PROG_TEST_RUN` (Calico's `felix/bpf/ut` is
//! the model): a crafted packet in, the rewritten packet out, compared byte for byte with the packet the test
//! builds itself, whose checksums an independent RFC 1071 routine computes. The programs run in a network
//! namespace the test made (their FIB lookups see its routes), with maps the test fills. Needs root.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        Array, HashMap,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{SchedClassifier, TestRun, TestRunOptions},
};
use lb_common::{
    Backend, CT_DIR_IN, CT_DIR_OUT, CtAddr, CtKey, CtValue, FLAG_EMPTY_IS_DROP, FLAG_POLICY_LOCAL,
    FLAG_SNAT_TO_FRONTEND, FLAG_SOURCE_RANGES, FrontendKey, FrontendValue, MAP_CONNTRACK, MAP_FRONTENDS,
    MAP_LOCAL_BACKENDS, MAP_NAT_CONFIG, MAP_SLOTS, MAP_SOURCE_RANGES, NatConfig, PROTO_TCP, PROTO_UDP,
    SCOPE_OUTSIDE, SOURCE_RANGE_FRONTEND_BITS, SlotKey, SourceRangeKey, TierRange,
};
use lb_testkit::sandbox::NetNs;
use tierlb::datapath::addr;

/// `TC_ACT_UNSPEC`: passed on (to the next program, or the stack).
const PASS: u32 = u32::MAX;
const SHOT: u32 = 2;
const REDIRECT: u32 = 7;

const CLIENT: &str = "192.0.2.100";
const NODE: &str = "192.0.2.1";
const NEXT_HOP: &str = "192.0.2.2";
const LOCAL_POD: &str = "10.244.1.2";
const REMOTE_POD: &str = "10.244.2.2";
const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const NEXT_HOP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];

// ---- an independent packet builder and checksum -------------------------------------------------------------

/// RFC 1071 one's-complement sum of `data` folded to 16 bits (not yet inverted).
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], 0]) };
        acc += u32::from(w);
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

fn checksum(data: &[u8], acc: u32) -> u16 {
    !(sum16(data, acc) as u16)
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

#[derive(Clone, Copy)]
struct Pkt {
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
    /// TCP flags.
    flags: u8,
    ttl: u8,
    smac: [u8; 6],
    dmac: [u8; 6],
    /// UDP over IPv4 without a checksum (0).
    no_udp_csum: bool,
}

impl Pkt {
    fn tcp(src: &str, dst: &str, flags: u8) -> Self {
        Self {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto: PROTO_TCP,
            flags,
            ttl: 64,
            smac: CLIENT_MAC,
            dmac: NODE_MAC,
            no_udp_csum: false,
        }
    }
    fn udp(src: &str, dst: &str) -> Self {
        Self { proto: PROTO_UDP, flags: 0, ..Self::tcp(src, dst, 0) }
    }
    fn to(self, dst: SocketAddr) -> Self {
        Self { dst, ..self }
    }
    fn from(self, src: SocketAddr) -> Self {
        Self { src, ..self }
    }

    /// The packet's bytes with every checksum computed from scratch.
    fn bytes(&self) -> Vec<u8> {
        let payload = b"tierlb north-south";
        let mut l4 = Vec::new();
        l4.extend_from_slice(&self.src.port().to_be_bytes());
        l4.extend_from_slice(&self.dst.port().to_be_bytes());
        if self.proto == PROTO_TCP {
            l4.extend_from_slice(&1000u32.to_be_bytes()); // seq
            l4.extend_from_slice(&0u32.to_be_bytes()); // ack
            l4.push(5 << 4);
            l4.push(self.flags);
            l4.extend_from_slice(&65535u16.to_be_bytes());
            l4.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent
        } else {
            l4.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        }
        l4.extend_from_slice(payload);
        let (s, d) = (octets(self.src.ip()), octets(self.dst.ip()));
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&s);
        pseudo.extend_from_slice(&d);
        if self.src.is_ipv4() {
            pseudo.extend_from_slice(&[0, self.proto]);
            pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        } else {
            pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, self.proto]);
        }
        let mut c = checksum(&l4, sum16(&pseudo, 0));
        if self.proto == PROTO_UDP && c == 0 {
            c = 0xffff;
        }
        if !(self.proto == PROTO_UDP && self.no_udp_csum) {
            let at = if self.proto == PROTO_TCP { 16 } else { 6 };
            l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        let mut out = Vec::new();
        out.extend_from_slice(&self.dmac);
        out.extend_from_slice(&self.smac);
        if self.src.is_ipv4() {
            out.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
            ip.extend_from_slice(&[0x12, 0x34, 0x40, 0]); // id, DF
            ip.extend_from_slice(&[self.ttl, self.proto, 0, 0]);
            ip.extend_from_slice(&s);
            ip.extend_from_slice(&d);
            let c = checksum(&ip, 0);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            out.extend_from_slice(&ip);
        } else {
            out.extend_from_slice(&0x86ddu16.to_be_bytes());
            out.extend_from_slice(&[0x60, 0, 0, 0]);
            out.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            out.extend_from_slice(&[self.proto, self.ttl]);
            out.extend_from_slice(&s);
            out.extend_from_slice(&d);
        }
        out.extend_from_slice(&l4);
        out
    }
}

/// Whether every checksum of `p` (IPv4 header, TCP/UDP with its pseudo-header) verifies, computed here.
fn checksums_valid(p: &[u8]) -> bool {
    let v4 = u16::from_be_bytes([p[12], p[13]]) == 0x0800;
    let (l3_len, proto, s, d) =
        if v4 { (20, p[23], &p[26..30], &p[30..34]) } else { (40, p[20], &p[22..38], &p[38..54]) };
    if v4 && checksum(&p[14..34], 0) != 0 {
        return false;
    }
    let l4 = &p[14 + l3_len..];
    if proto == PROTO_UDP && v4 && l4[6..8] == [0, 0] {
        return true; // no checksum
    }
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(s);
    pseudo.extend_from_slice(d);
    if v4 {
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    } else {
        pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, proto]);
    }
    checksum(l4, sum16(&pseudo, 0)) == 0
}

fn src_of(p: &[u8]) -> SocketAddr {
    let v4 = u16::from_be_bytes([p[12], p[13]]) == 0x0800;
    if v4 {
        let ip = Ipv4Addr::new(p[26], p[27], p[28], p[29]);
        SocketAddr::new(ip.into(), u16::from_be_bytes([p[34], p[35]]))
    } else {
        let o: [u8; 16] = p[22..38].try_into().unwrap();
        SocketAddr::new(Ipv6Addr::from(o).into(), u16::from_be_bytes([p[54], p[55]]))
    }
}

// ---- the programs in a namespace of their own -----------------------------------------------------------------

struct Lab {
    ebpf: Ebpf,
    /// The namespace the test thread runs in; its `eth` device is what the packets "arrive" on.
    _ns: NetNs,
    ifindex: u32,
    next_svc: u32,
}

impl Lab {
    fn new(tag: &str) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the packet tests load BPF programs and make a netns: run as root"
        );
        let ns = NetNs::new(tag).expect("netns");
        // A node with one uplink (`eth`, its peer is the "next hop") and forwarding on, as a Kubernetes node.
        ns.ip(&[
            "link",
            "add",
            "eth",
            "address",
            "02:00:00:00:00:01",
            "type",
            "veth",
            "peer",
            "name",
            "wire",
        ])
        .unwrap();
        ns.ip(&["link", "set", "wire", "address", "02:00:00:00:00:02"]).unwrap();
        ns.ip(&["addr", "add", &format!("{NODE}/24"), "dev", "eth"]).unwrap();
        ns.ip(&["addr", "add", "2001:db8::1/64", "dev", "eth", "nodad"]).unwrap();
        ns.ip(&["link", "set", "eth", "up"]).unwrap();
        ns.ip(&["link", "set", "wire", "up"]).unwrap();
        ns.ip(&["route", "add", "10.244.2.0/24", "via", NEXT_HOP]).unwrap();
        ns.ip(&[
            "neigh",
            "replace",
            NEXT_HOP,
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "eth",
            "nud",
            "permanent",
        ])
        .unwrap();
        ns.ip(&["neigh", "replace", CLIENT, "lladdr", "02:00:00:00:00:64", "dev", "eth", "nud", "permanent"])
            .unwrap();
        ns.enter_current_thread().expect("setns");
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("ip_forward");
        let ifindex = nix::net::if_::if_nametoindex("eth").expect("ifindex");
        let object = tierlb::datapath::ebpf::embedded_object().expect("built with the BPF object");
        let mut ebpf = EbpfLoader::new().load(object).expect("load object");
        for name in ["tc_ingress", "tc_egress"] {
            let p: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            p.load().unwrap_or_else(|e| panic!("verifying {name}: {e:?}"));
        }
        Self { ebpf, _ns: ns, ifindex, next_svc: 1 }
    }

    fn map(&mut self, name: &str) -> &mut aya::maps::Map {
        self.ebpf.map_mut(name).unwrap_or_else(|| panic!("map {name}"))
    }

    /// An outside frontend at `fe` over `proto` whose one tier `tier` holds `backends`.
    fn frontend(&mut self, fe: &str, proto: u8, tier: usize, backends: &[&str], flags: u32) -> u32 {
        let fe: SocketAddr = fe.parse().unwrap();
        let svc_id = self.next_svc;
        self.next_svc += 1;
        let mut key = addr::frontend_key(fe.ip(), fe.port(), proto);
        key.family |= SCOPE_OUTSIDE;
        let mut tiers = [TierRange::default(); 3];
        tiers[tier] = TierRange { start: 0, len: backends.len() as u16 };
        let value = FrontendValue { key, svc_id, generation: 1, tiers, flags, affinity_timeout_s: 0 };
        let mut slots: HashMap<_, SlotKey, Backend> = HashMap::try_from(self.map(MAP_SLOTS)).unwrap();
        for (i, b) in backends.iter().enumerate() {
            let k = SlotKey { svc_id, generation: 1, index: i as u32 };
            slots.insert(k, addr::backend(b.parse().unwrap(), proto), 0).unwrap();
        }
        let mut fes: HashMap<_, FrontendKey, FrontendValue> =
            HashMap::try_from(self.map(MAP_FRONTENDS)).unwrap();
        fes.insert(key, value, 0).unwrap();
        svc_id
    }

    fn local(&mut self, ip: &str) {
        let mut m: HashMap<_, CtAddr, u32> = HashMap::try_from(self.map(MAP_LOCAL_BACKENDS)).unwrap();
        let a = addr::words(ip.parse().unwrap());
        m.insert(CtAddr { addr: a }, 1, 0).unwrap();
    }

    /// Let `range` reach the outside frontend at `fe` over `proto` (its `loadBalancerSourceRanges`).
    fn source_range(&mut self, fe: &str, proto: u8, range: &str) {
        let fe: SocketAddr = fe.parse().unwrap();
        let (ip, len) = range.split_once('/').unwrap();
        let frontend = addr::outside_frontend_key(fe.ip(), fe.port(), proto);
        let data = SourceRangeKey { frontend, client: addr::words(ip.parse().unwrap()) };
        let mut m: LpmTrie<_, SourceRangeKey, u32> = LpmTrie::try_from(self.map(MAP_SOURCE_RANGES)).unwrap();
        m.insert(&Key::new(SOURCE_RANGE_FRONTEND_BITS + len.parse::<u32>().unwrap(), data), 1, 0).unwrap();
    }

    fn config(&mut self, c: NatConfig) {
        let mut m: Array<_, NatConfig> = Array::try_from(self.map(MAP_NAT_CONFIG)).unwrap();
        m.set(0, c, 0).unwrap();
    }

    fn conntrack(&mut self) -> Vec<(CtKey, CtValue)> {
        let m: HashMap<_, CtKey, CtValue> = HashMap::try_from(self.map(MAP_CONNTRACK)).unwrap();
        m.iter().map(Result::unwrap).collect()
    }

    /// Run `prog` on `packet` as if it arrived on (or left by) `eth`: the verdict and the packet after it.
    fn run(&mut self, prog: &str, packet: &[u8]) -> (u32, Vec<u8>) {
        let p: &mut SchedClassifier = self.ebpf.program_mut(prog).unwrap().try_into().unwrap();
        // struct __sk_buff (192 bytes): ingress_ifindex at 36, ifindex at 40; the rest must be zero.
        let mut ctx = [0u8; 192];
        ctx[36..40].copy_from_slice(&self.ifindex.to_ne_bytes());
        ctx[40..44].copy_from_slice(&self.ifindex.to_ne_bytes());
        let mut out = vec![0u8; packet.len() + 64];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(packet);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        let r = p.test_run(opts).expect("BPF_PROG_TEST_RUN");
        out.truncate(r.data_size_out as usize);
        (r.return_value, out)
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

// ---- the tests ------------------------------------------------------------------------------------------------

#[test]
fn tc_dnat_to_a_local_endpoint_keeps_the_client_and_its_reply_leaves_from_the_node_port() {
    let mut lab = Lab::new("tc-local");
    lab.frontend(
        &format!("{NODE}:30080"),
        PROTO_TCP,
        2,
        &[&format!("{LOCAL_POD}:8080")],
        FLAG_SNAT_TO_FRONTEND,
    );
    lab.local(LOCAL_POD);
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
    let mut lab = Lab::new("tc-snat");
    lab.frontend(
        &format!("{NODE}:30080"),
        PROTO_TCP,
        2,
        &[&format!("{REMOTE_POD}:8080")],
        FLAG_SNAT_TO_FRONTEND,
    );
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), &format!("{NODE}:30080"), 0x02);
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT, "an SNAT packet is sent out of the uplink by the program itself");
    let snat = src_of(&out);
    assert_eq!(snat.ip().to_string(), NODE, "the source is the node port's address");
    assert!((61_000..=65_535).contains(&snat.port()), "an SNAT port above the ephemeral range: {snat}");
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
    let mut lab = Lab::new("tc-udp");
    lab.frontend(
        &format!("{NODE}:30053"),
        PROTO_UDP,
        2,
        &[&format!("{LOCAL_POD}:53")],
        FLAG_SNAT_TO_FRONTEND,
    );
    lab.local(LOCAL_POD);
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
    let mut lab = Lab::new("tc-other");
    lab.frontend(
        &format!("{NODE}:30080"),
        PROTO_TCP,
        2,
        &[&format!("{LOCAL_POD}:8080")],
        FLAG_SNAT_TO_FRONTEND,
    );
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

#[test]
fn tc_load_balancer_ip_snats_to_the_configured_node_address() {
    let mut lab = Lab::new("tc-lb");
    lab.frontend("203.0.113.10:80", PROTO_TCP, 2, &[&format!("{REMOTE_POD}:8080")], 0);
    let syn = Pkt::tcp(&format!("{CLIENT}:40000"), "203.0.113.10:80", 0x02);
    let (rc, _) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, SHOT, "no node address to SNAT to: dropped, not sent with the LB IP as its source");
    lab.config(NatConfig { snat_v4: addr::words(NODE.parse().unwrap())[0], ..NatConfig::default() });
    let (rc, out) = lab.run("tc_ingress", &syn.bytes());
    assert_eq!(rc, REDIRECT);
    assert_eq!(src_of(&out).ip().to_string(), NODE);
    assert!(checksums_valid(&out));
    let ct = lab.conntrack();
    let fwd = ct
        .iter()
        .find(|(k, _)| k.dir == CT_DIR_IN && k.daddr == addr::words("203.0.113.10".parse().unwrap()));
    assert!(fwd.is_some(), "{ct:?}");
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
