//! The maps of the socket programs: `FRONTENDS`, `SLOTS`, `BACKEND_STATE`, `COUNTERS`, `SVC_NAMES` (user space only),
//! `REVERSE`, `CONNECTED_UDP`, `UDP_PER_NETNS`, `AFFINITY`, `NESTED_AFFINITY`, `CGROUP_NETNS`, `MEMBERS`, `HEALTH`, `HEALTH_CONFIG`, the socket storage
//! `SOCKS`, and the trace maps `TRACE_EVENTS`, `TRACE_CONTROL`, `TRACE_SERVICES`. User space opens them by the `lb_common::MAP_*` constants, but `#[map(name = ..)]` takes only a
//! literal (it becomes the symbol's `export_name`); `named_map!` checks at compile time that each literal is
//! its constant, so the two spellings cannot drift apart.
//! Sizes here are defaults; the agent overrides them before load (`EbpfLoader::set_max_entries`).
//! `pub(crate)` is enough: the symbol `#[map]` exports is what puts a map in the object.
use core::{
    mem::MaybeUninit,
    ptr::{addr_of, addr_of_mut, read_volatile},
};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, bpf_dynptr},
    btf_maps::SkStorage,
    helpers::generated::{bpf_dynptr_from_mem, bpf_dynptr_read},
    macros::{btf_map, map},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use lb_common::{
    AddrKey, AffinityKey, AffinityValue, Backend, BackendState, CtAddr, CtKey, CtValue, DEFAULT_MAX_AFFINITY,
    DEFAULT_MAX_BACKENDS, DEFAULT_MAX_CGROUPS, DEFAULT_MAX_CONNTRACK, DEFAULT_MAX_CONNTRACK_SYN,
    DEFAULT_MAX_CONNTRACK_UDP, DEFAULT_MAX_FRAGMENTS, DEFAULT_MAX_FRONTENDS, DEFAULT_MAX_LOCAL_BACKENDS,
    DEFAULT_MAX_MAGLEV, DEFAULT_MAX_NS_ADDRS, DEFAULT_MAX_REVERSE, DEFAULT_MAX_SLOTS,
    DEFAULT_MAX_SOURCE_RANGES, DEFAULT_MAX_UDP_NETNS, FrontendKey, FrontendValue, Health, HealthConfig,
    MAP_AFFINITY, MAP_BACKEND_STATE, MAP_CGROUP_NETNS, MAP_CONNECTED_UDP, MAP_COUNTERS, MAP_CT_SYN,
    MAP_CT_TCP, MAP_CT_UDP, MAP_FRAGMENTS, MAP_FRONTENDS, MAP_HEALTH, MAP_HEALTH_CONFIG, MAP_LOCAL_BACKENDS,
    MAP_MAGLEV, MAP_MEMBERS, MAP_NAMES, MAP_NAT_CONFIG, MAP_NESTED_AFFINITY, MAP_NS_ADDRS, MAP_NS_COUNTERS,
    MAP_OUTSIDE_AFFINITY, MAP_REVERSE, MAP_REVERSE_TCP, MAP_SLOTS, MAP_SOCKS, MAP_SOURCE_RANGES,
    MAP_TRACE_CONTROL, MAP_TRACE_EVENTS, MAP_TRACE_SERVICES, MAP_UDP_PER_NETNS, MaglevKey, MaglevTable,
    MemberKey, MemberValue, NS_COUNTER_SLOTS, NatConfig, OutsideAffinityKey, REVERSE_TCP_SLOTS, ReverseKey,
    ReverseValue, ServiceCounters, ServiceName, SlotBlock, SlotKey, SockState, SourceRangeKey,
    TRACE_MAX_SERVICES, TRACE_RING_BYTES, TcpReverse, TraceControl,
};

/// `a == b` at compile time (`str` equality is not `const`).
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `#[map(name = $name)]` on `$item`, and a build error unless `$name` equals `lb_common`'s `$constant`.
macro_rules! named_map {
    ($constant:ident == $name:tt, $item:item) => {
        const _: () = assert!(same($constant, $name), "map name differs from its lb_common constant");
        #[map(name = $name)]
        $item
    };
}

