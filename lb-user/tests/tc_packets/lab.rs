//! The tc programs loaded in a network namespace of their own, with maps the tests fill.
use std::net::SocketAddr;

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        Array, HashMap, PerCpuArray,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{SchedClassifier, TestRun, TestRunOptions, Xdp},
};
use lb_common::{
    ADDR_FOREIGN, ADDR_NODE, AddrKey, CT_TABLES, CtAddr, CtKey, CtValue, FLAG_SNAT_TO_FRONTEND, FrontendKey,
    FrontendValue, MAP_FRONTENDS, MAP_LOCAL_BACKENDS, MAP_MEMBERS, MAP_NAT_CONFIG, MAP_NS_ADDRS,
    MAP_NS_COUNTERS, MAP_SLOTS, MAP_SOURCE_RANGES, MemberKey, MemberValue, NatConfig, SCOPE_OUTSIDE,
    SOURCE_RANGE_FRONTEND_BITS, SlotBlock, SlotKey, SourceRangeKey, TierRange,
};
use lb_testkit::sandbox::NetNs;
use tierlb::datapath::addr;

use super::{CLIENT, NEXT_HOP, NEXT_HOP_6, NODE};

pub(crate) struct Lab {
    ebpf: Ebpf,
    /// The namespace the test thread runs in; its `eth` device is what the packets "arrive" on.
    ns: NetNs,
    ifindex: u32,
    next_svc: u32,
}

impl Lab {
    pub(crate) fn new(tag: &str) -> Self {
        Self::sized(tag, &[])
    }

    /// `new`, with the maps named in `sizes` made that many entries large.
    pub(crate) fn sized(tag: &str, sizes: &[(&str, u32)]) -> Self {
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
        ns.ip(&["-6", "route", "add", "fd00:244:2::/64", "via", NEXT_HOP_6]).unwrap();
        for hop in [NEXT_HOP, NEXT_HOP_6] {
            ns.ip(&[
                "neigh",
                "replace",
                hop,
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                "eth",
                "nud",
                "permanent",
            ])
            .unwrap();
        }
        ns.ip(&["neigh", "replace", CLIENT, "lladdr", "02:00:00:00:00:64", "dev", "eth", "nud", "permanent"])
            .unwrap();
        ns.enter_current_thread().expect("setns");
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("ip_forward");
        // The FIB lookup refuses IPv6 without forwarding.
        std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1").expect("IPv6 forwarding");
        let ifindex = nix::net::if_::if_nametoindex("eth").expect("ifindex");
        let object = tierlb::datapath::ebpf::embedded_object().expect("built with the BPF object");
        let mut loader = EbpfLoader::new();
        for (name, n) in sizes {
            loader.map_max_entries(name, *n);
        }
        let mut ebpf = loader.load(object).expect("load object");
        for name in ["tc_ingress", "tc_egress", "tc_egress_l3"] {
            let p: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            p.load().unwrap_or_else(|e| panic!("verifying {name}: {e:?}"));
        }
        let mut lab = Self { ebpf, ns, ifindex, next_svc: 1 };
        // The node's addresses in the pre-filter, as the agent writes them.
        lab.addr(NODE, ADDR_NODE);
        lab.addr("2001:db8::1", ADDR_NODE);
        lab
    }

    /// Put `ip` in the ingress pre-filter with `flags` (`ADDR_*`).
    pub(crate) fn addr(&mut self, ip: &str, flags: u32) {
        let ip: std::net::IpAddr = ip.parse().unwrap();
        let family = if ip.is_ipv4() { lb_common::FAMILY_V4 } else { lb_common::FAMILY_V6 };
        let mut m: HashMap<_, AddrKey, u32> = HashMap::try_from(self.map(MAP_NS_ADDRS)).unwrap();
        m.insert(AddrKey { addr: addr::words(ip), family, _pad: [0; 3] }, flags, 0).unwrap();
    }

    /// A lab with one outside frontend, the node port `NODE:fe_port` over `proto`, whose cluster tier holds
    /// `backend` (`local`: an endpoint of this node, else reached with SNAT).
    pub(crate) fn with_node_port(tag: &str, proto: u8, fe_port: u16, backend: &str, local: bool) -> Self {
        let mut lab = Self::new(tag);
        lab.frontend(&format!("{NODE}:{fe_port}"), proto, 2, &[backend], FLAG_SNAT_TO_FRONTEND);
        if local {
            lab.local(backend.rsplit_once(':').unwrap().0);
        }
        lab
    }

