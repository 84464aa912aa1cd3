//! The limits one Service may take (`--max-*-per-service`): a Service over one is refused and keeps what it
//! had, named with its reason, and the others are applied.
use std::{collections::BTreeMap, time::Instant};

use lb_testkit::{
    manifests::{Ep, Svc, to_yaml, write_atomic, write_service},
    sandbox::TempDir,
};

use super::{agent, eps, ip, programmed};
use crate::{
    agent::AgentCore,
    datapath::{self, MapReader as _, fake::FakeMaps},
};

/// `web`'s manifests with `n` ready endpoints on node-2 in slices of 1,000 (the API's maximum per slice).
fn big(name: &str, vip: &str, n: u32, external_ips: u32) -> Vec<serde_json::Value> {
    let svc = Svc::new(name, ip(vip), 80, 8080);
    let mut docs = vec![svc.service()];
    if external_ips > 0 {
        let ips: Vec<String> =
            (0..external_ips).map(|i| format!("198.18.{}.{}", i / 250, i % 250 + 1)).collect();
        docs[0]["spec"]["externalIPs"] = serde_json::json!(ips);
    }
    let all: Vec<Ep> = (0..n)
        .map(|i| Ep::ready(ip(&format!("10.{}.{}.{}", 100 + i / 65_536, i / 256 % 256, i % 256)), "node-2"))
        .collect();
    for (k, chunk) in all.chunks(1000).enumerate() {
        for mut slice in svc.slices(chunk) {
            slice["metadata"]["name"] = serde_json::json!(format!("{name}-{k}"));
            docs.push(slice);
        }
    }
    docs
}

/// One Service over a per-Service limit (5,000 externalIPs; 100,000 endpoints) is refused with its reason
/// and keeps what it had programmed; another Service's edit in the same sync is applied; back within its
/// limits, it is programmed.
#[test]
fn a_service_over_its_limits_is_refused_and_the_others_are_applied() {
    let tmp = TempDir::new("agent-limits").unwrap();
    let dir = tmp.path();
    write_service(dir, &Svc::new("web", ip("10.96.0.10"), 80, 8080), &eps(&["10.0.0.1"])).unwrap();
    write_atomic(dir, "ips.yaml", &to_yaml(&big("ips", "10.96.0.11", 2, 5_000))).unwrap();
    // As JSON documents (YAML too): a YAML writer would take longer than the agent's reading.
    let docs: Vec<String> = big("eps", "10.96.0.12", 100_000, 0).iter().map(ToString::to_string).collect();
    write_atomic(dir, "eps.yaml", &docs.join("\n---\n")).unwrap();
    write_atomic(dir, "grows.yaml", &to_yaml(&big("grows", "10.96.0.13", 2, 2))).unwrap();
    let mut a = agent(dir, 1 << 16);
    let t0 = Instant::now();
    let r = a.sync(t0).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let on = programmed(&a);
    let names: Vec<&str> = on.values().map(String::as_str).collect();
    assert!(names.contains(&"default/web:main") && names.contains(&"default/grows:main"), "{on:?}");
    assert!(!names.iter().any(|n| n.starts_with("default/ips") || n.starts_with("default/eps")), "{on:?}");
    let reasons = |a: &AgentCore<FakeMaps>| -> BTreeMap<String, String> {
        a.unprogrammed().into_iter().map(|u| (u.service.to_string(), u.reasons.join("; "))).collect()
    };
    let u = reasons(&a);
    assert_eq!(u.len(), 2, "{u:?}");
    assert!(
        u["default/ips"].contains("over its limit: 5000 externalIPs")
            && u["default/ips"].contains("--max-external-ips-per-service 1024"),
        "{u:?}"
    );
    assert!(
        u["default/eps"].contains("100000 endpoints")
            && u["default/eps"].contains("--max-endpoints-per-service 50000"),
        "{u:?}"
    );
    let grows_before: Vec<String> = on.keys().filter(|k| k.starts_with("198.18.")).cloned().collect();
    assert_eq!(grows_before.len(), 2, "grows' two externalIPs: {on:?}");

    // In one sync: web gets a second endpoint, grows goes over the limit, ips stays over it.
    write_service(dir, &Svc::new("web", ip("10.96.0.10"), 80, 8080), &eps(&["10.0.0.1", "10.0.0.2"]))
        .unwrap();
    write_atomic(dir, "grows.yaml", &to_yaml(&big("grows", "10.96.0.13", 2, 2_000))).unwrap();
    let r = a.sync(t0).unwrap();
    assert_eq!((r.updated, r.errors.len()), (1, 0), "web's edit applied: {r:?}");
    let web = datapath::read_back(a.reconciler().writer())
        .unwrap()
        .into_values()
        .find(|rb| {
            a.reconciler().writer().name(rb.value.svc_id).unwrap().as_deref() == Some("default/web:main")
        })
        .unwrap();
    assert_eq!(web.tiers[2].len(), 2, "web's two endpoints");
    let on = programmed(&a);
    let grows_now: Vec<String> = on.keys().filter(|k| k.starts_with("198.18.")).cloned().collect();
    assert_eq!(grows_now, grows_before, "grows keeps what it had");
    assert!(reasons(&a)["default/grows"].contains("2000 externalIPs"), "{:?}", reasons(&a));

    // Back within its limits: programmed, and no longer reported.
    write_atomic(dir, "grows.yaml", &to_yaml(&big("grows", "10.96.0.13", 2, 3))).unwrap();
    a.sync(t0).unwrap();
    assert_eq!(programmed(&a).keys().filter(|k| k.starts_with("198.18.")).count(), 3);
    assert!(!reasons(&a).contains_key("default/grows"));
}

/// The limits checked after planning: frontends and slots of one Service (a Service with 3 endpoints over a
/// slot limit of 2; one with 2 frontends over a frontend limit of 1).
#[test]
fn the_frontend_and_slot_limits_refuse_a_service_after_planning() {
    let tmp = TempDir::new("agent-limits2").unwrap();
    let dir = tmp.path();
    write_service(
        dir,
        &Svc::new("three", ip("10.96.0.20"), 80, 8080),
        &eps(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
    )
    .unwrap();
    let cases = [
        (
            "slots",
            crate::agent::ServiceLimits { slots: 2, ..crate::agent::DEFAULT_LIMITS },
            "3 backend slots",
            "--max-slots-per-service 2",
        ),
        (
            "frontends",
            crate::agent::ServiceLimits { frontends: 0, ..crate::agent::DEFAULT_LIMITS },
            "1 frontends",
            "--max-frontends-per-service 0",
        ),
    ];
    for (what, limits, count, flag) in cases {
        let mut a = agent(dir, 1 << 10).with_limits(limits);
        a.sync(Instant::now()).unwrap();
        assert!(programmed(&a).is_empty(), "{what}");
        let u = a.unprogrammed();
        assert_eq!(u.len(), 1, "{what}");
        assert!(
            u[0].reasons[0].contains(count) && u[0].reasons[0].contains(flag),
            "{what}: {:?}",
            u[0].reasons
        );
    }
}