named_map!(
    MAP_FRONTENDS == "FRONTENDS",
    /// Service frontends: VIP, port, protocol -> svc_id, generation, tier ranges, flags.
    ///
    /// Why every value carries its own key, checked after the copy (`sock_addr::frontend`): a program holds a
    /// pointer into a hash element from `bpf_map_lookup_elem` until it has copied the value, and the element
    /// can meanwhile be given to another key. In a preallocated hash (this one) `htab_map_update_elem`
    /// replaces an existing key by `alloc_htab_elem(.., old_elem)`, which parks the old element in the
    /// per-CPU `htab->extra_elems` and hands it to the next in-place update on that CPU at once, and
    /// `free_htab_elem` (on delete) pushes it on the `pcpu_freelist` that the next insert pops: no RCU grace
    /// period either way (kernel/bpf/hashtab.c, 6.x). `BPF_F_NO_PREALLOC` alone does not help:
    /// `htab_elem_free` gives the element back with `bpf_mem_cache_free`, whose per-CPU free list
    /// (`unit_free` -> `free_llist`, kernel/bpf/memalloc.c) `unit_alloc` takes from at once; the memory is
    /// only type-stable under RCU (it is not returned to the slab before a grace period), not reserved. So
    /// the program may read another frontend's value, or a mix of two while it is rewritten; hence the check.
    /// `alloc_htab_elem` writes an element's value with one forward `copy_map_value` (the key first, as it is
    /// first, then the generation), and the program copies the rest of the value before them and the
    /// value's last field, a second copy of the generation, first (`read_volatile`, in program order): a
    /// copy that got a reused element's new bytes anywhere also gets its new key and generation, and fails
    /// the check, for another key by the key, for the same key rewritten (twice while the program read it:
    /// the element it held went to the second write) by the two generations, which differ. On x86 (TSO: loads are not reordered with loads, nor stores with stores) that holds as stated;
    /// on weakly ordered CPUs (arm64) the JIT emits plain loads and a torn copy that passes remains possible
    /// in principle. A failed check retries the lookup once, then fails open (counted).
    pub(crate) static FRONTENDS: HashMap<FrontendKey, FrontendValue> =
        HashMap::with_max_entries(DEFAULT_MAX_FRONTENDS, 0);
);

/// Copy the `FRONTENDS` value at `p` into `out` in the order its checks need, and check it: true if the
/// copy is whole and of `key`.
///
/// Volatile reads keep the program order, the reverse of the order `alloc_htab_elem`'s forward copy writes
/// the value: `generation_tail` (last in the value) first, then the fields from the end down to
/// `generation` and the key (first in the value). A copy that got any field from a later write got that
/// write's `generation` and key too (written before every other field, read after them), and its
/// `generation_tail` only if it got all of it: an element reused for another key fails the key check; one
/// rewritten for the same key (two writes of it during the read) fails the generation check, since every
/// write of a key has a new generation. `out` is written field by field (no reference to uninitialised
/// memory is made).
///
/// # Safety
/// `p` is a `FRONTENDS` value, mapped for the program's run (RCU; its bytes may change under us, which is
/// what the checks are for); `out` is valid for writes.
#[inline(always)]
pub(crate) unsafe fn copy_frontend(
    p: *const FrontendValue,
    out: *mut FrontendValue,
    key: &FrontendKey,
) -> bool {
    // SAFETY: as the caller promises.
    unsafe {
        addr_of_mut!((*out).generation_tail).write(read_volatile(addr_of!((*p).generation_tail)));
        addr_of_mut!((*out).affinity_timeout_s).write(read_volatile(addr_of!((*p).affinity_timeout_s)));
        addr_of_mut!((*out).flags).write(read_volatile(addr_of!((*p).flags)));
        addr_of_mut!((*out).tiers).write(read_volatile(addr_of!((*p).tiers)));
        addr_of_mut!((*out).svc_id).write(read_volatile(addr_of!((*p).svc_id)));
        addr_of_mut!((*out).generation).write(read_volatile(addr_of!((*p).generation)));
        addr_of_mut!((*out).key).write(read_volatile(addr_of!((*p).key)));
        (*out).key == *key && (*out).generation == (*out).generation_tail
    }
}

