//! Lint warnings and property tests of the plan.
use super::*;

#[test]
fn lints_name_the_problem() {
    let warn =
        |s: Service, eps: &[E]| plan::plan(&model(s, eps), &node("n1", None)).services[0].warnings.join("\n");
    let cases: Vec<(&str, Service, Vec<E>, &str)> = vec![
        (
            "dead line",
            Service { internal_policy: Policy::Local, ..psn() },
            vec![e("10.0.0.1", "n1").psn()],
            "dead line",
        ),
        (
            "annotation overrides",
            Service { topology_mode_annotation: Some("Auto".into()), ..psn() },
            vec![e("10.0.0.1", "n1")],
            "overrides trafficDistribution",
        ),
        (
            "hints missing on some",
            psn(),
            vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2")],
            "1 of 2 ready endpoints carry no hints (10.0.0.2)",
        ),
        (
            "field set, no hints",
            psn(),
            vec![e("10.0.0.1", "n1"), e("10.0.0.2", "n2")],
            "controller is too old",
        ),
        (
            "unknown value",
            Service { traffic_distribution: Some("PreferNearby".into()), ..svc() },
            vec![e("10.0.0.1", "n1")],
            "unknown trafficDistribution value \"PreferNearby\"",
        ),
        (
            "PreferClose alias",
            Service { traffic_distribution: Some("PreferClose".into()), ..svc() },
            vec![e("10.0.0.1", "n1").zones(&["a"])],
            "deprecated alias",
        ),
    ];
    for (name, s, eps, want) in cases {
        let w = warn(s, &eps);
        assert!(w.contains(want), "{name}: {w}");
    }
    assert_eq!(warn(psn(), &[e("10.0.0.1", "n1").psn()]), "", "a clean Service has no warning");
}

mod props {
    use proptest::prelude::*;

    use super::*;

    fn arb_ep() -> impl Strategy<Value = E> {
        let nodes: &'static [&'static str] = &["n1", "n2", "n3", ""];
        let zones: &'static [Option<&'static str>] = &[Some("a"), Some("b"), None, Some("")];
        let hint_sets: &'static [Option<&'static [&'static str]>] =
            &[None, Some(&[]), Some(&["n1"]), Some(&["n2"]), Some(&["n1", "n3"])];
        let zone_sets: &'static [Option<&'static [&'static str]>] =
            &[None, Some(&[]), Some(&["a"]), Some(&["b"]), Some(&["a", "b"])];
        (
            0u8..6,
            0..nodes.len(),
            0..zones.len(),
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<bool>()),
            0..hint_sets.len(),
            0..zone_sets.len(),
        )
            .prop_map(move |(ip, n, z, r, s, t, h, zs)| E {
                ip: ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"][ip as usize],
                node: nodes[n],
                zone: zones[z],
                ready: r,
                serving: s,
                terminating: t,
                for_nodes: hint_sets[h],
                for_zones: zone_sets[zs],
            })
    }

    proptest! {
        #[test]
        fn the_plan_never_panics_and_selects_only_usable_endpoints_of_the_service(
            eps in proptest::collection::vec(arb_ep(), 0..8),
            local in any::<bool>(),
            td in 0usize..4,
            node_name in 0usize..3,
            zone in proptest::option::of(0usize..2),
        ) {
            let s = Service {
                internal_policy: if local { Policy::Local } else { Policy::Cluster },
                traffic_distribution: [None, Some("PreferSameNode"), Some("PreferSameZone"), Some("Bogus")][td].map(str::to_owned),
                ..svc()
            };
            let mut m = model(s, &eps);
            hints::fill_missing(&mut m);
            let n = node(["n1", "n2", "n3"][node_name], zone.map(|z| ["a", "b"][z]));
            let p = plan::plan(&m, &n);
            for sp in &p.services {
                let usable: Vec<IpAddr> = eps.iter().map(E::build).filter(|e| e.is_ready() || (e.is_serving() && e.is_terminating())).filter_map(|e| e.address).collect();
                for t in [&sp.internal].into_iter().chain(sp.external.as_ref().map(|x| &x.from_outside)) {
                    for ep in t.endpoints.iter().chain(&t.tiers.node).chain(&t.tiers.zone).chain(&t.tiers.cluster) {
                        prop_assert!(usable.contains(&ep.ip()), "{ep} is not a usable endpoint");
                        prop_assert_eq!(ep.port(), 8080);
                    }
                    prop_assert_eq!(t.endpoints.is_empty(), t.when_empty.is_some());
                    if t.policy == Policy::Local {
                        let local_ips: Vec<IpAddr> = eps.iter().filter(|e| e.node == n.name).filter_map(|e| e.build().address).collect();
                        for ep in &t.endpoints {
                            prop_assert!(local_ips.contains(&ep.ip()));
                        }
                    }
                }
            }
        }
    }
}