    pub(crate) fn map(&mut self, name: &str) -> &mut aya::maps::Map {
        self.ebpf.map_mut(name).unwrap_or_else(|| panic!("map {name}"))
    }

    /// An outside frontend at `fe` over `proto` whose one tier `tier` holds `backends`.
    pub(crate) fn frontend(
        &mut self,
        fe: &str,
        proto: u8,
        tier: usize,
        backends: &[&str],
        flags: u32,
    ) -> u32 {
        let fe: SocketAddr = fe.parse().unwrap();
        let svc_id = self.next_svc;
        self.next_svc += 1;
        if flags & FLAG_SNAT_TO_FRONTEND == 0 {
            // A load-balancer IP: on no interface of the lab's node.
            self.addr(&fe.ip().to_string(), ADDR_FOREIGN);
        }
        let mut key = addr::frontend_key(fe.ip(), fe.port(), proto);
        key.family |= SCOPE_OUTSIDE;
        let mut tiers = [TierRange::default(); 3];
        tiers[tier] = TierRange { start: 0, len: backends.len() as u16 };
        let value = FrontendValue {
            key,
            svc_id,
            generation: 1,
            tiers,
            flags,
            affinity_timeout_s: 0,
            generation_tail: 1,
        };
        let mut slots: HashMap<_, SlotKey, SlotBlock> = HashMap::try_from(self.map(MAP_SLOTS)).unwrap();
        let all = backends.iter().map(|b| addr::backend(b.parse().unwrap(), proto));
        for (block, value) in (0..).zip(SlotBlock::pack(all)) {
            slots.insert(SlotKey { svc_id, generation: 1, block }, value, 0).unwrap();
        }
        let mut fes: HashMap<_, FrontendKey, FrontendValue> =
            HashMap::try_from(self.map(MAP_FRONTENDS)).unwrap();
        fes.insert(key, value, 0).unwrap();
        svc_id
    }

    pub(crate) fn local(&mut self, ip: &str) {
        self.local_as(ip, lb_common::LOCAL_ENDPOINT);
    }

    /// `ip` a local endpoint with `value` (`LOCAL_*` bits: `LOCAL_DSR` as under `--dsr`).
    pub(crate) fn local_as(&mut self, ip: &str, value: u32) {
        let mut m: HashMap<_, CtAddr, u32> = HashMap::try_from(self.map(MAP_LOCAL_BACKENDS)).unwrap();
        let a = addr::words(ip.parse().unwrap());
        m.insert(CtAddr { addr: a }, value, 0).unwrap();
    }

    /// Let `range` reach the outside frontend at `fe` over `proto` (its `loadBalancerSourceRanges`).
    pub(crate) fn source_range(&mut self, fe: &str, proto: u8, range: &str) {
        let fe: SocketAddr = fe.parse().unwrap();
        let (ip, len) = range.split_once('/').unwrap();
        let frontend = addr::outside_frontend_key(fe.ip(), fe.port(), proto);
        let data = SourceRangeKey { frontend, client: addr::words(ip.parse().unwrap()) };
        let mut m: LpmTrie<_, SourceRangeKey, u32> = LpmTrie::try_from(self.map(MAP_SOURCE_RANGES)).unwrap();
        m.insert(&Key::new(SOURCE_RANGE_FRONTEND_BITS + len.parse::<u32>().unwrap(), data), 1, 0).unwrap();
    }

    pub(crate) fn config(&mut self, c: NatConfig) {
        let mut m: Array<_, NatConfig> = Array::try_from(self.map(MAP_NAT_CONFIG)).unwrap();
        m.set(0, c, 0).unwrap();
    }