named_map!(
    MAP_SLOTS == "SLOTS",
    /// Backend slots of every frontend's tiers, `SLOT_BLOCK` to an entry, by (svc_id, generation, block):
    /// read with `backend_at`. Not preallocated: its memory is charged to the agent's memory cgroup (as every
    /// map's), and a preallocated million entries is more than the DaemonSet's limit allows; elements come
    /// and go per generation, freed after readers (RCU) as the slots of a generation are after their grace
    /// period.
    pub(crate) static SLOTS: HashMap<SlotKey, SlotBlock> =
        HashMap::with_max_entries(DEFAULT_MAX_SLOTS, BPF_F_NO_PREALLOC);
);

/// Slot `index` of the frontend's generation (`svc_id`, `generation`): one lookup of its block and a copy
/// of its backend; `None` if the block is missing (inconsistent maps).
#[inline(always)]
pub(crate) fn backend_at(svc_id: u32, generation: u32, index: u32) -> Option<Backend> {
    let mut out = MaybeUninit::<Backend>::uninit();
    // SAFETY: `out` is this frame's, and `read_slot` writes all of it when it returns true.
    read_slot(svc_id, generation, index, out.as_mut_ptr()).then(|| unsafe { out.assume_init() })
}

/// `backend_at`'s work, out of line: its dynptr is in a frame of its own on every call (a kernel before
/// 6.3 refuses to initialise a dynptr stack slot twice, as a loop would). The slot is copied with
/// `bpf_dynptr_read`, whose offset the helper checks at run time, not with an offset added to the value's
/// pointer: the verifier would then track the offset, and with it the `TIER_SCAN` loop's counter it comes
/// from, exactly, and explore every turn of that loop separately (sendmsg6 went past the verifier's
/// million instructions).
#[inline(never)]
fn read_slot(svc_id: u32, generation: u32, index: u32, out: *mut Backend) -> bool {
    let (key, at) = SlotKey::locate(svc_id, generation, index);
    let Some(block) = SLOTS.get_ptr(key) else { return false };
    let mut dynptr = MaybeUninit::<bpf_dynptr>::uninit();
    let size = size_of::<Backend>() as u32;
    // SAFETY: `block` is a map value of `size_of::<SlotBlock>()` bytes, valid for the program's run (RCU);
    // `dynptr` and `out` are stack memory the helpers write; the read is bounds-checked by the helper.
    unsafe {
        bpf_dynptr_from_mem(block.cast_mut().cast(), size_of::<SlotBlock>() as u32, 0, dynptr.as_mut_ptr())
            == 0
            && bpf_dynptr_read(out.cast(), size, dynptr.as_ptr(), at as u32 * size, 0) == 0
    }
}

