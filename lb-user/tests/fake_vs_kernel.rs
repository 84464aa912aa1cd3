//! `FakeMaps` checked against the kernel's maps: the reconciler tests, the agent tests and the fuzz targets
//! stand on the fake, so it must refuse what the kernel refuses and hold what the kernel holds. The same
//! generated sequences of applies (whole and per Service), grace periods, collections and backend marks go to
//! a reconciler over `FakeMaps` and one over the BPF object's real maps (small capacities, so maps fill up and
//! ids run out); after every step the errors, the frontends read back, the slots, the sessionAffinity member
//! entries, the names and the marks must be the same.
//!
//! What the fake does not model, and this test does not compare: the LRU maps' eviction (REVERSE, AFFINITY,
//! conntrack: the kernel evicts from per-CPU free lists, an order no fake can predict; the fake keeps every
//! entry) and `ReverseOccupancy::lru` (always 0 in the fake). Needs root (loads the BPF object; attaches
//! nothing).
//!
//! Two generators: this file's own (seeded, with backend marks), and the reconcile fuzz target's
//! (`fuzz/src/steps.rs`, the same file compiled here), fed its committed seeds and seeded random bytes.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use lb_common::{Backend, BackendState, PROTO_TCP, PROTO_UDP, TIER_COUNT};
// The same deterministic source the chaos runs use: the sequences are the same on every run.
use lb_testkit::chaos::Rng;
use tierlb::{
    datapath::{
        Desired, DesiredFrontend, MapReader, MapWriter, Reconciler, addr,
        ebpf::{Capacities, Loaded},
        fake::FakeMaps,
        read_back,
    },
    model::{ObjKey, ServicePortName},
};

#[path = "../../fuzz/src/steps.rs"]
#[expect(unreachable_pub, reason = "the fuzz crate's API, where the file is a public module")]
mod steps;

fn service(i: u64) -> ObjKey {
    ObjKey::new("ns", format!("s{i}"))
}

fn backend(i: u64) -> Backend {
    backend_of(i, false, PROTO_TCP)
}

/// Backend `i` in IPv6 (`v6`) or IPv4, for protocol `proto`: the map keys of each layout.
fn backend_of(i: u64, v6: bool, proto: u8) -> Backend {
    let ip = if v6 {
        IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, (i + 1) as u16))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 244, 0, (i + 1) as u8))
    };
    addr::backend(SocketAddr::new(ip, 8080), proto)
}

/// Up to 8 frontends of 4 Services on 8 VIPs of each family, TCP and UDP (the keys' layouts differ by
/// family and protocol), tiers of up to 6 of 16 backends of the frontend's family and protocol, every other
/// with affinity.
fn desired(rng: &mut Rng) -> Desired {
    let mut d = Desired::new();
    for _ in 0..rng.below(9) {
        let v6 = rng.below(2) == 0;
        let proto = if rng.below(2) == 0 { PROTO_TCP } else { PROTO_UDP };
        let n = rng.below(8) as u8 + 1;
        let vip = if v6 {
            IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, u16::from(n)))
        } else {
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, n))
        };
        let tiers: [Vec<Backend>; TIER_COUNT] = std::array::from_fn(|_| {
            let mut t: Vec<Backend> =
                (0..rng.below(7)).map(|_| backend_of(rng.below(16), v6, proto)).collect();
            t.dedup();
            t
        });
        d.insert(
            addr::frontend_key(vip, 80 + rng.below(2) as u16, proto),
            DesiredFrontend {
                name: Arc::new(ServicePortName::new(service(rng.below(4)), "")),
                tiers,
                flags: 0,
                affinity_timeout_s: if rng.below(2) == 0 { 60 } else { 0 },
            },
        );
    }
    d
}

/// A frontend as read back: its tiers' backends, flags, affinity timeout and service id.
type Frontend = ([Vec<Backend>; TIER_COUNT], u32, u32, u32);

