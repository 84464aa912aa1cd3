//! The reconciler against `FakeMaps`: generations, grace periods, ids, members, batching.
use std::net::SocketAddr;

use lb_common::{Backend, MemberKey, SLOT_BLOCK, SlotBlock, SlotKey};

use super::*;
use crate::datapath::{DesiredFrontend, MapReader as _, fake::FakeMaps};

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
        tiers: [node.iter().map(|s| be(s)).collect(), Vec::new(), cluster.iter().map(|s| be(s)).collect()],
        flags: 0,
        affinity_timeout_s: 0,
    }
}

/// The data path's torn-copy check compares the value's two copies of the generation, so no two writes of
/// one key may carry the same one: a change by the same Service port, a flags-only change and a takeover by
/// another Service (a fresh id) each write the previous generation plus one, both copies alike.
#[test]
fn every_write_of_a_frontend_has_a_new_generation_a_takeover_included() {
    let mut r = Reconciler::new(FakeMaps::new(16, 64));
    let t0 = Instant::now();
    let k = fe("10.96.0.1:80");
    let mut d = Desired::new();
    let mut seen = Vec::new();
    let mut write = |r: &mut Reconciler<FakeMaps>, d: &Desired| {
        let rep = r.apply(d, t0);
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        let v = r.writer().frontend(k).unwrap();
        assert_eq!(v.generation, v.generation_tail, "both copies written alike");
        seen.push((v.svc_id, v.generation));
    };
    d.insert(k, want(&["10.0.0.1:8080"], &["10.0.0.1:8080"]));
    write(&mut r, &d);
    d.insert(k, want(&[], &["10.0.0.2:8080"]));
    write(&mut r, &d);
    d.insert(k, DesiredFrontend { flags: lb_common::FLAG_POLICY_LOCAL, ..want(&[], &["10.0.0.2:8080"]) });
    write(&mut r, &d);
    let other = Arc::new(ServicePortName::new(ObjKey::new("default", "other"), "http"));
    d.insert(k, DesiredFrontend { name: other, ..want(&[], &["10.0.0.3:8080"]) });
    write(&mut r, &d);
    let generations: Vec<u32> = seen.iter().map(|(_, g)| *g).collect();
    assert_eq!(generations, [1, 2, 3, 4], "{seen:?}");
    assert_ne!(seen[3].0, seen[2].0, "the takeover has a fresh service id");
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
    assert_eq!(r.writer().slot_entries(), 1, "three slots, one entry");

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
    assert_eq!(r.writer().slot_entries(), 2, "old generation kept until the grace period");
    assert_eq!(r.writer().reader_waits(), 0, "apply never waits");
    r.collect_garbage(t0);
    assert_eq!(r.writer().reader_waits(), 1);
    assert_eq!(r.writer().slot_entries(), 1);

    // Removal frees the id after the grace period.
    let rep = r.apply(&Desired::new(), t0);
    assert_eq!(rep.removed, 1);
    assert!(r.writer().frontend(k).is_none());
    r.collect_garbage(t0);
    assert_eq!(r.writer().slot_entries(), 0);
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
    assert_eq!(r.writer().slot_entries(), 40);
    r.collect_garbage(t0);
    assert_eq!(r.writer().reader_waits(), 1);
    assert_eq!(r.writer().slot_entries(), 20);
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
    assert_eq!(r.writer().slot_entries(), 2, "old generation kept during the fixed grace");
    r.collect_garbage(t0 + DEFAULT_GRACE / 2);
    assert_eq!(r.writer().slot_entries(), 2);
    r.collect_garbage(t0 + DEFAULT_GRACE);
    assert_eq!(r.writer().slot_entries(), 1);
}

