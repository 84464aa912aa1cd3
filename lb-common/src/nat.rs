//! North-south: the types of the tc programs that translate traffic arriving from outside the node
//! (`nodeIP:nodePort`, load-balancer ingress IPs, externalIPs) and their connection tracking.
//!
//! Their frontends live in `MAP_FRONTENDS` beside the connect-time ones, told apart by `SCOPE_OUTSIDE` in the
//! key's family byte (Cilium's `lb4_key.scope` does the same for its external scope): the reconciler, the
//! counters, the names and the generation swap are the ones the socket programs use, and the cgroup programs
//! never build a key with that bit, so they never see an outside frontend. Their backends are the same slots.
//!
//! A translated flow has two conntrack entries (`CtKey` -> `CtValue`), each keyed by a packet as it is seen
//! on the wire, so each direction costs one lookup:
//! - forward (`CT_DIR_IN`, the client's packet on ingress): rewrite the destination to the backend, and for
//!   `CT_SNAT` the source to the node's address and a port of the SNAT range;
//! - reply: with SNAT it arrives on ingress addressed to the node (`CT_DIR_IN`, backend -> node:port), without
//!   it the stack routes the backend's reply out of the device (`CT_DIR_OUT`, backend -> client); either way
//!   the source becomes the address the client used and, with SNAT, the destination the client again.
use core::mem::size_of;

use bytemuck::{Pod, Zeroable};

/// `FrontendValue::flags` of an outside frontend: SNAT leaves from the frontend's own address (a node port:
/// the node address the client reached); without it, from `NatConfig::snat_v4` / `snat_v6`.
pub const FLAG_SNAT_TO_FRONTEND: u32 = 1 << 2;
/// `FrontendValue::flags` of an outside frontend with `loadBalancerSourceRanges`: a new flow's client must
/// match one of its `MAP_SOURCE_RANGES` entries, else the packet is dropped (`NS_DROP_SOURCE_RANGE`).
pub const FLAG_SOURCE_RANGES: u32 = 1 << 3;

/// Conntrack entries: `CtKey` -> `CtValue`. An LRU: a full table forgets the least recently used flow.
pub const MAP_CONNTRACK: &str = "CONNTRACK";
/// Endpoints on this node (`CtAddr` -> 1): external traffic to them keeps the client's address (no SNAT).
pub const MAP_LOCAL_BACKENDS: &str = "LOCAL_BACKENDS";
/// The tc programs' settings (`NatConfig`), one entry written by the agent at start.
pub const MAP_NAT_CONFIG: &str = "NAT_CONFIG";
/// `loadBalancerSourceRanges`: an LPM trie of (frontend, client prefix) -> 1.
pub const MAP_SOURCE_RANGES: &str = "SOURCE_RANGES";
/// Entries of `MAP_SOURCE_RANGES` (not preallocated).
pub const DEFAULT_MAX_SOURCE_RANGES: u32 = 65_536;
/// Per-CPU counters of the tc programs by `NS_*` kind.
pub const MAP_NS_COUNTERS: &str = "NS_COUNTERS";
/// Datagrams of translated flows in fragments (IPv4, and IPv6 with a Fragment header): (source,
/// destination, id, protocol) -> the ports of their first fragment, for the later ones, which carry none.
/// An LRU the kernel alone uses (not pinned).
pub const MAP_FRAGMENTS: &str = "FRAGMENTS";
/// Entries of `MAP_FRAGMENTS`: datagrams in flight at once.
pub const DEFAULT_MAX_FRAGMENTS: u32 = 16_384;
/// How long a first fragment's ports are kept for the later ones: Linux's `ipfrag_time` default.
pub const FRAGMENT_LIFETIME_NS: u64 = 30_000_000_000;

