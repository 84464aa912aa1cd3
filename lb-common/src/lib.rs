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

// Per-service counter kinds, stored in a per-CPU array at `svc_id * COUNTERS_PER_SERVICE + kind`.
/// Connects translated to a node-tier backend.
pub const COUNTER_NODE: u32 = 0;
/// Connects translated to a zone-tier backend.
pub const COUNTER_ZONE: u32 = 1;
/// Connects translated to a cluster-tier backend.
pub const COUNTER_CLUSTER: u32 = 2;
/// Connect refused because the Service has no usable endpoint (kube-proxy would REJECT).
pub const COUNTER_REJECTED: u32 = 3;
/// Connect refused because a Local policy found no local endpoint (kube-proxy would DROP).
pub const COUNTER_DROPPED: u32 = 4;
/// An internal error (a slot the frontend points at is missing); the connect went through untranslated.
pub const COUNTER_FAIL_OPEN: u32 = 5;
/// Counter slots per Service in the counter array; the kinds above use six, the rest are spare.
pub const COUNTERS_PER_SERVICE: u32 = 8;
// The data path counts a pick from tier `t` under counter kind `t`.
const _: () = assert!(COUNTER_NODE == TIER_NODE as u32 && COUNTER_ZONE == TIER_ZONE as u32);
const _: () = assert!(COUNTER_CLUSTER == TIER_CLUSTER as u32);
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

// Frontend flags (`FrontendValue::flags`).
/// The Service's internal traffic policy is Local: only the node tier is filled (with the local set). The
/// data path never reads it (it acts on the tiers alone); it tells user space (`tierlb status`) why the
/// tiers look so.
pub const FLAG_POLICY_LOCAL: u32 = 1 << 0;
/// When no tier has a live backend this is kube-proxy's DROP case (endpoints exist, none local).
/// Without it, the REJECT case.
pub const FLAG_EMPTY_IS_DROP: u32 = 1 << 1;

/// Backend-state flag (value of the backend-state map): new connects skip this backend and fall back to the
/// next live one, before the agent re-plans.
pub const BACKEND_DOWN: u32 = 1 << 0;

// Map names, shared so user space never spells them differently from the BPF side.
/// Service frontends: `FrontendKey` -> `FrontendValue`.
pub const MAP_FRONTENDS: &str = "FRONTENDS";
/// Backend slots of every tier: `SlotKey` -> `Backend`.
pub const MAP_SLOTS: &str = "SLOTS";
/// Backends marked down: `Backend` -> flags (`BACKEND_DOWN`); absent means up.
pub const MAP_BACKEND_STATE: &str = "BACKEND_STATE";
/// Per-CPU counters at `counter_index(svc_id, kind)`.
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Service names by `svc_id`: read by `tierlb status` and by a restarted agent adopting the maps; the BPF
/// programs never touch it.
pub const MAP_NAMES: &str = "SVC_NAMES";
/// Reverse translation: (socket cookie, backend) -> VIP, for recvmsg and getpeername.
pub const MAP_REVERSE: &str = "REVERSE";
/// Every map, in the order the agent pins them.
pub const MAPS: [&str; 6] =
    [MAP_FRONTENDS, MAP_SLOTS, MAP_BACKEND_STATE, MAP_COUNTERS, MAP_NAMES, MAP_REVERSE];

// Default capacities (the agent can change them before load).
/// Default entries of the frontend map; the name map and the counter array are sized from it.
pub const DEFAULT_MAX_FRONTENDS: u32 = 65_536;
/// Default entries of the slot map: every frontend's tiers together, both generations during a swap.
pub const DEFAULT_MAX_SLOTS: u32 = 1_048_576;
/// Default entries of the backend-state map: how many backends can be marked down at once.
pub const DEFAULT_MAX_BACKENDS: u32 = 262_144;
/// Default entries of the reverse map (an LRU: beyond this the oldest translations are forgotten).
pub const DEFAULT_MAX_REVERSE: u32 = 262_144;

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
    /// `FAMILY_V4` or `FAMILY_V6`; tells which words of `addr` are meaningful.
    pub family: u8,
}
const _: () = assert!(size_of::<FrontendKey>() == 20);

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

