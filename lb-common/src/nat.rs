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

/// Conntrack entries of established and closing TCP flows: `CtKey` -> `CtValue`. An LRU: a full table
/// forgets the least recently used flow. A TCP flow's entries live in `MAP_CT_SYN` until its handshake
/// completes (a non-SYN packet from each side), then move here, so a flood of half-open flows evicts only
/// half-open flows.
pub const MAP_CT_TCP: &str = "CT_TCP";
/// Conntrack entries of half-open TCP flows (SYN sent, SYN-ACK perhaps seen, the client's ACK not yet): an
/// LRU of its own, on a short timeout (`NatConfig::tcp_syn_s`).
pub const MAP_CT_SYN: &str = "CT_TCP_SYN";
/// Conntrack entries of UDP flows: an LRU apart from TCP's, so a UDP service's flood of short flows evicts
/// UDP flows only.
pub const MAP_CT_UDP: &str = "CT_UDP";
/// The conntrack tables, in the order status and metrics show them.
pub const CT_TABLES: [&str; 3] = [MAP_CT_TCP, MAP_CT_SYN, MAP_CT_UDP];
/// The pre-filter of the tc programs' ingress: the addresses traffic from outside may be translated to or
/// from (`AddrKey` -> `ADDR_*` flags): node addresses (node ports, SNAT) and the load-balancer IPs and
/// externalIPs of outside frontends. A packet to an address not in it costs one lookup and is passed on.
pub const MAP_NS_ADDRS: &str = "NS_ADDRS";
/// Entries of `MAP_NS_ADDRS` (not preallocated).
pub const DEFAULT_MAX_NS_ADDRS: u32 = 262_144;
/// `MAP_NS_ADDRS` value flag: an address of this node (a NodePort address, the SNAT source, or a frontend
/// address assigned to one of its interfaces): what is not translated is the stack's.
pub const ADDR_NODE: u32 = 1 << 0;
/// `MAP_NS_ADDRS` value flag: a load-balancer IP or externalIP on none of this node's interfaces: a packet to it
/// that matches no flow and starts none is dropped (`NS_DROP_UNMATCHED`), since the stack would route it
/// back to the router that sent it (a loop until its TTL runs out).
pub const ADDR_FOREIGN: u32 = 1 << 1;

/// Key of `MAP_NS_ADDRS`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddrKey {
    /// Network order words, IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// Always 0.
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<AddrKey>() == 20);
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

