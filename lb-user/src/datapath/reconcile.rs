//! Diff the desired frontends against what was applied and write only the difference, one Service at a time,
//! never leaving a frontend pointing at a half-written slot set.
//!
//! The swap for a changed frontend: (1) write its new slots under generation g+1, (2) replace the frontend
//! value in one map update, (3) delete generation g's slots after a grace period. A connect that read the old
//! frontend value just before (2) still looks its slots up during its run; deleting them at once would make
//! that lookup miss (the program would fail open and send the connect to the raw VIP).
//!
//! The grace period is the kernel's, not a guess: the programs run under `rcu_read_lock()`, and
//! `MapWriter::wait_for_readers` returns after an RCU grace period (one `synchronize_rcu()`, see
//! `datapath::rcu`), after which no program holds a frontend value read before (2). It is taken by
//! `collect_garbage`, once for everything buried since the last call (so at most once per batch, never per
//! Service), and not inside `apply`: a grace period takes milliseconds to tens of milliseconds on a busy node,
//! and a sync's frontends are live as soon as they are written, so nothing waits on it but the old slots
//! (and freed service ids, reusable only after it). The agent calls `collect_garbage` on its timer; `apply`
//! collects first only what was buried more than `DEFAULT_GRACE` ago (no timer ran since). If the
//! wait fails (the kernel refused the map-in-map update), old slots fall back to a fixed `DEFAULT_GRACE`,
//! far longer than any program's run.
use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
    time::Instant,
};

use lb_common::{FrontendKey, FrontendValue, GLOBAL_SVC_ID};

use super::{Desired, MapError, MapWriter, addr};
use crate::model::{ObjKey, ServicePortName, compact};

mod adopt;
mod applied;
mod grace;
mod members;
mod write;

pub use adopt::AdoptReport;
use applied::Applied;
pub use applied::AppliedFrontend;
use grace::Buried;
pub use grace::DEFAULT_GRACE;

/// A frontend that could not be applied; its previous state (if any) is untouched.
#[derive(Debug, thiserror::Error)]
#[error("Service {name} frontend {}: {error}", addr::frontend_addr(frontend))]
pub struct ApplyError {
    /// The Service port the frontend belongs to.
    pub name: Arc<ServicePortName>,
    /// The frontend (VIP, port, protocol).
    pub frontend: FrontendKey,
    /// What the maps refused.
    #[source]
    pub error: MapError,
}

/// What one `apply` did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Frontends written for the first time.
    pub added: usize,
    /// Frontends swapped to a new generation.
    pub updated: usize,
    /// Frontends deleted.
    pub removed: usize,
    /// Frontends already as desired (nothing written).
    pub unchanged: usize,
    /// Frontends that could not be applied.
    pub errors: Vec<ApplyError>,
}

impl ApplyReport {
    /// Frontends added, updated or removed.
    pub fn changed(&self) -> usize {
        self.added + self.updated + self.removed
    }
}

/// Keeps the maps equal to the desired frontends with as few writes as possible, remembering what it applied
/// (so a diff needs no map reads) and which slots wait for their grace period.
pub struct Reconciler<W: MapWriter> {
    writer: W,
    applied: BTreeMap<FrontendKey, Applied>,
    /// The applied frontends of each Service (for `apply_services`), sorted: a Service has a few, and a
    /// sorted `Few` (one inline) takes a tenth of a `BTreeSet`'s node.
    by_service: BTreeMap<ObjKey, compact::Few<FrontendKey>>,
    free_ids: Vec<u32>,
    next_id: u32,
    graveyard: VecDeque<Buried>,
}

impl<W: MapWriter> Reconciler<W> {
    /// A reconciler over `writer`'s maps, assumed empty (see `adopt` for maps a previous agent filled).
    pub fn new(writer: W) -> Self {
        Self {
            writer,
            applied: BTreeMap::new(),
            by_service: BTreeMap::new(),
            free_ids: Vec::new(),
            next_id: GLOBAL_SVC_ID + 1,
            graveyard: VecDeque::new(),
        }
    }

    /// The maps.
    pub fn writer(&self) -> &W {
        &self.writer
    }

    /// The maps back (to give them to another reconciler once this one has emptied them).
    pub fn into_writer(self) -> W {
        self.writer
    }

    /// The maps, for writes outside the diff (marking backends down, dropping reverse entries).
    pub fn writer_mut(&mut self) -> &mut W {
        &mut self.writer
    }

    /// Rebuild the records with full nodes (`compact::repack`).
    pub fn repack(&mut self) {
        compact::repack(&mut self.applied);
        compact::repack(&mut self.by_service);
    }

    /// Frontends as applied, with their map value.
    pub fn applied(&self) -> impl Iterator<Item = (&FrontendKey, &FrontendValue, AppliedFrontend<'_>)> {
        self.applied.iter().map(|(k, a)| (k, &a.value, a.view()))
    }