/// Where a frontend's backends are: slots `(svc_id, generation, index)` for index in each tier's range.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct FrontendValue {
    /// The Service port's id: keys its slots, its counters and its name (never `GLOBAL_SVC_ID`).
    pub svc_id: u32,
    /// Which slot set is current: the agent writes a changed frontend's slots under a new generation, then
    /// swaps this value in one update, so a connect never sees a half-written set.
    pub generation: u32,
    /// Indexed by `TIER_NODE`, `TIER_ZONE`, `TIER_CLUSTER`. Ranges may overlap and repeat a backend.
    pub tiers: [TierRange; TIER_COUNT],
    /// `FLAG_POLICY_LOCAL`, `FLAG_EMPTY_IS_DROP`.
    pub flags: u32,
}
const _: () = assert!(size_of::<FrontendValue>() == 24);

/// Key of one backend slot.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    /// `FrontendValue::svc_id` of the frontend the slot belongs to.
    pub svc_id: u32,
    /// `FrontendValue::generation` the slot was written under.
    pub generation: u32,
    /// Slot index, inside one of the frontend's `TierRange`s.
    pub index: u32,
}
const _: () = assert!(size_of::<SlotKey>() == 12);

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

/// Key of a reverse entry: which socket talked to which backend.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReverseKey {
    /// The socket's cookie (`bpf_get_socket_cookie`), stable for the socket's life.
    pub cookie: u64,
    /// The backend the socket was sent to, as recvmsg/getpeername later see it.
    pub backend: Backend,
    /// Explicit tail padding (the key is 8-aligned); always 0 so equal keys hash equal.
    pub _pad: u32,
}
const _: () = assert!(size_of::<ReverseKey>() == 32);

/// What the socket asked for (the VIP and port), and the network namespace it lives in (for the agent's
/// socket destruction, which must run inside that namespace).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReverseValue {
    /// The VIP the socket asked for, network byte order (`FrontendKey::addr`).
    pub vip: [u32; 4],
    /// Network byte order.
    pub port: u16,
    /// `FAMILY_V4` or `FAMILY_V6` of the VIP.
    pub family: u8,
    /// Explicit padding, always 0.
    pub _pad: u8,
    /// Explicit padding before the 8-aligned cookie, always 0.
    pub _pad2: u32,
    /// The socket's network namespace (`bpf_get_netns_cookie`), recorded for UDP only; 0 otherwise.
    pub netns_cookie: u64,
}
const _: () = assert!(size_of::<ReverseValue>() == 32);

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
aya_pod!(FrontendKey, FrontendValue, SlotKey, Backend, ReverseKey, ReverseValue, ServiceName);

/// Index of a counter in the per-CPU counter array.
#[inline(always)]
#[must_use]
pub const fn counter_index(svc_id: u32, kind: u32) -> u32 {
    svc_id.wrapping_mul(COUNTERS_PER_SERVICE).wrapping_add(kind)
}

/// What a slot lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot<B> {
    /// The slot exists and its backend is not marked down.
    Live(B),
    /// The slot exists but its backend is marked down.
    Down(B),
    /// The slot does not exist: the maps are inconsistent (internal error).
    Missing,
}

/// Outcome of the tier choice for one connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice<B> {
    /// Rewrite to this backend, taken from this tier.
    Backend {
        /// `TIER_NODE`, `TIER_ZONE` or `TIER_CLUSTER`: also the counter kind the pick is counted under.
        tier: usize,
        /// The backend to rewrite the destination to.
        backend: B,
    },
    /// No tier holds a live backend: fail the connect (which errno depends on `FLAG_EMPTY_IS_DROP`).
    Empty,
    /// A slot was missing: fail open.
    Error,
}

/// A number in `[0, n)` from a uniform 32-bit random value (Lemire's multiply-shift), for `n >= 1`. `r`
/// must use all 32 bits (as `bpf_get_prandom_u32` does); a 31-bit source would only ever give `[0, n/2)`.
///
/// Not `r % n`: a remainder needs a division-by-zero branch (a panic path the verifier rejects, or a branch on
/// `n` that makes the verifier track `n` exactly and explode the number of states it explores).
#[inline(always)]
#[must_use]
pub fn below(r: u32, n: u32) -> u32 {
    ((u64::from(r) * u64::from(n)) >> 32) as u32
}

