//! (g) of the in-kernel tests: while the reconciler swaps a Service between two backend sets as fast as it
//! can, concurrent clients never see a half-written set: every connect succeeds and reaches a backend of the
//! node tier of one of the two sets (the cluster tiers hold other backends, so a connect that read one
//! generation's ranges over another's slots would show), the data path counts every connect in the node tier
//! and none failed open. Needs root; a private netns and a child cgroup, removed on drop.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use lb_testkit::{
    probe::Report,
    sandbox::{Cgroup, Child, NamedServer, NetNs, confine},
};
use tierlb::{
    datapath::{
        Desired, DesiredFrontend, Reconciler, addr,
        ebpf::{Capacities, Loaded},
    },
    model::{ObjKey, ServicePortName},
};

fn ip(a: u8, b: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, a, b))
}

/// Four probe clients of `count` connects each to `vip`, their reports read on their own threads (a report
/// is larger than a pipe buffer).
fn clients(ns: &NetNs, cg: &Cgroup, vip: SocketAddr, count: u32) -> Vec<std::thread::JoinHandle<Report>> {
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    (0..4)
        .map(|_| {
            let mut cmd = std::process::Command::new(&lab);
            confine(&mut cmd, Some(cg), Some(ns)).unwrap();
            cmd.args(["probe", "--target", &vip.to_string(), "--count", &count.to_string()])
                .stdout(std::process::Stdio::piped());
            let mut child = Child::spawn(&mut cmd).unwrap();
            std::thread::spawn(move || {
                let mut out = String::new();
                std::io::Read::read_to_string(child.inner().stdout.as_mut().unwrap(), &mut out).unwrap();
                serde_json::from_str(&out).unwrap()
            })
        })
        .collect()
}

/// The VIP, and a private netns and child cgroup named after `tag`; needs root.
fn sandbox(tag: &str) -> (SocketAddr, NetNs, Cgroup) {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root (BPF, netns, cgroups)");
    ("10.96.0.10:80".parse().unwrap(), NetNs::new(tag).unwrap(), Cgroup::new(tag).unwrap())
}

#[test]
fn concurrent_connects_never_see_a_half_written_backend_set_during_swaps() {
    let (vip, ns, cg) = sandbox("swap");
    let set_a: Vec<SocketAddr> = (1..=3).map(|i| SocketAddr::new(ip(1, i), 8080)).collect();
    let set_b: Vec<SocketAddr> = (1..=5).map(|i| SocketAddr::new(ip(2, i), 8080)).collect();
    let lab = lb_testkit::workspace_bin("tierlb-lab", "lb-lab");
    let mut servers = Vec::new();
    for a in set_a.iter().chain(&set_b) {
        ns.add_address(a.ip()).unwrap();
        servers.push(NamedServer::start(&lab, &ns, *a, &a.to_string()).unwrap());
    }
    let Loaded { mut programs, maps, .. } = Loaded::load(Capacities::default(), None).unwrap();
    let mut rec = Reconciler::new(maps);
    let key = addr::frontend_key(vip.ip(), 80, 6);
    let desired = |set: &[SocketAddr], node: usize| {
        let b: Vec<_> = set.iter().map(|a| addr::backend(*a, 6)).collect();
        let mut d = Desired::new();
        d.insert(
            key,
            DesiredFrontend {
                name: ServicePortName::new(ObjKey::new("default", "web"), "").into(),
                tiers: [b[..node].to_vec(), Vec::new(), b.clone()],
                flags: 0,
                affinity_timeout_s: 0,
            },
        );
        d
    };
    rec.apply(&desired(&set_a, 1), Instant::now());
    programs.attach(cg.path(), None).unwrap();

    // Each set's node tier is non-empty, so every connect must land there: a1, or b1/b2. The other backends
    // are only in the cluster tiers.
    let allowed: BTreeSet<String> = set_a[..1].iter().chain(&set_b[..2]).map(ToString::to_string).collect();
    let mut seen = BTreeSet::new();
    let (mut swaps, mut total, mut rounds) = (0u32, 0usize, 0u32);
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    // Rounds of clients until the connects have spanned both sets and many swaps: one swap can be held by a
    // grace-period wait (a kernel RCU grace period, longer on a loaded machine) while a round's clients run.
    while !(swaps > 100
        && seen.iter().any(|s: &String| s.starts_with("10.244.1."))
        && seen.iter().any(|s| s.starts_with("10.244.2.")))
    {
        assert!(start.elapsed() < Duration::from_mins(1), "{rounds} rounds, {swaps} swaps, seen {seen:?}");
        rounds += 1;
        let round = clients(&ns, &cg, vip, 1500);
        while round.iter().any(|c| !c.is_finished()) {
            let (set, node) = if swaps.is_multiple_of(2) { (&set_b, 2) } else { (&set_a, 1) };
            let t = Instant::now();
            let rep = rec.apply(&desired(set, node), Instant::now());
            assert!(rep.errors.is_empty(), "{:?}", rep.errors);
            swaps += 1;
            // As the agent's timer does: old generations are deleted after the kernel's grace period, during
            // the swaps (each call waits one grace period, so not after every swap).
            if swaps.is_multiple_of(8) {
                rec.collect_garbage(Instant::now());
            }
            slowest = slowest.max(t.elapsed());
        }
        for c in round {
            let r = c.join().unwrap();
            assert_eq!(r.failures(), 0, "{:?}", r.errors());
            total += r.attempts.len();
            seen.extend(r.by_backend().into_keys());
        }
        assert!(seen.is_subset(&allowed), "{seen:?}");
    }
    let status =
        tierlb::status::Instance::read("swap", rec.writer(), tierlb::datapath::marks::boottime_ns()).unwrap();
    assert_eq!(status.fail_open_total, 0, "no connect went through untranslated");
    assert_eq!(status.frontends.len(), 1);
    let c = &status.frontends[0].connections;
    assert_eq!(
        (c.node, c.zone, c.cluster, c.rejected, c.dropped, c.fail_open),
        (total as u64, 0, 0, 0, 0, 0),
        "every connect counted once, in the node tier"
    );
    eprintln!(
        "{total} connects in {rounds} rounds during {swaps} swaps, no failure; slowest swap {slowest:?}"
    );
    drop(programs);
}