named_map!(
    MAP_BACKEND_STATE == "BACKEND_STATE",
    /// Backends marked down until a time (`BackendState`); absent or expired means up. One write moves new
    /// connects away.
    /// Not preallocated: marks are few, and a preallocated map costs its capacity (28 MiB) in the agent's
    /// memory cgroup.
    pub(crate) static BACKEND_STATE: HashMap<Backend, BackendState> =
        HashMap::with_max_entries(DEFAULT_MAX_BACKENDS, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_COUNTERS == "COUNTERS",
    /// Per-CPU counters: a Service's at its service id, the global ones at `GLOBAL_SVC_ID`.
    pub(crate) static COUNTERS: PerCpuArray<ServiceCounters> =
        PerCpuArray::with_max_entries(DEFAULT_MAX_FRONTENDS + 1, 0);
);

named_map!(
    MAP_NAMES == "SVC_NAMES",
    /// Service names by svc_id, for user space only (status, adoption after a restart). Not preallocated:
    /// it costs the names it holds, not its capacity.
    pub(crate) static SVC_NAMES: HashMap<u32, ServiceName> =
        HashMap::with_max_entries(DEFAULT_MAX_FRONTENDS + 1, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_REVERSE == "REVERSE",
    /// Reverse translation for recvmsg (the reply's source) and getpeername: (socket cookie, backend) -> VIP.
    ///
    /// An LRU hash rather than socket-local storage: socket storage holds one value per socket, but one
    /// unconnected UDP socket may talk to many Services (a resolver to several DNS VIPs); LRU bounds the memory
    /// of entries whose socket closed without telling us, and the oldest go first.
    pub(crate) static REVERSE: LruHashMap<ReverseKey, ReverseValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_REVERSE, 0);
);

named_map!(
    MAP_REVERSE_TCP == "REVERSE_TCP",
    /// TCP sockets' reverse entries, first: slot `tcp_slot(cookie)` holds the socket with that cookie if it
    /// was free when the socket connected (else the socket's entry is in `REVERSE`); freed by `sock_release`.
    pub(crate) static REVERSE_TCP: Array<TcpReverse> = Array::with_max_entries(REVERSE_TCP_SLOTS, 0);
);

named_map!(
    MAP_CONNECTED_UDP == "CONNECTED_UDP",
    /// Connected UDP sockets: (socket cookie, backend) -> VIP and network namespace, what the agent's socket
    /// destruction needs (user space cannot enumerate socket storage). Written by connect4/connect6 when a UDP
    /// socket's backend changes, deleted by `sock_release` with the socket, so it holds live sockets only.
    /// Not preallocated: it costs memory for the sockets it holds, not for its capacity.
    pub(crate) static CONNECTED_UDP: HashMap<ReverseKey, ReverseValue> =
        HashMap::with_max_entries(DEFAULT_MAX_REVERSE, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_UDP_PER_NETNS == "UDP_PER_NETNS",
    /// Connected UDP sockets registered in `CONNECTED_UDP` per network namespace: netns cookie -> count, kept
    /// below `UDP_PER_NETNS_MAX` so that one pod cannot fill the registry. Not preallocated.
    pub(crate) static UDP_PER_NETNS: HashMap<u64, u32> =
        HashMap::with_max_entries(DEFAULT_MAX_UDP_NETNS, BPF_F_NO_PREALLOC);
);

/// `lb_common::udp_per_netns` of the loaded registry's capacity, set by the loader
/// (`lb_common::GLOBAL_UDP_PER_NETNS`); the default's if it is not. Read with `read_volatile`: a plain
/// read of a constant `static` is folded at compile time.
#[unsafe(no_mangle)]
pub(crate) static UDP_PER_NETNS_MAX: u32 = lb_common::udp_per_netns(DEFAULT_MAX_REVERSE);
const _: () = assert!(same(lb_common::GLOBAL_UDP_PER_NETNS, "UDP_PER_NETNS_MAX"));

named_map!(
    MAP_AFFINITY == "AFFINITY",
    /// sessionAffinity ClientIP: (frontend, client network namespace) -> (backend, last connect). An LRU: it
    /// bounds memory without the agent sweeping expired entries (an expired entry is never used and is
    /// replaced by the client's next connect, or evicted).
    pub(crate) static AFFINITY: LruHashMap<AffinityKey, AffinityValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_AFFINITY, 0);
);

named_map!(
    MAP_NESTED_AFFINITY == "NESTED_AFFINITY",
    /// sessionAffinity ClientIP for network namespaces a pod's processes made themselves (a connect from a
    /// namespace other than its cgroup's first, `CGROUP_NETNS`): keyed and sized as `AFFINITY`, apart from it
    /// so that a process creating namespaces evicts only entries of such namespaces, never a pod's.
    pub(crate) static NESTED_AFFINITY: LruHashMap<AffinityKey, AffinityValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_AFFINITY, 0);
);