    /// The frontends applied for `service`.
    pub fn applied_of<'a>(
        &'a self,
        service: &ObjKey,
    ) -> impl Iterator<Item = (&'a FrontendKey, &'a FrontendValue, AppliedFrontend<'a>)> + 'a {
        let keys = self.by_service.get(service).map(compact::Few::as_slice).unwrap_or_default();
        keys.iter().filter_map(|k| self.applied.get_key_value(k)).map(|(k, a)| (k, &a.value, a.view()))
    }

    /// The frontend `key` as applied.
    pub fn applied_get(&self, key: &FrontendKey) -> Option<(&FrontendValue, AppliedFrontend<'_>)> {
        self.applied.get(key).map(|a| (&a.value, a.view()))
    }

    fn alloc_id(&mut self) -> Result<u32, MapError> {
        if let Some(id) = self.free_ids.pop() {
            return Ok(id);
        }
        let capacity = self.writer.max_services();
        if self.next_id > capacity {
            return Err(MapError::NoServiceId { capacity });
        }
        let id = self.next_id;
        self.next_id += 1;
        Ok(id)
    }

    /// Bring the maps to `desired`. Frontends that fail keep their previous state and are reported.
    pub fn apply(&mut self, desired: &Desired, now: Instant) -> ApplyReport {
        let gone = self.applied.keys().filter(|k| !desired.contains_key(k)).copied().collect();
        self.apply_diff(gone, desired, now)
    }

    /// Bring only the frontends of `services` to `desired`, which holds every frontend
    /// those Services should have and no other: the cost is that of the change, not of all Services. The
    /// rest stays as applied. (A VIP that moves to one of `services` from a Service not in the list is taken
    /// over; the API server never gives one VIP to two Services at once.)
    pub fn apply_services<'a>(
        &mut self,
        services: impl IntoIterator<Item = &'a ObjKey>,
        desired: &Desired,
        now: Instant,
    ) -> ApplyReport {
        let gone = services
            .into_iter()
            .filter_map(|service| self.by_service.get(service))
            .flatten()
            .filter(|k| !desired.contains_key(k))
            .copied()
            .collect();
        self.apply_diff(gone, desired, now)
    }

    /// Remove `gone`, then add or update every frontend of `desired` that differs from what is applied.
    fn apply_diff(&mut self, gone: Vec<FrontendKey>, desired: &Desired, now: Instant) -> ApplyReport {
        let mut report = ApplyReport::default();
        // The agent's timer collects within milliseconds of a change. A burial older than `DEFAULT_GRACE`
        // means no timer ran (a caller without one, or a loop that was busy): collect first, so the ids and
        // slots it frees are there for this batch. Otherwise a batch never waits for a grace period.
        if self.graveyard.front().is_some_and(|b| now.duration_since(b.since) >= DEFAULT_GRACE) {
            self.collect_garbage(now);
        }
        for key in gone {
            self.remove_frontend(key, now, &mut report);
        }
        // Each round's jobs in a vector sized at once (grown by doubling, it was copied into fresh pages).
        let round = || Vec::with_capacity(write::CHUNK.min(desired.len()));
        let mut jobs = round();
        for (key, want) in desired {
            let previous = match self.applied.get(key) {
                Some(a) if a.view().is(want) => {
                    report.unchanged += 1;
                    continue;
                }
                // Whether the frontend stays with the same Service port: a VIP taken over by another
                // Service gets a fresh service id (its own name and counters) in the same one-update swap,
                // and the old id is freed after the grace period.
                previous => previous.map(|a| (a.value, a.name == want.name)),
            };
            jobs.push(write::Job { key: *key, want, previous });
            if jobs.len() == write::CHUNK {
                self.write_jobs(std::mem::replace(&mut jobs, round()), now, &mut report);
            }
        }
        self.write_jobs(jobs, now, &mut report);
        report
    }

    fn remove_frontend(&mut self, key: FrontendKey, now: Instant, report: &mut ApplyReport) {
        let Some(applied) = self.applied.get(&key) else { return };
        match self.writer.delete_frontend(key) {
            Ok(()) => {
                let buried = Buried::new(&applied.value, &applied.view(), now, true);
                self.graveyard.push_back(buried);
                if let Some(applied) = self.applied.remove(&key) {
                    self.unindex(&applied.name.service, key);
                }
                report.removed += 1;
            }
            Err(error) => {
                report.errors.push(ApplyError { name: applied.name.clone(), frontend: key, error });
            }
        }
    }

    fn index(&mut self, key: FrontendKey, applied: Applied) {
        compact::insert_sorted(self.by_service.entry(applied.name.service.clone()).or_default(), key);
        if let Some(old) = self.applied.insert(key, applied)
            && old.name.service != self.applied[&key].name.service
        {
            self.unindex(&old.name.service, key);
        }
    }

    fn unindex(&mut self, service: &ObjKey, key: FrontendKey) {
        if let Some(keys) = self.by_service.get_mut(service) {
            compact::remove_sorted(keys, &key);
            if keys.is_empty() {
                self.by_service.remove(service);
            }
        }
    }
}

#[cfg(test)]
mod tests;
