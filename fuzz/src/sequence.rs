//! The reconciler target: a sequence of applies (whole or per Service), waits and collections against
//! small in-memory maps (so that maps fill up and ids run out), checked after every step against `Model`,
//! the reconciler's contract written a second time without its code: which frontends an apply must refuse
//! (out of service ids, slots or member entries, counting what waits for its grace period), what the maps
//! then hold, and how many slots, member entries and named ids are in use.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
    time::{Duration, Instant},
};

use lb_common::{Backend, FrontendKey, MemberKey, MemberValue, PROTO_TCP, TIER_COUNT};
use tierlb::{
    datapath::{
        DEFAULT_GRACE, Desired, DesiredFrontend, MapReader as _, ReadBack, Reconciler, addr, fake::FakeMaps,
        read_back,
    },
    model::ServicePortName,
};

pub use crate::steps::Steps;
use crate::steps::{Op, desired, service, services};

type Contents = BTreeMap<FrontendKey, ([Vec<Backend>; TIER_COUNT], u32, u32)>;

fn contents(maps: &FakeMaps) -> Contents {
    read_back(maps)
        .expect("fake maps")
        .into_iter()
        .map(|(k, rb)| (k, (rb.tiers, rb.value.flags, rb.value.affinity_timeout_s)))
        .collect()
}

fn of(state: &Desired) -> Contents {
    state.iter().map(|(k, d)| (*k, (d.tiers.clone(), d.flags, d.affinity_timeout_s))).collect()
}

/// The member entries the live frontends with sessionAffinity need: each backend of their current generation,
/// with the tiers it is in.
fn live_members(frontends: &BTreeMap<FrontendKey, ReadBack>) -> BTreeMap<MemberKey, MemberValue> {
    let mut want: BTreeMap<MemberKey, MemberValue> = BTreeMap::new();
    for rb in frontends.values().filter(|rb| rb.value.affinity_timeout_s != 0) {
        for (tier, backends) in rb.tiers.iter().enumerate() {
            for b in backends {
                let key = MemberKey { svc_id: rb.value.svc_id, generation: rb.value.generation, backend: *b };
                want.entry(key).or_default().tiers |= 1 << tier;
            }
        }
    }
    want
}

/// What the maps hold by the reconciler's contract (module `datapath::reconcile`'s documentation), kept
/// without its code. Each live frontend holds one service id, its backends' slots (`SLOT_BLOCK` to an entry
/// of the slot map) and (with sessionAffinity)
/// one member entry per distinct backend; a replaced generation's slots and members, and the id of a removed
/// or taken-over frontend, stay in use until a collection (an apply collects first once the oldest burial is
/// `DEFAULT_GRACE` old). An apply removes what is gone, then writes the desired frontends in key order; a
/// write that lacks an id, slots or member entries fails alone and leaves the frontend as it was.
struct Model {
    max_ids: usize,
    max_slots: usize,
    live: BTreeMap<FrontendKey, DesiredFrontend>,
    /// (when, slot entries, member entries, ids) waiting for their grace period.
    buried: Vec<(Instant, usize, usize, usize)>,
}

/// Entries of the slot map a generation of `d` takes (`SLOT_BLOCK` slots each).
fn slots_of(d: &DesiredFrontend) -> usize {
    lb_common::slot_blocks(d.tiers.iter().map(Vec::len).sum())
}

fn members_of(d: &DesiredFrontend) -> usize {
    if d.affinity_timeout_s == 0 {
        return 0;
    }
    d.tiers.iter().flatten().collect::<BTreeSet<_>>().len()
}

impl Model {
    fn used(&self) -> (usize, usize, usize) {
        let (mut slots, mut members, mut ids) = (0, 0, self.live.len());
        for d in self.live.values() {
            slots += slots_of(d);
            members += members_of(d);
        }
        for (_, s, m, i) in &self.buried {
            slots += s;
            members += m;
            ids += i;
        }
        (slots, members, ids)
    }

    fn bury(&mut self, now: Instant, d: &DesiredFrontend, id: bool) {
        self.buried.push((now, slots_of(d), members_of(d), usize::from(id)));
    }

    /// The frontends the apply must refuse.
    fn apply(&mut self, gone: &[FrontendKey], desired: &Desired, now: Instant) -> BTreeSet<FrontendKey> {
        if self.buried.first().is_some_and(|b| now.duration_since(b.0) >= DEFAULT_GRACE) {
            self.buried.clear();
        }
        for k in gone {
            if let Some(d) = self.live.remove(k) {
                self.bury(now, &d, true);
            }
        }
        let mut refused = BTreeSet::new();
        for (k, want) in desired {
            let old = self.live.get(k).cloned();
            if old.as_ref() == Some(want) {
                continue;
            }
            let fresh_id = old.as_ref().is_none_or(|o| o.name != want.name);
            let (slots, members, ids) = self.used();
            if (fresh_id && ids >= self.max_ids)
                || slots + slots_of(want) > self.max_slots
                || members + members_of(want) > self.max_slots
            {
                refused.insert(*k);
                continue;
            }
            if let Some(o) = old {
                self.bury(now, &o, fresh_id);
            }
            self.live.insert(*k, want.clone());
        }
        refused
    }
}

