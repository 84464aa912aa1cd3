//! The tc programs loaded once per fuzzing process, in a network namespace of its own (`unshare`: no name,
//! gone with the process), with frontends of every kind the agent writes for traffic from outside: node
//! ports to a local and to a remote endpoint over TCP and UDP (IPv4 and IPv6), an externalTrafficPolicy Local
//! node port with no local endpoint, and a load-balancer IP with session affinity, source ranges and a node
//! tier. The BPF object is the one the product embeds, written out by `tierlb-lab bpf-object` and named by
//! `TIERLB_BPF_OBJECT` (`cargo xtask fuzz` does both).
use std::{
    net::SocketAddr,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    process::Command,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        Array, HashMap, MapData,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{SchedClassifier, TestRun, TestRunOptions},
};
use lb_common::{
    ADDR_FOREIGN, ADDR_NODE, AddrKey, CT_TABLES, CtAddr, CtKey, CtValue, FAMILY_V4, FAMILY_V6,
    FLAG_EMPTY_IS_DROP, FLAG_POLICY_LOCAL, FLAG_SNAT_TO_FRONTEND, FLAG_SOURCE_RANGES, FrontendKey,
    FrontendValue, MAP_CT_SYN, MAP_CT_TCP, MAP_CT_UDP, MAP_FRAGMENTS, MAP_FRONTENDS, MAP_LOCAL_BACKENDS,
    MAP_MEMBERS, MAP_NAT_CONFIG, MAP_NS_ADDRS, MAP_OUTSIDE_AFFINITY, MAP_SLOTS, MAP_SOURCE_RANGES, MemberKey,
    MemberValue, NatConfig, PROTO_TCP, PROTO_UDP, SOURCE_RANGE_FRONTEND_BITS, SlotBlock, SlotKey,
    SourceRangeKey, TierRange,
};
use tierlb::datapath::addr;

/// The environment variable naming the BPF object file.
pub const OBJECT_ENV: &str = "TIERLB_BPF_OBJECT";

pub const CLIENT: &str = "192.0.2.100";
/// A client outside the load-balancer IP's source ranges.
pub const STRANGER: &str = "192.0.2.200";
pub const NODE: &str = "192.0.2.1";
pub const NEXT_HOP: &str = "192.0.2.2";
pub const LOCAL_POD: &str = "10.244.1.2";
pub const REMOTE_POD: &str = "10.244.2.2";
pub const LB_IP: &str = "203.0.113.10";
pub const CLIENT6: &str = "2001:db8::64";
pub const NODE6: &str = "2001:db8::1";
pub const NEXT_HOP6: &str = "2001:db8::2";
pub const LOCAL_POD6: &str = "fd00:244:1::2";
pub const REMOTE_POD6: &str = "fd00:244:2::2";

/// One outside frontend the lab holds: address, protocol, tiers (node, zone, cluster) and flags.
pub struct Frontend {
    pub addr: &'static str,
    pub proto: u8,
    pub tiers: [&'static [&'static str]; 3],
    pub flags: u32,
    pub affinity_s: u32,
}

/// Every frontend of the lab.
pub const FRONTENDS: [Frontend; 8] = [
    Frontend {
        addr: "192.0.2.1:30080",
        proto: PROTO_TCP,
        tiers: [&[], &[], &["10.244.1.2:8080"]],
        flags: FLAG_SNAT_TO_FRONTEND,
        affinity_s: 0,
    },
    Frontend {
        addr: "192.0.2.1:30053",
        proto: PROTO_UDP,
        tiers: [&[], &[], &["10.244.1.2:53"]],
        flags: FLAG_SNAT_TO_FRONTEND,
        affinity_s: 0,
    },
    Frontend {
        addr: "192.0.2.1:30081",
        proto: PROTO_TCP,
        tiers: [&[], &[], &["10.244.2.2:8080"]],
        flags: FLAG_SNAT_TO_FRONTEND,
        affinity_s: 0,
    },
    Frontend {
        addr: "192.0.2.1:30054",
        proto: PROTO_UDP,
        tiers: [&[], &[], &["10.244.2.2:53"]],
        flags: FLAG_SNAT_TO_FRONTEND,
        affinity_s: 0,
    },
    Frontend {
        addr: "192.0.2.1:30082",
        proto: PROTO_TCP,
        tiers: [&[], &[], &[]],
        flags: FLAG_POLICY_LOCAL | FLAG_EMPTY_IS_DROP,
        affinity_s: 0,
    },
    Frontend {
        addr: "203.0.113.10:80",
        proto: PROTO_TCP,
        tiers: [&["10.244.1.2:8080"], &[], &["10.244.1.2:8080", "10.244.2.2:8080"]],
        flags: FLAG_SOURCE_RANGES,
        affinity_s: 10_800,
    },
    Frontend {
        addr: "[2001:db8::1]:30080",
        proto: PROTO_TCP,
        tiers: [&[], &[], &["[fd00:244:1::2]:8080"]],
        flags: FLAG_SNAT_TO_FRONTEND,
        affinity_s: 0,
    },
    Frontend {
        addr: "[2001:db8::1]:30054",
        proto: PROTO_UDP,
        tiers: [&[], &[], &["[fd00:244:2::2]:53"]],
        flags: FLAG_SNAT_TO_FRONTEND,
        affinity_s: 0,
    },
];

