//! The reconciler target: a sequence of applies (whole or per Service), waits and collections against
//! small in-memory maps (so that maps fill up and ids run out), checked after every step against the state
//! the maps must hold, and against a fresh reconciler applying that state.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use arbitrary::Arbitrary;
use lb_common::{Backend, FrontendKey, MemberKey, MemberValue, PROTO_TCP, TIER_COUNT};
use tierlb::{
    datapath::{
        Desired, DesiredFrontend, MapReader as _, ReadBack, Reconciler, addr, fake::FakeMaps, read_back,
    },
    model::{ObjKey, ServicePortName},
};

/// The generated run.
#[derive(Arbitrary, Debug)]
pub struct Steps {
    max_services: u8,
    max_slots: u8,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// `apply` of everything.
    Apply(Vec<GenFrontend>),
    /// `apply_services` for these Services (the frontends of other Services are dropped from the list).
    ApplyServices(Vec<u8>, Vec<GenFrontend>),
    /// Time passes (milliseconds).
    Wait(u16),
    /// `collect_garbage` now.
    Collect,
}

#[derive(Arbitrary, Debug)]
struct GenFrontend {
    vip: u8,
    port: u8,
    service: u8,
    tiers: [Vec<u8>; TIER_COUNT],
    flags: u8,
}

fn service(i: u8) -> ObjKey {
    ObjKey::new("ns", format!("s{}", i % 4))
}

fn desired(list: &[GenFrontend], only: Option<&BTreeSet<ObjKey>>) -> Desired {
    let mut d = Desired::new();
    for f in list.iter().take(12) {
        let svc = service(f.service);
        if only.is_some_and(|o| !o.contains(&svc)) {
            continue;
        }
        let backend = |h: &u8| {
            addr::backend(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 244, 0, h % 16 + 1)), 8080), PROTO_TCP)
        };
        let tiers = f.tiers.each_ref().map(|t| t.iter().take(6).map(backend).collect::<Vec<Backend>>());
        d.insert(
            addr::frontend_key(
                IpAddr::V4(Ipv4Addr::new(10, 96, 0, f.vip % 8 + 1)),
                80 + u16::from(f.port % 3),
                PROTO_TCP,
            ),
            DesiredFrontend {
                name: Arc::new(ServicePortName::new(svc, "")),
                tiers,
                flags: u32::from(f.flags % 4),
                // Every other frontend with sessionAffinity, so member entries are written and buried too.
                affinity_timeout_s: if f.flags & 4 != 0 { 60 } else { 0 },
            },
        );
    }
    d
}

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

/// Run the steps, panicking at the first broken invariant.
pub fn run(steps: &Steps) {
    let max_services = u32::from(steps.max_services % 16) + 1;
    let max_slots = u32::from(steps.max_slots % 64) + 4;
    let mut r = Reconciler::new(FakeMaps::new(max_services, max_slots));
    // What the maps must hold: the last desired state, less the frontends that failed (which keep theirs).
    let mut state = Desired::new();
    let start = Instant::now();
    let mut now = start;
    for op in steps.ops.iter().take(24) {
        let (report, wanted, scope) = match op {
            Op::Apply(list) => {
                let d = desired(list, None);
                (r.apply(&d, now), d, None)
            }
            Op::ApplyServices(svcs, list) => {
                let svcs: BTreeSet<ObjKey> = svcs.iter().take(4).map(|s| service(*s)).collect();
                let d = desired(list, Some(&svcs));
                (r.apply_services(&svcs, &d, now), d, Some(svcs))
            }
            Op::Wait(ms) => {
                now += Duration::from_millis(u64::from(*ms));
                continue;
            }
            Op::Collect => {
                r.collect_garbage(now);
                continue;
            }
        };
        let failed: BTreeSet<FrontendKey> = report.errors.iter().map(|e| e.frontend).collect();
        let mut next: Desired = match &scope {
            None => Desired::new(),
            // Frontends of other Services stay as they are.
            Some(svcs) => state
                .iter()
                .filter(|(_, d)| !svcs.contains(&d.name.service))
                .map(|(k, d)| (*k, d.clone()))
                .collect(),
        };
        for (k, d) in &wanted {
            if !failed.contains(k) {
                next.insert(*k, d.clone());
            }
        }
        for k in &failed {
            match state.get(k) {
                Some(old) => next.insert(*k, old.clone()),
                None => next.remove(k),
            };
        }
        state = next;
        let got = contents(r.writer());
        assert_eq!(got, of(&state), "maps after {op:?} (errors: {:?})", report.errors);
        // A fresh reconciler with room for everything writes the same contents.
        let mut fresh = Reconciler::new(FakeMaps::new(64, 4096));
        let fresh_report = fresh.apply(&state, now);
        assert!(fresh_report.errors.is_empty(), "{:?}", fresh_report.errors);
        assert_eq!(got, contents(fresh.writer()), "fresh apply after {op:?}");
    }
    // Once the grace period is over, only the live frontends' slots and ids remain.
    r.collect_garbage(now + Duration::from_secs(3600));
    let maps = r.writer();
    let frontends = read_back(maps).expect("fake maps");
    let live_slots: usize = frontends.values().map(|rb| rb.tiers.iter().map(Vec::len).sum::<usize>()).sum();
    assert_eq!(maps.slot_count(), live_slots, "slots left behind");
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
    assert_eq!(r.writer().slot_count(), 0, "slots left behind once every frontend is gone");
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
