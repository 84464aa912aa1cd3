//! The counters every program adds to: their kinds, per Service and program-wide (`GLOBAL_SVC_ID`), and
//! the value the per-CPU counter array (`MAP_COUNTERS`) holds at a service id.
use bytemuck::{Pod, Zeroable};

use crate::{TIER_CLUSTER, TIER_NODE, TIER_ZONE};

// Per-service counter kinds: indices into the `ServiceCounters` a per-CPU array holds at `svc_id`.
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
/// Global only (`GLOBAL_SVC_ID`): a socket's reverse state could not be fully recorded (its socket storage
/// could not be created, it sent to more than `SOCK_LRU_RECORD` backends, or the connected-UDP registry was
/// full); see `SockState`.
pub const COUNTER_REVERSE_UNRECORDED: u32 = 6;
/// Connects that went to the client's sessionAffinity backend (an `AFFINITY` entry still valid); also
/// counted under their tier.
pub const COUNTER_AFFINITY: u32 = 7;
/// Global only (the slot of `COUNTER_NODE`): backends passive health held down for one client only (its own
/// failures in a row while no other client had failed; `HOLD_CLIENT`).
pub const GLOBAL_HEALTH_CLIENT_HOLDS: u32 = 0;
/// Global only (`GLOBAL_SVC_ID`, a slot services use for `COUNTER_ZONE`): backends passive health held down
/// (each hold, including a failed half-open trial's new hold).
pub const GLOBAL_HEALTH_HOLDS: u32 = 1;
/// Global only (the slot of `COUNTER_CLUSTER`): held or failing backends a successful connect made healthy.
pub const GLOBAL_HEALTH_RECOVERIES: u32 = 2;
/// Global only (the slot of `COUNTER_REJECTED`): connects sent to a held-down backend because every backend
/// of every tier was held or marked, at least one held (the panic threshold: a random backend of the first
/// non-empty tier, unless marked).
pub const GLOBAL_HEALTH_PANICS: u32 = 3;
// Global only, the slot of `COUNTER_DROPPED`: trace events lost to a full ring buffer (`GLOBAL_TRACE_LOST`,
// in trace.rs).
/// Counter slots per Service in the counter array; the kinds above use all eight.
pub const COUNTERS_PER_SERVICE: u32 = 8;
// The data path counts a pick from tier `t` under counter kind `t`.
const _: () = assert!(COUNTER_NODE == TIER_NODE as u32 && COUNTER_ZONE == TIER_ZONE as u32);
const _: () = assert!(COUNTER_CLUSTER == TIER_CLUSTER as u32);

/// One Service's counters (or the global ones, at `GLOBAL_SVC_ID`): the value of the per-CPU counter array
/// at its service id, `COUNTER_*` kinds as indices. One entry a Service, not one a counter: the kernel makes
/// a per-CPU array one per-CPU allocation per entry, and at 120,000 Services eight entries each were 960,000
/// allocations (0.6 s of CPU at the agent's start, beside the lists).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    /// By `COUNTER_*` (or `GLOBAL_*`) kind.
    pub counts: [u64; COUNTERS_PER_SERVICE as usize],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Service's counters are one value of eight kinds: 64 bytes, what the pinned-layout check expects,
    /// and every kind the data path counts is an index into it.
    #[test]
    fn a_services_counters_are_one_value_of_every_kind() {
        assert_eq!(size_of::<ServiceCounters>(), 64);
        let kinds = [
            COUNTER_NODE,
            COUNTER_ZONE,
            COUNTER_CLUSTER,
            COUNTER_REJECTED,
            COUNTER_DROPPED,
            COUNTER_FAIL_OPEN,
            COUNTER_REVERSE_UNRECORDED,
            COUNTER_AFFINITY,
        ];
        assert!(kinds.iter().all(|k| *k < COUNTERS_PER_SERVICE));
        assert_eq!(kinds.len(), ServiceCounters::default().counts.len());
    }
}
