//! The EndpointSlice controller's hints, as tierlb emulates them.
use super::*;

fn hinted(td: Option<&str>, eps: &[E]) -> (Vec<Endpoint>, hints::HintOutcome) {
    let s = Service { traffic_distribution: td.map(Into::into), ..svc() };
    let m = model(s.clone(), eps);
    let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
    let out = hints::apply(&m, &s, &mut slices);
    (slices.into_iter().flat_map(|s| s.endpoints).collect(), out)
}

fn strs(v: Option<&Vec<tierlb::model::Name>>) -> Option<Vec<&str>> {
    v.map(|v| v.iter().map(|n| &**n).collect())
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
        assert_eq!(strs(eps[0].hints.for_nodes().map(|l| &**l)), c.nodes, "{}", c.name);
        assert_eq!(strs(eps[0].hints.for_zones().map(|l| &**l)), c.zones, "{}", c.name);
    }
}

#[test]
fn controller_skips_not_ready_endpoints_and_writes_no_zone_hint_without_a_zone() {
    let (eps, _) = hinted(
        Some("PreferSameNode"),
        &[e("10.0.0.1", "n1").terminating().nodes(&["old"]), e("10.0.0.2", "n2")],
    );
    assert_eq!(
        strs(eps[0].hints.for_nodes().map(|l| &**l)),
        Some(vec!["old"]),
        "not-ready endpoints keep their old hints"
    );
    assert_eq!(strs(eps[1].hints.for_nodes().map(|l| &**l)), Some(vec!["n2"]));
    assert_eq!(eps[1].hints.for_zones(), None, "no zone, no zone hint");
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
            topology_mode_annotation: mode_ann.map(Into::into),
            topology_aware_hints_annotation: deprecated.map(Into::into),
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
        let any_hint = slices.iter().flat_map(|s| &s.endpoints).any(|e| e.hints.for_zones().is_some());
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
        slices[0].endpoints.iter().map(|e| e.hints.for_zones().unwrap().join(",")).collect();
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

/// Zone hints per zone name, over every endpoint of the slices.
fn zone_counts(slices: &[EndpointSlice]) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for e in slices.iter().flat_map(|s| &s.endpoints) {
        *counts.entry(e.hints.for_zones().map_or("-".to_owned(), |z| z.join(","))).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

/// One corner case of `controller_corner_cases_as_its_source_has_them`.
struct Corner {
    name: &'static str,
    nodes: Vec<NodeSpec>,
    /// Nodes left out of the CPU shares (control-plane, not Ready).
    excluded: &'static [&'static str],
    eps: Vec<E>,
    want: Vec<(String, usize)>,
}

/// Where the hint emulation once differed from the controller's source (found by the oracle,
/// `hint_oracle.rs`), one named case each.
#[test]
fn controller_corner_cases_as_its_source_has_them() {
    let three = [("n1", Some("a"), Some(4000)), ("n2", Some("b"), Some(4000)), ("n3", Some("c"), Some(4000))];
    let ab = [("n1", Some("a"), Some(4000)), ("n2", Some("b"), Some(4000))];
    let in_zone = |z: &'static str, n: usize| -> Vec<E> {
        (0..n)
            .map(|i| e(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"][i], "n1").zone(z))
            .collect()
    };
    let counts = |v: &[(&str, usize)]| v.iter().map(|(z, n)| ((*z).to_owned(), *n)).collect::<Vec<_>>();
    let cases = [
        Corner {
            // desired 3.33 each: a and b give 1.67, c needs 3.33; the controller moves whole endpoints
            // while either side has half an endpoint left (a, b, a), not only down to each zone's maximum.
            name: "5/5/0 endpoints over three equal zones end 3/4/3",
            nodes: three.to_vec(),
            excluded: &[],
            eps: [in_zone("a", 5), in_zone("b", 5)].concat(),
            want: counts(&[("a", 3), ("b", 4), ("c", 3)]),
        },
        Corner {
            name: "a control-plane or not-Ready node's zone gets no share",
            nodes: [ab.to_vec(), vec![("n3", Some("c"), Some(4000))]].concat(),
            excluded: &["n3"],
            eps: [in_zone("a", 1), in_zone("b", 1)].concat(),
            want: counts(&[("a", 1), ("b", 1)]),
        },
        Corner {
            name: "a node with zero allocatable CPU turns hints off",
            nodes: [ab.to_vec(), vec![("n3", Some("b"), Some(0))]].concat(),
            excluded: &[],
            eps: [in_zone("a", 1), in_zone("b", 1)].concat(),
            want: counts(&[("-", 2)]),
        },
    ];
    for c in cases {
        let (mut m, s) = auto_model(&c.nodes, &c.eps);
        for n in c.excluded {
            m.nodes.get_mut(*n).unwrap().cpu_share_excluded = true;
        }
        let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
        hints::apply(&m, &s, &mut slices);
        assert_eq!(zone_counts(&slices), c.want, "{}", c.name);
    }
}

/// Auto mode allocates each address type on its own: a dual-stack Service's IPv4 endpoints get hints while
/// its single IPv6 endpoint, fewer than the zones, gets none (counted together, all three would).
#[test]
fn auto_mode_allocates_each_address_family_on_its_own() {
    let (mut m, s) = auto_model(
        &[("n1", Some("a"), Some(4000)), ("n2", Some("b"), Some(4000))],
        &[e("10.0.0.1", "n1").zone("a"), e("10.0.0.2", "n2").zone("b")],
    );
    let v6 = slice("web-v6", AddressType::IPv6, 8080, &[e("fd00::1", "n1").zone("a")]);
    m.slices.insert(v6.key.clone(), v6);
    let filled = hints::fill_for(&m, &s).expect("the IPv4 slice is hinted");
    let by_family = |t: AddressType| {
        let s: Vec<EndpointSlice> = filled.iter().filter(|s| s.address_type == t).cloned().collect();
        zone_counts(&s)
    };
    assert_eq!(by_family(AddressType::IPv4), [("a".to_owned(), 1), ("b".to_owned(), 1)]);
    assert_eq!(by_family(AddressType::IPv6), [("-".to_owned(), 1)]);
}

/// `trafficdist` copies a zone or node name that is set, even empty: an endpoint with `zone: ""` gets the
/// zone hint `""` (which kube-proxy matches on a node without a zone label).
#[test]
fn prefer_same_node_copies_set_but_empty_zone_and_node_names() {
    let mut m = model(psn(), &[]);
    let mut sl = slice("web-abc", AddressType::IPv4, 8080, &[e("10.0.0.1", "n1").zone("")]);
    sl.endpoints[0].node_name = Some("".into());
    m.slices.insert(sl.key.clone(), sl);
    let filled = hints::fill_for(&m, &m.services[&ObjKey::new("default", "web")]).expect("hinted");
    let ep = &filled[0].endpoints[0];
    assert_eq!(
        (strs(ep.hints.for_nodes().map(|l| &**l)), strs(ep.hints.for_zones().map(|l| &**l))),
        (Some(vec![""]), Some(vec![""]))
    );
}