named_map!(
    MAP_CGROUP_NETNS == "CGROUP_NETNS",
    /// cgroup id -> netns cookie of the first connect to an affinity frontend from that cgroup (a container's
    /// cgroup: its pod's namespace). Kernel only. An LRU: only cgroups, which a pod cannot create, take entries.
    pub(crate) static CGROUP_NETNS: LruHashMap<u64, u64> =
        LruHashMap::with_max_entries(DEFAULT_MAX_CGROUPS, 0);
);

named_map!(
    MAP_OUTSIDE_AFFINITY == "OUTSIDE_AFFINITY",
    /// sessionAffinity ClientIP for clients outside the node: (frontend, client address) -> (backend, last
    /// new flow); sized as `AFFINITY` (`--max-affinity`).
    pub(crate) static OUTSIDE_AFFINITY: LruHashMap<OutsideAffinityKey, AffinityValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_AFFINITY, 0);
);

named_map!(
    MAP_MEMBERS == "MEMBERS",
    /// The backends of frontends with sessionAffinity: (svc_id, generation, backend) -> tiers. An affinity
    /// entry is used only while its backend is a member of the frontend's current generation. Written by the
    /// agent for affinity frontends only, with and like a generation's slots (before the swap, deleted after
    /// its grace period); not preallocated, so its capacity (`--max-slots`, counted per member where the slot
    /// map counts entries of 8 slots) costs nothing until used.
    pub(crate) static MEMBERS: HashMap<MemberKey, MemberValue> =
        HashMap::with_max_entries(DEFAULT_MAX_SLOTS, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_MAGLEV == "MAGLEV",
    /// Maglev tables of the outside frontends with `FLAG_MAGLEV`: (svc_id, generation, tier) -> the slot of
    /// each hash bucket. Written by the agent with and like a generation's slots; not preallocated.
    pub(crate) static MAGLEV: HashMap<MaglevKey, MaglevTable> =
        HashMap::with_max_entries(DEFAULT_MAX_MAGLEV, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_HEALTH == "HEALTH",
    /// Passive health by backend (`Health`), written by the kernel only (`health`); the agent deletes the
    /// entries of backends that left every Service, and healthy ones. Not preallocated: it holds the backends
    /// that failed lately, not one per capacity.
    pub(crate) static HEALTH: HashMap<Backend, Health> =
        HashMap::with_max_entries(DEFAULT_MAX_BACKENDS, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_HEALTH_CONFIG == "HEALTH_CONFIG",
    /// Passive health settings, written by the agent at start; all zero (the default) is off.
    pub(crate) static HEALTH_CONFIG: Array<HealthConfig> = Array::with_max_entries(1, 0);
);

named_map!(
    MAP_TRACE_EVENTS == "TRACE_EVENTS",
    /// Decision events for `tierlb trace` (`TraceEvent`), reserved and written in place (`trace::decision`).
    /// A ring buffer rather than a perf buffer: one buffer shared by the CPUs keeps events in order and its
    /// memory is one allocation, and a failed reserve tells the program an event is lost, which it counts.
    pub(crate) static TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(TRACE_RING_BYTES, 0);
);

named_map!(
    MAP_TRACE_CONTROL == "TRACE_CONTROL",
    /// The trace switch (`TraceControl`), set by `tierlb trace`: all zero (off) costs the connect programs
    /// this one array lookup.
    pub(crate) static TRACE_CONTROL: Array<TraceControl> = Array::with_max_entries(1, 0);
);

named_map!(
    MAP_TRACE_SERVICES == "TRACE_SERVICES",
    /// svc_id -> 1 for a trace filtered by Service or VIP (`TRACE_SELECTED`); read only while one runs.
    pub(crate) static TRACE_SERVICES: HashMap<u32, u32> = HashMap::with_max_entries(TRACE_MAX_SERVICES, 0);
);

/// Each socket's own reverse state (`SockState`), freed by the kernel with the socket (`bpf_sk_storage_free`
/// in `__sk_destruct`). A BTF map (`SkStorage` has no legacy form), so its name is the symbol's: `named_map!`
/// cannot check it, this assertion does.
#[btf_map]
pub(crate) static SOCKS: SkStorage<SockState> = SkStorage::new();
const _: () = assert!(same(MAP_SOCKS, "SOCKS"), "map name differs from its lb_common constant");

named_map!(
    MAP_CT_TCP == "CT_TCP",
    /// Established and closing TCP flows from outside the node, two entries each (`lb_common::nat`). An LRU,
    /// so a full table forgets the least recently used flows instead of refusing new ones.
    pub(crate) static CT_TCP: LruHashMap<CtKey, CtValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_CONNTRACK, 0);
);

named_map!(
    MAP_CT_SYN == "CT_TCP_SYN",
    /// Half-open TCP flows, until their handshake completes: a SYN flood evicts only these.
    pub(crate) static CT_SYN: LruHashMap<CtKey, CtValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_CONNTRACK_SYN, 0);
);

named_map!(
    MAP_CT_UDP == "CT_UDP",
    /// UDP flows from outside the node: apart from TCP's, so a flood of UDP flows evicts UDP flows only.
    pub(crate) static CT_UDP: LruHashMap<CtKey, CtValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_CONNTRACK_UDP, 0);
);