/// Everything the two sides must agree on.
#[derive(Debug, PartialEq)]
struct State {
    frontends: BTreeMap<lb_common::FrontendKey, Frontend>,
    slots: BTreeSet<lb_common::SlotKey>,
    members: Vec<(lb_common::MemberKey, u32)>,
    names: BTreeMap<u32, String>,
    marks: Vec<(Backend, BackendState)>,
}

fn state(m: &impl MapReader) -> State {
    let frontends = read_back(m)
        .unwrap()
        .into_iter()
        .map(|(k, rb)| (k, (rb.tiers, rb.value.flags, rb.value.affinity_timeout_s, rb.value.svc_id)))
        .collect();
    let mut members: Vec<_> = m.members().unwrap().into_iter().map(|(k, v)| (k, v.tiers)).collect();
    members.sort_by_key(|(k, _)| (k.svc_id, k.generation, k.backend));
    let mut marks = m.backend_marks().unwrap();
    marks.sort_by_key(|(b, _)| *b);
    let names = (1..=m.max_services()).filter_map(|id| m.name(id).unwrap().map(|n| (id, n))).collect();
    State { frontends, slots: m.slot_keys().unwrap().into_iter().collect(), members, names, marks }
}

fn errors(r: &tierlb::datapath::ApplyReport) -> Vec<String> {
    let mut e: Vec<String> = r.errors.iter().map(|e| format!("{:?}: {}", e.frontend, e.error)).collect();
    e.sort();
    e
}

#[test]
fn the_fake_maps_refuse_and_hold_what_the_kernel_maps_do() {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (loads BPF)");
    let mut steps = 0;
    let mut refusals = 0;
    for seed in 1..=5_u64 {
        let mut rng = Rng::new(seed);
        let caps = Capacities {
            services: rng.below(6) as u32 + 2,
            // Entries of the slot map, 8 slots each (and MEMBERS' capacity).
            slots: rng.below(8) as u32 + 2,
            backends: rng.below(4) as u32 + 2,
            reverse: 64,
            affinity: 64,
            conntrack: 64,
            conntrack_syn: 64,
            conntrack_udp: 64,
        };
        let Loaded { maps, .. } = Loaded::load(caps, None).expect("the BPF object loads");
        let mut kernel = Reconciler::new(maps);
        let mut fake = Reconciler::new(FakeMaps::new(caps.services, caps.slots).with_backends(caps.backends));
        let mut now = Instant::now();
        for step in 0..40 {
            let what = match rng.below(6) {
                0 | 1 => {
                    let d = desired(&mut rng);
                    let (k, f) = (kernel.apply(&d, now), fake.apply(&d, now));
                    refusals += k.errors.len();
                    assert_eq!(
                        errors(&f),
                        errors(&k),
                        "seed {seed} step {step}: apply's errors (fake, kernel)"
                    );
                    "apply"
                }
                2 => {
                    let svcs: BTreeSet<ObjKey> = (0..rng.below(3)).map(|_| service(rng.below(4))).collect();
                    let d = desired(&mut rng);
                    let (k, f) = (kernel.apply_services(&svcs, &d, now), fake.apply_services(&svcs, &d, now));
                    refusals += k.errors.len();
                    assert_eq!(errors(&f), errors(&k), "seed {seed} step {step}: apply_services' errors");
                    "apply_services"
                }
                3 => {
                    now += Duration::from_millis(rng.below(3_000));
                    kernel.collect_garbage(now);
                    fake.collect_garbage(now);
                    "collect"
                }
                4 => {
                    let b = backend(rng.below(16));
                    let mark =
                        BackendState { flags: 1, _pad: 0, since_ns: 1, until_ns: 2 + rng.below(1 << 40) };
                    let k = kernel.writer_mut().put_backend_mark(b, mark).map_err(|e| e.to_string());
                    let f = fake.writer_mut().put_backend_mark(b, mark).map_err(|e| e.to_string());
                    refusals += usize::from(k.is_err());
                    assert_eq!(f, k, "seed {seed} step {step}: put_backend_mark (fake, kernel)");
                    "mark"
                }
                _ => {
                    let b = backend(rng.below(16));
                    let k = kernel.writer_mut().delete_backend_mark(b).map_err(|e| e.to_string());
                    let f = fake.writer_mut().delete_backend_mark(b).map_err(|e| e.to_string());
                    assert_eq!(f, k, "seed {seed} step {step}: delete_backend_mark (fake, kernel)");
                    "unmark"
                }
            };
            assert_eq!(
                state(fake.writer()),
                state(kernel.writer()),
                "seed {seed} step {step} ({what}): fake, kernel"
            );
            steps += 1;
        }
    }
    eprintln!("{steps} steps, {refusals} refusals by the kernel's maps, the fake agreeing on each");
    assert!(refusals > 0, "the sequences never filled a map: the comparison of refusals is empty");
}

