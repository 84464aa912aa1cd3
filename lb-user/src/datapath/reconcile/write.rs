//! Steps (1) and (2) of the swap for many frontends at once: what comes before the swap (a fresh id's zeroed
//! counters and name, the new generation's slots, members and Maglev tables) for up to `CHUNK` frontends in one map operation
//! per map, then their frontend values in one more. A batch the kernel refuses (a full map) is undone and its
//! frontends written again one by one, so the outcome is that of writing each alone in key order: each
//! failure is reported against its own frontend, every other one is applied, and an id one failure frees goes
//! to the next frontend that needs one (the reconcile fuzz target's model checks exactly this).
//!
//! The order the data path needs holds across the batch: every slot and member of the chunk is in the maps
//! before any frontend value that points at them.
use std::time::Instant;

use lb_common::{
    Backend, FrontendKey, FrontendValue, MaglevKey, MaglevTable, MemberKey, MemberValue, SlotBlock, SlotKey,
    TIER_COUNT, TierRange, slot_blocks,
};

use super::{Applied, ApplyError, ApplyReport, Reconciler, grace::Buried, members};
use crate::datapath::{DesiredFrontend, MapError, MapWriter};

/// Frontends written per round of batches: about 1,000 frontends x 10 slots are a few hundred KiB of keys and
/// values, and 100,000 Services take a few hundred map operations instead of 400,000.
pub(super) const CHUNK: usize = 1024;

/// A frontend to write: its key, what is wanted, and the value applied before with whether it stays with the
/// same Service port (else it is taken over with a fresh id).
pub(super) struct Job<'a> {
    pub(super) key: FrontendKey,
    pub(super) want: &'a DesiredFrontend,
    pub(super) previous: Option<(FrontendValue, bool)>,
}

impl Job<'_> {
    fn error(&self, error: MapError) -> ApplyError {
        ApplyError { name: self.want.name.clone(), frontend: self.key, error }
    }
}

/// A job with its id and generation chosen: the value the swap writes and what is written before it.
struct Prepared<'a> {
    job: Job<'a>,
    value: FrontendValue,
    /// A new id: its counters are zeroed and its name written before the swap, and freed if that fails.
    fresh_id: bool,
    members: Vec<(Backend, MemberValue)>,
    /// The Maglev tables of an outside frontend with `FLAG_MAGLEV` (`maglev::tables`).
    maglev: Vec<(MaglevKey, Box<MaglevTable>)>,
}

impl Prepared<'_> {
    /// The generation's slots, tier after tier as `tier_ranges` lays them out, `SLOT_BLOCK` to an entry.
    fn slot_blocks(&self) -> impl Iterator<Item = SlotBlock> + '_ {
        SlotBlock::pack(self.job.want.tiers.iter().flatten().copied())
    }
    fn slot_keys(&self) -> impl Iterator<Item = SlotKey> + '_ {
        let (svc_id, generation) = (self.value.svc_id, self.value.generation);
        let blocks = slot_blocks(self.job.want.tiers.iter().map(Vec::len).sum());
        (0..blocks as u32).map(move |block| SlotKey { svc_id, generation, block })
    }
    fn member_keys(&self) -> impl Iterator<Item = MemberKey> + '_ {
        let (svc_id, generation) = (self.value.svc_id, self.value.generation);
        self.members.iter().map(move |(backend, _)| MemberKey { svc_id, generation, backend: *backend })
    }
}

/// The slot ranges of `want`'s tiers, laid out tier after tier.
fn tier_ranges(want: &DesiredFrontend) -> Result<[TierRange; TIER_COUNT], MapError> {
    let mut tiers = [TierRange::default(); TIER_COUNT];
    let mut index = 0usize;
    for (t, tier) in want.tiers.iter().enumerate() {
        let len = u16::try_from(tier.len()).map_err(|_| MapError::TierTooLong { len: tier.len() })?;
        let start = u16::try_from(index).map_err(|_| MapError::TierTooLong { len: index })?;
        tiers[t] = TierRange { start, len };
        index += tier.len();
    }
    Ok(tiers)
}

impl<W: MapWriter> Reconciler<W> {
    /// Write `jobs` (at most `CHUNK`, in key order), batched, with the outcome of writing them one by one in
    /// that order: what fails is reported per frontend and leaves its previous state untouched, and a service
    /// id freed by one frontend's failure goes to the next that needs one.
    pub(super) fn write_jobs(&mut self, jobs: Vec<Job<'_>>, now: Instant, report: &mut ApplyReport) {
        if jobs.is_empty() {
            // A sync that changed nothing, or a last round that would be empty: no map operation.
            return;
        }
        let single = jobs.len() == 1;
        let mut ready = Vec::with_capacity(jobs.len());
        let mut jobs = jobs.into_iter();
        while let Some(job) = jobs.next() {
            match self.prepare(&job) {
                Ok((value, fresh_id)) => ready.push(Prepared {
                    maglev: crate::datapath::maglev::tables(&value, &job.want.tiers),
                    value,
                    fresh_id,
                    members: members::of(
                        job.want.affinity_timeout_s,
                        job.want.tiers.each_ref().map(Vec::as_slice),
                    )
                    .into_iter()
                    .collect(),
                    job,
                }),
                Err(error) if single => return report.errors.push(job.error(error)),
                // Out of service ids (or a tier too long): one by one, since which frontend gets an id another's
                // failure frees depends on the order. Nothing is written yet.
                Err(_) => {
                    return self.one_by_one(
                        ready,
                        false,
                        None,
                        std::iter::once(job).chain(jobs),
                        now,
                        report,
                    );
                }
            }
        }
        // (1) What the new values point at.
        if let Err(error) = self.write_before_swap(&ready) {
            // Which frontend the map refused is not told: one by one.
            if let [one] = ready.as_slice() {
                self.undo(one, true);
                return report.errors.push(one.job.error(error));
            }
            return self.one_by_one(ready, true, None, std::iter::empty(), now, report);
        }
        // (2) The swap, every frontend of the chunk in one operation.
        let keys: Vec<FrontendKey> = ready.iter().map(|p| p.job.key).collect();
        let values: Vec<FrontendValue> = ready.iter().map(|p| p.value).collect();
        let written = self.writer.put_frontends(&keys, &values);
        let mut ready = ready.into_iter();
        let Err((before, error)) = written else {
            return ready.for_each(|p| self.book(&p, now, report));
        };
        // The first `before` are written, the next was refused, the rest were not tried.
        ready.by_ref().take(before).for_each(|p| self.book(&p, now, report));
        let refused = ready.next().map(|p| (p, error));
        self.one_by_one(ready.collect(), true, refused, std::iter::empty(), now, report);
    }

