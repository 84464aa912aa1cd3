//! The report's rendering, checked on the fixture's figures.
use super::{
    super::figures::{AgentFigures, MapMemory, MapWrites, RuleLoad},
    *,
};

/// Control-plane figures, typed: one of each kind of row.
fn figures() -> ControlPlane {
    let load = |tool, services, took| RuleLoad { tool, services, took };
    let done = |ms| LoadTime::Done(Duration::from_millis(ms));
    ControlPlane {
        maps: vec![MapWrites {
            services: 100_000,
            program: Duration::from_millis(1510),
            one_change: Duration::from_micros(14),
        }],
        map_memory: MapMemory {
            services: 100_000,
            maps: vec![("FRONTENDS".into(), 20 << 20), ("SLOTS".into(), 6 << 20)],
        },
        agent: vec![AgentFigures {
            source: AgentSource::Kube,
            services: 100_000,
            ready: Duration::from_millis(12_200),
            edit_took: Spread { median_ms: 0.29, max_ms: 1.66 },
            edit_wall: Spread { median_ms: 3.2, max_ms: 10.6 },
            rss_bytes: 300 << 20,
            phases: super::super::figures::Phases {
                source: Duration::from_millis(4100),
                load: Duration::from_millis(1300),
                read: Duration::from_millis(2900),
                plan: Duration::from_millis(700),
                program: Duration::from_millis(1510),
                attach: Duration::from_millis(90),
            },
        }],
        rule_loads: vec![
            load("iptables-restore", 1_000, done(300)),
            load("iptables-restore", 100_000, LoadTime::Stopped { limit: Duration::from_mins(3) }),
            load("nft -f", 10_000, done(20_450)),
        ],
    }
}

/// The control-plane section reads as written here by hand.
#[test]
fn the_control_plane_figures_read_as_written() {
    let mut r = super::super::fixture::report();
    r.control = figures();
    let md = markdown(&r);
    let section = &md[md.find("\n## Control plane").unwrap()..md.find("\n![connect4").unwrap()];
    assert_eq!(
        section,
        "
## Control plane

| what | figure |
|---|---|
| program 100,000 Services x 10 endpoints into the maps (from scratch) | 1510 ms |
| apply one EndpointSlice change at 100,000 Services, map writes (new slots, frontend swap) | 0.014 ms |
| Service maps' memory with 100,000 Services x 10 endpoints (the kernel's accounting, fdinfo memlock; FRONTENDS preallocated, the others their buckets by capacity and what they hold) | 26.0 MiB (FRONTENDS 20.0, SLOTS 6.0 MiB) |
| agent (kube) start to ready with 100,000 Services x 10 endpoints (access review, chunked lists from the API-server stand-in, plan, load, program) | 12.20 s |
| agent (kube) start to ready by phase at 100,000 Services (its ready line) | source 4100 ms, load 1300 ms, read 2900 ms, plan 700 ms, program 1510 ms, attach 90 ms |
| agent (kube): one EndpointSlice edit at 100,000 Services, from reading the change to maps written (20 edits, the agent's took_us) | median 0.290 ms, max 1.660 ms |
| agent (kube): the same edits from the watch event sent to the synced log line | median 3.2 ms, max 10.6 ms |
| agent (kube) RSS with 100,000 Services x 10 endpoints | 300.0 MiB |
| load 100,000 Services x 10 endpoints with iptables-restore | not done within 180 s (stopped) |
| load 10,000 Services x 10 endpoints with nft -f | 20.45 s |
"
    );
    for want in [
        "| 100,000 Services x 10 endpoints programmed from scratch in under 1 s | 1510 ms | no |",
        "| one change applied in under 1 ms at 100,000 Services (agent, kube, reading the change to maps written) | median 0.290 ms, max 1.660 ms | yes |",
        "| agent (kube) start to ready under 5 s at 100,000 Services | 12.20 s | no |",
        "| agent (kube) RSS under 256 MiB at 100,000 Services | 300.0 MiB | no |",
    ] {
        assert!(md.contains(want), "missing {want:?} in\n{md}");
    }
}

