//! Lint warnings of the plan.
use super::*;

#[test]
fn lints_name_the_problem() {
    let warn = |s: Service, eps: &[E]| {
        let (m, n) = (model(s, eps), node("n1", None));
        lint::lint(&m, &n, &plan::plan(&m, &n)).ports[0].join("\n")
    };
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
            "1 of 2 ready endpoints carry no forNodes hint: 10.0.0.2 (node n2): node hints apply only when every \
             ready endpoint has one, so no node prefers its own endpoint",
        ),
        (
            "no hint at all on one of two, named once",
            psn(),
            vec![e("10.0.0.1", "n1").psn().zones(&["a"]), e("10.0.0.2", "n2")],
            "1 of 2 ready endpoints carry no forNodes hint and no forZones hint: 10.0.0.2 (node n2): node and zone \
             hints apply only when every ready endpoint has one",
        ),
        (
            // The control plane wrote zone hints only (PreferSameNode unknown to it): every endpoint is named.
            "PreferSameNode, forZones only",
            psn(),
            vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").zones(&["a"])],
            "2 of 2 ready endpoints carry no forNodes hint (forZones only): 10.0.0.1 (node n1), 10.0.0.2 (node \
             n2): node hints apply only when every ready endpoint has one",
        ),
        (
            "two of three without forNodes, each named",
            psn(),
            vec![
                e("10.0.0.1", "n1").psn(),
                e("10.0.0.2", "n2").zones(&["a"]),
                e("10.0.0.3", "n3").zones(&["a"]),
            ],
            "2 of 3 ready endpoints carry no forNodes hint (forZones only): 10.0.0.2 (node n2), 10.0.0.3 (node n3)",
        ),
        (
            "a zone hint missing beside others",
            Service { traffic_distribution: Some("PreferSameZone".into()), ..svc() },
            vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").nodes(&["n2"])],
            "1 of 2 ready endpoints carry no forZones hint: 10.0.0.2 (node n2)",
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
