//! The member entries of a frontend with sessionAffinity (`lb_common::MAP_MEMBERS`): which backends a
//! generation holds, in which tiers. Written with that generation's slots, before the swap, and buried with
//! them; the data path uses a client's remembered backend only if it is a member of the current generation.
use std::collections::BTreeMap;

use lb_common::{Backend, MemberValue};

use crate::datapath::DesiredFrontend;

/// Each backend of `want` once, with the tiers it is in; none without sessionAffinity.
pub(super) fn of(want: &DesiredFrontend) -> BTreeMap<Backend, MemberValue> {
    let mut out: BTreeMap<Backend, MemberValue> = BTreeMap::new();
    if want.affinity_timeout_s == 0 {
        return out;
    }
    for (tier, backends) in want.tiers.iter().enumerate() {
        for b in backends {
            out.entry(*b).or_default().tiers |= 1 << tier;
        }
    }
    out
}