/// The maps that hold what packets leave behind: emptied before each input, so an input's outcome is its own.
const STATE_MAPS: [&str; 5] = [MAP_CT_TCP, MAP_CT_SYN, MAP_CT_UDP, MAP_FRAGMENTS, MAP_OUTSIDE_AFFINITY];

pub struct Lab {
    ebpf: Ebpf,
    ifindex: u32,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Lab {
    /// The lab: this thread in a new network namespace, the programs verified and loaded, the maps filled.
    /// Panics (a finding at the first input) when the object is missing or a program fails verification.
    pub fn new() -> Self {
        let path = std::env::var(OBJECT_ENV)
            .unwrap_or_else(|_| panic!("{OBJECT_ENV} names no BPF object (run through `cargo xtask fuzz`)"));
        let object = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        // SAFETY: unshare(2) with CLONE_NEWNET only changes this thread's network namespace; the children
        // `ip` runs below fork from this thread and inherit it.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {} (the tc target needs root)",
            std::io::Error::last_os_error()
        );
        ip(&["link", "add", "eth", "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", "wire"]);
        ip(&["link", "set", "wire", "address", "02:00:00:00:00:02"]);
        ip(&["addr", "add", &format!("{NODE}/24"), "dev", "eth"]);
        ip(&["addr", "add", &format!("{NODE6}/64"), "dev", "eth", "nodad"]);
        ip(&["link", "set", "eth", "up"]);
        ip(&["link", "set", "wire", "up"]);
        ip(&["route", "add", "10.244.2.0/24", "via", NEXT_HOP]);
        ip(&["-6", "route", "add", "fd00:244:2::/64", "via", NEXT_HOP6]);
        for (addr, mac) in
            [(NEXT_HOP, "02:00:00:00:00:02"), (CLIENT, "02:00:00:00:00:64"), (NEXT_HOP6, "02:00:00:00:00:02")]
        {
            ip(&["neigh", "replace", addr, "lladdr", mac, "dev", "eth", "nud", "permanent"]);
        }
        ip(&["neigh", "replace", CLIENT6, "lladdr", "02:00:00:00:00:64", "dev", "eth", "nud", "permanent"]);
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("ip_forward");
        std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1").expect("ipv6 forwarding");
        let ifindex = nix_ifindex("eth");
        // The state maps small: emptying a hash map walks its buckets (`BPF_MAP_GET_NEXT_KEY`), and at the
        // product's sizes (262,144 conntrack entries) that walk cost most of each input's time.
        let mut loader = EbpfLoader::new();
        for name in STATE_MAPS {
            loader.map_max_entries(name, 1024);
        }
        let mut ebpf = loader.load(&object).expect("loading the BPF object");
        for name in ["tc_ingress", "tc_egress"] {
            let p: &mut SchedClassifier = ebpf.program_mut(name).expect("program").try_into().expect("tc");
            p.load().unwrap_or_else(|e| panic!("verifying {name}: {e:?}"));
        }
        let mut lab = Self { ebpf, ifindex };
        lab.fill();
        lab
    }

    fn map(&mut self, name: &str) -> &mut aya::maps::Map {
        self.ebpf.map_mut(name).unwrap_or_else(|| panic!("map {name}"))
    }