/// README: "If the maps are inconsistent (a bug), the program fails open: the call proceeds untranslated and a
/// fail-open counter is raised." Here the inconsistency is made on purpose: the frontend's slots are deleted
/// behind the reconciler's back. The connects then go to the VIP itself (no route to it in the test's
/// netns: ENETUNREACH, so nothing leaves), and each is counted, on the Service and program-wide.
#[test]
fn a_frontend_whose_slots_are_missing_fails_open_and_counts_each_connect() {
    let (vip, ns, cg) = sandbox("failopen");
    let backend = SocketAddr::new(ip(1, 1), 8080);
    let Loaded { mut programs, maps, .. } = Loaded::load(Capacities::default(), None).unwrap();
    let mut rec = Reconciler::new(maps);
    let b = addr::backend(backend, 6);
    let mut d = Desired::new();
    let name = ServicePortName::new(ObjKey::new("default", "web"), "").into();
    d.insert(
        addr::frontend_key(vip.ip(), 80, 6),
        DesiredFrontend { name, tiers: [vec![], vec![], vec![b]], flags: 0, affinity_timeout_s: 0 },
    );
    assert!(rec.apply(&d, Instant::now()).errors.is_empty());
    let (_, value, _) = rec.applied().next().unwrap();
    let (svc_id, generation) = (value.svc_id, value.generation);
    tierlb::datapath::MapWriter::delete_slot_block(
        rec.writer_mut(),
        lb_common::SlotKey { svc_id, generation, block: 0 },
    )
    .unwrap();
    programs.attach(cg.path(), None).unwrap();
    let r = clients(&ns, &cg, vip, 5).into_iter().map(|c| c.join().unwrap()).collect::<Vec<_>>();
    for rep in &r {
        assert_eq!(rep.errors().get("ENETUNREACH"), Some(&5), "untranslated: {:?}", rep.attempts);
    }
    let status =
        tierlb::status::Instance::read("failopen", rec.writer(), tierlb::datapath::marks::boottime_ns())
            .unwrap();
    let c = &status.frontends[0].connections;
    assert_eq!((status.fail_open_total, c.fail_open), (20, 20), "4 clients x 5 connects, each counted");
    assert_eq!((c.node, c.zone, c.cluster, c.rejected, c.dropped), (0, 0, 0, 0, 0));
    drop(programs);
}