/// Capacities small enough to fill by direct writes.
const SMALL: Capacities = Capacities {
    services: 3,
    slots: 5,
    backends: 2,
    reverse: 64,
    affinity: 64,
    conntrack: 64,
    conntrack_syn: 64,
    conntrack_udp: 64,
};

/// Each hash map the agent writes, filled one entry past its capacity by direct writes (what no reconciler
/// sequence reaches: it hands out no more ids than there is room for): the fake refuses the same write, with
/// the same error, as the kernel's `E2BIG`.
#[test]
fn every_map_the_agent_writes_is_full_at_the_same_entry_in_the_fake_and_the_kernel() {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (loads BPF)");
    let caps = SMALL;
    let Loaded { mut maps, .. } = Loaded::load(caps, None).expect("the BPF object loads");
    let mut fake = FakeMaps::new(caps.services, caps.slots).with_backends(caps.backends);
    let fill = |n: u32, put: &mut dyn FnMut(u32) -> Result<(), String>| (0..n).map(put).collect::<Vec<_>>();
    let frontend =
        |i: u32| addr::frontend_key(IpAddr::V4(Ipv4Addr::new(10, 96, 1, i as u8 + 1)), 80, PROTO_TCP);
    let slot = |i: u32| lb_common::SlotKey { svc_id: 1, generation: 1, block: i };
    let member = |i: u32| lb_common::MemberKey { svc_id: 1, generation: 1, backend: backend(u64::from(i)) };
    let name = ServicePortName::new(service(0), "");
    let mark = BackendState { flags: 1, _pad: 0, since_ns: 1, until_ns: 2 };
    let cases: [(&str, u32); 5] = [
        ("FRONTENDS", caps.services + 1),
        ("SLOTS", caps.slots + 1),
        ("MEMBERS", caps.slots + 1),
        // Names are kept under ids 0 (the node's) to --max-services.
        ("SVC_NAMES", caps.services + 2),
        ("BACKEND_STATE", caps.backends + 1),
    ];
    for (map, n) in cases {
        let write = |w: &mut dyn MapWriter, i: u32| -> Result<(), String> {
            match map {
                "FRONTENDS" => w.put_frontend(frontend(i), lb_common::FrontendValue::default()),
                "SLOTS" => w.put_slot_block(slot(i), lb_common::SlotBlock::of(&[backend(u64::from(i))])),
                "MEMBERS" => w.put_member(member(i), lb_common::MemberValue { tiers: 1 }),
                "SVC_NAMES" => w.put_name(i, &name),
                _ => w.put_backend_mark(backend(u64::from(i)), mark),
            }
            .map_err(|e| e.to_string())
        };
        let k = fill(n, &mut |i| write(&mut maps, i));
        let f = fill(n, &mut |i| write(&mut fake, i));
        assert!(k[..n as usize - 1].iter().all(Result::is_ok), "{map}: the kernel takes its capacity: {k:?}");
        assert!(k[n as usize - 1].is_err(), "{map}: the kernel refuses one more: {k:?}");
        assert_eq!(f, k, "{map}: the fake's writes (left) and the kernel's (right)");
    }
}

