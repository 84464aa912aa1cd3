//! Types shared by the BPF programs (`lb-ebpf`) and the agent (`lb-user`), and the tier choice they both run.
//!
//! Every map key and value is `#[repr(C)]`, `Copy`, has no `bool`/enum/`Option` field and explicit padding, and
//! carries a compile-time size assertion, so the kernel and user space agree on the layout byte for byte.
//! Each derives `bytemuck::Pod`, so the compiler proves it has no implicit padding and that every bit
//! pattern is a valid value (what copying it to and from map memory as bytes relies on).
//! Addresses and ports are kept in network byte order, exactly as the kernel hands them to a
//! `cgroup/sock_addr` program (`user_ip4`, `user_ip6`, and `user_port` whose low 16 bits hold the port).
#![cfg_attr(target_arch = "bpf", no_std)]
#![warn(missing_docs)]

use core::mem::size_of;

use bytemuck::{Pod, Zeroable};

// Address family tags stored in keys are not the `AF_*` values, so that a zeroed key never matches.
/// Family tag of an IPv4 key (also a v4-mapped IPv6 destination, which is looked up as IPv4).
pub const FAMILY_V4: u8 = 4;
/// Family tag of an IPv6 key.
pub const FAMILY_V6: u8 = 6;
/// The bits of `FrontendKey::family` that hold `FAMILY_V4` / `FAMILY_V6`.
pub const FAMILY_MASK: u8 = 0x0f;
/// The high bit of `FrontendKey::family`: a frontend for traffic from outside the node (the plan's
/// `from_outside` set, `nat`), looked up only by the tc programs.
pub const SCOPE_OUTSIDE: u8 = 0x80;

/// Third 32-bit word of a v4-mapped IPv6 address (`::ffff:a.b.c.d`, the prefix `::ffff:0:0/96`); the first
/// two words are zero and the fourth is the IPv4 address. A dual-stack socket connecting to an IPv4 Service
/// hands the BPF program this form in `user_ip6`. Built with `from_ne_bytes` because address words are
/// compared as they lie in memory (bytes `00 00 ff ff`, network order), so it is right on either byte order.
pub const V4_MAPPED_WORD2: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

// IP protocol numbers as found in `bpf_sock_addr.protocol`, so keys built by the agent match the kernel's.
/// `IPPROTO_TCP`.
pub const PROTO_TCP: u8 = 6;
/// `IPPROTO_UDP` (the only protocol for which the data path records the socket's network namespace, see
/// `ReverseValue::netns_cookie`).
pub const PROTO_UDP: u8 = 17;
/// `IPPROTO_SCTP`.
pub const PROTO_SCTP: u8 = 132;

// Tier indexes into `FrontendValue::tiers`; their order is the order the data path tries them in.
/// Endpoints on this node (under a Local policy, kube-proxy's local set).
pub const TIER_NODE: usize = 0;
/// Endpoints in this node's zone (topology hints), tried when no node endpoint is live.
pub const TIER_ZONE: usize = 1;
/// Every usable endpoint of the Service: the last resort (empty under a Local policy).
pub const TIER_CLUSTER: usize = 2;
/// How many tiers a frontend has.
pub const TIER_COUNT: usize = 3;

/// `svc_id` 0 is never given to a Service: its counters are the program-wide ones.
pub const GLOBAL_SVC_ID: u32 = 0;

/// How many slots of each tier the slow path scans after a random pick hit a backend marked down (the
/// verifier needs a bound). A longer tier still works: the random pick covers every slot; only the scan is
/// limited to this many slots from a random offset. See `choose`.
pub const TIER_SCAN: u32 = 16;

/// Errno a connect()/sendmsg() gets when the Service has no usable endpoint (kube-proxy: REJECT).
pub const ERRNO_NO_ENDPOINTS: i32 = 111; // ECONNREFUSED
/// Errno when endpoints exist but a Local traffic policy finds none on this node (kube-proxy: DROP, so the
/// client would hang until its own timeout; tierlb fails fast instead).
pub const ERRNO_NO_LOCAL_ENDPOINT: i32 = 113; // EHOSTUNREACH

