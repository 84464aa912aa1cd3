//! A frontend's connect counters as `tierlb status` prints them and `tierlb study --clients` reads them back:
//! the per-CPU `COUNTERS` slots of one service id, summed over CPUs, by kind.
use lb_common::{
    COUNTER_AFFINITY, COUNTER_CLUSTER, COUNTER_DROPPED, COUNTER_FAIL_OPEN, COUNTER_NODE, COUNTER_REJECTED,
    COUNTER_ZONE, COUNTERS_PER_SERVICE,
};
use serde::{Deserialize, Serialize};

/// A frontend's connect counters (lb_common's `COUNTER_*`), summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Translated to a node-tier backend.
    pub node: u64,
    /// Translated to a zone-tier backend.
    pub zone: u64,
    /// Translated to a cluster-tier backend.
    pub cluster: u64,
    /// Refused: no usable endpoint (kube-proxy's REJECT).
    pub rejected: u64,
    /// Refused: a Local policy found no local endpoint (kube-proxy's DROP).
    pub dropped: u64,
    /// Let through untranslated after an internal error.
    pub fail_open: u64,
    /// Went to the client's sessionAffinity backend (also counted under their tier).
    pub affinity: u64,
}

impl Counters {
    /// The counters of one service id, as `MapReader::counters` reads them.
    pub fn of(c: &[u64; COUNTERS_PER_SERVICE as usize]) -> Self {
        let at = |k: u32| c[k as usize];
        Self {
            node: at(COUNTER_NODE),
            zone: at(COUNTER_ZONE),
            cluster: at(COUNTER_CLUSTER),
            rejected: at(COUNTER_REJECTED),
            dropped: at(COUNTER_DROPPED),
            fail_open: at(COUNTER_FAIL_OPEN),
            affinity: at(COUNTER_AFFINITY),
        }
    }

    /// Every connect the frontend saw: translated in any tier, refused, dropped or let through (affinity hits
    /// are already counted under their tier).
    pub fn total(self) -> u64 {
        self.node + self.zone + self.cluster + self.rejected + self.dropped + self.fail_open
    }
}