/// Default entries of the established TCP conntrack LRU (two per flow: 65,536 flows): 21 MiB preallocated as
/// the kernel accounts it (fdinfo `memlock`): 168 bytes an entry, 104 of key and value, 48 of the hash
/// table's own per element and 16 of a hash bucket. The three tables' defaults take 36.75 MiB together,
/// where the single table before them took 40 (262,144 entries of 160 bytes).
pub const DEFAULT_MAX_CONNTRACK: u32 = 131_072;
/// Default entries of the half-open TCP LRU (`MAP_CT_SYN`): 16,384 handshakes in flight, 5.25 MiB.
pub const DEFAULT_MAX_CONNTRACK_SYN: u32 = 32_768;
/// Default entries of the UDP LRU (`MAP_CT_UDP`): 32,768 flows (at the 30 s timeout, about 1,100 new flows a
/// second before a live one is evicted), 10.5 MiB.
pub const DEFAULT_MAX_CONNTRACK_UDP: u32 = 65_536;
/// Bytes the kernel accounts a conntrack entry (`memlock` over entries, measured: 458,752 entries took
/// 77,073,024 bytes).
pub const CONNTRACK_ENTRY_BYTES: u64 = 168;
/// Default entries of the local-endpoint set.
pub const DEFAULT_MAX_LOCAL_BACKENDS: u32 = 16_384;
/// Default SNAT source ports: every unprivileged port, less the holes `SnatPorts` cuts out of it (the node's
/// ephemeral range, which its own sockets are given automatically, and the NodePort range).
pub const DEFAULT_SNAT_PORT_MIN: u16 = 1_024;
/// Last default SNAT source port.
pub const DEFAULT_SNAT_PORT_MAX: u16 = 65_535;
/// Linux's default `net.ipv4.ip_local_port_range`, the hole when the agent wrote none.
pub const DEFAULT_EPHEMERAL_MIN: u16 = 32_768;
/// Last port of Linux's default ephemeral range.
pub const DEFAULT_EPHEMERAL_MAX: u16 = 60_999;
/// The API server's default `--service-node-port-range`, the second hole: a UDP reply to an SNAT port that
/// is also a UDP node port must never look like a new flow to it.
pub const DEFAULT_NODE_PORT_MIN: u16 = 30_000;
/// Last port of the default NodePort range.
pub const DEFAULT_NODE_PORT_MAX: u16 = 32_767;
/// How many ports a new SNAT flow tries after the client's own (Cilium: 32).
pub const SNAT_TRIES: u32 = 32;
/// Default idle time of an established TCP flow (seconds), as Cilium's `--bpf-ct-timeout-regular-tcp`.
pub const DEFAULT_CT_TCP_ESTABLISHED_S: u32 = 21_600;
/// Default time of a half-open TCP flow (SYN seen, the handshake not complete), refreshed by the client's
/// retransmitted SYNs: Calico's 20 s (netfilter: SYN_RECV 60 s).
pub const DEFAULT_CT_TCP_SYN_S: u32 = 20;
/// Default idle time of a half-closed TCP flow (a FIN from one side): kube-proxy's
/// `conntrack.tcpCloseWaitTimeout` (1 h), which it raises netfilter's CLOSE_WAIT to.
pub const DEFAULT_CT_TCP_CLOSE_WAIT_S: u32 = 3_600;
/// Default time of a closed TCP flow (FIN from both sides, or a RST in the window): netfilter's CLOSE (10 s).
/// Its SNAT port is free again when it expires; a new SYN from the client on the same tuple replaces it
/// at once.
pub const DEFAULT_CT_TCP_CLOSE_S: u32 = 10;
/// Default idle time of a UDP flow that has seen at most one exchange: netfilter's `nf_conntrack_udp_timeout`.
pub const DEFAULT_CT_UDP_S: u32 = 30;
/// Default idle time of a UDP stream (a datagram from the client after a reply): netfilter's
/// `nf_conntrack_udp_timeout_stream`.
pub const DEFAULT_CT_UDP_STREAM_S: u32 = 120;

/// `CtKey::dir`: the entry matches a packet on the devices' ingress.
pub const CT_DIR_IN: u8 = 1;
/// `CtKey::dir`: the entry matches a packet on the devices' egress.
pub const CT_DIR_OUT: u8 = 2;