/// The errno a refused connect returns for a frontend with these `flags` (`FLAG_EMPTY_IS_DROP`: a Local
/// policy with no local endpoint), as the data path picks it.
#[must_use]
pub const fn refusal_errno(flags: u32) -> i32 {
    if flags & FLAG_EMPTY_IS_DROP != 0 { ERRNO_NO_LOCAL_ENDPOINT } else { ERRNO_NO_ENDPOINTS }
}

/// The name of a refusal errno (`ERRNO_NO_ENDPOINTS`, `ERRNO_NO_LOCAL_ENDPOINT`), for status and trace.
#[must_use]
pub const fn errno_name(errno: i32) -> &'static str {
    match errno {
        ERRNO_NO_ENDPOINTS => "ECONNREFUSED",
        ERRNO_NO_LOCAL_ENDPOINT => "EHOSTUNREACH",
        _ => "unknown",
    }
}

// Frontend flags (`FrontendValue::flags`).
/// The Service's internal traffic policy is Local: only the node tier is filled (with the local set). The
/// data path never reads it (it acts on the tiers alone); it tells user space (`tierlb status`) why the
/// tiers look so.
pub const FLAG_POLICY_LOCAL: u32 = 1 << 0;
/// When no tier has a live backend this is kube-proxy's DROP case (endpoints exist, none local).
/// Without it, the REJECT case.
pub const FLAG_EMPTY_IS_DROP: u32 = 1 << 1;

/// Backend-state flag (`BackendState::flags`): while the mark lasts, new connects skip this backend and fall
/// back to the next live one, before the agent re-plans.
pub const BACKEND_DOWN: u32 = 1 << 0;

