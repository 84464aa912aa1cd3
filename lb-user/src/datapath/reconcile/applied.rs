//! The reconciler's record of a frontend it applied, kept as compact as the map image it wrote: the frontend
//! value, the Service port's shared name and the generation's slots in one boxed slice, tier after tier (the
//! value's tier ranges say where each tier starts). A `DesiredFrontend` holds three vectors (72 bytes of
//! headers, plus flags the value repeats); at 100,000 Services the record is the reconciler's whole memory.
use std::sync::Arc;

use lb_common::{Backend, FrontendValue, TIER_COUNT};

use crate::{datapath::DesiredFrontend, model::ServicePortName};

#[derive(Clone, Debug)]
pub(super) struct Applied {
    pub(super) value: FrontendValue,
    /// The slots are not laid out as the value's ranges say (adopted maps with a missing slot, or ranges
    /// that overlap or leave gaps, which this agent never writes): the record matches no desired state, so
    /// the next apply rewrites the frontend. In the value's padding.
    stale: bool,
    pub(super) name: Arc<ServicePortName>,
    slots: Box<[Backend]>,
}

// One record per frontend: what each frontend costs the reconciler besides its slots.
const _: () = assert!(size_of::<Applied>() <= 80);

impl Applied {
    /// `value` was written for `want`.
    pub(super) fn new(value: FrontendValue, want: &DesiredFrontend) -> Self {
        let slots = want.tiers.iter().flatten().copied().collect();
        Self { value, stale: false, name: want.name.clone(), slots }
    }

    /// What the maps hold for a frontend an earlier agent wrote: `value` and the slots read back per tier
    /// (a slot missing from the map is missing from its tier).
    pub(super) fn adopted(value: FrontendValue, name: Arc<ServicePortName>, tiers: &[Vec<Backend>]) -> Self {
        let mut next = 0usize;
        let laid_out = value.tiers.iter().zip(tiers).all(|(range, read)| {
            // An empty tier reads nothing wherever it starts.
            let starts = range.len == 0 || usize::from(range.start) == next;
            let ok = starts && read.len() == usize::from(range.len);
            next += read.len();
            ok
        });
        let slots = tiers.iter().flatten().copied().collect();
        Self { value, stale: !laid_out, name, slots }
    }

    /// The record, borrowed.
    pub(super) fn view(&self) -> AppliedFrontend<'_> {
        let tiers = self.value.tiers.map(|r| {
            let start = usize::from(r.start).min(self.slots.len());
            let end = (start + usize::from(r.len)).min(self.slots.len());
            &self.slots[start..end]
        });
        AppliedFrontend {
            name: &self.name,
            tiers,
            slots: &self.slots,
            flags: self.value.flags,
            affinity_timeout_s: self.value.affinity_timeout_s,
            stale: self.stale,
        }
    }
}

/// A frontend as the reconciler applied it: what `DesiredFrontend` asked for, borrowed from its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppliedFrontend<'a> {
    /// The Service port it serves.
    pub name: &'a Arc<ServicePortName>,
    /// Backends per tier (node, zone, cluster).
    pub tiers: [&'a [Backend]; TIER_COUNT],
    /// Every slot, tier after tier (a backend in two tiers is there twice).
    pub slots: &'a [Backend],
    /// `FLAG_*` bits of the frontend value.
    pub flags: u32,
    /// sessionAffinity ClientIP timeout in seconds; 0 is none.
    pub affinity_timeout_s: u32,
    /// Adopted maps not laid out as the value says (`tiers` may then not be what the data path reads).
    pub stale: bool,
}

impl AppliedFrontend<'_> {
    /// Whether this is what `want` asks for (nothing to write).
    pub fn is(&self, want: &DesiredFrontend) -> bool {
        !self.stale
            && self.flags == want.flags
            && self.affinity_timeout_s == want.affinity_timeout_s
            && self.tiers.iter().zip(&want.tiers).all(|(have, want)| *have == want.as_slice())
            && *self.name == want.name
    }

    /// The same frontend as a `DesiredFrontend` (a copy of its backends).
    pub fn to_desired(&self) -> DesiredFrontend {
        DesiredFrontend {
            name: self.name.clone(),
            tiers: self.tiers.map(<[Backend]>::to_vec),
            flags: self.flags,
            affinity_timeout_s: self.affinity_timeout_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use lb_common::TierRange;

    use super::*;
    use crate::datapath::addr;

    fn backend(last: u8) -> Backend {
        addr::backend(std::net::SocketAddr::from(([10, 0, 0, last], 80)), 6)
    }

    #[test]
    fn a_record_gives_back_the_tiers_it_was_written_for() {
        let (a, b, c) = (backend(1), backend(2), backend(3));
        let want = DesiredFrontend {
            name: Arc::new(ServicePortName::default()),
            tiers: [vec![a], vec![a, b], vec![a, b, c]],
            flags: 4,
            affinity_timeout_s: 30,
        };
        let value = FrontendValue {
            tiers: [
                TierRange { start: 0, len: 1 },
                TierRange { start: 1, len: 2 },
                TierRange { start: 3, len: 3 },
            ],
            flags: 4,
            affinity_timeout_s: 30,
            ..FrontendValue::default()
        };
        let applied = Applied::new(value, &want);
        let view = applied.view();
        assert!(view.is(&want));
        assert_eq!(view.to_desired(), want);
        assert_eq!(view.slots, [a, a, b, a, b, c]);
        // The record shares the port's name rather than copying it.
        assert!(Arc::ptr_eq(view.name, &want.name));
        let mut other = want.clone();
        other.tiers[1].pop();
        assert!(!view.is(&other), "a tier that differs is a write");
        let mut other = want.clone();
        other.flags = 0;
        assert!(!view.is(&other), "flags that differ are a write");
        // Adopted as written, it is the same record; with a slot missing from the maps it matches nothing,
        // even a desired state its remaining slots would seem to equal.
        let read_back = [vec![a], vec![a, b], vec![a, b, c]];
        assert!(Applied::adopted(value, want.name.clone(), &read_back).view().is(&want));
        let missing = [vec![], vec![a, b], vec![a, b, c]];
        let looks_like = DesiredFrontend { tiers: [vec![a, b], vec![a, b, c], vec![]], ..want.clone() };
        let adopted = Applied::adopted(value, want.name.clone(), &missing);
        assert!(!adopted.view().is(&looks_like) && !adopted.view().is(&want));
        let overlapping = FrontendValue {
            tiers: [TierRange { start: 0, len: 1 }, TierRange { start: 0, len: 1 }, TierRange::default()],
            ..value
        };
        let one = DesiredFrontend { tiers: [vec![a], vec![a], vec![]], ..want.clone() };
        assert!(
            !Applied::adopted(overlapping, want.name.clone(), &[vec![a], vec![a], vec![]]).view().is(&one)
        );
    }
}