/// Run the steps, panicking at the first broken invariant.
pub fn run(steps: &Steps) {
    let (max_services, max_slots) = (steps.max_services(), steps.max_slots());
    let mut r = Reconciler::new(FakeMaps::new(max_services, max_slots));
    let mut model = Model {
        max_ids: max_services as usize,
        max_slots: max_slots as usize,
        live: BTreeMap::new(),
        buried: Vec::new(),
    };
    let start = Instant::now();
    let mut now = start;
    for op in steps.ops() {
        let (report, refused) = match op {
            Op::Apply(list) => {
                let d = desired(list, None);
                let gone: Vec<FrontendKey> =
                    model.live.keys().filter(|k| !d.contains_key(k)).copied().collect();
                (r.apply(&d, now), model.apply(&gone, &d, now))
            }
            Op::ApplyServices(svcs, list) => {
                let svcs = services(svcs);
                let d = desired(list, Some(&svcs));
                let gone: Vec<FrontendKey> = model
                    .live
                    .iter()
                    .filter(|(k, f)| svcs.contains(&f.name.service) && !d.contains_key(k))
                    .map(|(k, _)| *k)
                    .collect();
                (r.apply_services(&svcs, &d, now), model.apply(&gone, &d, now))
            }
            Op::Wait(ms) => {
                now += Duration::from_millis(u64::from(*ms));
                continue;
            }
            Op::Collect => {
                r.collect_garbage(now);
                model.buried.clear();
                continue;
            }
        };
        let failed: BTreeSet<FrontendKey> = report.errors.iter().map(|e| e.frontend).collect();
        assert_eq!(failed, refused, "frontends refused by {op:?} (reconciler, model): {:?}", report.errors);
        let got = contents(r.writer());
        assert_eq!(got, of(&model.live), "maps after {op:?} (errors: {:?})", report.errors);
        let (slots, members, ids) = model.used();
        let maps = r.writer();
        let names = (1..=max_services).filter(|id| maps.name(*id).expect("fake maps").is_some()).count();
        assert_eq!(
            (maps.slot_entries(), maps.member_map().len(), names),
            (slots, members, ids),
            "slots, member entries and named ids in use after {op:?} (maps, model)"
        );
    }
    // Once the grace period is over, only the live frontends' slots and ids remain.
    r.collect_garbage(now + Duration::from_secs(3600));
    let maps = r.writer();
    let frontends = read_back(maps).expect("fake maps");
    let live_slots: usize = frontends
        .values()
        .map(|rb| lb_common::slot_blocks(rb.tiers.iter().map(Vec::len).sum::<usize>()))
        .sum();
    assert_eq!(maps.slot_entries(), live_slots, "slots left behind");
    assert_eq!(*maps.member_map(), live_members(&frontends), "member entries wrong or left behind");
    let ids: BTreeSet<u32> = frontends.values().map(|rb| rb.value.svc_id).collect();
    assert_eq!(ids.len(), frontends.len(), "two frontends share a service id");
    for id in &ids {
        assert!(maps.name(*id).expect("fake maps").is_some(), "service id {id} in use without a name");
    }
    // No id is lost: once everything is removed and buried, every id can be handed out again (frontends
    // without backends need no slot).
    now += Duration::from_secs(3600);
    let report = r.apply(&Desired::new(), now);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    r.collect_garbage(now + Duration::from_secs(3600));
    assert_eq!(r.writer().slot_entries(), 0, "slots left behind once every frontend is gone");
    assert!(r.writer().member_map().is_empty(), "member entries left behind once every frontend is gone");
    let all: Desired = (0..max_services)
        .map(|i| {
            let vip = IpAddr::V4(Ipv4Addr::new(10, 97, 0, u8::try_from(i).expect("at most 16")));
            let name = Arc::new(ServicePortName::new(service(0), ""));
            (
                addr::frontend_key(vip, 80, PROTO_TCP),
                DesiredFrontend { name, tiers: Default::default(), flags: 0, affinity_timeout_s: 0 },
            )
        })
        .collect();
    let report = r.apply(&all, now + Duration::from_secs(7200));
    assert!(report.errors.is_empty(), "service ids lost: {:?}", report.errors);
}
