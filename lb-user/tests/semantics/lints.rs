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