/// The north-south section and its targets, from rows whose ratios are known (fixture): per-round
/// ratios to direct, their range, and the verdicts; the conntrack tables' memory per flow.
#[test]
fn the_north_south_rows_and_targets_read_from_the_interleaved_ratios() {
    let md = markdown(&super::super::fixture::report());
    for want in [
        "## From outside the node",
        "| tierlb | 1 | 31.5 | 63.0 | 31746 | 1.05x (1.05-1.05) | 0.95x (0.95-0.95) | 95 | 0 |",
        "| iptables | 10,000 | 39.0 | 78.0 | 25641 | 1.30x (1.30-1.30) | 0.77x (0.77-0.77) | - | 0 |",
        "| from outside, tierlb's node port within 1.10x of direct at 1 Services (p50, connect) | 1.05x (rounds 1.05-1.05) | yes |",
        "| from outside, tierlb's node port within 1.10x of direct at 10,000 Services (p50, connect) | 1.15x (rounds 1.15-1.15) | no |",
        "| from outside at 10,000 Services at least iptables' throughput (rr) | tierlb 0.87x direct, iptables 0.77x",
        "### Conntrack memory at 100,000 tracked flows",
        "| tierlb | 100,000 | 200,000 | 40.0 | 419 | 131,072 | 0.0 | 0 |",
        "| nf_conntrack | 100,000 | 100,000 | 30.0 | 315 | grows on demand | 30.0 | 100,000 |",
    ] {
        assert!(md.contains(want), "missing {want:?} in\n{md}");
    }
    let mut r = super::super::fixture::report();
    r.north_south.clear();
    r.conntrack.clear();
    let md = markdown(&r);
    assert!(!md.contains("From outside") && !md.contains("from outside"), "no rows, no section: {md}");
    assert!(!md.contains("Conntrack memory"), "no tables measured, no table: {md}");
}

/// Without the agent's figures (they failed) the report leaves out their rows and targets.
#[test]
fn missing_agent_figures_leave_out_their_rows_and_targets() {
    let mut r = super::super::fixture::report();
    r.control.agent.clear();
    let md = markdown(&r);
    assert!(!md.contains("agent ("), "{md}");
    assert!(
        md.contains(
            "| 100,000 Services x 10 endpoints programmed from scratch in under 1 s | 2300 ms | no |"
        ),
        "{md}"
    );
}

