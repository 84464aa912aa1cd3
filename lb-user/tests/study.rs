//! `tierlb study`: every shipped scenario runs, the models differ where they should, and (in the kernel)
//! tierlb's measured shares match the simulator's prediction.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use lb_testkit::{
    cluster::SimCluster,
    manifests::{Ep, Svc, write_service},
};
use tierlb::study::{self, ProxyModel, StudyResult};

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn run(name: &str) -> StudyResult {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/study/{name}.yaml"));
    study::run(&study::load(&path).unwrap())
}

fn get(r: &StudyResult, phase: usize, m: ProxyModel) -> &study::ModelResult {
    r.phases[phase].models.iter().find(|x| x.model == m).unwrap()
}

#[test]
fn every_shipped_scenario_runs_and_accounts_for_every_request() {
    let files = scenarios();
    assert!(files.len() >= 5, "{files:?}");
    for f in files {
        let r = study::run(&study::load(&f).unwrap());
        for p in &r.phases {
            for m in &p.models {
                let total: f64 = m.shares.values().sum::<f64>() + m.failed + m.hang;
                assert!((total - 1.0).abs() < 1e-9, "{}: {} {:?}: {total}", f.display(), p.phase, m.model);
            }
        }
        assert!(!study::table(&r).is_empty());
        assert!(tierlb::chart::study_chart(&r).unwrap().starts_with("<svg"));
    }
}

#[test]
#[expect(
    clippy::float_cmp,
    reason = "exact values: nothing fails or hangs, and one node of four is exactly 1/4"
)]
fn the_models_differ_where_the_study_says() {
    let story = run("story");
    let kp = get(&story, 0, ProxyModel::KubeProxy);
    assert!((kp.shares["10.244.1.21"] - 0.65).abs() < 1e-9 && (kp.shares["10.244.3.21"] - 0.35).abs() < 1e-9);
    // Zone-only proxies ignore forNodes: 50/50.
    assert!((get(&story, 0, ProxyModel::ZoneOnly).shares["10.244.1.21"] - 0.5).abs() < 1e-9);
    // A crashed pod the control plane has not noticed: kube-proxy keeps sending node-1's clients to it.
    assert!((get(&story, 1, ProxyModel::KubeProxy).failed - 0.65).abs() < 1e-9);
    assert_eq!(get(&story, 1, ProxyModel::Tierlb).failed, 0.0);

    let roll = run("local-policy-roll");
    let last = roll.phases.len() - 1;
    assert!(
        (get(&roll, last, ProxyModel::KubeProxy).hang - 1.0 / 3.0).abs() < 1e-9,
        "kube-proxy drops: clients hang"
    );
    assert!((get(&roll, last, ProxyModel::Tierlb).failed - 1.0 / 3.0).abs() < 1e-9, "tierlb fails fast");
    assert_eq!(get(&roll, last, ProxyModel::Tierlb).hang, 0.0);

    let half = run("upgraded-halfway");
    let ns = get(&half, 0, ProxyModel::NoSafeguard);
    assert!((ns.shares["10.244.1.5"] - 0.375).abs() < 1e-9, "without the all-endpoints rule: skew {ns:?}");
    assert_eq!(get(&half, 0, ProxyModel::KubeProxy).shares["10.244.1.5"], 0.25);

    let lag = run("hints-lag");
    assert!(get(&lag, 0, ProxyModel::KubeProxy).cross_node > get(&lag, 1, ProxyModel::KubeProxy).cross_node);
}

/// Build the scenario's cluster for real (one agent per node, one pod per endpoint), send each node's share
/// of connects through the VIP, and compare tierlb's measured shares with the simulator's.
fn measure(name: &str, connects: usize) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    assert!(nix::unistd::geteuid().is_root(), "in-kernel tests need root");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/study/{name}.yaml"));
    let sc = study::load(&path).unwrap();
    let predicted = study::run(&sc).phases[0]
        .models
        .iter()
        .find(|m| m.model == ProxyModel::Tierlb)
        .unwrap()
        .shares
        .clone();
    let model = study::model_of(&sc, &sc.endpoints);
    let mut c = SimCluster::new(
        "study",
        Path::new(env!("CARGO_BIN_EXE_tierlb")),
        &lb_testkit::workspace_bin("tierlb-lab", "lb-lab"),
    )
    .unwrap();
    let slice = model.slices.values().next().unwrap();
    let mut eps = Vec::new();
    for e in &slice.endpoints {
        let ip = e.address.unwrap();
        c.add_pod(SocketAddr::new(ip, 8080), &ip.to_string()).unwrap();
        let mut ep = Ep::ready(ip, e.node_name.as_deref().unwrap());
        ep.zone.clone_from(&e.zone);
        ep.for_nodes.clone_from(&e.for_nodes);
        ep.for_zones.clone_from(&e.for_zones);
        eps.push(ep);
    }
    let vip: IpAddr = "10.96.0.99".parse().unwrap();
    let mut svc = Svc::new("svc", vip, 80, 8080);
    svc.traffic_distribution.clone_from(&sc.service.traffic_distribution);
    write_service(c.manifests.path(), &svc, &eps).unwrap();
    for n in &sc.nodes {
        let mut args = vec![];
        if let Some(z) = &n.zone {
            args.extend(["--zone", z.as_str()]);
        }
        c.add_node(&n.name, &args).unwrap();
    }
    let total: f64 = sc.nodes.iter().map(|n| n.clients).sum();
    let mut counts: BTreeMap<String, f64> = predicted.keys().map(|k| (k.clone(), 0.0)).collect();
    let mut sent = 0.0;
    for n in &sc.nodes {
        #[expect(clippy::cast_sign_loss, reason = "a node's share of the connects, never negative")]
        let k = (connects as f64 * n.clients / total).round() as usize;
        let r = c.probe(&n.name, SocketAddr::new(vip, 80), k, Duration::ZERO).unwrap();
        assert_eq!(r.failures(), 0);
        for (b, x) in r.by_backend() {
            *counts.get_mut(&b).unwrap() += x as f64;
        }
        sent += k as f64;
    }
    let measured = counts.into_iter().map(|(k, v)| (k, v / sent)).collect();
    (predicted, measured)
}

#[test]
fn tierlbs_measured_shares_match_the_simulator_within_five_points() {
    for (name, connects) in [("story", 1000), ("multizone", 800)] {
        let (predicted, measured) = measure(name, connects);
        eprintln!("{name}: predicted {predicted:?}\n{name}: measured  {measured:?}");
        for (ip, p) in &predicted {
            let m = measured[ip];
            assert!((p - m).abs() < 0.05, "{name} {ip}: predicted {p:.3}, measured {m:.3}");
        }
    }
}