// Map names, shared so user space never spells them differently from the BPF side.
/// Service frontends: `FrontendKey` -> `FrontendValue`.
pub const MAP_FRONTENDS: &str = "FRONTENDS";
/// Backend slots of every tier, `SLOT_BLOCK` to an entry: `SlotKey` -> `SlotBlock`.
pub const MAP_SLOTS: &str = "SLOTS";
/// Backends marked down: `Backend` -> `BackendState`; absent (or expired) means up.
pub const MAP_BACKEND_STATE: &str = "BACKEND_STATE";
/// Per-CPU counters: one `ServiceCounters` at each service id (`GLOBAL_SVC_ID`: the program-wide ones).
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Service names by `svc_id`: read by `tierlb status` and by a restarted agent adopting the maps; the BPF
/// programs never touch it.
pub const MAP_NAMES: &str = "SVC_NAMES";
/// sessionAffinity ClientIP: (frontend, client network namespace) -> (backend, last use). An LRU.
pub const MAP_AFFINITY: &str = "AFFINITY";
/// sessionAffinity ClientIP for the network namespaces a pod's processes create themselves: keyed as
/// `MAP_AFFINITY`, used for a connect from a namespace that is not the first one its cgroup connected from
/// (`MAP_CGROUP_NETNS`), so that namespaces made inside a pod evict only each other's entries. An LRU.
pub const MAP_NESTED_AFFINITY: &str = "NESTED_AFFINITY";
/// cgroup id -> the network namespace (cookie) of the first connect to an affinity frontend made from that
/// cgroup: the pod's own namespace. An LRU written and read by the kernel only.
pub const MAP_CGROUP_NETNS: &str = "CGROUP_NETNS";
/// Backends of the frontends with sessionAffinity: (svc_id, generation, backend) -> tiers, what the data path
/// checks an affinity entry against.
pub const MAP_MEMBERS: &str = "MEMBERS";
/// Passive health: `Backend` -> `Health`, written by the kernel (`sock_ops` and the connect programs); the
/// agent deletes the entries of backends that left every Service.
pub const MAP_HEALTH: &str = "HEALTH";
/// Passive health settings (`HealthConfig`), one entry, written by the agent at start.
pub const MAP_HEALTH_CONFIG: &str = "HEALTH_CONFIG";
/// Every map the agent opens by type, in the order the agent pins them.
pub const MAPS: [&str; 14] = [
    MAP_FRONTENDS,
    MAP_SLOTS,
    MAP_BACKEND_STATE,
    MAP_COUNTERS,
    MAP_NAMES,
    MAP_REVERSE,
    MAP_CONNECTED_UDP,
    MAP_AFFINITY,
    MAP_MEMBERS,
    MAP_HEALTH,
    MAP_HEALTH_CONFIG,
    MAP_OUTSIDE_AFFINITY,
    MAP_NESTED_AFFINITY,
    MAP_MAGLEV,
];
/// Maps the agent creates and pins but never opens: the socket storage, the TCP sockets' reverse slots, the
/// per-namespace count of connected UDP sockets and each cgroup's first namespace (which only the kernel
/// reads, but a restarted agent must reuse them, or live sockets would lose their reverse state and their
/// count) and the trace maps (which `tierlb trace` opens from the pins; the agent reads the lost-event count
/// from `MAP_COUNTERS`).
pub const PINNED_ONLY: [&str; 7] = [
    MAP_SOCKS,
    MAP_REVERSE_TCP,
    MAP_UDP_PER_NETNS,
    MAP_CGROUP_NETNS,
    MAP_TRACE_EVENTS,
    MAP_TRACE_CONTROL,
    MAP_TRACE_SERVICES,
];
/// The north-south maps (`nat`): pinned like the others, so tracked flows survive an agent restart; the
/// agent opens them apart from `MAPS` (`datapath::tc::NsMaps`).
pub const NS_MAPS: [&str; 8] = [
    MAP_CT_TCP,
    MAP_CT_SYN,
    MAP_CT_UDP,
    MAP_LOCAL_BACKENDS,
    MAP_NAT_CONFIG,
    MAP_NS_COUNTERS,
    MAP_SOURCE_RANGES,
    MAP_NS_ADDRS,
];
/// Every map that is pinned: `MAPS`, then `PINNED_ONLY`, then `NS_MAPS`.
pub const PINNED_MAPS: [&str; MAPS.len() + PINNED_ONLY.len() + NS_MAPS.len()] = {
    let mut out = [MAP_SOCKS; MAPS.len() + PINNED_ONLY.len() + NS_MAPS.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = if i < MAPS.len() {
            MAPS[i]
        } else if i < MAPS.len() + PINNED_ONLY.len() {
            PINNED_ONLY[i - MAPS.len()]
        } else {
            NS_MAPS[i - MAPS.len() - PINNED_ONLY.len()]
        };
        i += 1;
    }
    out
};

// Default capacities (the agent can change them before load).
/// Default entries of the frontend map; the name map and the counter array are sized from it.
pub const DEFAULT_MAX_FRONTENDS: u32 = 65_536;
/// Default entries of the slot map (`SLOT_BLOCK` slots each; a frontend with `n` slots takes `slot_blocks(n)`):
/// every frontend's tiers together, both generations during a swap.
pub const DEFAULT_MAX_SLOTS: u32 = 1_048_576;
/// Default entries of the backend-state map: how many backends can be marked down at once.
pub const DEFAULT_MAX_BACKENDS: u32 = 262_144;
/// Default entries of the sessionAffinity LRU: how many (frontend, client) pairs are remembered at once; beyond
/// this the least recently used are forgotten (their next connect is balanced anew).
pub const DEFAULT_MAX_AFFINITY: u32 = 65_536;
/// Entries of `MAP_CGROUP_NETNS`: cgroups remembered with their first network namespace (a node's containers,
/// live and recently gone; the least recently connecting are forgotten and learnt again on their next connect).
pub const DEFAULT_MAX_CGROUPS: u32 = 16_384;

