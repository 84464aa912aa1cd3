//! The maps' sizes (the agent's `--max-*` flags), which the loader sets and `layout` checks pinned maps against.
/// The maps' sizes, set before load (`EbpfLoader::set_max_entries`); the defaults are lb_common's.
#[derive(Clone, Copy, Debug)]
pub struct Capacities {
    /// Frontends (VIP, port, protocol) and service ids.
    pub services: u32,
    /// Entries of the slot map (`SLOT_BLOCK` slots each; a frontend's generation takes `slot_blocks` of its
    /// slots), and the entries of `MEMBERS` (one per distinct backend of a sessionAffinity frontend's
    /// generation, so it can fill before the slot map when most Services have sessionAffinity).
    pub slots: u32,
    /// Backends `BACKEND_STATE` can mark down at once.
    pub backends: u32,
    /// Reverse entries (socket, backend) -> VIP of unconnected UDP and of TCP sockets whose slot was held (the
    /// LRU), and connected UDP sockets tracked at once for destruction.
    pub reverse: u32,
    /// sessionAffinity entries (frontend, client) remembered at once (an LRU).
    pub affinity: u32,
    /// Conntrack entries of established TCP flows from outside the node (an LRU, two per flow).
    pub conntrack: u32,
    /// Conntrack entries of half-open TCP flows (an LRU of its own).
    pub conntrack_syn: u32,
    /// Conntrack entries of UDP flows (an LRU of its own).
    pub conntrack_udp: u32,
}

impl Capacities {
    /// Every map at `n` entries: maps of a few pages, for a load that only verifies the programs or tries a
    /// map's contents (`tierlb preflight`, tests).
    #[must_use]
    pub const fn all(n: u32) -> Self {
        Self {
            services: n,
            slots: n,
            backends: n,
            reverse: n,
            affinity: n,
            conntrack: n,
            conntrack_syn: n,
            conntrack_udp: n,
        }
    }
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            services: lb_common::DEFAULT_MAX_FRONTENDS,
            slots: lb_common::DEFAULT_MAX_SLOTS,
            backends: lb_common::DEFAULT_MAX_BACKENDS,
            reverse: lb_common::DEFAULT_MAX_REVERSE,
            affinity: lb_common::DEFAULT_MAX_AFFINITY,
            conntrack: lb_common::DEFAULT_MAX_CONNTRACK,
            conntrack_syn: lb_common::DEFAULT_MAX_CONNTRACK_SYN,
            conntrack_udp: lb_common::DEFAULT_MAX_CONNTRACK_UDP,
        }
    }
}
