//! Step (3) of the swap: old slots (and the service ids of removed frontends) wait in a graveyard until the
//! kernel's grace period is over, then go. See the parent module for why the wait is the kernel's.
use std::time::{Duration, Instant};

use lb_common::{Backend, FrontendValue, MaglevKey, MemberKey, SlotKey, slot_blocks};

use super::{AppliedFrontend, Reconciler, members};
use crate::datapath::MapWriter;

/// How long old slots outlive the frontend update that stopped pointing at them when the kernel's grace
/// period cannot be waited for (`MapWriter::wait_for_readers` failed). Programs finish in microseconds.
pub const DEFAULT_GRACE: Duration = Duration::from_millis(50);

/// Slots (and the member entries of a frontend with sessionAffinity, the Maglev tables of one with Maglev) waiting for their grace period to end;
/// `free_id` returns the service id as well.
#[derive(Clone, Debug)]
pub(super) struct Buried {
    pub(super) since: Instant,
    svc_id: u32,
    generation: u32,
    count: u32,
    members: Vec<Backend>,
    maglev: Vec<MaglevKey>,
    free_id: bool,
}

impl Buried {
    /// The generation `value` points at, holding `applied`.
    pub(super) fn new(
        value: &FrontendValue,
        applied: &AppliedFrontend<'_>,
        now: Instant,
        free_id: bool,
    ) -> Self {
        let count = value.tiers.iter().map(|r| u32::from(r.start) + u32::from(r.len)).max().unwrap_or(0);
        Self {
            since: now,
            svc_id: value.svc_id,
            generation: value.generation,
            count,
            // Every backend of the generation, whichever tier the record says it is in (only the keys go).
            members: members::of(applied.affinity_timeout_s, [applied.slots, &[], &[]]).into_keys().collect(),
            maglev: crate::datapath::maglev::keys(value, &applied.tiers),
            free_id,
        }
    }
}

impl<W: MapWriter> Reconciler<W> {
    /// Step (3): wait for the kernel's grace period (once, if anything was buried) and delete the slots
    /// buried so far, freeing their service ids. Call it periodically, off the sync path; if the wait fails,
    /// what was buried goes by `DEFAULT_GRACE` from its burial instead, measured at `now`.
    pub fn collect_garbage(&mut self, now: Instant) {
        if self.graveyard.is_empty() {
            return;
        }
        let waited = match self.writer.wait_for_readers() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "waiting for an RCU grace period failed; old slots go after a fixed delay");
                false
            }
        };
        while let Some(b) = self.graveyard.front() {
            if !waited && now.duration_since(b.since) < DEFAULT_GRACE {
                break;
            }
            let Some(b) = self.graveyard.pop_front() else { break };
            for block in 0..slot_blocks(b.count as usize) as u32 {
                if let Err(e) = self.writer.delete_slot_block(SlotKey {
                    svc_id: b.svc_id,
                    generation: b.generation,
                    block,
                }) {
                    tracing::warn!(svc_id = b.svc_id, error = %e, "deleting an old slot failed");
                }
            }
            for backend in b.members {
                let key = MemberKey { svc_id: b.svc_id, generation: b.generation, backend };
                if let Err(e) = self.writer.delete_member(key) {
                    tracing::warn!(svc_id = b.svc_id, error = %e, "deleting an old member entry failed");
                }
            }
            for key in b.maglev {
                if let Err(e) = self.writer.delete_maglev_table(key) {
                    tracing::warn!(svc_id = b.svc_id, error = %e, "deleting an old Maglev table failed");
                }
            }
            if b.free_id {
                if let Err(e) = self.writer.delete_name(b.svc_id) {
                    tracing::warn!(svc_id = b.svc_id, error = %e, "deleting a service name failed");
                }
                self.free_ids.push(b.svc_id);
            }
        }
    }
}