/// `scan_tier` found no live backend in its window.
pub const SCAN_NONE: u32 = u32::MAX;
/// `scan_tier` met a missing slot (inconsistent maps).
pub const SCAN_ERROR: u32 = u32::MAX - 1;

/// Index of the first tier, in the order node, zone, cluster (`TIER_NODE`, `TIER_ZONE`, `TIER_CLUSTER`), that
/// holds a backend `live` accepts (one not marked down); `None` when no tier does, which the data path turns
/// into a refused connect (`Choice::Empty`).
///
/// This is the rule the data path applies: `choose` takes its backend from this tier, so host faces
/// (`tierlb status`, the study) call this function rather than re-deriving the order. The one place they can
/// differ is `choose`'s bounded slow path: in a tier longer than `TIER_SCAN` whose scanned window holds only
/// backends marked down, `choose` moves on although this function would name that tier (see `scan_tier`).
#[must_use]
pub fn first_live_tier<B>(tiers: [&[B]; TIER_COUNT], mut live: impl FnMut(&B) -> bool) -> Option<usize> {
    tiers.iter().position(|tier| tier.iter().any(&mut live))
}

/// The tier choice the data path makes on every connect, written once for BPF and host tests.
///
/// The tier is the one `first_live_tier` names (node, zone, cluster: the first holding a live backend; the
/// two agree, up to the `TIER_SCAN` bound described there), and within it the backend is uniform among the
/// live ones.
///
/// Fast path (nothing marked down, the common case): one random slot of the first non-empty tier; if it is
/// live, that is the answer, at the cost of one slot lookup. Slow path (the pick was marked down): each tier in
/// turn is scanned by `scan_tier`, the first with a live backend wins. Together that is exactly uniform: a
/// live slot of the first tier is taken with probability `1/len` directly plus `(down/len) * (1/live)` from
/// the scan, which sums to `1/live`.
#[inline(always)]
pub fn choose<B: Copy + Default>(
    fe: &FrontendValue,
    mut lookup: impl FnMut(u32) -> Slot<B>,
    mut random: impl FnMut() -> u32,
) -> Choice<B> {
    let [node, zone, cluster] = fe.tiers;
    let (first, first_tier) = if node.len != 0 {
        (node, TIER_NODE)
    } else if zone.len != 0 {
        (zone, TIER_ZONE)
    } else if cluster.len != 0 {
        (cluster, TIER_CLUSTER)
    } else {
        return Choice::Empty;
    };
    match lookup(u32::from(first.start) + below(random(), u32::from(first.len))) {
        Slot::Live(backend) => {
            return Choice::Backend { tier: first_tier, backend };
        }
        Slot::Missing => return Choice::Error,
        Slot::Down(_) => {}
    }
    let mut tier = 0;
    while tier < TIER_COUNT {
        let range = fe.tiers[tier];
        if range.len != 0 {
            let found = scan_tier(range, &mut lookup, &mut random);
            if found == SCAN_ERROR {
                return Choice::Error;
            }
            if found != SCAN_NONE {
                // Look the winner up again (the scan returns only its index, see `scan_tier`). It may have been
                // marked down in the meantime; it was live a moment ago, so take it anyway.
                return match lookup(found) {
                    Slot::Live(backend) | Slot::Down(backend) => Choice::Backend { tier, backend },
                    Slot::Missing => Choice::Error,
                };
            }
        }
        tier += 1;
    }
    Choice::Empty
}