    fn fill(&mut self) {
        for (i, fe) in FRONTENDS.iter().enumerate() {
            let svc_id = u32::try_from(i).expect("few") + 1;
            let at: SocketAddr = fe.addr.parse().expect("frontend address");
            let key = addr::outside_frontend_key(at.ip(), at.port(), fe.proto);
            let mut tiers = [TierRange::default(); 3];
            let mut all = Vec::new();
            for (t, backends) in fe.tiers.iter().enumerate() {
                let start = u16::try_from(all.len()).expect("few");
                tiers[t] = TierRange { start, len: u16::try_from(backends.len()).expect("few") };
                all.extend(backends.iter().map(|b| addr::backend(b.parse().expect("backend"), fe.proto)));
            }
            let value = FrontendValue {
                key,
                svc_id,
                generation: 1,
                tiers,
                flags: fe.flags,
                affinity_timeout_s: fe.affinity_s,
                generation_tail: 1,
            };
            let mut slots: HashMap<_, SlotKey, SlotBlock> =
                HashMap::try_from(self.map(MAP_SLOTS)).expect("slots");
            for (block, b) in (0..).zip(SlotBlock::pack(all.iter().copied())) {
                slots.insert(SlotKey { svc_id, generation: 1, block }, b, 0).expect("slot");
            }
            let mut fes: HashMap<_, FrontendKey, FrontendValue> =
                HashMap::try_from(self.map(MAP_FRONTENDS)).expect("frontends");
            fes.insert(key, value, 0).expect("frontend");
            if fe.affinity_s != 0 {
                let mut members: HashMap<_, MemberKey, MemberValue> =
                    HashMap::try_from(self.map(MAP_MEMBERS)).expect("members");
                for (t, backends) in fe.tiers.iter().enumerate() {
                    for b in *backends {
                        let backend = addr::backend(b.parse().expect("backend"), fe.proto);
                        let k = MemberKey { svc_id, generation: 1, backend };
                        let old = members.get(&k, 0).map_or(0, |m| m.tiers);
                        members.insert(k, MemberValue { tiers: old | 1 << t }, 0).expect("member");
                    }
                }
            }
            if fe.flags & FLAG_SOURCE_RANGES != 0 {
                let frontend = addr::outside_frontend_key(at.ip(), at.port(), fe.proto);
                let data =
                    SourceRangeKey { frontend, client: addr::words("192.0.2.96".parse().expect("ip")) };
                let mut m: LpmTrie<_, SourceRangeKey, u32> =
                    LpmTrie::try_from(self.map(MAP_SOURCE_RANGES)).expect("ranges");
                m.insert(&Key::new(SOURCE_RANGE_FRONTEND_BITS + 28, data), 1, 0).expect("range");
            }
        }
        let mut local: HashMap<_, CtAddr, u32> =
            HashMap::try_from(self.map(MAP_LOCAL_BACKENDS)).expect("local");
        for pod in [LOCAL_POD, LOCAL_POD6] {
            local.insert(CtAddr { addr: addr::words(pod.parse().expect("ip")) }, 1, 0).expect("local");
        }
        // The pre-filter as the agent writes it: the node's addresses, and the load-balancer IP (on no
        // interface of the lab's node).
        let mut addrs: HashMap<_, AddrKey, u32> = HashMap::try_from(self.map(MAP_NS_ADDRS)).expect("addrs");
        for (a, flags) in [(NODE, ADDR_NODE), (NODE6, ADDR_NODE), (LB_IP, ADDR_FOREIGN)] {
            let ip: std::net::IpAddr = a.parse().expect("ip");
            let family = if ip.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 };
            addrs.insert(AddrKey { addr: addr::words(ip), family, _pad: [0; 3] }, flags, 0).expect("addr");
        }
        let mut cfg: Array<_, NatConfig> = Array::try_from(self.map(MAP_NAT_CONFIG)).expect("config");
        let config = NatConfig {
            snat_v4: addr::words(NODE.parse().expect("ip"))[0],
            snat_v6: addr::words(NODE6.parse().expect("ip")),
            ..NatConfig::default()
        };
        cfg.set(0, config, 0).expect("config");
    }

    /// Empty what earlier inputs left (conntrack, fragments, affinity).
    pub fn reset(&mut self) {
        for name in STATE_MAPS {
            let map = self.map(name);
            clear(map);
        }
    }

    /// Conntrack entries now, in the three tables.
    pub fn tracked(&mut self) -> usize {
        let mut n = 0;
        for t in CT_TABLES {
            let m: HashMap<_, CtKey, CtValue> = HashMap::try_from(self.map(t)).expect("conntrack");
            n += m.keys().count();
        }
        n
    }

    /// Run `tc_egress` (`egress`) or `tc_ingress` on `packet` as it arrives on (leaves by) the uplink: the
    /// verdict and the packet after it.
    /// `None` when the kernel refuses to run the frame: an IPv4 or IPv6 frame shorter than its network
    /// header (`bpf_prog_test_run_skb` pulls that header first and answers `EINVAL`; a real device hands tc
    /// such a frame, which this harness cannot reproduce).
    pub fn run(&mut self, egress: bool, packet: &[u8]) -> Option<(u32, Vec<u8>)> {
        let name = if egress { "tc_egress" } else { "tc_ingress" };
        let ifindex = self.ifindex;
        let p: &mut SchedClassifier = self.ebpf.program_mut(name).expect("program").try_into().expect("tc");
        // struct __sk_buff (192 bytes): ingress_ifindex at 36, ifindex at 40; the rest must be zero.
        let mut ctx = [0u8; 192];
        ctx[36..40].copy_from_slice(&ifindex.to_ne_bytes());
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        let mut out = vec![0u8; packet.len() + 256];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(packet);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        let r = match p.test_run(opts) {
            Ok(r) => r,
            Err(e) if short_network_header(packet) => {
                let _ = e;
                return None;
            }
            Err(e) => panic!("BPF_PROG_TEST_RUN of {name} on {} bytes: {e:?}", packet.len()),
        };
        out.truncate(r.data_size_out as usize);
        Some((r.return_value, out))
    }
}