/// A Service frontend: VIP, port and protocol. For IPv4 only `addr[0]` is used.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    /// The VIP in network byte order, as `user_ip4` / `user_ip6`.
    pub addr: [u32; 4],
    /// Network byte order, as the low 16 bits of `user_port`.
    pub port: u16,
    /// `PROTO_TCP`, `PROTO_UDP` or `PROTO_SCTP`: the same VIP:port may map differently per protocol.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`; tells which words of `addr` are meaningful. With `SCOPE_OUTSIDE` set, the
    /// frontend of traffic arriving from outside the node (the tc programs' only; see `nat`).
    pub family: u8,
}
const _: () = assert!(size_of::<FrontendKey>() == 20);

impl FrontendKey {
    /// `FAMILY_V4` or `FAMILY_V6`, without the scope bit.
    #[must_use]
    pub const fn ip_family(&self) -> u8 {
        self.family & FAMILY_MASK
    }
    /// Whether this is a frontend of traffic from outside the node (`SCOPE_OUTSIDE`).
    #[must_use]
    pub const fn is_outside(&self) -> bool {
        self.family & SCOPE_OUTSIDE != 0
    }
}

/// A half-open range of slot indexes `[start, start + len)` of one tier.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct TierRange {
    /// First slot index of the tier.
    pub start: u16,
    /// Number of slots; 0 is an empty tier, skipped by the data path.
    pub len: u16,
}
const _: () = assert!(size_of::<TierRange>() == 4);

/// Where a frontend's backends are: slots `index` of each tier's range of the generation `(svc_id, generation)`,
/// `SLOT_BLOCK` to an entry of the slot map (`SlotKey::locate`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct FrontendValue {
    /// The key this value is stored under, first in the value. The data path checks it after copying the value
    /// out: a hash element can be reused for another key while a program still reads it (see `FRONTENDS` in
    /// lb-ebpf's maps.rs for why and why first).
    pub key: FrontendKey,
    /// Which slot set is current: the agent writes a changed frontend's slots under a new generation, then
    /// swaps this value in one update, so a connect never sees a half-written set. Every write of a key
    /// has a new one (the previous value's plus one, a takeover by another Service included). Right after
    /// the key, before every other field (see `generation_tail`).
    pub generation: u32,
    /// The Service port's id: keys its slots, its counters and its name (never `GLOBAL_SVC_ID`).
    pub svc_id: u32,
    /// Indexed by `TIER_NODE`, `TIER_ZONE`, `TIER_CLUSTER`. Ranges may overlap and repeat a backend.
    pub tiers: [TierRange; TIER_COUNT],
    /// `FLAG_POLICY_LOCAL`, `FLAG_EMPTY_IS_DROP`.
    pub flags: u32,
    /// sessionAffinity ClientIP: how long (seconds, from the client's last connect) a client keeps its backend;
    /// 0 is no affinity. Its backends are in `MAP_MEMBERS`.
    pub affinity_timeout_s: u32,
    /// `generation` again, last in the value. The data path reads it first and `generation` last: a copy
    /// torn by a rewrite of the same key (whose `key` matches) has the two from different writes (see
    /// `FRONTENDS` in lb-ebpf's maps.rs).
    pub generation_tail: u32,
}
const _: () = assert!(size_of::<FrontendValue>() == 52);

/// Backend slots per entry of the slot map: a frontend's slots `8b .. 8b + 7` are one entry (`SlotKey::block`
/// `b`). One entry per 8 slots, not per slot: writing a map entry (the kernel's allocation, hash and bucket
/// lock) costs far more than its bytes, so 100,000 Services of 10 slots are 200,000 writes, not 1,000,000.
pub const SLOT_BLOCK: usize = 8;

/// Entries of the slot map a frontend with `slots` slots takes.
#[inline(always)]
#[must_use]
pub const fn slot_blocks(slots: usize) -> usize {
    slots.div_ceil(SLOT_BLOCK)
}