/// Reservoir-sample one live slot among up to `TIER_SCAN` slots of `range`, from a random offset; returns its
/// index, `SCAN_NONE` or `SCAN_ERROR`.
///
/// Kept out of line and returning a plain index for the BPF verifier: it explores this function once per call
/// and only the return value flows back, so what it learned about this tier's length inside the loop does not
/// multiply the states it must explore for the next tier (inlined, three tiers of 16 slots exceed the
/// verifier's one million instructions).
///
/// Bounded: in a tier longer than `TIER_SCAN`, if the scanned window holds only backends marked down the scan
/// reports none although live ones may sit outside it. Marking down bridges the moments before the agent
/// re-plans, so this is a documented approximation.
#[inline(never)]
pub fn scan_tier<B: Copy>(
    range: TierRange,
    lookup: &mut impl FnMut(u32) -> Slot<B>,
    random: &mut impl FnMut() -> u32,
) -> u32 {
    let len = u32::from(range.len);
    let start = u32::from(range.start);
    let offset = below(random(), len);
    let mut seen: u32 = 0;
    let mut picked = SCAN_NONE;
    let mut i: u32 = 0;
    while i < TIER_SCAN && i < len {
        let mut k = offset + i;
        if k >= len {
            k -= len;
        }
        match lookup(start + k) {
            Slot::Live(_) => {
                seen += 1;
                if below(random(), seen) == 0 {
                    picked = start + k;
                }
            }
            Slot::Missing => return SCAN_ERROR,
            Slot::Down(_) => {}
        }
        i += 1;
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fe(node: (u16, u16), zone: (u16, u16), cluster: (u16, u16)) -> FrontendValue {
        let r = |(start, len)| TierRange { start, len };
        FrontendValue { svc_id: 1, generation: 1, tiers: [r(node), r(zone), r(cluster)], flags: 0 }
    }

    /// A tiny deterministic generator so tests are repeatable.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 32) as u32
        }
    }

    /// slots: backend number per slot index; down: backend numbers marked down.
    fn run(fe: &FrontendValue, slots: &[u32], down: &[u32], rng: &mut Lcg) -> Choice<u32> {
        choose(
            fe,
            |i| match slots.get(i as usize) {
                None => Slot::Missing,
                Some(&b) if down.contains(&b) => Slot::Down(b),
                Some(&b) => Slot::Live(b),
            },
            || rng.next(),
        )
    }

    #[test]
    fn tier_choice_table() {
        // slots: 0 = node backend 10; 1..3 = zone backends 20, 21; 3..6 = cluster 10, 20, 30
        let slots = [10, 20, 21, 10, 20, 30];
        let f = fe((0, 1), (1, 2), (3, 3));
        struct Case {
            name: &'static str,
            fe: FrontendValue,
            down: &'static [u32],
            want_tier: Option<usize>,
        }
        let cases = [
            Case { name: "node tier wins when its backend is live", fe: f, down: &[], want_tier: Some(0) },
            Case { name: "node backend down -> zone tier", fe: f, down: &[10], want_tier: Some(1) },
            Case { name: "node and zone down -> cluster", fe: f, down: &[10, 20, 21], want_tier: Some(2) },
            Case { name: "everything down -> empty", fe: f, down: &[10, 20, 21, 30], want_tier: None },
            Case {
                name: "empty node tier is skipped",
                fe: fe((0, 0), (1, 2), (3, 3)),
                down: &[],
                want_tier: Some(1),
            },
            Case {
                name: "no tiers at all -> empty",
                fe: fe((0, 0), (0, 0), (0, 0)),
                down: &[],
                want_tier: None,
            },
        ];
        let mut rng = Lcg(7);
        for c in cases {
            for _ in 0..50 {
                let got = run(&c.fe, &slots, c.down, &mut rng);
                match (got, c.want_tier) {
                    (Choice::Backend { tier, backend }, Some(want)) => {
                        assert_eq!(tier, want, "{}", c.name);
                        assert!(!c.down.contains(&backend), "{}: picked a down backend", c.name);
                    }
                    (Choice::Empty, None) => {}
                    (other, want) => panic!("{}: got {other:?}, want tier {want:?}", c.name),
                }
            }
        }
    }

    #[test]
    fn missing_slot_is_an_internal_error_not_a_silent_skip() {
        let mut rng = Lcg(1);
        let got = run(&fe((0, 0), (0, 0), (0, 4)), &[1, 2], &[], &mut rng);
        // Half the random picks land on a missing slot (2 or 3): every run either picks a live one or errors.
        assert!(matches!(got, Choice::Backend { .. } | Choice::Error));
        let always_missing = run(&fe((0, 0), (0, 0), (5, 1)), &[1, 2], &[], &mut rng);
        assert_eq!(always_missing, Choice::Error);
    }

    #[test]
    fn choice_is_uniform_among_live_backends_with_some_down() {
        let slots: Vec<u32> = (0..8).collect();
        let f = fe((0, 0), (0, 0), (0, 8));
        let down = [1, 2, 5];
        let mut rng = Lcg(42);
        let mut hits = [0u32; 8];
        let n = 60_000;
        for _ in 0..n {
            match run(&f, &slots, &down, &mut rng) {
                Choice::Backend { backend, .. } => hits[backend as usize] += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        let expect = n / 5;
        for (b, &h) in hits.iter().enumerate() {
            if down.contains(&(b as u32)) {
                assert_eq!(h, 0, "down backend {b} was picked");
            } else {
                assert!(h.abs_diff(expect) < expect / 10, "backend {b}: {h} hits, expected ~{expect}");
            }
        }
    }

    #[test]
    fn long_tier_still_reaches_every_slot() {
        let slots: Vec<u32> = (0..100).collect();
        let f = fe((0, 0), (0, 0), (0, 100));
        let mut rng = Lcg(3);
        let mut seen = [false; 100];
        for _ in 0..5_000 {
            if let Choice::Backend { backend, .. } = run(&f, &slots, &[], &mut rng) {
                seen[backend as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn first_live_tier_table() {
        struct Case {
            name: &'static str,
            tiers: [&'static [u32]; TIER_COUNT],
            down: &'static [u32],
            want: Option<usize>,
        }
        let cases = [
            Case {
                name: "node tier wins when it holds a live backend",
                tiers: [&[10], &[20], &[30]],
                down: &[],
                want: Some(TIER_NODE),
            },
            Case {
                name: "node backend down -> zone",
                tiers: [&[10], &[20], &[30]],
                down: &[10],
                want: Some(TIER_ZONE),
            },
            Case {
                name: "node and zone down -> cluster",
                tiers: [&[10], &[20, 21], &[10, 20, 30]],
                down: &[10, 20, 21],
                want: Some(TIER_CLUSTER),
            },
            Case {
                name: "one live backend among down ones keeps its tier",
                tiers: [&[10, 11, 12], &[20], &[30]],
                down: &[10, 12],
                want: Some(TIER_NODE),
            },
            Case {
                name: "empty tiers are skipped",
                tiers: [&[], &[], &[30]],
                down: &[],
                want: Some(TIER_CLUSTER),
            },
            Case {
                name: "everything down -> none",
                tiers: [&[10], &[20], &[10, 20]],
                down: &[10, 20],
                want: None,
            },
            Case { name: "no tiers at all -> none", tiers: [&[], &[], &[]], down: &[], want: None },
        ];
        for c in cases {
            assert_eq!(first_live_tier(c.tiers, |b| !c.down.contains(b)), c.want, "{}", c.name);
        }
    }

    #[test]
    fn choose_takes_its_backend_from_the_first_live_tier() {
        // slots: 0 = node backend 10; 1..3 = zone backends 20, 21; 3..6 = cluster 10, 20, 30
        let slots = [10, 20, 21, 10, 20, 30];
        let layouts = [fe((0, 1), (1, 2), (3, 3)), fe((0, 0), (1, 2), (3, 3)), fe((0, 0), (0, 0), (3, 3))];
        let backends = [10, 20, 21, 30];
        let mut rng = Lcg(11);
        for f in layouts {
            let tiers = f.tiers.map(|r| &slots[usize::from(r.start)..usize::from(r.start + r.len)]);
            // Every subset of backends marked down.
            for mask in 0..(1u32 << backends.len()) {
                let down: Vec<u32> = backends
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, &b)| b)
                    .collect();
                let want = first_live_tier(tiers, |b| !down.contains(b));
                for _ in 0..20 {
                    let got = match run(&f, &slots, &down, &mut rng) {
                        Choice::Backend { tier, .. } => Some(tier),
                        Choice::Empty => None,
                        Choice::Error => panic!("no slot is missing"),
                    };
                    assert_eq!(got, want, "tiers {:?}, down {down:?}", f.tiers);
                }
            }
        }
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

    #[test]
    fn counter_index_layout() {
        assert_eq!(counter_index(0, COUNTER_FAIL_OPEN), 5);
        assert_eq!(counter_index(3, COUNTER_ZONE), 25);
    }
}