#[test]
fn a_full_slot_map_never_leaves_a_half_applied_service() {
    // Room for one entry of the slot map: the first Service (2 slots) fits, the second (2 more) does not.
    let mut r = Reconciler::new(FakeMaps::new(16, 1));
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
    assert_eq!(r.writer().slot_entries(), 1, "partially written slots are removed again");

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
    let orphan = SlotKey { svc_id: v.svc_id, generation: v.generation + 1, block: 0 };
    maps.put_slot_block(orphan, SlotBlock::of(&[be("10.0.0.9:80")])).unwrap();
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
            orphan_maglev_removed: 0,
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
    let ids: std::collections::BTreeSet<u32> =
        second.writer().frontends().unwrap().iter().map(|(_, v)| v.svc_id).collect();
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
fn many_frontends_are_written_in_one_map_operation_per_map() {
    let mut r = Reconciler::new(FakeMaps::new(16, 64));
    let mut d = Desired::new();
    for i in 1..=3 {
        d.insert(fe(&format!("10.96.0.{i}:80")), want(&["10.0.0.1:80"], &["10.0.0.1:80", "10.0.0.2:80"]));
    }
    let rep = r.apply(&d, Instant::now());
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    let batches = (r.writer().slot_batches(), r.writer().frontend_batches());
    assert_eq!(batches, (1, 1), "the three frontends' slots in one operation, their values in another");
    assert_eq!(r.writer().slot_keys().unwrap().len(), 3, "every slot written, one entry per frontend");
    // One change is a batch of one.
    d.insert(fe("10.96.0.2:80"), want(&[], &["10.0.0.2:80"]));
    r.apply(&d, Instant::now());
    assert_eq!((r.writer().slot_batches(), r.writer().frontend_batches()), (2, 2));
}

/// A generation's slots are `SLOT_BLOCK` to an entry, tier after tier across the tiers' borders: 3 + 6 + 9
/// slots are 3 entries, read back as the tiers were written, and the three go with the generation.
#[test]
fn a_generations_slots_are_packed_eight_to_an_entry_across_tiers() {
    assert_eq!(SLOT_BLOCK, 8);
    let mut r = Reconciler::new(FakeMaps::new(16, 64));
    let t0 = Instant::now();
    let vip = fe("10.96.0.1:80");
    let addrs: Vec<String> = (1..=9).map(|i| format!("10.0.0.{i}:80")).collect();
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let mut wanted = want(&addrs[..3], &addrs);
    wanted.tiers[1] = addrs[3..].iter().map(|s| be(s)).collect();
    let mut d = Desired::new();
    d.insert(vip, wanted.clone());
    assert!(r.apply(&d, t0).errors.is_empty());
    let v = r.writer().frontend(vip).unwrap();
    let keys = r.writer().slot_keys().unwrap();
    let blocks: Vec<u32> = keys.iter().map(|key| key.block).collect();
    assert_eq!(blocks, [0, 1, 2], "18 slots, 3 entries");
    assert!(keys.iter().all(|key| (key.svc_id, key.generation) == (v.svc_id, v.generation)));
    let last = r.writer().slot_block(keys[2]).unwrap().unwrap();
    assert_eq!(last.slots[..2], [be("10.0.0.8:80"), be("10.0.0.9:80")], "slots 16 and 17");
    assert_eq!(last.slots[2..], [Backend::default(); SLOT_BLOCK - 2], "the rest zeroed");
    let back = crate::datapath::read_back(r.writer()).unwrap();
    assert_eq!(back[&vip].tiers, wanted.tiers, "every tier read back as written");
    r.apply(&Desired::new(), t0);
    r.collect_garbage(t0);
    assert_eq!(r.writer().slot_entries(), 0, "the generation's three entries go with it");
}

/// A round with more frontends than service ids (the frontend map holds one per id, so it is never the one
/// that fills): those that get an id are applied, the one without is reported with its own name and leaves
/// nothing behind (no slot, no name).
#[test]
fn out_of_service_ids_only_the_frontends_without_one_are_refused() {
    let mut r = Reconciler::new(FakeMaps::new(2, 64));
    let mut d = Desired::new();
    for i in 1..=3 {
        let name =
            Arc::new(ServicePortName::new(ObjKey::new("default", format!("web-{i}").as_str()), "http"));
        d.insert(fe(&format!("10.96.0.{i}:80")), DesiredFrontend { name, ..want(&[], &["10.0.0.1:80"]) });
    }
    let rep = r.apply(&d, Instant::now());
    assert_eq!(rep.added, 2);
    assert_eq!(rep.errors.len(), 1, "{:?}", rep.errors);
    let msg = rep.errors[0].to_string();
    assert!(msg.contains("default/web-3:http") && msg.contains("10.96.0.3:80"), "{msg}");
    assert!(r.writer().frontend(fe("10.96.0.3:80")).is_none());
    assert_eq!(r.writer().slot_entries(), 2, "the refused frontend's slot entry is removed again");
    let ids: Vec<u32> =
        (1..=2).map(|i| r.writer().frontend(fe(&format!("10.96.0.{i}:80"))).unwrap().svc_id).collect();
    let names: Vec<Option<String>> = (0..=4).map(|id| r.writer().name(id).unwrap()).collect();
    let kept = names.iter().flatten().count();
    assert_eq!(kept, 2, "only the applied frontends' ids keep a name: {names:?} (ids {ids:?})");
    // The refused frontend's id was freed: with room again it is applied under it.
    d.remove(&fe("10.96.0.1:80"));
    r.apply(&d, Instant::now());
    r.collect_garbage(Instant::now());
    let rep = r.apply(&d, Instant::now());
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert!(r.writer().frontend(fe("10.96.0.3:80")).is_some());
}

#[test]
fn affinity_members_follow_their_generation_and_go_with_it() {
    let mut r = Reconciler::new(FakeMaps::new(16, 64));
    let t0 = Instant::now();
    let k = fe("10.96.0.1:80");
    let with_affinity =
        |node: &[&str], cluster: &[&str]| DesiredFrontend { affinity_timeout_s: 60, ..want(node, cluster) };
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
    assert_eq!(left, [MemberKey { svc_id: v.svc_id, generation: v.generation, backend: be("10.0.0.1:80") }]);
    let rep = second.apply(&d, t0);
    assert_eq!((rep.unchanged, rep.changed()), (1, 0), "the adopted frontend keeps its affinity");
}

#[test]
fn maglev_tables_follow_their_generation_and_adoption_removes_orphans() {
    use lb_common::{FLAG_MAGLEV, MaglevKey, TIER_CLUSTER};
    let t0 = Instant::now();
    let mut r = Reconciler::new(FakeMaps::new(16, 64));
    let k = fe("10.96.0.1:80");
    let maglev =
        |node: &[&str], cluster: &[&str]| DesiredFrontend { flags: FLAG_MAGLEV, ..want(node, cluster) };
    let keys = |r: &Reconciler<FakeMaps>| r.writer().maglev_keys().unwrap();
    let cluster = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
    let mut d = Desired::new();
    // A node tier of one backend needs no table; the cluster tier of three has one.
    d.insert(k, maglev(&["10.0.0.1:80"], &cluster));
    r.apply(&d, t0);
    let id = r.writer().frontend(k).unwrap().svc_id;
    let gen1 = MaglevKey { svc_id: id, generation: 1, tier: TIER_CLUSTER as u32 };
    assert_eq!(keys(&r), [gen1]);
    let tier: Vec<Backend> = cluster.iter().map(|s| be(s)).collect();
    let written = r.writer().maglev_table(gen1).unwrap().unwrap();
    assert!(*written == *crate::datapath::maglev::table(&tier).unwrap(), "the tier's table as built");

    // A change writes generation 2's table beside generation 1's, which goes after the grace period.
    d.insert(k, maglev(&[], &cluster[1..]));
    r.apply(&d, t0);
    let gen2 = MaglevKey { generation: 2, ..gen1 };
    assert_eq!(keys(&r), [gen1, gen2]);
    r.collect_garbage(t0);
    assert_eq!(keys(&r), [gen2]);
    // Maglev off (random again): no table once the grace period is over.
    d.insert(k, want(&[], &cluster[1..]));
    r.apply(&d, t0);
    r.collect_garbage(t0);
    assert!(keys(&r).is_empty());

    // Adoption: a current generation's table stays, one of no current generation (a swap cut short) goes.
    d.insert(k, maglev(&[], &cluster));
    r.apply(&d, t0);
    let v = r.writer().frontend(k).unwrap();
    let current = MaglevKey { svc_id: v.svc_id, generation: v.generation, tier: TIER_CLUSTER as u32 };
    let mut maps = r.writer;
    let table = maps.maglev_table(current).unwrap().unwrap();
    let orphan = MaglevKey { generation: v.generation + 1, ..current };
    maps.put_maglev_table(orphan, &table).unwrap();
    let mut second = Reconciler::new(maps);
    let rep = second.adopt().unwrap();
    assert_eq!(rep.orphan_maglev_removed, 1);
    assert_eq!(second.writer().maglev_keys().unwrap(), [current]);
    let rep = second.apply(&d, t0);
    assert_eq!((rep.unchanged, rep.changed()), (1, 0), "the adopted frontend keeps its tables");
}