/// Key of one entry of the slot map: `SLOT_BLOCK` consecutive slots of one frontend's generation.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    /// `FrontendValue::svc_id` of the frontend the slots belong to.
    pub svc_id: u32,
    /// `FrontendValue::generation` the slots were written under.
    pub generation: u32,
    /// Which `SLOT_BLOCK` slots: indexes `block * SLOT_BLOCK ..`, inside the frontend's `TierRange`s.
    pub block: u32,
}
const _: () = assert!(size_of::<SlotKey>() == 12);

impl SlotKey {
    /// The entry holding slot `index` of a frontend's generation, and the slot's place in it.
    #[inline(always)]
    #[must_use]
    pub const fn locate(svc_id: u32, generation: u32, index: u32) -> (Self, usize) {
        let block = index / SLOT_BLOCK as u32;
        (Self { svc_id, generation, block }, (index % SLOT_BLOCK as u32) as usize)
    }
}

/// Value of one entry of the slot map: `SLOT_BLOCK` slots; the last entry of a generation is padded with
/// zeroed backends, which no tier range reaches.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlotBlock {
    /// The backends of the block's slots, in index order.
    pub slots: [Backend; SLOT_BLOCK],
}
const _: () = assert!(size_of::<SlotBlock>() == 20 * SLOT_BLOCK);

impl SlotBlock {
    /// A generation's `slots`, in index order, as the entries of the slot map hold them: `SLOT_BLOCK` to a
    /// block, the last one zeroed after its slots (`slot_blocks` of them; none for no slot).
    pub fn pack(slots: impl IntoIterator<Item = Backend>) -> impl Iterator<Item = Self> {
        let mut slots = slots.into_iter();
        core::iter::from_fn(move || {
            let mut block = Self::default();
            let mut n = 0;
            // `zip` asks its first iterator first: past the block's last place no slot is taken.
            for (place, backend) in block.slots.iter_mut().zip(slots.by_ref()) {
                *place = backend;
                n += 1;
            }
            (n != 0).then_some(block)
        })
    }

    /// `slots` (at most `SLOT_BLOCK`) as one block: the first entry `pack` makes of them.
    #[must_use]
    pub fn of(slots: &[Backend]) -> Self {
        Self::pack(slots.iter().copied()).next().unwrap_or_default()
    }
}

/// A backend (endpoint) address; value of a slot and key of the backend-state map.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    /// Network byte order. For IPv4 only `addr[0]` is used.
    pub addr: [u32; 4],
    /// Network byte order.
    pub port: u16,
    /// The frontend's protocol; part of the key so a backend marked down for TCP stays up for UDP.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
}
const _: () = assert!(size_of::<Backend>() == 20);

/// A backend's mark (value of the backend-state map). Times are `CLOCK_BOOTTIME` nanoseconds, the clock of
/// `bpf_ktime_get_boot_ns` (user space: `clock_gettime(CLOCK_BOOTTIME)`): it counts suspended time too and
/// is the same for every process on the host, so a mark expires exactly on time whether or not an agent runs.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct BackendState {
    /// `BACKEND_DOWN`.
    pub flags: u32,
    /// Explicit padding before the 8-aligned times, always 0.
    pub _pad: u32,
    /// When the backend was marked down.
    pub since_ns: u64,
    /// When the mark ends: from then on the data path uses the backend again.
    pub until_ns: u64,
}
const _: () = assert!(size_of::<BackendState>() == 24);

impl BackendState {
    /// A down mark from `since_ns` until `until_ns`.
    #[must_use]
    pub const fn down(since_ns: u64, until_ns: u64) -> Self {
        Self { flags: BACKEND_DOWN, _pad: 0, since_ns, until_ns }
    }
    /// Whether new connects skip the backend at `now_ns`: marked down and not yet expired.
    #[inline(always)]
    #[must_use]
    pub const fn is_down_at(&self, now_ns: u64) -> bool {
        self.flags & BACKEND_DOWN != 0 && now_ns < self.until_ns
    }
}

