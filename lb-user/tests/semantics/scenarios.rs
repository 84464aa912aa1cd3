//! KEP-3015's PreferSameNode scenarios and the story's skew.
use super::*;

#[test]
fn kep3015_prefer_same_node_scenarios() {
    let three = || {
        vec![
            e("10.0.0.1", "n1").zone("a").psn(),
            e("10.0.0.2", "n2").zone("a").psn(),
            e("10.0.0.3", "n3").zone("b").psn(),
        ]
    };
    check(vec![
        Case {
            name: "local endpoint ready: node tier",
            svc: psn(),
            eps: three(),
            node: node("n1", Some("a")),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "local endpoint gone: same zone",
            svc: psn(),
            eps: vec![e("10.0.0.2", "n2").zone("a").psn(), e("10.0.0.3", "n3").zone("b").psn()],
            node: node("n1", Some("a")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.2"],
        },
        Case {
            name: "local endpoint terminating keeps its old hints, is skipped: same zone",
            svc: psn(),
            eps: vec![
                e("10.0.0.1", "n1").zone("a").psn().terminating(),
                e("10.0.0.2", "n2").zone("a").psn(),
                e("10.0.0.3", "n3").zone("b").psn(),
            ],
            node: node("n1", Some("a")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.2"],
        },
        Case {
            name: "no zone hints (no zone labels): cluster",
            svc: psn(),
            eps: vec![e("10.0.0.2", "n2").psn(), e("10.0.0.3", "n3").psn()],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.2", "10.0.0.3"],
        },
        Case {
            name: "one endpoint without hints: no filtering at all",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").zone("a").psn(), e("10.0.0.2", "n2").zone("a")],
            node: node("n1", Some("a")),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
    ]);
}

#[test]
fn the_data_path_tiers_behind_kube_proxys_choice_are_zone_then_cluster() {
    let m = model(
        psn(),
        &[
            e("10.0.0.1", "n1").zone("a").psn(),
            e("10.0.0.2", "n2").zone("a").psn(),
            e("10.0.0.3", "n3").zone("b").psn(),
        ],
    );
    let t = internal(&m, &node("n1", Some("a")));
    assert_eq!(ips(&t.tiers.node), ["10.0.0.1"]);
    assert_eq!(ips(&t.tiers.zone), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(ips(&t.tiers.cluster), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    assert_eq!(plan::plan(&m, &node("n1", Some("a"))).services[0].topology.mode, TopologyMode::Node);
}

fn story_model() -> Model {
    // The PDF-resume service: two replicas (n1, n3) on three nodes, one zone, no zone label.
    let mut m = model(psn(), &[e("10.0.0.1", "n1").psn(), e("10.0.0.3", "n3").psn()]);
    for n in ["n1", "n2", "n3"] {
        m.nodes.insert(
            n.into(),
            Node { name: n.into(), zone: None, allocatable_cpu_millis: Some(4000), ..Node::default() },
        );
    }
    m
}

#[test]
#[expect(clippy::float_cmp, reason = "no request fails: the share is exactly zero")]
fn two_replicas_on_three_nodes_under_prefer_same_node_skew_load_65_35() {
    let m = story_model();
    let s = &m.services[&ObjKey::new("default", "web")];
    let weights = vec![(node("n1", None), 0.5), (node("n2", None), 0.3), (node("n3", None), 0.2)];
    let shares = lint::shares(&m, s, &s.ports[0], Family::V4, &weights);
    let a: SocketAddr = "10.0.0.1:8080".parse().unwrap();
    let b: SocketAddr = "10.0.0.3:8080".parse().unwrap();
    assert!((shares.by_endpoint[&a] - 0.65).abs() < 1e-9, "{shares:?}");
    assert!((shares.by_endpoint[&b] - 0.35).abs() < 1e-9, "{shares:?}");
    assert_eq!(shares.failed, 0.0);
    // The lint knows no clients per node: with equal ones (study's default) the two replicas take 50/50, an
    // even load, so it says nothing (`tierlb study --clients` gives the 65/35 of these clients).
    assert_eq!(lint::skew_warning(&m, s, &s.ports[0], Family::V4), None);
}