/// The batched writes (`BPF_MAP_UPDATE_BATCH`) of the maps the reconciler writes in batches, one entry past
/// each capacity in one operation: the kernel writes the entries before the refusal and refuses with the single
/// write's error; the fake does the same.
#[test]
fn a_batch_past_a_maps_capacity_writes_what_fits_in_the_fake_and_the_kernel() {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (loads BPF)");
    let caps = SMALL;
    let Loaded { mut maps, .. } = Loaded::load(caps, None).expect("the BPF object loads");
    let mut fake = FakeMaps::new(caps.services, caps.slots);
    let frontends: Vec<_> = (0..=caps.services)
        .map(|i| addr::frontend_key(IpAddr::V4(Ipv4Addr::new(10, 96, 1, i as u8 + 1)), 80, PROTO_TCP))
        .collect();
    let slots: Vec<_> =
        (0..=caps.slots).map(|i| lb_common::SlotKey { svc_id: 1, generation: 1, block: i }).collect();
    let backends: Vec<_> = (0..=caps.slots).map(|i| backend(u64::from(i))).collect();
    let blocks: Vec<_> = backends.iter().map(|b| lb_common::SlotBlock::of(&[*b])).collect();
    let members: Vec<_> =
        backends.iter().map(|b| lb_common::MemberKey { svc_id: 1, generation: 1, backend: *b }).collect();
    let name = ServicePortName::new(service(0), "");
    let ids: Vec<u32> = (1..=caps.services + 1).collect();
    let write = |w: &mut dyn MapWriter| -> Vec<Result<(), String>> {
        [
            w.put_frontends(&frontends, &vec![lb_common::FrontendValue::default(); frontends.len()]).map_err(
                |(written, e)| {
                    assert_eq!(written, frontends.len() - 1, "the count written before the refusal");
                    e
                },
            ),
            w.put_slot_blocks(&slots, &blocks),
            w.put_members(&members, &vec![lb_common::MemberValue { tiers: 1 }; members.len()]),
            // Ids 0 to --max-services fit; one past the capacity is refused.
            w.put_names(&ids, &vec![&name; ids.len()]).and_then(|()| w.put_names(&[0, 100], &[&name, &name])),
        ]
        .into_iter()
        .map(|r| r.map_err(|e| e.to_string()))
        .collect()
    };
    let k = write(&mut maps);
    let f = write(&mut fake);
    assert!(k.iter().all(Result::is_err), "each batch is refused at its last entry: {k:?}");
    assert_eq!(f, k, "the fake's refusals (left) and the kernel's (right)");
    let held = |m: &dyn MapReader| {
        let names = (0..=101).filter(|i| m.name(*i).unwrap().is_some()).count();
        (m.frontends().unwrap().len(), m.slot_keys().unwrap().len(), m.members().unwrap().len(), names)
    };
    let full = (caps.services as usize, caps.slots as usize, caps.slots as usize, caps.services as usize + 1);
    assert_eq!((held(&fake), held(&maps)), (full, full), "what fits is written (fake, kernel)");
}

/// The map sizes the fuzz target's runs are given here: loading the BPF object takes seconds, so each run
/// takes the nearest of nine sizes (its own service and slot capacities rounded up) and the maps of a size
/// are loaded once, emptied by the run's reconciler at its end (everything removed, the grace period over)
/// and handed to the next run's.
fn bucket(run: &steps::Steps) -> (u32, u32) {
    let up = |n: u32, of: &[u32]| *of.iter().find(|b| **b >= n).unwrap_or(of.last().unwrap());
    (up(run.max_services(), &[2, 5, 16]), up(run.max_slots(), &[4, 12, 24]))
}