/// Key of an affinity entry: which client asked for which frontend.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AffinityKey {
    /// The frontend the client connected to (as it asked, before any translation).
    pub frontend: FrontendKey,
    /// Explicit padding before the 8-aligned cookie, always 0.
    pub _pad: u32,
    /// The client's identity: its network namespace (`bpf_get_netns_cookie`), one per pod; the node's own
    /// processes share the host's. A socket-level load balancer sees no source address before the connect.
    pub netns_cookie: u64,
}
const _: () = assert!(size_of::<AffinityKey>() == 32);

/// The backend a client was given and when it last connected (`CLOCK_BOOTTIME` ns, as `BackendState`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityValue {
    /// The backend.
    pub backend: Backend,
    /// Explicit padding before the 8-aligned time, always 0.
    pub _pad: u32,
    /// The client's last connect to the frontend: the timeout runs from here (kube-proxy's `recent` match).
    pub last_ns: u64,
}
const _: () = assert!(size_of::<AffinityValue>() == 32);

impl AffinityValue {
    /// Whether the entry still holds at `now_ns` for a frontend whose timeout is `timeout_s` seconds.
    #[inline(always)]
    #[must_use]
    pub const fn is_fresh(&self, now_ns: u64, timeout_s: u32) -> bool {
        now_ns.saturating_sub(self.last_ns) < timeout_s as u64 * 1_000_000_000
    }
}

/// Key of a member entry: one backend of one generation of a frontend with sessionAffinity (immutable, like
/// that generation's slots, and deleted with them).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberKey {
    /// `FrontendValue::svc_id`.
    pub svc_id: u32,
    /// `FrontendValue::generation`.
    pub generation: u32,
    /// The backend.
    pub backend: Backend,
}
const _: () = assert!(size_of::<MemberKey>() == 28);

/// In which tiers of its generation a member is.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemberValue {
    /// Bit `t` set: the backend is in tier `t` (`TIER_NODE`, `TIER_ZONE`, `TIER_CLUSTER`).
    pub tiers: u32,
}
const _: () = assert!(size_of::<MemberValue>() == 4);

impl MemberValue {
    /// Whether the backend is in tier `tier`.
    #[inline(always)]
    #[must_use]
    pub const fn in_tier(&self, tier: usize) -> bool {
        tier < 32 && self.tiers & (1 << tier) != 0
    }
}

/// `namespace/name:port` of a frontend's Service, NUL-padded UTF-8 (longer names are cut).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
pub struct ServiceName {
    /// The name's UTF-8 bytes, then NULs; a fixed array because map values have a fixed size.
    pub bytes: [u8; 128],
}
const _: () = assert!(size_of::<ServiceName>() == 128);

impl ServiceName {
    /// The name for the map; cut at a character boundary if longer than 128 bytes, so it stays valid UTF-8.
    #[must_use]
    pub fn new(s: &str) -> Self {
        let mut bytes = [0u8; 128];
        let mut end = s.len().min(128);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        bytes[..end].copy_from_slice(&s.as_bytes()[..end]);
        Self { bytes }
    }
    /// The name up to its first NUL; "" if the bytes are not UTF-8 (a map not written by the agent).
    #[must_use]
    pub fn as_str(&self) -> &str {
        let end = self.bytes.iter().position(|b| *b == 0).unwrap_or(self.bytes.len());
        core::str::from_utf8(&self.bytes[..end]).unwrap_or("")
    }
}

