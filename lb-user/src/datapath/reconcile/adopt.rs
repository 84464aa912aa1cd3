//! Taking over the maps a previous agent pinned: what they hold becomes the applied state.
use std::{collections::BTreeSet, sync::Arc};

use lb_common::GLOBAL_SVC_ID;

use super::{Applied, Reconciler};
use crate::{
    datapath::{MapError, MapWriter},
    model::ServicePortName,
};

/// What taking over a previous agent's maps found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AdoptReport {
    /// Frontends now known as applied.
    pub frontends: usize,
    /// Entries of the slot map no frontend pointed at (a swap cut short), deleted.
    pub orphan_slots_removed: usize,
    /// Service names (SVC_NAMES) of ids no frontend uses, deleted: a new frontend's id is named before its
    /// frontend is written, and a removed frontend's name goes a grace period after it, so an agent killed in
    /// between leaves one.
    pub orphan_names_removed: usize,
    /// sessionAffinity member entries of no current generation (a swap cut short), deleted.
    pub orphan_members_removed: usize,
    /// Maglev tables of no current generation with Maglev (a swap cut short, or `--lb-algorithm` changed),
    /// deleted.
    pub orphan_maglev_removed: usize,
    /// Frontends whose stored name is not `namespace/name[:port]` (adopted nameless; the first full sync
    /// replaces or removes them).
    pub unnamed: usize,
}

impl<W: MapWriter> Reconciler<W> {
    /// Take over maps written by an earlier agent (pinned, surviving its restart): what they hold becomes the
    /// applied state, so the next `apply` rewrites only what changed. Slots no frontend points at (left by
    /// an agent killed in the middle of a swap) are deleted.
    pub fn adopt(&mut self) -> Result<AdoptReport, MapError> {
        let current = crate::datapath::read_back(&self.writer)?;
        let mut report = AdoptReport::default();
        let mut used = BTreeSet::new();
        for (key, rb) in &current {
            let label = self.writer.name(rb.value.svc_id)?.unwrap_or_default();
            let name = label.parse::<ServicePortName>().unwrap_or_else(|_| {
                report.unnamed += 1;
                ServicePortName::default()
            });
            self.index(*key, Applied::adopted(rb.value, Arc::new(name), &rb.tiers));
            used.insert(rb.value.svc_id);
            report.frontends += 1;
        }
        let live: BTreeSet<(u32, u32)> =
            current.values().map(|rb| (rb.value.svc_id, rb.value.generation)).collect();
        for key in self.writer.slot_keys()? {
            if !live.contains(&(key.svc_id, key.generation)) {
                self.writer.delete_slot_block(key)?;
                report.orphan_slots_removed += 1;
            }
        }
        // Member entries are checked against the generation too, so an orphan is never used; removed all the
        // same, as their generation's slots were (or the member map would fill).
        let with_affinity: BTreeSet<(u32, u32)> = current
            .values()
            .filter(|rb| rb.value.affinity_timeout_s != 0)
            .map(|rb| (rb.value.svc_id, rb.value.generation))
            .collect();
        for (key, _) in self.writer.members()? {
            if !with_affinity.contains(&(key.svc_id, key.generation)) {
                self.writer.delete_member(key)?;
                report.orphan_members_removed += 1;
            }
        }
        // Maglev tables likewise: of a current generation with the flag, or removed.
        let with_maglev: BTreeSet<(u32, u32)> = current
            .values()
            .filter(|rb| rb.value.flags & lb_common::FLAG_MAGLEV != 0)
            .map(|rb| (rb.value.svc_id, rb.value.generation))
            .collect();
        for key in self.writer.maglev_keys()? {
            if !with_maglev.contains(&(key.svc_id, key.generation)) {
                self.writer.delete_maglev_table(key)?;
                report.orphan_maglev_removed += 1;
            }
        }
        // Every id the maps can name, since any may have been named last (O(--max-services) lookups, once).
        for id in GLOBAL_SVC_ID + 1..=self.writer.max_services() {
            if !used.contains(&id) && self.writer.name(id)?.is_some() {
                self.writer.delete_name(id)?;
                report.orphan_names_removed += 1;
            }
        }
        let max = used.iter().copied().max().unwrap_or(GLOBAL_SVC_ID);
        self.next_id = max + 1;
        self.free_ids = (GLOBAL_SVC_ID + 1..max).filter(|id| !used.contains(id)).rev().collect();
        Ok(report)
    }
}