/// `CtValue::flags`: a forward entry (rewrite the destination); without it, a reply entry (rewrite the source).
pub const CT_FORWARD: u16 = 1 << 0;
/// `CtValue::flags`: the flow's source is translated to the node (a remote backend under
/// externalTrafficPolicy Cluster).
pub const CT_SNAT: u16 = 1 << 1;
/// `CtValue::flags`: a packet of the reply direction was seen (TCP: a SYN-ACK; not yet established).
pub const CT_SEEN_REPLY: u16 = 1 << 3;
/// `CtValue::flags`: TCP: a non-SYN packet from the client after the reply (the handshake's last ACK): the
/// flow is established (its entries are in `MAP_CT_TCP`). UDP: a datagram from the client after a reply (a
/// stream, netfilter's "assured").
pub const CT_ESTABLISHED: u16 = 1 << 4;
/// `CtValue::flags`: a FIN from the client was seen (half-closed: `tcp_close_wait_s`).
pub const CT_FIN_CLIENT: u16 = 1 << 5;
/// `CtValue::flags`: a FIN from the backend was seen.
pub const CT_FIN_SERVER: u16 = 1 << 6;
/// `CtValue::flags`: closed: a FIN from each side, or a RST inside the window (`tcp_close_s`).
pub const CT_CLOSED: u16 = 1 << 7;
/// `CtValue::flags`: `seq` and `ack` hold the last segment from this entry's side (TCP).
pub const CT_SEQ_SEEN: u16 = 1 << 8;
/// The flags both entries of a flow carry alike (the state); the others belong to one entry.
pub const CT_STATE: u16 = CT_SEEN_REPLY | CT_ESTABLISHED | CT_FIN_CLIENT | CT_FIN_SERVER | CT_CLOSED;

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
/// A packet the SNAT path sends itself is larger than the route's MTU: dropped, and answered with
/// "fragmentation needed" / "packet too big" (`NS_ICMP_SENT`) as the stack's forwarding would; or a GSO
/// packet whose segments exceed the egress device's MTU: dropped unanswered (its retransmission is answered).
pub const NS_DROP_FRAG_NEEDED: u32 = 14;
/// New SNAT flows that kept the client's source port (free for the backend and node address, and in the
/// SNAT ports).
pub const NS_SNAT_PORT_KEPT: u32 = 15;
/// SNAT port tries that found the port held by a live flow (the client's own port and each of the tries
/// after it: up to `SNAT_TRIES` + 1 for one flow).
pub const NS_SNAT_PORT_RETRIES: u32 = 16;
/// Dropped: a packet to a load-balancer IP or externalIP on none of the node's interfaces (`ADDR_FOREIGN`)
/// that matched no flow and started none (the stack would route it back out).
pub const NS_DROP_UNMATCHED: u32 = 17;
/// A RST outside the window of its flow: passed on translated, the flow's state left as it was.
pub const NS_RST_OUTSIDE_WINDOW: u32 = 18;
/// TCP flows whose handshake completed (moved from the half-open table to the established one).
pub const NS_ESTABLISHED: u32 = 19;
/// New keys written to each conntrack table, from `NS_CT_INSERTED` in `CT_TABLES` order (established TCP,
/// half-open TCP, UDP). With the removals below and a table's entries they give its evictions
/// ([`ct_evictions`]): an LRU reclaims entries without telling the program.
pub const NS_CT_INSERTED: u32 = 20;
/// Entries the programs deleted from each conntrack table, from `NS_CT_REMOVED` in `CT_TABLES` order.
pub const NS_CT_REMOVED: u32 = 23;
/// UDP entries the agent deleted (flows to departed backends). Written by the agent alone (read, added to,
/// written back), never by a program, so the two writers of the per-CPU slots cannot race.
pub const NS_CT_REMOVED_BY_AGENT: u32 = 26;
/// ICMP errors the node sent itself about SNAT packets it could not forward (time exceeded, fragmentation
/// needed / packet too big), which the stack's forwarding would have sent.
pub const NS_ICMP_SENT: u32 = 27;
/// Such errors not sent: over the rate (a per-CPU token bucket), the packet dropped.
pub const NS_ICMP_RATE_LIMITED: u32 = 28;
/// New flows to a frontend with `FLAG_MAGLEV` whose table's backend was marked down or held down (or whose
/// table was missing): the tier's random choice served them instead.
pub const NS_MAGLEV_FALLBACK: u32 = 29;
/// Packets `xdp_ingress` translated and sent back out of the device they came in by (`XDP_TX`).
pub const NS_XDP_TX: u32 = 30;
/// Packets `xdp_ingress` translated and sent out of another device (`XDP_REDIRECT`).
pub const NS_XDP_REDIRECT: u32 = 31;
/// Packets of tracked or new flows `xdp_ingress` left to `tc_ingress` (a local backend, no neighbour entry
/// yet, an ICMP answer to give, a TCP segment that moves a flow's state).
pub const NS_XDP_TO_TC: u32 = 32;
/// New flows to a remote endpoint with direct server return (`FLAG_DSR`): the client's address kept, the
/// frontend carried in an IPv4 option (`dsr`).
pub const NS_NEW_DSR: u32 = 33;
/// New flows to a remote endpoint of a frontend with `FLAG_DSR` that took SNAT instead: IPv6 (no option), or
/// a first UDP datagram with no room for the option on the device it came in by.
pub const NS_DSR_SNAT: u32 = 34;
/// On a backend's node: reply entries written from a packet's DSR option (new flows, and flows whose entry
/// had expired), so the backend's reply leaves with the frontend's address.
pub const NS_DSR_LEARNED: u32 = 35;
/// Packets of DSR flows sent on without the option: no room for it within the route's MTU (a UDP datagram;
/// a TCP segment is answered with "fragmentation needed" for 8 bytes less, `NS_DROP_FRAG_NEEDED`), or a UDP
/// GSO packet the kernel cannot grow. The backend's node knows the flow from its earlier packets.
pub const NS_DSR_NO_ROOM: u32 = 36;
/// Counter kinds of `MAP_NS_COUNTERS`.
pub const NS_COUNTER_KINDS: u32 = 37;
/// Entries of `MAP_NS_COUNTERS`: room for kinds a later version adds, so its pinned map keeps its layout.
/// 32 until map layout 2, which made room for the XDP and DSR paths' counters (29 of 32 were taken); the agent
/// migrates a pinned map of 32 in place (`lb-user`'s `datapath::migrate`).
pub const NS_COUNTER_SLOTS: u32 = 64;
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
    "snat_client_port_kept",
    "snat_port_retries",
    "drop_unmatched",
    "rst_outside_window",
    "established",
    "conntrack_inserted_established",
    "conntrack_inserted_half_open",
    "conntrack_inserted_udp",
    "conntrack_removed_established",
    "conntrack_removed_half_open",
    "conntrack_removed_udp",
    "conntrack_udp_forgotten_by_agent",
    "icmp_sent",
    "icmp_rate_limited",
    "maglev_fallback",
    "xdp_tx",
    "xdp_redirect",
    "xdp_to_tc",
    "new_dsr",
    "dsr_snat",
    "dsr_learned",
    "dsr_no_room",
];