/// An IPv4 or IPv6 frame too short for its network header.
fn short_network_header(frame: &[u8]) -> bool {
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => frame.len() < 14 + 20,
        0x86dd => frame.len() < 14 + 40,
        _ => false,
    }
}

/// Delete every key of a hash map whatever its key type (the raw bytes, through aya's `MapData`).
fn clear(map: &mut aya::maps::Map) {
    let data: &MapData = match map {
        aya::maps::Map::HashMap(d) | aya::maps::Map::LruHashMap(d) => d,
        other => panic!("not a hash map: {other:?}"),
    };
    let fd = data.fd().as_fd();
    let info = data.info().expect("map info");
    let key_size = info.key_size() as usize;
    let mut keys = Vec::new();
    let mut prev: Option<Vec<u8>> = None;
    loop {
        let mut next = vec![0u8; key_size];
        if !raw_next_key(fd, prev.as_deref(), &mut next) {
            break;
        }
        keys.push(next.clone());
        prev = Some(next);
    }
    for k in keys {
        raw_delete(fd, &k);
    }
}

/// `bpf(BPF_MAP_GET_NEXT_KEY)`: false at the end.
fn raw_next_key(fd: BorrowedFd<'_>, key: Option<&[u8]>, next: &mut [u8]) -> bool {
    // union bpf_attr for map element commands: map_fd u32, pad, key u64, next_key/value u64, flags u64.
    let mut attr = [0u64; 4];
    attr[0] = u64::from(fd.as_raw_fd().cast_unsigned());
    attr[1] = key.map_or(0, |k| k.as_ptr() as u64);
    attr[2] = next.as_mut_ptr() as u64;
    // SAFETY: the attr points at buffers of the map's key size that live for the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, 4 /* BPF_MAP_GET_NEXT_KEY */, attr.as_mut_ptr(), size_of_val(&attr))
    };
    rc == 0
}

/// `bpf(BPF_MAP_DELETE_ELEM)`.
fn raw_delete(fd: BorrowedFd<'_>, key: &[u8]) {
    let mut attr = [0u64; 4];
    attr[0] = u64::from(fd.as_raw_fd().cast_unsigned());
    attr[1] = key.as_ptr() as u64;
    // SAFETY: as above.
    unsafe {
        libc::syscall(libc::SYS_bpf, 3 /* BPF_MAP_DELETE_ELEM */, attr.as_mut_ptr(), size_of_val(&attr))
    };
}

fn nix_ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).expect("name");
    // SAFETY: a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(i, 0, "no device {name}");
    i
}