/// The reconcile fuzz target's runs (its committed seeds, then 60 from seeded random bytes), each against a
/// reconciler over `FakeMaps` and one over the kernel's maps of the same size (`bucket`): after every step,
/// the same refusals and the same contents.
#[test]
fn the_fuzz_targets_runs_give_the_same_refusals_and_maps_in_the_fake_and_the_kernel() {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (loads BPF)");
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/reconcile");
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&seeds)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            (path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap())
        })
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 10, "the committed seeds: {seeds:?}");
    let mut rng = Rng::new(32);
    for i in 0..60 {
        let bytes = (0..rng.below(1500) + 16).map(|_| rng.below(256) as u8).collect();
        inputs.push((format!("random {i}"), bytes));
    }
    let mut loaded: BTreeMap<(u32, u32), tierlb::datapath::ebpf::KernelMaps> = BTreeMap::new();
    let (mut runs, mut steps_run, mut refusals) = (0, 0, 0);
    for (name, bytes) in &inputs {
        let Ok(run) =
            <steps::Steps as arbitrary::Arbitrary>::arbitrary(&mut arbitrary::Unstructured::new(bytes))
        else {
            continue;
        };
        let (services, slots) = bucket(&run);
        let caps = Capacities {
            services,
            slots,
            backends: 16,
            reverse: 64,
            affinity: 64,
            conntrack: 64,
            conntrack_syn: 64,
            conntrack_udp: 64,
        };
        let maps = match loaded.remove(&(services, slots)) {
            Some(maps) => maps,
            None => Loaded::load(caps, None).expect("the BPF object loads").maps,
        };
        let mut kernel = Reconciler::new(maps);
        let mut fake = Reconciler::new(FakeMaps::new(services, slots).with_backends(caps.backends));
        let mut now = Instant::now();
        for (n, op) in run.ops().iter().enumerate() {
            let (k, f) = match op {
                steps::Op::Apply(list) => {
                    let d = steps::desired(list, None);
                    (kernel.apply(&d, now), fake.apply(&d, now))
                }
                steps::Op::ApplyServices(svcs, list) => {
                    let svcs = steps::services(svcs);
                    let d = steps::desired(list, Some(&svcs));
                    (kernel.apply_services(&svcs, &d, now), fake.apply_services(&svcs, &d, now))
                }
                steps::Op::Wait(ms) => {
                    now += Duration::from_millis(u64::from(*ms));
                    continue;
                }
                steps::Op::Collect => {
                    kernel.collect_garbage(now);
                    fake.collect_garbage(now);
                    assert_eq!(state(fake.writer()), state(kernel.writer()), "{name} step {n} (collect)");
                    continue;
                }
            };
            refusals += k.errors.len();
            assert_eq!(errors(&f), errors(&k), "{name} step {n}: refusals (fake, kernel)");
            assert_eq!(
                state(fake.writer()),
                state(kernel.writer()),
                "{name} step {n}: {op:?} (fake, kernel)"
            );
            steps_run += 1;
        }
        // Emptied for the next run of this size.
        now += Duration::from_hours(1);
        assert!(kernel.apply(&Desired::new(), now).errors.is_empty(), "{name}: emptying");
        kernel.collect_garbage(now + Duration::from_hours(1));
        let empty = state(kernel.writer());
        assert!(empty.frontends.is_empty() && empty.slots.is_empty() && empty.members.is_empty(), "{name}");
        assert!(empty.names.is_empty(), "{name}: names left {:?}", empty.names);
        loaded.insert((services, slots), kernel.into_writer());
        runs += 1;
    }
    eprintln!(
        "{runs} runs ({} map sizes loaded), {steps_run} applies, {refusals} refusals, the fake agreeing on each",
        loaded.len()
    );
    assert!(refusals > 0, "the runs never filled a map: the comparison of refusals is empty");
}