/// Entries an LRU conntrack table reclaimed to make room (live flows and expired ones it had not reused):
/// the new keys written to it less those deleted and those it holds now (`entries`, a walk of the table).
/// Counters and walk are not taken at one instant, so a value can be low by the keys written meanwhile;
/// never below 0.
#[must_use]
pub const fn ct_evictions(inserted: u64, removed: u64, entries: u64) -> u64 {
    inserted.saturating_sub(removed).saturating_sub(entries)
}

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
    /// `CT_*` flags: `CT_FORWARD`, `CT_SNAT`, `CT_SEQ_SEEN` of this entry, and the flow's state
    /// (`CT_STATE`), which both entries carry.
    pub flags: u16,
    /// Explicit padding, always 0.
    pub _pad: u16,
    /// The frontend's svc_id, for its counters and for the agent's sweep.
    pub svc_id: u32,
    /// TCP: the sequence number of the last segment from this entry's side (host order), for the RST
    /// window check (`CT_SEQ_SEEN`).
    pub seq: u32,
    /// TCP: the acknowledgement number of the last segment from this entry's side that carried one.
    pub ack: u32,
    /// Explicit padding before the 8-aligned time, always 0.
    pub _pad2: u32,
    /// `CLOCK_BOOTTIME` ns after which the entry is dead (refreshed by every packet).
    pub expires_ns: u64,
}
const _: () = assert!(size_of::<CtValue>() == 64);