/// `aya::Pod` for the map keys and values, only where `bytemuck::Pod` already holds: the bound in the
/// expansion fails to compile for a type that could have padding or invalid bit patterns, so the unsafe impl
/// can never claim more than the compiler proved. Behind `user` because only the agent links aya (as aya's
/// own `test/integration-common` does).
#[cfg(feature = "user")]
macro_rules! aya_pod {
    ($($t:ty),+ $(,)?) => {$(
        const _: fn() = || {
            fn assert_pod<T: bytemuck::Pod>() {}
            assert_pod::<$t>();
        };
        // SAFETY: aya::Pod asks for a `Copy` type without padding for which every bit pattern is valid, so
        // it can be copied to and from map memory as bytes. `bytemuck::Pod`, derived (so the compiler checks
        // every field and that there is no padding) and required of `$t` just above, guarantees exactly that.
        unsafe impl aya::Pod for $t {}
    )+};
}

#[cfg(feature = "user")]
aya_pod!(
    AddrKey,
    FrontendKey,
    FrontendValue,
    SlotKey,
    SlotBlock,
    Backend,
    BackendState,
    ReverseKey,
    ReverseValue,
    TcpReverse,
    ServiceName,
    ServiceCounters,
    SockState,
    AffinityKey,
    AffinityValue,
    MemberKey,
    MemberValue,
    Health,
    HealthConfig,
    TraceControl,
    TraceEvent,
    CtAddr,
    CtKey,
    CtValue,
    NatConfig,
    SourceRangeKey,
    OutsideAffinityKey,
    MaglevKey,
    MaglevTable
);

mod choice;
mod counters;
mod csum;
mod dsr;
mod health;
mod maglev;
mod nat;
mod reverse;
mod snat;
mod trace;
pub use choice::{
    Choice, SCAN_ERROR, SCAN_NONE, Scan, Slot, below, choose, choose_with, first_live_tier,
    first_nonempty_tier, keep_sticky, last_nonempty_tier, scan_tier,
};
pub use counters::*;
pub use csum::{CsumDiff, fold as csum_fold};
pub use dsr::*;
pub use health::{
    HEALTH_REFUSED, HEALTH_TIMEOUT, HEALTH_TRIAL_NS, HEALTH_UNREACHABLE, HOLD_ALL, HOLD_CLIENT, Health,
    HealthConfig, HealthVerdict, Held, syn_sent_close_reason,
};
pub use maglev::*;
pub use nat::*;
pub use reverse::*;
pub use snat::SnatPorts;
pub use trace::{
    GLOBAL_TRACE_LOST, MAP_TRACE_CONTROL, MAP_TRACE_EVENTS, MAP_TRACE_SERVICES, OUTCOME_FAIL_OPEN,
    OUTCOME_REFUSED, OUTCOME_TRANSLATED, TRACE_AFFINITY, TRACE_ALL, TRACE_CONNECT, TRACE_HELD,
    TRACE_LEASE_NS, TRACE_MAX_SERVICES, TRACE_OFF, TRACE_PANIC, TRACE_RING_BYTES, TRACE_SELECTED,
    TRACE_SKIPPED_SHIFT, TRACE_TC, TRACE_TORN, TRACE_TRIAL, TRACE_V6, TraceControl, TraceEvent, trace_info,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_down_only_until_it_expires() {
        let m = BackendState::down(100, 200);
        assert!(m.is_down_at(100) && m.is_down_at(199));
        assert!(!m.is_down_at(200) && !m.is_down_at(u64::MAX), "expired at until_ns");
        assert!(!BackendState { flags: 0, ..m }.is_down_at(150), "no flag, no mark");
    }

    #[test]
    fn v4_mapped_word2_is_the_third_word_of_a_mapped_address_in_memory() {
        let octets = std::net::Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped().octets();
        let word = |i: usize| {
            u32::from_ne_bytes([octets[4 * i], octets[4 * i + 1], octets[4 * i + 2], octets[4 * i + 3]])
        };
        assert_eq!([word(0), word(1), word(2)], [0, 0, V4_MAPPED_WORD2]);
        assert_eq!(word(3), u32::from_ne_bytes([192, 0, 2, 1]));
    }
}