/// Default entries of the conntrack LRU (two per flow): 40 MiB preallocated as the kernel accounts it
/// (fdinfo `memlock`, measured by the bench): 96 bytes of key and value and 48 of the hash table's own per
/// element, and 16 a hash bucket.
pub const DEFAULT_MAX_CONNTRACK: u32 = 262_144;
/// Default entries of the local-endpoint set.
pub const DEFAULT_MAX_LOCAL_BACKENDS: u32 = 16_384;
/// Default SNAT source ports: above Linux's default `ip_local_port_range` (32768-60999), so a port the
/// node's own sockets are given automatically never collides with a translated flow.
pub const DEFAULT_SNAT_PORT_MIN: u16 = 61_000;
/// Last default SNAT source port.
pub const DEFAULT_SNAT_PORT_MAX: u16 = 65_535;
/// Default idle time of an established TCP flow (seconds), as Cilium's `--bpf-ct-timeout-regular-tcp`.
pub const DEFAULT_CT_TCP_ESTABLISHED_S: u32 = 21_600;
/// Default time of a TCP flow that has sent only its SYN, or closed with FIN or RST (seconds).
pub const DEFAULT_CT_TCP_TRANSIENT_S: u32 = 60;
/// Default idle time of a UDP flow (seconds).
pub const DEFAULT_CT_UDP_S: u32 = 60;

/// `CtKey::dir`: the entry matches a packet on the devices' ingress.
pub const CT_DIR_IN: u8 = 1;
/// `CtKey::dir`: the entry matches a packet on the devices' egress.
pub const CT_DIR_OUT: u8 = 2;

/// `CtValue::flags`: a forward entry (rewrite the destination); without it, a reply entry (rewrite the source).
pub const CT_FORWARD: u16 = 1 << 0;
/// `CtValue::flags`: the flow's source is translated to the node (a remote backend under
/// externalTrafficPolicy Cluster).
pub const CT_SNAT: u16 = 1 << 1;
/// `CtValue::flags`: a FIN or RST was seen: the entry lives `tcp_transient_s` from the last packet.
pub const CT_CLOSING: u16 = 1 << 2;
/// `CtValue::flags`: a packet of the reply direction was seen (TCP: the flow is established).
pub const CT_SEEN_REPLY: u16 = 1 << 3;

// Counter kinds of `MAP_NS_COUNTERS`.
/// New flows translated to a local endpoint (the client's address kept).
pub const NS_NEW_LOCAL: u32 = 0;
/// New flows translated to a remote endpoint with SNAT.
pub const NS_NEW_SNAT: u32 = 1;
/// Packets translated by a conntrack entry (both directions).
pub const NS_TRANSLATED: u32 = 2;
/// Dropped: externalTrafficPolicy Local and no local endpoint (kube-proxy's DROP).
pub const NS_DROP_NO_LOCAL: u32 = 3;
/// Dropped: the Service has no usable endpoint (kube-proxy REJECTs; a packet program drops).
pub const NS_DROP_NO_ENDPOINTS: u32 = 4;
/// Dropped: no free SNAT port for the (backend, node address) pair after the tries.
pub const NS_DROP_SNAT_EXHAUSTED: u32 = 5;
/// Dropped: the conntrack entries could not be written.
pub const NS_DROP_CT_FULL: u32 = 6;
/// Dropped: the SNAT path found no route to the backend (FIB lookup failed).
pub const NS_DROP_NO_ROUTE: u32 = 7;
/// Passed untranslated: a TCP segment that is not a SYN for a frontend with no conntrack entry (an expired
/// or evicted flow, or not ours).
pub const NS_PASS_NOT_SYN: u32 = 8;
/// Passed untranslated: a later fragment (IPv4, or IPv6 with a Fragment header) whose first fragment was not
/// translated (not a translated flow's, or ahead of it), or an IPv6 packet to a unicast address with extension
/// headers other than one Fragment header before its L4 header (multicast, such as MLD, is not counted).
pub const NS_PASS_FRAGMENT: u32 = 9;
/// Passed untranslated: a slot the frontend points at is missing (fail open, as the socket programs).
pub const NS_FAIL_OPEN: u32 = 10;
/// Packets rewritten whose checksum helper failed (dropped: a half-rewritten packet must not leave).
pub const NS_DROP_REWRITE: u32 = 11;
/// Dropped: a load-balancer IP's `loadBalancerSourceRanges` do not include the client.
pub const NS_DROP_SOURCE_RANGE: u32 = 12;
/// ICMP errors about a translated flow, translated back (outer and quoted headers) toward its sender.
pub const NS_ICMP_TRANSLATED: u32 = 13;
/// Dropped: a packet the SNAT path sends itself is larger than the next hop's MTU (the stack, which would
/// answer with "fragmentation needed", is bypassed; counted so the black hole is visible).
pub const NS_DROP_FRAG_NEEDED: u32 = 14;
/// Counter kinds of `MAP_NS_COUNTERS`.
pub const NS_COUNTER_KINDS: u32 = 15;
/// Entries of `MAP_NS_COUNTERS`: room for kinds a later version adds, so its pinned map keeps its layout.
pub const NS_COUNTER_SLOTS: u32 = 32;
const _: () = assert!(NS_COUNTER_KINDS <= NS_COUNTER_SLOTS);
/// The name of each `NS_*` counter kind, by index, as status and metrics show it.
pub const NS_COUNTER_NAMES: [&str; NS_COUNTER_KINDS as usize] = [
    "new_local",
    "new_snat",
    "translated",
    "drop_no_local_endpoint",
    "drop_no_endpoints",
    "drop_snat_ports_exhausted",
    "drop_conntrack_full",
    "drop_no_route",
    "pass_not_syn",
    "pass_fragment",
    "fail_open",
    "drop_rewrite",
    "drop_source_range",
    "icmp_translated",
    "drop_frag_needed",
];