/// The largest segment (a GSO packet on the wire counts as one) a RST may follow in the window check: a
/// RST's sequence number is accepted between what the other side last acknowledged and this side's last
/// sequence number plus this.
pub const RST_SLACK: u32 = 65_536;

/// Whether a RST with sequence number `seq` from one side of a flow is inside its window: between `acked`
/// (the other side's last acknowledgement number: what it expects next) and `sent` (this side's last
/// sequence number) plus `RST_SLACK`, modulo 2^32. A blind attacker must hit that span; the peer's own
/// RST (the kernel answers with the acknowledged number) always does.
#[must_use]
pub const fn rst_in_window(seq: u32, acked: u32, sent: u32) -> bool {
    let end = sent.wrapping_add(RST_SLACK);
    seq.wrapping_sub(acked) <= end.wrapping_sub(acked)
}

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
    /// The node's `ip_local_port_range` (its sockets' automatic ports), cut out of the SNAT ports.
    pub ephemeral_min: u16,
    /// Last port of the node's ephemeral range.
    pub ephemeral_max: u16,
    /// The NodePort range, cut out of the SNAT ports.
    pub node_port_min: u16,
    /// Last port of the NodePort range.
    pub node_port_max: u16,
    /// Idle seconds of an established TCP flow.
    pub tcp_established_s: u32,
    /// Seconds of a half-open TCP flow.
    pub tcp_syn_s: u32,
    /// Idle seconds of a half-closed TCP flow (a FIN from one side).
    pub tcp_close_wait_s: u32,
    /// Seconds of a closed TCP flow.
    pub tcp_close_s: u32,
    /// Idle seconds of a UDP flow before it is a stream.
    pub udp_s: u32,
    /// Idle seconds of a UDP stream.
    pub udp_stream_s: u32,
    /// The node's IPv4 address SNAT uses for load-balancer IPs and externalIPs (a node port keeps the node
    /// address it was reached on), network order; 0: none, such flows to remote backends are dropped.
    pub snat_v4: u32,
    /// The node's IPv6 address for the same, network order; all zero: none.
    pub snat_v6: [u32; 4],
}
const _: () = assert!(size_of::<NatConfig>() == 56);

impl NatConfig {
    /// The SNAT ports, defaults applied: the range less its two holes.
    #[must_use]
    pub const fn snat_ports(&self) -> crate::snat::SnatPorts {
        let (lo, hi) = if self.snat_port_min == 0 || self.snat_port_max < self.snat_port_min {
            (DEFAULT_SNAT_PORT_MIN, DEFAULT_SNAT_PORT_MAX)
        } else {
            (self.snat_port_min, self.snat_port_max)
        };
        let eph = if self.ephemeral_min == 0 || self.ephemeral_max < self.ephemeral_min {
            (DEFAULT_EPHEMERAL_MIN, DEFAULT_EPHEMERAL_MAX)
        } else {
            (self.ephemeral_min, self.ephemeral_max)
        };
        let np = if self.node_port_min == 0 || self.node_port_max < self.node_port_min {
            (DEFAULT_NODE_PORT_MIN, DEFAULT_NODE_PORT_MAX)
        } else {
            (self.node_port_min, self.node_port_max)
        };
        crate::snat::SnatPorts::new(lo, hi, eph, np)
    }

    /// Lifetime (ns) of a flow's entry after a packet, by protocol and state (`CT_*` flags).
    #[must_use]
    pub const fn lifetime_ns(&self, tcp: bool, flags: u16) -> u64 {
        let s = if !tcp {
            if flags & CT_ESTABLISHED != 0 {
                or_default(self.udp_stream_s, DEFAULT_CT_UDP_STREAM_S)
            } else {
                or_default(self.udp_s, DEFAULT_CT_UDP_S)
            }
        } else if flags & CT_CLOSED != 0 {
            or_default(self.tcp_close_s, DEFAULT_CT_TCP_CLOSE_S)
        } else if flags & (CT_FIN_CLIENT | CT_FIN_SERVER) != 0 {
            or_default(self.tcp_close_wait_s, DEFAULT_CT_TCP_CLOSE_WAIT_S)
        } else if flags & CT_ESTABLISHED != 0 {
            or_default(self.tcp_established_s, DEFAULT_CT_TCP_ESTABLISHED_S)
        } else {
            or_default(self.tcp_syn_s, DEFAULT_CT_TCP_SYN_S)
        };
        s as u64 * 1_000_000_000
    }
}