    /// Give the outside frontend at `fe` over `proto` (made by `frontend`, tier `tier` holding `backends`)
    /// sessionAffinity for `timeout_s`: its timeout and its generation's members, as the agent writes them.
    pub(crate) fn affinity(&mut self, fe: &str, proto: u8, tier: usize, backends: &[&str], timeout_s: u32) {
        let fe: SocketAddr = fe.parse().unwrap();
        let key = addr::outside_frontend_key(fe.ip(), fe.port(), proto);
        let mut fes: HashMap<_, FrontendKey, FrontendValue> =
            HashMap::try_from(self.map(MAP_FRONTENDS)).unwrap();
        let mut v = fes.get(&key, 0).unwrap();
        v.affinity_timeout_s = timeout_s;
        fes.insert(key, v, 0).unwrap();
        let mut members: HashMap<_, MemberKey, MemberValue> =
            HashMap::try_from(self.map(MAP_MEMBERS)).unwrap();
        for b in backends {
            let k = MemberKey {
                svc_id: v.svc_id,
                generation: v.generation,
                backend: addr::backend(b.parse().unwrap(), proto),
            };
            members.insert(k, MemberValue { tiers: 1 << tier }, 0).unwrap();
        }
    }

    /// `ip ARGS` in the lab's namespace.
    pub(crate) fn ip(&self, args: &[&str]) {
        self.ns.ip(args).unwrap();
    }

    /// The tc programs' counter of `NS_*` kind `kind`, summed over CPUs.
    pub(crate) fn ns_counter(&mut self, kind: u32) -> u64 {
        let m: PerCpuArray<_, u64> = PerCpuArray::try_from(self.map(MAP_NS_COUNTERS)).unwrap();
        m.get(&kind, 0).unwrap().iter().sum()
    }

    /// Every conntrack entry, of the three tables.
    pub(crate) fn conntrack(&mut self) -> Vec<(CtKey, CtValue)> {
        CT_TABLES.iter().flat_map(|t| self.table(t)).collect()
    }

    /// The entries of conntrack table `name` (`lb_common::CT_TABLES`).
    pub(crate) fn table(&mut self, name: &str) -> Vec<(CtKey, CtValue)> {
        let m: HashMap<_, CtKey, CtValue> = HashMap::try_from(self.map(name)).unwrap();
        m.iter().map(Result::unwrap).collect()
    }

    /// Age every entry of every table: its expiry set `by_ns` earlier (an entry's age written through the
    /// map, as time passing would).
    pub(crate) fn age(&mut self, by_ns: u64) {
        for t in CT_TABLES {
            let mut m: HashMap<_, CtKey, CtValue> = HashMap::try_from(self.map(t)).unwrap();
            let all: Vec<(CtKey, CtValue)> = m.iter().map(Result::unwrap).collect();
            for (k, mut v) in all {
                v.expires_ns = v.expires_ns.saturating_sub(by_ns);
                m.insert(k, v, 0).unwrap();
            }
        }
    }

    /// Run `prog` on `packet` as if it arrived on (or left by) `eth`: the verdict and the packet after it.
    pub(crate) fn run(&mut self, prog: &str, packet: &[u8]) -> (u32, Vec<u8>) {
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

impl Lab {
    /// Run `xdp_ingress` on `packet` as if it arrived on `eth`: the XDP verdict and the frame after it.
    pub(crate) fn run_xdp(&mut self, packet: &[u8]) -> (u32, Vec<u8>) {
        let p: &mut Xdp = self.ebpf.program_mut("xdp_ingress").unwrap().try_into().unwrap();
        // Loaded here, not with the tc programs: their tests do not depend on XDP's verification (a kernel
        // that refuses xdp_ingress still runs them; Debian's 6.1 did, until XDP's next hop left the stack).
        if p.fd().is_err() {
            p.load().unwrap_or_else(|e| panic!("verifying xdp_ingress: {e:?}"));
        }
        // struct xdp_md (24 bytes): data (0: the frame starts after the kernel's headroom), data_end (the
        // frame's length: with 0 the kernel took the frame to end where it starts, and refused to move its
        // head), data_meta, ingress_ifindex at 12, rx_queue_index at 16 (queue 0 of `eth`), egress_ifindex.
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
        ctx[12..16].copy_from_slice(&self.ifindex.to_ne_bytes());
        let mut out = vec![0u8; packet.len() + 64];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(packet);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        let r = p.test_run(opts).expect("BPF_PROG_TEST_RUN (XDP)");
        out.truncate(r.data_size_out as usize);
        (r.return_value, out)
    }
}

pub(crate) fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}