/// sessionAffinity ClientIP for clients outside the node: (outside-scope frontend, client address) ->
/// `AffinityValue`. An LRU the tc programs write; pinned, so a restarted agent keeps the clients' backends, and
/// read by `tierlb status`.
pub const MAP_OUTSIDE_AFFINITY: &str = "OUTSIDE_AFFINITY";

/// Key of `MAP_OUTSIDE_AFFINITY`: kube-proxy keys its `recent` match by the source address, as this does.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct OutsideAffinityKey {
    /// The outside-scope frontend the client reached (`SCOPE_OUTSIDE` in its family).
    pub frontend: crate::FrontendKey,
    /// The client's address, network order words (IPv4 in `client[0]`).
    pub client: [u32; 4],
}
const _: () = assert!(size_of::<OutsideAffinityKey>() == 36);

/// An address and port as they lie in a packet (network order words; IPv4 in `addr[0]`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CtAddr {
    /// Network byte order.
    pub addr: [u32; 4],
}
const _: () = assert!(size_of::<CtAddr>() == 16);

/// A packet's flow as seen on the wire, and where it was seen.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CtKey {
    /// Source address, network order.
    pub saddr: [u32; 4],
    /// Destination address, network order.
    pub daddr: [u32; 4],
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// `CT_DIR_IN` or `CT_DIR_OUT`.
    pub dir: u8,
    /// Always 0, so equal keys hash equal.
    pub _pad: u8,
}
const _: () = assert!(size_of::<CtKey>() == 40);

/// What to do with a packet of a tracked flow.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtValue {
    /// Forward: the backend (the new destination). Reply: the frontend the client used (the new source).
    pub a: [u32; 4],
    /// With `CT_SNAT`: forward: the node's address (the new source); reply: the client (the new destination).
    pub b: [u32; 4],
    /// Port of `a`, network order.
    pub a_port: u16,
    /// Port of `b`, network order.
    pub b_port: u16,
    /// `CT_FORWARD`, `CT_SNAT`, `CT_CLOSING`, `CT_SEEN_REPLY`.
    pub flags: u16,
    /// Explicit padding, always 0.
    pub _pad: u16,
    /// The frontend's svc_id, for its counters and for the agent's sweep.
    pub svc_id: u32,
    /// Explicit padding before the 8-aligned time, always 0.
    pub _pad2: u32,
    /// `CLOCK_BOOTTIME` ns after which the entry is dead (refreshed by every packet).
    pub expires_ns: u64,
}
const _: () = assert!(size_of::<CtValue>() == 56);

/// The data of a `MAP_SOURCE_RANGES` key (after the trie's prefix length): the frontend, matched whole (its
/// 160 bits first), then the client address, matched to the range's length. `prefix_len` is
/// `SOURCE_RANGE_FRONTEND_BITS` plus the range's.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRangeKey {
    /// The outside-scope frontend (`SCOPE_OUTSIDE` set).
    pub frontend: crate::FrontendKey,
    /// The client address (a range's network), network order; IPv4 in `addr[0]`.
    pub client: [u32; 4],
}
const _: () = assert!(size_of::<SourceRangeKey>() == 36);
/// The bits of `SourceRangeKey::frontend`, always matched.
pub const SOURCE_RANGE_FRONTEND_BITS: u32 = 160;

