//! One test per rule of DESIGN.md's semantics section.
use super::*;

#[test]
fn nil_conditions_mean_ready_serving_and_not_terminating() {
    let eps = [
        e("10.0.0.1", "n1").conditions(None, None, None),
        e("10.0.0.2", "n2").conditions(Some(false), None, None),
    ];
    let m = model(svc(), &eps);
    let t = internal(&m, &node("n1", None));
    // 10.0.0.2: not ready, serving defaults to true but terminating to false, so not usable at all.
    assert_eq!(ips(&t.endpoints), ["10.0.0.1"]);
}

#[test]
fn node_hints_apply_only_when_every_ready_endpoint_has_them_and_one_names_this_node() {
    check(vec![
        Case {
            name: "all ready have forNodes, one names n1",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").psn()],
            node: node("n1", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "one ready endpoint lacks forNodes: no node filtering",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "all have forNodes but none names this node",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").psn()],
            node: node("n3", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "a not-ready endpoint without hints does not count",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").not_ready()],
            node: node("n1", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "an endpoint may name several nodes",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").nodes(&["n1", "n3"]), e("10.0.0.2", "n2").nodes(&["n2"])],
            node: node("n3", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "hints are read even without trafficDistribution (kube-proxy never reads the field)",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").psn()],
            node: node("n2", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.2"],
        },
    ]);
}

#[test]
fn zone_hints_follow_the_same_all_or_nothing_rule_and_a_node_without_zone_matches_only_the_empty_zone() {
    check(vec![
        Case {
            name: "all ready have forZones, one names zone a",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("a")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.1"],
        },
        Case {
            name: "one ready endpoint lacks forZones",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2")],
            node: node("n3", Some("a")),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "node without zone label",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            // kube-proxy reads the zone as `nodeLabels[topology.kubernetes.io/zone]`: "" for a node without
            // the label, which a `forZones: [""]` hint (a valid label value) names (topology.go,
            // `topologyModeFromHints`: `endpoint.ZoneHints().Has(zone)`).
            name: "node with an empty zone label, an endpoint hinted for the empty zone",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&[""]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.1"],
        },
        Case {
            name: "node without zone label, an endpoint hinted for the empty zone",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&[""]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", None),
            tier: SelectedTier::Zone,
            want: &["10.0.0.1"],
        },
        Case {
            name: "several zone hints per endpoint (Auto mode lends endpoints to other zones)",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a", "c"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("c")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.1"],
        },
        Case {
            name: "no endpoint names this zone",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("z")),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "node hints but not for this node: zone hints are used",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").zone("a").psn(), e("10.0.0.2", "n2").zone("b").psn()],
            node: node("n3", Some("b")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.2"],
        },
    ]);
}

#[test]
fn the_cluster_set_falls_back_to_serving_terminating_endpoints_when_none_is_ready() {
    check(vec![
        Case {
            name: "ready ones win over serving+terminating",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").terminating(), e("10.0.0.2", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.2"],
        },
        Case {
            name: "nothing ready: serving+terminating, topology ignored",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn().terminating(), e("10.0.0.2", "n2").psn().terminating()],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "terminating but not serving is never used",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").conditions(Some(false), Some(false), Some(true))],
            node: node("n1", None),
            tier: SelectedTier::None,
            want: &[],
        },
    ]);
}

#[test]
fn the_local_set_is_local_ready_then_local_serving_terminating_and_ignores_hints() {
    let local = || Service { internal_policy: Policy::Local, ..svc() };
    check(vec![
        Case {
            name: "local ready endpoints",
            svc: local(),
            eps: vec![e("10.0.0.1", "n1"), e("10.0.0.2", "n1").terminating(), e("10.0.0.3", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Local,
            want: &["10.0.0.1"],
        },
        Case {
            name: "no local ready: local serving+terminating",
            svc: local(),
            eps: vec![e("10.0.0.2", "n1").terminating(), e("10.0.0.3", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Local,
            want: &["10.0.0.2"],
        },
        Case {
            name: "hints naming another node do not matter",
            svc: local(),
            eps: vec![e("10.0.0.1", "n1").nodes(&["n2"]), e("10.0.0.3", "n2").nodes(&["n2"])],
            node: node("n1", None),
            tier: SelectedTier::Local,
            want: &["10.0.0.1"],
        },
    ]);
}

#[test]
fn a_local_internal_policy_always_wins_over_traffic_distribution() {
    let s = Service {
        internal_policy: Policy::Local,
        traffic_distribution: Some("PreferSameNode".into()),
        ..svc()
    };
    let m = model(s, &[e("10.0.0.2", "n2").psn()]);
    let p = plan::plan(&m, &node("n1", None));
    let t = &p.services[0].internal;
    assert_eq!(t.selected_tier, SelectedTier::None);
    assert_eq!(t.when_empty, Some(WhenEmpty::Drop), "no fallback to n2: DROP");
    let warnings = &lint::lint(&m, &node("n1", None), &p).ports[0];
    assert!(warnings.iter().any(|w| w.contains("dead line")), "{warnings:?}");
}

#[test]
fn external_policy_local_applies_only_to_externally_reachable_ports() {
    struct X {
        name: &'static str,
        svc: Service,
        external: Option<SelectedTier>,
    }
    let eps = [e("10.0.0.1", "n1"), e("10.0.0.2", "n2")];
    let etp = |f: fn(&mut Service)| {
        let mut s = Service { external_policy: Policy::Local, ..svc() };
        f(&mut s);
        s
    };
    let cases = [
        X {
            name: "pure ClusterIP: ETP Local ignored, no external traffic",
            svc: etp(|_| {}),
            external: None,
        },
        X {
            name: "nodePort",
            svc: etp(|s| {
                s.type_ = ServiceType::NodePort;
                s.ports[0].node_port = Some(30080);
            }),
            external: Some(SelectedTier::Local),
        },
        X {
            name: "load-balancer ingress IP",
            svc: etp(|s| s.load_balancer_ips = vec!["192.0.2.10".parse().unwrap()].into()),
            external: Some(SelectedTier::Local),
        },
        X {
            name: "external IP",
            svc: etp(|s| s.external_ips = vec!["192.0.2.11".parse().unwrap()].into()),
            external: Some(SelectedTier::Local),
        },
    ];
    for c in cases {
        let m = model(c.svc, &eps);
        let p = plan::plan(&m, &node("n2", None));
        let s = &p.services[0];
        assert_eq!(s.external.as_ref().map(|t| t.from_outside.selected_tier), c.external, "{}", c.name);
        // Internal traffic keeps its own (Cluster) policy whatever ETP says.
        assert_eq!(s.internal.selected_tier, SelectedTier::Cluster, "{}", c.name);
        if let Some(x) = &s.external {
            assert_eq!(ips(&x.from_outside.endpoints), ["10.0.0.2"], "{}", c.name);
        }
    }
}

#[test]
fn reject_when_there_is_no_usable_endpoint_drop_when_a_local_policy_finds_only_remote_ones() {
    struct X {
        name: &'static str,
        policy: Policy,
        eps: Vec<E>,
        has_any: bool,
        when_empty: Option<WhenEmpty>,
    }
    let cases = [
        X {
            name: "no endpoints, Cluster",
            policy: Policy::Cluster,
            eps: vec![],
            has_any: false,
            when_empty: Some(WhenEmpty::Reject),
        },
        X {
            name: "no endpoints, Local",
            policy: Policy::Local,
            eps: vec![],
            has_any: false,
            when_empty: Some(WhenEmpty::Reject),
        },
        X {
            name: "only not-ready endpoints",
            policy: Policy::Cluster,
            eps: vec![e("10.0.0.1", "n2").not_ready()],
            has_any: false,
            when_empty: Some(WhenEmpty::Reject),
        },
        X {
            name: "Local, endpoint elsewhere",
            policy: Policy::Local,
            eps: vec![e("10.0.0.1", "n2")],
            has_any: true,
            when_empty: Some(WhenEmpty::Drop),
        },
        X {
            name: "Local, serving+terminating endpoint elsewhere counts as an endpoint",
            policy: Policy::Local,
            eps: vec![e("10.0.0.1", "n2").terminating()],
            has_any: true,
            when_empty: Some(WhenEmpty::Drop),
        },
        X {
            name: "Cluster, endpoint elsewhere",
            policy: Policy::Cluster,
            eps: vec![e("10.0.0.1", "n2")],
            has_any: true,
            when_empty: None,
        },
    ];
    for c in cases {
        let m = model(Service { internal_policy: c.policy, ..svc() }, &c.eps);
        let p = plan::plan(&m, &node("n1", None));
        assert_eq!(p.services[0].has_any_endpoints, c.has_any, "{}", c.name);
        assert_eq!(p.services[0].internal.when_empty, c.when_empty, "{}", c.name);
    }
}

#[test]
fn duplicate_ip_port_across_slices_is_merged_keeping_the_local_copy() {
    let mut m = model(psn(), &[e("10.0.0.1", "n2").psn()]);
    let dup = slice("web-dup", AddressType::IPv4, 8080, &[e("10.0.0.1", "n1").psn()]);
    m.slices.insert(dup.key.clone(), dup);
    let eps =
        plan::port_endpoints(m.slices_of(&ObjKey::new("default", "web")), &psn().ports[0], Family::V4, "n1");
    assert_eq!(eps.len(), 1);
    assert!(eps[0].local);
    let t = internal(&m, &node("n1", None));
    assert_eq!((t.selected_tier, ips(&t.endpoints)), (SelectedTier::Node, vec!["10.0.0.1".to_owned()]));
}

#[test]
fn endpoints_of_the_other_ip_family_are_ignored() {
    let mut s = svc();
    s.cluster_ips = vec!["10.96.0.10".parse().unwrap(), "fd00::10".parse().unwrap()].into();
    let mut m = model(s, &[e("10.0.0.1", "n1")]);
    let v6 = slice("web-v6", AddressType::IPv6, 8080, &[e("fd00::1", "n2")]);
    m.slices.insert(v6.key.clone(), v6);
    let p = plan::plan(&m, &node("n1", None));
    assert_eq!(p.services.len(), 2, "one entry per family");
    for s in &p.services {
        let want: &[&str] = if s.family == Family::V4 { &["10.0.0.1"] } else { &["fd00::1"] };
        assert_eq!(ips(&s.internal.endpoints), want);
        assert!(s.cluster_ips.iter().all(|ip| Family::of(ip) == s.family));
    }
}

#[test]
fn named_target_ports_resolve_per_slice() {
    let mut m = model(svc(), &[e("10.0.0.1", "n1")]);
    // A second slice (pods of another version) resolved the same port name to another number.
    let other = slice("web-v2", AddressType::IPv4, 9090, &[e("10.0.0.2", "n2")]);
    m.slices.insert(other.key.clone(), other);
    // A slice whose port has another name or protocol does not serve this Service port.
    let mut wrong = slice("web-x", AddressType::IPv4, 7070, &[e("10.0.0.3", "n3")]);
    wrong.ports[0].name = "metrics".into();
    m.slices.insert(wrong.key.clone(), wrong);
    let mut udp = slice("web-u", AddressType::IPv4, 6060, &[e("10.0.0.4", "n4")]);
    udp.ports[0].protocol = Protocol::Udp;
    m.slices.insert(udp.key.clone(), udp);
    let t = internal(&m, &node("n1", None));
    let got: Vec<String> = t.endpoints.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["10.0.0.1:8080", "10.0.0.2:9090"]);
}

/// A Service and one slice whose endpoints have two addresses each, read as both sources read them
/// (source/convert.rs).
fn two_address_model(policy: &str) -> Model {
    let text = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {{clusterIP: 10.96.0.10, internalTrafficPolicy: {policy}, ports: [{{name: http, port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n- {{addresses: [10.0.0.1, 10.0.0.2], nodeName: n1}}\n- {{addresses: [10.0.0.3, 10.0.0.1], nodeName: n2}}\n"
    );
    let (objects, diagnostics) =
        tierlb::source::manifests::parse_text(std::path::Path::new("two-addresses.yaml"), &text);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let mut m = Model::default();
    for o in objects {
        o.insert_into(&mut m);
    }
    m
}

#[test]
fn only_the_first_address_of_an_endpoint_counts_and_headless_services_get_no_plan() {
    // The second address is neither an endpoint of its own nor the other endpoint's copy.
    let m = two_address_model("Cluster");
    assert_eq!(ips(&internal(&m, &node("n1", None)).endpoints), ["10.0.0.1", "10.0.0.3"]);
    // 10.0.0.1 is n1's endpoint; n2's second address does not make it local to n2.
    let m = two_address_model("Local");
    assert_eq!(ips(&internal(&m, &node("n2", None)).endpoints), ["10.0.0.3"]);
    assert_eq!(ips(&internal(&m, &node("n1", None)).endpoints), ["10.0.0.1"]);
    let mut headless = svc();
    headless.cluster_ips = Box::default();
    let m = model(headless, &[e("10.0.0.1", "n1")]);
    assert!(plan::plan(&m, &node("n1", None)).services.is_empty());
}
