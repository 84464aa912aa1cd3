//! The EndpointSlice controller's hints, as tierlb emulates them.
use super::*;

fn hinted(td: Option<&str>, eps: &[E]) -> (Vec<Endpoint>, hints::HintOutcome) {
    let s = Service { traffic_distribution: td.map(str::to_owned), ..svc() };
    let m = model(s.clone(), eps);
    let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
    let out = hints::apply(&m, &s, &mut slices);
    (slices.into_iter().flat_map(|s| s.endpoints).collect(), out)
}

fn strs(v: Option<&[String]>) -> Option<Vec<&str>> {
    v.map(|v| v.iter().map(String::as_str).collect())
}

#[test]
fn controller_hints_per_traffic_distribution_value() {
    struct X {
        name: &'static str,
        td: Option<&'static str>,
        nodes: Option<Vec<&'static str>>,
        zones: Option<Vec<&'static str>>,
    }
    let cases = [
        X { name: "PreferSameZone", td: Some("PreferSameZone"), nodes: None, zones: Some(vec!["a"]) },
        X { name: "PreferClose (alias)", td: Some("PreferClose"), nodes: None, zones: Some(vec!["a"]) },
        X {
            name: "PreferSameNode",
            td: Some("PreferSameNode"),
            nodes: Some(vec!["n1"]),
            zones: Some(vec!["a"]),
        },
        X { name: "unset removes hints", td: None, nodes: None, zones: None },
        X { name: "unknown value removes hints", td: Some("PreferFarAway"), nodes: None, zones: None },
    ];
    for c in cases {
        let (eps, _) = hinted(c.td, &[e("10.0.0.1", "n1").zone("a").nodes(&["old"]).zones(&["old"])]);
        assert_eq!(strs(eps[0].for_nodes.as_deref()), c.nodes, "{}", c.name);
        assert_eq!(strs(eps[0].for_zones.as_deref()), c.zones, "{}", c.name);
    }
}

#[test]
fn controller_skips_not_ready_endpoints_and_writes_no_zone_hint_without_a_zone() {
    let (eps, _) = hinted(
        Some("PreferSameNode"),
        &[e("10.0.0.1", "n1").terminating().nodes(&["old"]), e("10.0.0.2", "n2")],
    );
    assert_eq!(
        strs(eps[0].for_nodes.as_deref()),
        Some(vec!["old"]),
        "not-ready endpoints keep their old hints"
    );
    assert_eq!(strs(eps[1].for_nodes.as_deref()), Some(vec!["n2"]));
    assert_eq!(eps[1].for_zones, None, "no zone, no zone hint");
}

#[test]
fn topology_annotation_takes_precedence_over_the_field_and_the_deprecated_one_wins() {
    let base = Service { traffic_distribution: Some("PreferSameNode".into()), ..svc() };
    let cases = [
        (Some("Auto"), None, HintMode::AutoAnnotation),
        (Some("auto"), None, HintMode::AutoAnnotation),
        (Some("Disabled"), None, HintMode::PreferSameNode),
        (None, Some("Auto"), HintMode::AutoAnnotation),
        (Some("Auto"), Some("Disabled"), HintMode::PreferSameNode),
        (Some("Disabled"), Some("Auto"), HintMode::AutoAnnotation),
    ];
    for (mode_ann, deprecated, want) in cases {
        let s = Service {
            topology_mode_annotation: mode_ann.map(str::to_owned),
            topology_aware_hints_annotation: deprecated.map(str::to_owned),
            ..base.clone()
        };
        assert_eq!(hints::mode(&s), want, "topology-mode {mode_ann:?}, topology-aware-hints {deprecated:?}");
    }
}

fn auto_model(nodes: &[(&str, Option<&str>, Option<u64>)], eps: &[E]) -> (Model, Service) {
    let s = Service { topology_mode_annotation: Some("Auto".into()), ..svc() };
    let mut m = model(s.clone(), eps);
    for (n, z, cpu) in nodes {
        m.nodes.insert(
            (*n).into(),
            Node {
                name: (*n).into(),
                zone: z.map(str::to_owned),
                allocatable_cpu_millis: *cpu,
                ..Node::default()
            },
        );
    }
    (m, s)
}