/// The tc programs' settings (`MAP_NAT_CONFIG`); all zero means the defaults above.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash)]
pub struct NatConfig {
    /// First SNAT source port.
    pub snat_port_min: u16,
    /// Last SNAT source port.
    pub snat_port_max: u16,
    /// Idle seconds of an established TCP flow.
    pub tcp_established_s: u32,
    /// Seconds of a TCP flow before its reply, or after FIN/RST.
    pub tcp_transient_s: u32,
    /// Idle seconds of a UDP flow.
    pub udp_s: u32,
    /// The node's IPv4 address SNAT uses for load-balancer IPs and externalIPs (a node port keeps the node
    /// address it was reached on), network order; 0: none, such flows to remote backends are dropped.
    pub snat_v4: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// The node's IPv6 address for the same, network order; all zero: none.
    pub snat_v6: [u32; 4],
}
const _: () = assert!(size_of::<NatConfig>() == 40);

impl NatConfig {
    /// The SNAT port range in host order, defaults applied.
    #[must_use]
    pub const fn snat_ports(&self) -> (u16, u16) {
        if self.snat_port_min == 0 || self.snat_port_max < self.snat_port_min {
            (DEFAULT_SNAT_PORT_MIN, DEFAULT_SNAT_PORT_MAX)
        } else {
            (self.snat_port_min, self.snat_port_max)
        }
    }

    /// Lifetime (ns) of an entry after a packet: UDP's idle time; TCP's established time, or the transient
    /// time before the reply and after FIN/RST.
    #[must_use]
    pub const fn lifetime_ns(&self, tcp: bool, established: bool, closing: bool) -> u64 {
        let s = if !tcp {
            or_default(self.udp_s, DEFAULT_CT_UDP_S)
        } else if closing || !established {
            or_default(self.tcp_transient_s, DEFAULT_CT_TCP_TRANSIENT_S)
        } else {
            or_default(self.tcp_established_s, DEFAULT_CT_TCP_ESTABLISHED_S)
        };
        s as u64 * 1_000_000_000
    }
}

/// `v`, or `d` where `v` is 0 (unset).
const fn or_default(v: u32, d: u32) -> u32 {
    if v == 0 { d } else { v }
}

/// The SNAT port for try `attempt` of a flow whose hash is `seed`, in `[min, max]` (host order).
#[inline(always)]
#[must_use]
pub const fn snat_port(seed: u32, attempt: u32, min: u16, max: u16) -> u16 {
    let span = (max - min) as u32 + 1;
    // Successive tries walk the range by a large odd stride from a random start, so a crowded region of the
    // range is left after a few tries.
    let x = seed.wrapping_add(attempt.wrapping_mul(40_503));
    min + (x % span) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snat_ports_stay_in_the_range_and_differ_between_tries() {
        let (lo, hi) = NatConfig::default().snat_ports();
        assert_eq!((lo, hi), (DEFAULT_SNAT_PORT_MIN, DEFAULT_SNAT_PORT_MAX));
        for seed in [0, 1, 4_000_000_000, u32::MAX] {
            let ports: Vec<u16> = (0..8).map(|a| snat_port(seed, a, lo, hi)).collect();
            assert!(ports.iter().all(|p| (lo..=hi).contains(p)), "{ports:?}");
            let mut d = ports.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), ports.len(), "tries repeat a port: {ports:?}");
        }
        assert_eq!(snat_port(7, 3, 5000, 5000), 5000, "a one-port range");
    }

    #[test]
    fn lifetimes_follow_the_tcp_state() {
        let c = NatConfig { tcp_established_s: 100, tcp_transient_s: 5, udp_s: 30, ..Default::default() };
        assert_eq!(c.lifetime_ns(false, false, false), 30_000_000_000);
        assert_eq!(c.lifetime_ns(true, false, false), 5_000_000_000, "SYN only");
        assert_eq!(c.lifetime_ns(true, true, false), 100_000_000_000, "established");
        assert_eq!(c.lifetime_ns(true, true, true), 5_000_000_000, "closing");
        let d = NatConfig::default();
        assert_eq!(d.lifetime_ns(true, true, false), u64::from(DEFAULT_CT_TCP_ESTABLISHED_S) * 1_000_000_000);
    }
}
