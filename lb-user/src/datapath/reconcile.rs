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
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::Arc,
    time::Instant,
};

use lb_common::{FrontendKey, FrontendValue, GLOBAL_SVC_ID, MemberKey, SlotKey, TIER_COUNT, TierRange};

use super::{Desired, DesiredFrontend, MapError, MapWriter, addr};
use crate::model::{ObjKey, ServicePortName};

mod adopt;
mod grace;
mod members;

pub use adopt::AdoptReport;
use grace::Buried;
pub use grace::DEFAULT_GRACE;

#[derive(Clone, Debug)]
struct Applied {
    value: FrontendValue,
    desired: DesiredFrontend,
}

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
    /// The applied frontends of each Service (for `apply_services`).
    by_service: BTreeMap<ObjKey, BTreeSet<FrontendKey>>,
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

    /// The maps, for writes outside the diff (marking backends down, dropping reverse entries).
    pub fn writer_mut(&mut self) -> &mut W {
        &mut self.writer
    }

    /// Frontends as applied, with their map value.
    pub fn applied(&self) -> impl Iterator<Item = (&FrontendKey, &FrontendValue, &DesiredFrontend)> {
        self.applied.iter().map(|(k, a)| (k, &a.value, &a.desired))
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
        for (key, want) in desired {
            self.upsert_frontend(*key, want, now, &mut report);
        }
        report
    }

    fn remove_frontend(&mut self, key: FrontendKey, now: Instant, report: &mut ApplyReport) {
        let Some(applied) = self.applied.get(&key) else { return };
        match self.writer.delete_frontend(key) {
            Ok(()) => {
                let buried = Buried::new(&applied.value, &applied.desired, now, true);
                self.graveyard.push_back(buried);
                if let Some(applied) = self.applied.remove(&key) {
                    self.unindex(&applied.desired.name.service, key);
                }
                report.removed += 1;
            }
            Err(error) => {
                report.errors.push(ApplyError { name: applied.desired.name.clone(), frontend: key, error });
            }
        }
    }

    fn upsert_frontend(
        &mut self,
        key: FrontendKey,
        want: &DesiredFrontend,
        now: Instant,
        report: &mut ApplyReport,
    ) {
        let previous = match self.applied.get(&key) {
            Some(a) if &a.desired == want => {
                report.unchanged += 1;
                return;
            }
            // Whether the frontend stays with the same Service port: a VIP taken over by another Service
            // gets a fresh service id (its own name and counters) in the same one-update swap, and the old id
            // is freed after the grace period.
            previous => previous.map(|a| (a.value, a.desired.name == want.name)),
        };
        match self.write_frontend(key, want, previous.filter(|(_, same)| *same).map(|(v, _)| v)) {
            Ok(value) => {
                if let Some((old, same)) = previous {
                    let buried = Buried::new(&old, &self.applied[&key].desired, now, !same);
                    self.graveyard.push_back(buried);
                    report.updated += 1;
                } else {
                    report.added += 1;
                }
                self.index(key, Applied { value, desired: want.clone() });
            }
            Err(error) => {
                report.errors.push(ApplyError { name: want.name.clone(), frontend: key, error });
            }
        }
    }

    fn index(&mut self, key: FrontendKey, applied: Applied) {
        self.by_service.entry(applied.desired.name.service.clone()).or_default().insert(key);
        if let Some(old) = self.applied.insert(key, applied)
            && old.desired.name.service != self.applied[&key].desired.name.service
        {
            self.unindex(&old.desired.name.service, key);
        }
    }

    fn unindex(&mut self, service: &ObjKey, key: FrontendKey) {
        if let Some(keys) = self.by_service.get_mut(service) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_service.remove(service);
            }
        }
    }

    /// Steps (1) and (2) of the swap. On failure, the new slots are removed again and nothing else changed.
    fn write_frontend(
        &mut self,
        key: FrontendKey,
        want: &DesiredFrontend,
        previous: Option<FrontendValue>,
    ) -> Result<FrontendValue, MapError> {
        let (svc_id, generation, fresh_id) = match previous {
            Some(v) => (v.svc_id, v.generation.wrapping_add(1), false),
            None => (self.alloc_id()?, 1, true),
        };
        if fresh_id {
            // A reused id must not inherit another Service's counts.
            let named =
                self.writer.reset_counters(svc_id).and_then(|()| self.writer.put_name(svc_id, &want.name));
            if let Err(e) = named {
                self.free_ids.push(svc_id);
                return Err(e);
            }
        }
        let mut tiers = [TierRange::default(); TIER_COUNT];
        let mut index: u32 = 0;
        let mut written: u32 = 0;
        let members = members::of(want);
        let result = (|| {
            for (t, backends) in want.tiers.iter().enumerate() {
                let len = u16::try_from(backends.len())
                    .map_err(|_| MapError::TierTooLong { len: backends.len() })?;
                let start =
                    u16::try_from(index).map_err(|_| MapError::TierTooLong { len: index as usize })?;
                tiers[t] = TierRange { start, len };
                for b in backends {
                    self.writer.put_slot(SlotKey { svc_id, generation, index }, *b)?;
                    index += 1;
                    written = index;
                }
            }
            // Before the swap, like the slots: a connect that reads the new value finds its members.
            for (backend, value) in &members {
                self.writer.put_member(MemberKey { svc_id, generation, backend: *backend }, *value)?;
            }
            let affinity_timeout_s = want.affinity_timeout_s;
            let value =
                FrontendValue { key, svc_id, generation, tiers, flags: want.flags, affinity_timeout_s };
            self.writer.put_frontend(key, value)?;
            Ok(value)
        })();
        if result.is_err() {
            for i in 0..written {
                // Best effort: these slots were never visible to the data path.
                let _ = self.writer.delete_slot(SlotKey { svc_id, generation, index: i });
            }
            for backend in members.keys() {
                // Nor these members (absent ones are fine).
                let _ = self.writer.delete_member(MemberKey { svc_id, generation, backend: *backend });
            }
            if fresh_id {
                // Nor was the name of an id that never had a frontend: it goes with the id.
                let _ = self.writer.delete_name(svc_id);
                self.free_ids.push(svc_id);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use lb_common::Backend;

    use super::*;
    use crate::datapath::{MapReader as _, fake::FakeMaps};

    fn be(s: &str) -> Backend {
        addr::backend(s.parse::<SocketAddr>().unwrap(), 6)
    }

    fn fe(vip: &str) -> FrontendKey {
        let a: SocketAddr = vip.parse().unwrap();
        addr::frontend_key(a.ip(), a.port(), 6)
    }

    fn want(node: &[&str], cluster: &[&str]) -> DesiredFrontend {
        DesiredFrontend {
            name: Arc::new(ServicePortName::new(ObjKey::new("default", "web"), "http")),
            tiers: [
                node.iter().map(|s| be(s)).collect(),
                Vec::new(),
                cluster.iter().map(|s| be(s)).collect(),
            ],
            flags: 0,
            affinity_timeout_s: 0,
        }
    }

    #[test]
    fn add_update_remove_with_generation_swap() {
        let mut r = Reconciler::new(FakeMaps::new(16, 64));
        let t0 = Instant::now();
        let k = fe("10.96.0.1:80");
        let mut d = Desired::new();
        d.insert(k, want(&["10.0.0.1:8080"], &["10.0.0.1:8080", "10.0.0.2:8080"]));
        let rep = r.apply(&d, t0);
        assert_eq!((rep.added, rep.errors.len()), (1, 0));
        let v1 = r.writer().frontend(k).unwrap();
        assert_eq!(v1.generation, 1);
        assert_eq!(r.writer().slot_count(), 3);

        // Same desired state: nothing written.
        let writes = r.writer().writes();
        assert_eq!(r.apply(&d, t0).unchanged, 1);
        assert_eq!(r.writer().writes(), writes);

        // Change: new generation written, old slots still there until the grace period, which is one wait
        // for the kernel's readers.
        assert_eq!(r.writer().reader_waits(), 0);
        d.insert(k, want(&[], &["10.0.0.2:8080"]));
        let rep = r.apply(&d, t0);
        assert_eq!(rep.updated, 1);
        let v2 = r.writer().frontend(k).unwrap();
        assert_eq!((v2.svc_id, v2.generation, v2.key), (v1.svc_id, 2, k));
        assert_eq!(r.writer().slot_count(), 4, "old generation kept until the grace period");
        assert_eq!(r.writer().reader_waits(), 0, "apply never waits");
        r.collect_garbage(t0);
        assert_eq!(r.writer().reader_waits(), 1);
        assert_eq!(r.writer().slot_count(), 1);

        // Removal frees the id after the grace period.
        let rep = r.apply(&Desired::new(), t0);
        assert_eq!(rep.removed, 1);
        assert!(r.writer().frontend(k).is_none());
        r.collect_garbage(t0);
        assert_eq!(r.writer().slot_count(), 0);
        assert_eq!(r.writer().reader_waits(), 2);
        // Nothing buried: no wait.
        r.collect_garbage(t0);
        assert_eq!(r.writer().reader_waits(), 2);
    }

    #[test]
    fn one_grace_period_for_many_replaced_frontends_never_one_each() {
        let mut r = Reconciler::new(FakeMaps::new(64, 256));
        let t0 = Instant::now();
        let mut d = Desired::new();
        for i in 1..=20 {
            d.insert(fe(&format!("10.96.0.{i}:80")), want(&[], &["10.0.0.1:80"]));
        }
        r.apply(&d, t0);
        assert_eq!(r.writer().reader_waits(), 0, "nothing replaced: nothing to wait for");
        for w in d.values_mut() {
            *w = want(&[], &["10.0.0.2:80"]);
        }
        let rep = r.apply(&d, t0);
        assert_eq!(rep.updated, 20);
        assert_eq!(r.writer().slot_count(), 40);
        r.collect_garbage(t0);
        assert_eq!(r.writer().reader_waits(), 1);
        assert_eq!(r.writer().slot_count(), 20);
    }

    #[test]
    fn without_the_kernels_grace_period_old_slots_wait_a_fixed_delay() {
        let mut r = Reconciler::new(FakeMaps::new(16, 64));
        r.writer_mut().fail_reader_waits(true);
        let t0 = Instant::now();
        let k = fe("10.96.0.1:80");
        let mut d = Desired::new();
        d.insert(k, want(&[], &["10.0.0.1:8080"]));
        r.apply(&d, t0);
        d.insert(k, want(&[], &["10.0.0.2:8080"]));
        r.apply(&d, t0);
        assert_eq!(r.writer().slot_count(), 2, "old generation kept during the fixed grace");
        r.collect_garbage(t0 + DEFAULT_GRACE / 2);
        assert_eq!(r.writer().slot_count(), 2);
        r.collect_garbage(t0 + DEFAULT_GRACE);
        assert_eq!(r.writer().slot_count(), 1);
    }

    #[test]
    fn a_full_slot_map_never_leaves_a_half_applied_service() {
        // Room for 3 slots: the first Service (2 slots) fits, the second (2 more) does not.
        let mut r = Reconciler::new(FakeMaps::new(16, 3));
        let t0 = Instant::now();
        let mut d = Desired::new();
        d.insert(fe("10.96.0.1:80"), want(&[], &["10.0.0.1:80", "10.0.0.2:80"]));
        d.insert(fe("10.96.0.2:80"), want(&[], &["10.0.0.3:80", "10.0.0.4:80"]));
        let rep = r.apply(&d, t0);
        assert_eq!(rep.added, 1);
        assert_eq!(rep.errors.len(), 1);
        let msg = rep.errors[0].to_string();
        assert!(
            msg.contains("default/web:http") && msg.contains("10.96.0.2:80") && msg.contains("full"),
            "{msg}"
        );
        assert!(matches!(rep.errors[0].error, MapError::Full { .. }), "{:?}", rep.errors[0]);
        assert!(r.writer().frontend(fe("10.96.0.2:80")).is_none());
        assert_eq!(r.writer().slot_count(), 2, "partially written slots are removed again");

        // An update that does not fit keeps the previous generation in place.
        let before = r.writer().frontend(fe("10.96.0.1:80")).unwrap();
        d.remove(&fe("10.96.0.2:80"));
        d.insert(fe("10.96.0.1:80"), want(&[], &["10.0.0.1:80", "10.0.0.2:80", "10.0.0.5:80"]));
        let rep = r.apply(&d, t0);
        assert_eq!(rep.errors.len(), 1);
        assert_eq!(r.writer().frontend(fe("10.96.0.1:80")).unwrap(), before);
    }

    #[test]
    fn a_restarted_agent_adopts_the_maps_and_rewrites_only_what_changed() {
        let t0 = Instant::now();
        let mut first = Reconciler::new(FakeMaps::new(16, 64));
        let mut d = Desired::new();
        d.insert(fe("10.96.0.1:80"), want(&["10.0.0.1:80"], &["10.0.0.1:80", "10.0.0.2:80"]));
        d.insert(fe("10.96.0.2:80"), want(&[], &["10.0.0.3:80"]));
        first.apply(&d, t0);
        // Killed in the middle of a swap: new slots written, frontend not yet switched.
        let v = first.writer().frontend(fe("10.96.0.2:80")).unwrap();
        let mut maps = first.writer;
        maps.put_slot(
            SlotKey { svc_id: v.svc_id, generation: v.generation + 1, index: 0 },
            be("10.0.0.9:80"),
        )
        .unwrap();
        // ... and killed after naming a new frontend's id, before writing the frontend.
        let orphan_id = v.svc_id + 3;
        maps.put_name(orphan_id, &ServicePortName::new(ObjKey::new("default", "gone"), "http")).unwrap();

        let mut second = Reconciler::new(maps);
        let rep = second.adopt().unwrap();
        assert_eq!(
            rep,
            AdoptReport {
                frontends: 2,
                orphan_slots_removed: 1,
                orphan_names_removed: 1,
                orphan_members_removed: 0,
                unnamed: 0
            }
        );
        assert_eq!(second.writer().name(orphan_id).unwrap(), None);
        assert!(second.writer().name(v.svc_id).unwrap().is_some(), "a used id keeps its name");
        let writes = second.writer().writes();
        let rep = second.apply(&d, t0);
        assert_eq!((rep.unchanged, rep.changed()), (2, 0), "nothing rewritten after adoption");
        assert_eq!(second.writer().writes(), writes);
        // A new frontend gets a fresh id, not one in use.
        d.insert(fe("10.96.0.3:80"), want(&[], &["10.0.0.4:80"]));
        second.apply(&d, t0);
        let ids: BTreeSet<u32> = second.writer().frontends().unwrap().iter().map(|(_, v)| v.svc_id).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(
            second
                .writer()
                .name(second.writer().frontend(fe("10.96.0.3:80")).unwrap().svc_id)
                .unwrap()
                .as_deref(),
            Some("default/web:http")
        );
    }

    #[test]
    fn service_ids_are_reused_with_fresh_counters() {
        let mut r = Reconciler::new(FakeMaps::new(1, 64));
        let t0 = Instant::now();
        let mut d = Desired::new();
        d.insert(fe("10.96.0.1:80"), want(&[], &["10.0.0.1:80"]));
        r.apply(&d, t0);
        let id = r.writer().frontend(fe("10.96.0.1:80")).unwrap().svc_id;
        r.writer_mut().bump_counter(id, 2);
        let mut d2 = Desired::new();
        d2.insert(fe("10.96.0.9:80"), want(&[], &["10.0.0.1:80"]));
        // Only one id exists: the new frontend must wait until the old one's grace period is over. No timer
        // collects here: a batch more than DEFAULT_GRACE after the burial collects first (one wait).
        let rep = r.apply(&d2, t0);
        assert_eq!(rep.errors.len(), 1);
        let rep = r.apply(&d2, t0 + DEFAULT_GRACE / 2);
        assert_eq!((rep.errors.len(), r.writer().reader_waits()), (1, 0), "a batch soon after never waits");
        let rep = r.apply(&d2, t0 + DEFAULT_GRACE);
        assert_eq!(r.writer().reader_waits(), 1);
        assert_eq!(rep.errors.len(), 0, "{:?}", rep.errors);
        let v = r.writer().frontend(fe("10.96.0.9:80")).unwrap();
        assert_eq!(v.svc_id, id);
        assert_eq!(r.writer().counters(id).unwrap()[2], 0);
    }

    #[test]
    fn affinity_members_follow_their_generation_and_go_with_it() {
        let mut r = Reconciler::new(FakeMaps::new(16, 64));
        let t0 = Instant::now();
        let k = fe("10.96.0.1:80");
        let with_affinity = |node: &[&str], cluster: &[&str]| DesiredFrontend {
            affinity_timeout_s: 60,
            ..want(node, cluster)
        };
        let member = |svc_id, generation, b: &str, tiers| {
            (MemberKey { svc_id, generation, backend: be(b) }, lb_common::MemberValue { tiers })
        };
        let mut d = Desired::new();
        d.insert(k, with_affinity(&["10.0.0.1:80"], &["10.0.0.1:80", "10.0.0.2:80"]));
        r.apply(&d, t0);
        let v1 = r.writer().frontend(k).unwrap();
        assert_eq!(v1.affinity_timeout_s, 60);
        let id = v1.svc_id;
        let gen1 = BTreeMap::from([member(id, 1, "10.0.0.1:80", 0b101), member(id, 1, "10.0.0.2:80", 0b100)]);
        assert_eq!(*r.writer().member_map(), gen1, "each backend once, with the tiers it is in");

        // A change writes generation 2's members beside generation 1's, which go after the grace period.
        d.insert(k, with_affinity(&[], &["10.0.0.2:80", "10.0.0.3:80"]));
        r.apply(&d, t0);
        let gen2 = BTreeMap::from([member(id, 2, "10.0.0.2:80", 0b100), member(id, 2, "10.0.0.3:80", 0b100)]);
        let both: BTreeMap<_, _> = gen1.iter().chain(&gen2).map(|(k, v)| (*k, *v)).collect();
        assert_eq!(*r.writer().member_map(), both);
        r.collect_garbage(t0);
        assert_eq!(*r.writer().member_map(), gen2);

        // Affinity turned off: a new generation without members; then the frontend goes, and nothing is left.
        d.insert(k, want(&[], &["10.0.0.2:80"]));
        r.apply(&d, t0);
        r.collect_garbage(t0);
        assert!(r.writer().member_map().is_empty());
        assert_eq!(r.writer().frontend(k).unwrap().affinity_timeout_s, 0);
        d.insert(k, with_affinity(&[], &["10.0.0.4:80"]));
        r.apply(&d, t0);
        assert_eq!(r.writer().member_map().len(), 1);
        r.apply(&Desired::new(), t0);
        r.collect_garbage(t0);
        assert!(r.writer().member_map().is_empty(), "a removed frontend's members go with its slots");
    }

    #[test]
    fn adoption_keeps_current_members_and_removes_orphans() {
        let t0 = Instant::now();
        let mut first = Reconciler::new(FakeMaps::new(16, 64));
        let k = fe("10.96.0.1:80");
        let mut d = Desired::new();
        d.insert(k, DesiredFrontend { affinity_timeout_s: 30, ..want(&[], &["10.0.0.1:80"]) });
        first.apply(&d, t0);
        let v = first.writer().frontend(k).unwrap();
        let mut maps = first.writer;
        // Killed in the middle of a swap: the next generation's member written, the frontend not switched.
        let orphan = MemberKey { svc_id: v.svc_id, generation: v.generation + 1, backend: be("10.0.0.9:80") };
        maps.put_member(orphan, lb_common::MemberValue { tiers: 0b100 }).unwrap();
        let mut second = Reconciler::new(maps);
        let rep = second.adopt().unwrap();
        assert_eq!(rep.orphan_members_removed, 1);
        let left: Vec<MemberKey> = second.writer().member_map().keys().copied().collect();
        assert_eq!(
            left,
            [MemberKey { svc_id: v.svc_id, generation: v.generation, backend: be("10.0.0.1:80") }]
        );
        let rep = second.apply(&d, t0);
        assert_eq!((rep.unchanged, rep.changed()), (1, 0), "the adopted frontend keeps its affinity");
    }
}