/// `v`, or `d` where `v` is 0 (unset).
const fn or_default(v: u32, d: u32) -> u32 {
    if v == 0 { d } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_follow_the_flow_state() {
        let c = NatConfig {
            tcp_established_s: 100,
            tcp_syn_s: 5,
            tcp_close_wait_s: 50,
            tcp_close_s: 2,
            udp_s: 30,
            udp_stream_s: 60,
            ..Default::default()
        };
        let s = 1_000_000_000;
        let cases = [
            ("UDP one exchange", false, CT_SEEN_REPLY, 30),
            ("UDP stream", false, CT_SEEN_REPLY | CT_ESTABLISHED, 60),
            ("SYN only", true, 0, 5),
            ("SYN-ACK seen, no ACK from the client", true, CT_SEEN_REPLY, 5),
            ("established", true, CT_SEEN_REPLY | CT_ESTABLISHED, 100),
            ("half-closed by the client", true, CT_ESTABLISHED | CT_FIN_CLIENT, 50),
            ("half-closed by the backend", true, CT_ESTABLISHED | CT_FIN_SERVER, 50),
            ("closed", true, CT_ESTABLISHED | CT_FIN_CLIENT | CT_FIN_SERVER | CT_CLOSED, 2),
            ("reset during the handshake", true, CT_CLOSED, 2),
        ];
        for (name, tcp, flags, secs) in cases {
            assert_eq!(c.lifetime_ns(tcp, flags), secs * s, "{name}");
        }
        let d = NatConfig::default();
        assert_eq!(d.lifetime_ns(true, CT_ESTABLISHED), u64::from(DEFAULT_CT_TCP_ESTABLISHED_S) * s);
        assert_eq!(d.lifetime_ns(true, 0), u64::from(DEFAULT_CT_TCP_SYN_S) * s);
    }

    #[test]
    fn rst_window() {
        // acked: what the receiver expects next; sent: the sender's last sequence number.
        let cases = [
            ("the peer's own RST, at the acknowledged number", 1_000, 1_000, 900, true),
            ("after data in flight", 5_000, 1_000, 4_000, true),
            ("just inside the slack", 4_000 + RST_SLACK, 1_000, 4_000, true),
            ("beyond the slack", 4_001 + RST_SLACK, 1_000, 4_000, false),
            ("before the acknowledged number", 999, 1_000, 4_000, false),
            ("blind guess far away", 2_000_000_000, 1_000, 4_000, false),
            ("across the wrap", 5, u32::MAX - 10, u32::MAX - 20, true),
        ];
        for (name, seq, acked, sent, ok) in cases {
            assert_eq!(rst_in_window(seq, acked, sent), ok, "{name}");
        }
    }

    #[test]
    fn evictions_are_new_keys_less_removals_and_what_the_table_holds() {
        let cases = [
            ("nothing written", 0, 0, 0, 0),
            ("every key still there", 10, 0, 10, 0),
            ("deleted, not evicted", 10, 4, 6, 0),
            ("a full table that reclaimed 90", 100, 0, 10, 90),
            ("deletes and evictions", 100, 30, 20, 50),
            ("keys written after the counters were read", 10, 0, 12, 0),
        ];
        for (name, inserted, removed, entries, evicted) in cases {
            assert_eq!(ct_evictions(inserted, removed, entries), evicted, "{name}");
        }
    }
}