/// Every target judged from the fixture's rows: those it meets say yes, those it misses say no.
#[test]
fn the_report_judges_the_targets_from_the_rows() {
    let md = markdown(&super::super::fixture::report());
    for want in [
        "| connect4 at most 500 ns per call at 10,000 Services | 1500 ns | no |",
        "| connect4 at most 500 ns per call at 100,000 Services | 1800 ns | no |",
        "| tierlb connect() at 1 Services within 1.05x of direct (p50, median of 3 interleaved pairs) | 1.020x (middle half 1.02-1.02, all 1.02-1.02), p50 18.4 us; p25 latency 1.02x | yes |",
        "| tierlb connect() at 10,000 Services within 1.05x of direct (p50, median of 3 interleaved pairs) | 1.040x (middle half 1.04-1.04, all 1.04-1.04), p50 18.7 us; p25 latency 1.04x | yes |",
        "| tierlb connect() at 100,000 Services within 1.05x of direct (p50, median of 3 interleaved pairs) | 1.090x (middle half 1.09-1.09, all 1.09-1.09), p50 19.6 us; p25 latency 1.09x | no |",
        "| connect4's cost flat with the number of Services (100,000 vs 1 within 10%) | 1800 ns vs 1500 ns = 1.20x | no |",
        "iptables adds 68.0 us over direct (p50), tierlb's connect4 costs 1.50 us per call: 45x",
        "## On the node, interleaved with direct",
        "| tierlb | 100,000 | 19.6 | 39.2 | 50968 | 1.09x (1.09-1.09) | 0.92x (0.92-0.92) | 0 |",
        "| agent (manifests) memory per Service x 10 endpoints (RSS slope from 10,000 to 100,000) | 1.2 KiB |",
        "| at 10,000 Services no slower than nftables | p50 18.0 us vs nftables 24.0 us | yes |",
        "| 100,000 Services x 10 endpoints programmed from scratch in under 1 s | 2300 ms | no |",
        "| one change applied in under 1 ms at 10,000 Services (agent, manifests, reading the change to maps written) | median 0.900 ms, max 1.400 ms | yes |",
        "| agent (manifests) RSS under 64 MiB at 10,000 Services | 92.0 MiB | no |",
        "| one change applied in under 1 ms at 10,000 Services (agent, kube, reading the change to maps written) | median 1.200 ms, max 2.000 ms | no |",
        "| agent (kube) RSS under 64 MiB at 10,000 Services | 50.0 MiB | yes |",
        "| agent (manifests) start to ready under 10 s at 100,000 Services | 8.50 s | yes |",
        "| agent (manifests) RSS under 256 MiB at 100,000 Services | 200.0 MiB | yes |",
        "| tierlb | 100000 | 18.5 |",
        "![p50 latency by number of Services](bench/latency-rr.svg)",
    ] {
        assert!(md.contains(want), "missing {want:?} in\n{md}");
    }
}

/// connect4's own rows: a table by the measured Service's shape, targets for the shaped Services at 10,000
/// and more, and the flatness claim from the paired runs (median ratio with its spread) instead of the rows'
/// single runs.
#[test]
fn connect4_rows_and_the_paired_flatness_read_as_measured() {
    use super::super::figures::{Connect4Row, Flatness, Ratio};
    let mut r = super::super::fixture::report();
    for (shape, ns, ratios) in [
        (Shape::One, 250.0, [1.0, 1.0, 1.0]),
        (Shape::Tiered, 270.0, [1.06, 1.08, 1.1]),
        (Shape::Held, 520.0, [2.0, 2.1, 2.2]),
    ] {
        r.connect4.push(Connect4Row {
            services: 100_000,
            shape,
            rounds: 3,
            ns_per_run: ns,
            vs_one: Ratio::of(&ratios),
            sock_ops_ns_per_run: Some(60.0),
        });
    }
    r.flatness = Some(Flatness {
        services: 100_000,
        pairs: 4,
        one_ns: 250.0,
        many_ns: 260.0,
        ratio: Ratio::of(&[1.02, 1.03, 1.05, 1.2]),
    });
    let md = markdown(&r);
    for want in [
        "## connect4 per call, by the measured Service",
        "| 100,000 | 10 endpoints: node tier empty, 3 in the zone, 10 in the cluster | 270 | 1.08x (1.08-1.10) | 60 |",
        "| connect4 at most 500 ns per call at 100,000 Services, measured Service: the same, 2 of the zone's 3 held by passive health | 520 ns (median of 3 rounds; 2.10x the 1-endpoint Service's in the same rounds, middle half 2.10-2.20) | no |",
        "| connect4's cost flat with the number of Services (100,000 vs 1 within 10%: median of 4 pairs of statistics runs, 1 and 100,000 Services alternating) | 1.040x (middle half 1.03-1.05, all 1.02-1.20); 260 vs 250 ns per call (medians) | yes |",
    ] {
        assert!(md.contains(want), "missing {want:?} in\n{md}");
    }
    // The rows' single runs no longer judge flatness when the paired runs are there.
    assert!(!md.contains("1800 ns vs 1500 ns"), "{md}");
    assert!(
        !md.contains("connect4 at most 500 ns per call at 100,000 Services, measured Service: 1 endpoint"),
        "{md}"
    );
}