    /// Undo `ready` (`written`: step (1) may have written their entries) in reverse, which gives their ids back
    /// in the order they were taken, then `refused` (reported with `error`: its id is the first one taken
    /// again, as when it fails alone), then write each of `ready` and of `then` on its own.
    fn one_by_one<'a>(
        &mut self,
        ready: Vec<Prepared<'a>>,
        written: bool,
        refused: Option<(Prepared<'a>, MapError)>,
        then: impl Iterator<Item = Job<'a>>,
        now: Instant,
        report: &mut ApplyReport,
    ) {
        for p in ready.iter().rev() {
            self.undo(p, written);
        }
        if let Some((p, error)) = refused {
            self.undo(&p, true);
            report.errors.push(p.job.error(error));
        }
        for job in ready.into_iter().map(|p| p.job).chain(then) {
            self.write_jobs(vec![job], now, report);
        }
    }

    /// The value `job`'s swap writes, and whether its id is fresh. The generation goes up on every write of a
    /// key, so that two writes of it never look alike to the data path's torn-copy check.
    fn prepare(&mut self, job: &Job<'_>) -> Result<(FrontendValue, bool), MapError> {
        let tiers = tier_ranges(job.want)?;
        let (svc_id, generation, fresh_id) = match job.previous {
            Some((v, true)) => (v.svc_id, v.generation.wrapping_add(1), false),
            Some((v, false)) => (self.alloc_id()?, v.generation.wrapping_add(1), true),
            None => (self.alloc_id()?, 1, true),
        };
        let value = FrontendValue {
            key: job.key,
            svc_id,
            generation,
            tiers,
            flags: job.want.flags,
            affinity_timeout_s: job.want.affinity_timeout_s,
            generation_tail: generation,
        };
        Ok((value, fresh_id))
    }

    /// Step (1) for the whole chunk: fresh ids' counters zeroed (a reused id must not inherit another Service's
    /// counts) and names stored, then every slot and member. On an error any of them may be written.
    fn write_before_swap(&mut self, ready: &[Prepared<'_>]) -> Result<(), MapError> {
        let fresh: Vec<&Prepared<'_>> = ready.iter().filter(|p| p.fresh_id).collect();
        let ids: Vec<u32> = fresh.iter().map(|p| p.value.svc_id).collect();
        self.writer.reset_counters(&ids)?;
        let names: Vec<_> = fresh.iter().map(|p| &*p.job.want.name).collect();
        let keys: Vec<SlotKey> = ready.iter().flat_map(Prepared::slot_keys).collect();
        // As many as the keys, sized at once (collected from a flat map, it grew by doubling, copying).
        let mut blocks: Vec<SlotBlock> = Vec::with_capacity(keys.len());
        blocks.extend(ready.iter().flat_map(Prepared::slot_blocks));
        self.writer.put_names_and_slots(&ids, &names, &keys, &blocks)?;
        let keys: Vec<MemberKey> = ready.iter().flat_map(Prepared::member_keys).collect();
        let values: Vec<MemberValue> = ready.iter().flat_map(|p| p.members.iter().map(|(_, v)| *v)).collect();
        self.writer.put_members(&keys, &values)?;
        for (key, table) in ready.iter().flat_map(|p| &p.maglev) {
            self.writer.put_maglev_table(*key, table)?;
        }
        Ok(())
    }

    /// Give back `p`'s fresh id and, if step (1) may have written them (`written`), remove its entries (best
    /// effort: none of them was ever visible to the data path) and the id's name.
    fn undo(&mut self, p: &Prepared<'_>, written: bool) {
        if written {
            for key in p.slot_keys() {
                let _ = self.writer.delete_slot_block(key);
            }
            for key in p.member_keys() {
                let _ = self.writer.delete_member(key);
            }
            for (key, _) in &p.maglev {
                let _ = self.writer.delete_maglev_table(*key);
            }
            if p.fresh_id {
                let _ = self.writer.delete_name(p.value.svc_id);
            }
        }
        if p.fresh_id {
            self.free_ids.push(p.value.svc_id);
        }
    }

    /// `p` is written: the generation it replaced waits for its grace period, and it is applied.
    fn book(&mut self, p: &Prepared<'_>, now: Instant, report: &mut ApplyReport) {
        let key = p.job.key;
        if let Some((old, same)) = p.job.previous {
            let buried = Buried::new(&old, &self.applied[&key].view(), now, !same);
            self.graveyard.push_back(buried);
            report.updated += 1;
        } else {
            report.added += 1;
        }
        self.index(key, Applied::new(p.value, p.job.want));
    }
}
