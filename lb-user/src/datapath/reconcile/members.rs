//! The member entries of a frontend with sessionAffinity (`lb_common::MAP_MEMBERS`): which backends a
//! generation holds, in which tiers. Written with that generation's slots, before the swap, and buried with
//! them; the data path uses a client's remembered backend only if it is a member of the current generation.
use std::collections::BTreeMap;

use lb_common::{Backend, MemberValue, TIER_COUNT};

/// Each backend of `tiers` once, with the tiers it is in; none without sessionAffinity
/// (`affinity_timeout_s` 0).
pub(super) fn of(affinity_timeout_s: u32, tiers: [&[Backend]; TIER_COUNT]) -> BTreeMap<Backend, MemberValue> {
    let mut out: BTreeMap<Backend, MemberValue> = BTreeMap::new();
    if affinity_timeout_s == 0 {
        return out;
    }
    for (tier, backends) in tiers.into_iter().enumerate() {
        for b in backends {
            out.entry(*b).or_default().tiers |= 1 << tier;
        }
    }
    out
}