/// (name, nodes as (name, zone, CPU millis), endpoints, why Auto mode is off)
type AutoCase = (&'static str, Vec<NodeSpec>, Vec<E>, Option<AutoDisabled>);
type NodeSpec = (&'static str, Option<&'static str>, Option<u64>);

#[test]
fn auto_mode_safeguards_disable_hints() {
    let two_zones = [("n1", Some("a"), Some(4000)), ("n2", Some("b"), Some(4000))];
    let eps2 = [e("10.0.0.1", "n1").zone("a"), e("10.0.0.2", "n2").zone("b")];
    let cases: Vec<AutoCase> = vec![
        ("two balanced zones: hints", two_zones.to_vec(), eps2.to_vec(), None),
        (
            "one zone only",
            vec![("n1", Some("a"), Some(4000)), ("n2", Some("a"), Some(4000))],
            eps2.to_vec(),
            Some(AutoDisabled::NodesReadyInOneZoneOnly),
        ),
        (
            "a node without CPU",
            vec![("n1", Some("a"), Some(4000)), ("n2", Some("b"), None)],
            eps2.to_vec(),
            Some(AutoDisabled::InsufficientNodeInfo),
        ),
        (
            "a node without zone",
            vec![("n1", Some("a"), Some(4000)), ("n2", None, Some(4000))],
            eps2.to_vec(),
            Some(AutoDisabled::InsufficientNodeInfo),
        ),
        (
            "fewer endpoints than zones",
            two_zones.to_vec(),
            vec![e("10.0.0.1", "n1").zone("a")],
            Some(AutoDisabled::InsufficientNumberOfEndpoints { endpoints: 1, zones: 2 }),
        ),
        (
            "overload threshold: 3 endpoints over zones of 1:1:1 CPU with one tiny extra zone",
            vec![
                ("n1", Some("a"), Some(1000)),
                ("n2", Some("b"), Some(1000)),
                ("n3", Some("c"), Some(1000)),
                ("n4", Some("d"), Some(1000)),
            ],
            vec![
                e("10.0.0.1", "n1").zone("a"),
                e("10.0.0.2", "n2").zone("b"),
                e("10.0.0.3", "n3").zone("c"),
                e("10.0.0.4", "n3").zone("c"),
                e("10.0.0.5", "n3").zone("c"),
            ],
            Some(AutoDisabled::MinAllocationExceedsOverloadThreshold { endpoints: 5, zones: 4 }),
        ),
        (
            "an endpoint without zone",
            two_zones.to_vec(),
            vec![e("10.0.0.1", "n1").zone("a"), e("10.0.0.2", "n2")],
            Some(AutoDisabled::NoZoneSpecified),
        ),
    ];
    for (name, nodes, eps, want) in cases {
        let (m, s) = auto_model(&nodes, &eps);
        let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
        let out = hints::apply(&m, &s, &mut slices);
        assert_eq!(out.auto_disabled, want, "{name}");
        let any_hint = slices.iter().flat_map(|s| &s.endpoints).any(|e| e.for_zones.is_some());
        assert_eq!(any_hint, want.is_none(), "{name}");
    }
}

#[test]
fn auto_mode_moves_hints_from_overloaded_zones_by_cpu_share() {
    // Zone a has 3 endpoints, zone b 1, but both zones have the same CPU: b should get one of a's.
    let (m, s) = auto_model(
        &[("n1", Some("a"), Some(4000)), ("n2", Some("b"), Some(4000))],
        &[
            e("10.0.0.1", "n1").zone("a"),
            e("10.0.0.2", "n1").zone("a"),
            e("10.0.0.3", "n1").zone("a"),
            e("10.0.0.4", "n2").zone("b"),
        ],
    );
    let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
    hints::apply(&m, &s, &mut slices);
    let zones: Vec<String> =
        slices[0].endpoints.iter().map(|e| e.for_zones.clone().unwrap().join(",")).collect();
    assert_eq!(zones.iter().filter(|z| *z == "b").count(), 2, "{zones:?}");
    assert_eq!(zones.iter().filter(|z| *z == "a").count(), 2, "{zones:?}");
}

#[test]
fn manifests_without_hints_get_the_controllers_hints() {
    let mut m = model(psn(), &[e("10.0.0.1", "n1"), e("10.0.0.2", "n2")]);
    let filled = hints::fill_missing(&mut m);
    assert_eq!(filled, [ObjKey::new("default", "web")]);
    let t = internal(&m, &node("n1", None));
    assert_eq!((t.selected_tier, ips(&t.endpoints)), (SelectedTier::Node, vec!["10.0.0.1".to_owned()]));
    // Slices that already carry hints are left as they are.
    let mut m = model(psn(), &[e("10.0.0.1", "n1").nodes(&["n2"]), e("10.0.0.2", "n2").nodes(&["n2"])]);
    assert!(hints::fill_missing(&mut m).is_empty());
}