named_map!(
    MAP_NS_ADDRS == "NS_ADDRS",
    /// The ingress pre-filter: node addresses and outside frontends' addresses (`ADDR_*` flags).
    pub(crate) static NS_ADDRS: HashMap<AddrKey, u32> =
        HashMap::with_max_entries(DEFAULT_MAX_NS_ADDRS, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_LOCAL_BACKENDS == "LOCAL_BACKENDS",
    /// The node's own endpoints: external traffic to them keeps the client's address.
    pub(crate) static LOCAL_BACKENDS: HashMap<CtAddr, u32> =
        HashMap::with_max_entries(DEFAULT_MAX_LOCAL_BACKENDS, BPF_F_NO_PREALLOC);
);

named_map!(
    MAP_NAT_CONFIG == "NAT_CONFIG",
    /// The tc programs' settings (`NatConfig`), written by the agent at start.
    pub(crate) static NAT_CONFIG: Array<NatConfig> = Array::with_max_entries(1, 0);
);

named_map!(
    MAP_NS_COUNTERS == "NS_COUNTERS",
    /// Per-CPU counters of the tc programs by `NS_*` kind (translations, drops by reason).
    pub(crate) static NS_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NS_COUNTER_SLOTS, 0);
);

/// `MAP_FRAGMENTS`' key: a datagram as its fragments name it (addresses and id in network order; the IPv4
/// id in the first two bytes of `id`, the IPv6 Fragment header's 32 bits whole).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct FragKey {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub id: u32,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}

/// `MAP_FRAGMENTS`' value: the first fragment's ports (network order) and when they stop applying.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct FragPorts {
    pub sport: u16,
    pub dport: u16,
    pub _pad: u32,
    pub expires_ns: u64,
}

named_map!(
    MAP_FRAGMENTS == "FRAGMENTS",
    /// The ports of fragmented datagrams of translated flows (IPv4, and IPv6 with a Fragment header), from
    /// their first fragment.
    pub(crate) static FRAGMENTS: LruHashMap<FragKey, FragPorts> =
        LruHashMap::with_max_entries(DEFAULT_MAX_FRAGMENTS, 0);
);

named_map!(
    MAP_SOURCE_RANGES == "SOURCE_RANGES",
    /// `loadBalancerSourceRanges` of the outside frontends that have them (`FLAG_SOURCE_RANGES`).
    pub(crate) static SOURCE_RANGES: LpmTrie<SourceRangeKey, u32> =
        LpmTrie::with_max_entries(DEFAULT_MAX_SOURCE_RANGES, BPF_F_NO_PREALLOC);
);
