//! A small report for the report's and the charts' tests: direct, and the three other paths at 1, 10,000
//! and 100,000 Services, in both modes. Some of its figures miss their targets, so that the verdicts are
//! seen to say no.
use std::time::Duration;

use super::{
    figures::{
        AgentFigures, AgentSource, ControlPlane, CtMemory, DataPath, MapMemory, MapWrites, NsRow, Phases,
        Report, Row, Spread,
    },
    load::{LoadMode, LoadResult},
};

fn result(p50: f64) -> LoadResult {
    LoadResult {
        ops: 1000,
        errors: 0,
        secs: 1.0,
        p50_us: p50,
        p99_us: p50 * 2.0,
        p25_us: p50 * 0.9,
        per_sec: 1e6 / p50,
        slow: 0,
    }
}

/// North-south rows over three rounds: direct at 30 us, tierlb 1.05x (1 Service) and 1.15x (10,000) of it,
/// iptables 1.30x; throughput in inverse proportion.
fn north_south() -> Vec<NsRow> {
    let mut out = Vec::new();
    for n in [1, 10_000] {
        for mode in LoadMode::ALL {
            let direct: Vec<LoadResult> = [29.0, 30.0, 31.0].iter().map(|p| result(*p)).collect();
            for path in DataPath::ALL {
                let k = match (path, n) {
                    (DataPath::Direct, _) => 1.0,
                    (DataPath::Tierlb, 1) => 1.05,
                    (DataPath::Tierlb, _) => 1.15,
                    _ => 1.30,
                };
                let runs: Vec<LoadResult> = direct.iter().map(|d| result(d.p50_us * k)).collect();
                let tc = (path == DataPath::Tierlb).then_some(95.0);
                out.push(NsRow::of(path, n, mode, &runs, &direct, tc));
            }
        }
    }
    out
}

/// tierlb's table (40 MiB preallocated) and nf_conntrack (30 MiB grown) at 100,000 flows.
fn conntrack() -> Vec<CtMemory> {
    vec![
        CtMemory {
            table: "tierlb".into(),
            flows: 100_000,
            entries: 200_000,
            bytes: 40 << 20,
            slab_growth: 0,
            capacity_flows: Some(131_072),
            nf_conntrack_alongside: 0,
        },
        CtMemory {
            table: "nf_conntrack".into(),
            flows: 100_000,
            entries: 100_000,
            bytes: 30 << 20,
            slab_growth: 30 << 20,
            capacity_flows: None,
            nf_conntrack_alongside: 100_000,
        },
    ]
}

/// tierlb's connects on the node against direct over three rounds: 1.02x at 1 Service, 1.04x at 10,000,
/// 1.09x at 100,000.
fn east_west() -> Vec<NsRow> {
    let mut out = Vec::new();
    for (n, k) in [(1, 1.02), (10_000, 1.04), (100_000, 1.09)] {
        for mode in LoadMode::ALL {
            let direct: Vec<LoadResult> = [17.0, 18.0, 19.0].iter().map(|p| result(*p)).collect();
            let runs: Vec<LoadResult> = direct.iter().map(|d| result(d.p50_us * k)).collect();
            out.push(NsRow::of(DataPath::Tierlb, n, mode, &runs, &direct, None));
        }
    }
    out
}

fn kube_proxy() -> Vec<super::figures::KubeProxySync> {
    use super::figures::{KubeProxyAfter, KubeProxySync, LoadTime};
    vec![
        KubeProxySync {
            mode: "iptables",
            services: 1_000,
            first_sync: LoadTime::Done(Duration::from_millis(5_500)),
            after: Some(KubeProxyAfter {
                first_sync_metric: 4.9,
                one_change: Duration::from_millis(230),
                one_change_metric: 0.1,
            }),
        },
        KubeProxySync {
            mode: "iptables",
            services: 10_000,
            first_sync: LoadTime::Stopped { limit: Duration::from_mins(5) },
            after: None,
        },
    ]
}

/// The control-plane figures: map writes at 10,000 and 100,000, the maps' memory, three agent runs.
fn control() -> ControlPlane {
    ControlPlane {
        maps: vec![
            MapWrites {
                services: 10_000,
                program: Duration::from_millis(181),
                one_change: Duration::from_micros(14),
            },
            MapWrites {
                services: 100_000,
                program: Duration::from_millis(2300),
                one_change: Duration::from_micros(15),
            },
        ],
        map_memory: MapMemory {
            services: 100_000,
            maps: vec![("FRONTENDS".into(), 30 << 20), ("SLOTS".into(), 20 << 20)],
        },
        agent: vec![
            AgentFigures {
                source: AgentSource::Manifests,
                services: 10_000,
                ready: Duration::from_millis(2200),
                edit_took: Spread { median_ms: 0.9, max_ms: 1.4 },
                edit_wall: Spread { median_ms: 9.2, max_ms: 10.6 },
                rss_bytes: 94208 * 1024,
                phases: Phases::default(),
            },
            AgentFigures {
                source: AgentSource::Kube,
                services: 10_000,
                ready: Duration::from_millis(3100),
                edit_took: Spread { median_ms: 1.2, max_ms: 2.0 },
                edit_wall: Spread { median_ms: 2.5, max_ms: 4.0 },
                rss_bytes: 50 << 20,
                phases: Phases::default(),
            },
            AgentFigures {
                source: AgentSource::Manifests,
                services: 100_000,
                ready: Duration::from_millis(8500),
                edit_took: Spread { median_ms: 0.95, max_ms: 1.5 },
                edit_wall: Spread { median_ms: 10.0, max_ms: 12.0 },
                rss_bytes: 200 << 20,
                phases: Phases::default(),
            },
        ],
        rule_loads: Vec::new(),
    }
}

pub(crate) fn report() -> Report {
    let mut rows = Vec::new();
    for mode in LoadMode::ALL {
        let extra = if mode == LoadMode::Rr { 10.0 } else { 0.0 };
        rows.push(Row {
            path: DataPath::Direct,
            services: 0,
            mode,
            result: result(17.0 + extra),
            bpf_ns_per_run: None,
            sock_ops_ns_per_run: None,
        });
        for (n, t, i, f) in [(1, 17.0, 26.0, 29.0), (10_000, 18.0, 85.0, 24.0), (100_000, 18.5, 300.0, 25.0)]
        {
            rows.push(Row {
                path: DataPath::Tierlb,
                services: n,
                mode,
                result: result(t + extra),
                bpf_ns_per_run: Some(if n == 100_000 { 1800.0 } else { 1500.0 }),
                sock_ops_ns_per_run: Some(300.0),
            });
            rows.push(Row {
                path: DataPath::Iptables,
                services: n,
                mode,
                result: result(i + extra),
                bpf_ns_per_run: None,
                sock_ops_ns_per_run: None,
            });
            rows.push(Row {
                path: DataPath::Nftables,
                services: n,
                mode,
                result: result(f + extra),
                bpf_ns_per_run: None,
                sock_ops_ns_per_run: None,
            });
        }
    }
    Report {
        kernel: "6.18".into(),
        cpus: 2,
        threads: 1,
        placement: super::load::Placement { client: Some(0), backend: Some(1) },
        seconds: 1.5,
        rows,
        east_west: east_west(),
        north_south: north_south(),
        snat: None,
        xdp: None,
        conntrack: conntrack(),
        kube_proxy: kube_proxy(),
        control: control(),
        connect4: Vec::new(),
        flatness: None,
    }
}
