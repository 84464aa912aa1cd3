//! Agent-level tests of what point 3 of the "under pressure" issue asks: Services that failed to apply are
//! retried on a timer with backoff, two Services on one VIP:port resolve the same way whatever the order, and
//! backend marks go with the backend. Against the in-memory maps, with a manifests directory as the source.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use lb_testkit::{
    manifests::{Ep, Svc, to_yaml, write_atomic, write_service},
    sandbox::TempDir,
};

use super::{AgentCore, RETRY_FIRST};
use crate::{
    datapath::{self, DEFAULT_GRACE, MapReader as _, addr, fake::FakeMaps, marks},
    model::ObjKey,
    source::manifests::ManifestDir,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn agent(dir: &Path, max_slots: u32) -> AgentCore<FakeMaps> {
    AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), FakeMaps::new(64, max_slots))
}

fn eps(addrs: &[&str]) -> Vec<Ep> {
    addrs.iter().map(|a| Ep::ready(ip(a), "node-2")).collect()
}

/// Frontend address -> the Service name stored for its service id (what `status` and adoption read).
fn programmed(a: &AgentCore<FakeMaps>) -> BTreeMap<String, String> {
    let w = a.reconciler().writer();
    datapath::read_back(w)
        .unwrap()
        .into_iter()
        .map(|(k, rb)| {
            (addr::frontend_addr(&k).to_string(), w.name(rb.value.svc_id).unwrap().unwrap_or_default())
        })
        .collect()
}

#[test]
fn a_service_that_did_not_fit_is_programmed_once_capacity_is_freed_without_a_source_event() {
    let tmp = TempDir::new("agent-freed").unwrap();
    let dir = tmp.path();
    let two = eps(&["10.0.0.1", "10.0.0.2"]);
    write_service(dir, &Svc::new("alpha", ip("10.96.0.11"), 80, 8080), &two).unwrap();
    write_service(dir, &Svc::new("beta", ip("10.96.0.12"), 80, 8080), &two).unwrap();
    let mut a = agent(dir, 3);
    let t0 = Instant::now();
    assert_eq!(a.sync(t0).unwrap().errors.len(), 1, "beta does not fit");
    std::fs::remove_file(dir.join("alpha.yaml")).unwrap();
    // alpha's slots are freed only after the grace period (and beta's backoff is not due yet).
    let r = a.sync(t0).unwrap();
    assert_eq!((r.removed, r.added, r.errors.len()), (1, 0, 0), "{:?}", r.errors);
    assert!(a.retry_due(t0).is_none(), "nothing is due before the grace period ends");
    // No further source event: the loop's tick retries it once the slots are free.
    let r = a.retry_due(t0 + DEFAULT_GRACE).expect("a retry once capacity is free");
    assert_eq!((r.added, r.errors.len()), (1, 0), "{:?}", r.errors);
    assert_eq!(programmed(&a).into_values().collect::<Vec<_>>(), ["default/beta:main"]);
    assert!(a.unprogrammed().is_empty());
    assert!(a.retry_due(t0 + Duration::from_mins(5)).is_none(), "nothing left to retry");
}

#[test]
fn a_service_that_never_fits_is_retried_with_doubling_waits_and_named_with_its_reason() {
    let tmp = TempDir::new("agent-backoff").unwrap();
    let dir = tmp.path();
    write_service(
        dir,
        &Svc::new("big", ip("10.96.0.11"), 80, 8080),
        &eps(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
    )
    .unwrap();
    let mut a = agent(dir, 2);
    let t0 = Instant::now();
    assert_eq!(a.sync(t0).unwrap().errors.len(), 1);
    let mut tries = Vec::new();
    let mut t = t0;
    while t < t0 + Duration::from_secs(20) {
        t += Duration::from_millis(100);
        if let Some(r) = a.retry_due(t) {
            assert_eq!(r.errors.len(), 1, "still does not fit");
            tries.push((t - t0).as_millis());
        }
    }
    assert_eq!(tries, [1000, 3000, 7000, 15000], "waits of 1, 2, 4, 8 s");
    assert_eq!(RETRY_FIRST, Duration::from_secs(1));
    let u = a.unprogrammed();
    assert_eq!(u.len(), 1);
    assert_eq!((u[0].service.to_string(), u[0].attempts), ("default/big".to_owned(), 5));
    assert!(
        u[0].reasons[0].contains("map SLOTS is full") && u[0].reasons[0].contains("--max-slots"),
        "{u:?}"
    );
    assert_eq!(u[0].next_retry, Some(t0 + Duration::from_secs(15 + 16)));
}

#[test]
fn two_services_on_one_vip_the_first_by_name_wins_in_any_order_and_the_other_takes_over_when_it_leaves() {
    let vip = ip("10.96.0.10");
    let a_svc = Svc::new("a", vip, 80, 8080);
    let b_svc = Svc::new("b", vip, 80, 8080);
    for a_first in [true, false] {
        let tmp = TempDir::new("agent-vip").unwrap();
        let dir = tmp.path();
        let mut agent = agent(dir, 64);
        let t0 = Instant::now();
        let with_a = (&a_svc, eps(&["10.0.0.1"]));
        let with_b = (&b_svc, eps(&["10.0.0.2"]));
        let (first, second) = if a_first { (with_a, with_b) } else { (with_b, with_a) };
        write_service(dir, first.0, &first.1).unwrap();
        agent.sync(t0).unwrap();
        write_service(dir, second.0, &second.1).unwrap();
        let r = agent.sync(t0).unwrap();
        assert_eq!((r.errors.len(), r.frontends), (0, 1));
        assert_eq!(r.conflicts.len(), 1, "reported once, when it starts");
        let conflict = &r.conflicts[0];
        assert_eq!(
            (addr::frontend_addr(&conflict.frontend).to_string(), &conflict.winner, &conflict.losers),
            ("10.96.0.10:80".to_owned(), &ObjKey::new("default", "a"), &vec![ObjKey::new("default", "b")])
        );
        assert_eq!(programmed(&agent)["10.96.0.10:80"], "default/a:main", "a_first: {a_first}");
        let tiers =
            datapath::read_back(agent.reconciler().writer()).unwrap().into_values().next().unwrap().tiers;
        assert_eq!(tiers[2], [addr::backend("10.0.0.1:8080".parse().unwrap(), 6)], "a's endpoints");
        let u = agent.unprogrammed();
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].service, ObjKey::new("default", "b"));
        assert!(
            u[0].reasons[0].contains("default/b is NOT programmed there until default/a leaves it"),
            "{u:?}"
        );
        assert_eq!(agent.sync(t0).unwrap().conflicts.len(), 0, "not reported again while unchanged");

        // The winner leaves: b is programmed, under its own name, with no restart and no edit of b.
        std::fs::remove_file(dir.join("a.yaml")).unwrap();
        let r = agent.sync(t0).unwrap();
        assert_eq!((r.updated, r.errors.len()), (1, 0), "one swap: {:?}", r.errors);
        assert_eq!(programmed(&agent)["10.96.0.10:80"], "default/b:main");
        assert!(agent.unprogrammed().is_empty());
        let tiers =
            datapath::read_back(agent.reconciler().writer()).unwrap().into_values().next().unwrap().tiers;
        assert_eq!(tiers[2], [addr::backend("10.0.0.2:8080".parse().unwrap(), 6)], "b's endpoints");

        // A fresh agent on the same files programs the same.
        let mut fresh = self::agent(dir, 64);
        fresh.sync(t0).unwrap();
        assert_eq!(programmed(&fresh), programmed(&agent));
    }
}

#[test]
fn a_mark_is_cleared_when_its_backend_leaves_every_service_and_kept_while_one_holds_it() {
    let tmp = TempDir::new("agent-marks").unwrap();
    let dir = tmp.path();
    let web = Svc::new("web", ip("10.96.0.10"), 80, 8080);
    let api = Svc::new("api", ip("10.96.0.11"), 80, 8080);
    write_service(dir, &web, &eps(&["10.0.0.1", "10.0.0.2"])).unwrap();
    write_service(dir, &api, &eps(&["10.0.0.1"])).unwrap();
    let mut a = agent(dir, 64);
    a.sync(Instant::now()).unwrap();
    let be = |s: &str| addr::backend(s.parse::<SocketAddr>().unwrap(), 6);
    let now = marks::boottime_ns();
    for b in ["10.0.0.1:8080", "10.0.0.2:8080"] {
        marks::mark_down(a.reconciler_mut().writer_mut(), be(b), Duration::from_mins(10), now).unwrap();
    }
    assert_eq!(a.sweep_marks(now, true).unwrap(), marks::SweepReport::default(), "both are held");
    // 10.0.0.1 leaves web but api still holds it; 10.0.0.2 leaves every Service.
    write_service(dir, &web, &eps(&["10.0.0.3"])).unwrap();
    a.sync(Instant::now()).unwrap();
    let r = a.sweep_marks(now, true).unwrap();
    assert_eq!(r.departed, [be("10.0.0.2:8080")]);
    assert_eq!(a.reconciler().writer().backends_down().unwrap(), [be("10.0.0.1:8080")]);
    // A pod reusing 10.0.0.2 later starts unmarked.
    write_service(dir, &web, &eps(&["10.0.0.2"])).unwrap();
    a.sync(Instant::now()).unwrap();
    assert!(!a.reconciler().writer().backends_down().unwrap().contains(&be("10.0.0.2:8080")));
}

#[test]
fn passive_health_is_forgotten_when_its_backend_leaves_every_service_and_reported_once_per_hold() {
    let tmp = TempDir::new("agent-health").unwrap();
    let dir = tmp.path();
    let web = Svc::new("web", ip("10.96.0.10"), 80, 8080);
    write_service(dir, &web, &eps(&["10.0.0.1", "10.0.0.2"])).unwrap();
    let mut a = agent(dir, 64);
    a.sync(Instant::now()).unwrap();
    let be = |s: &str| addr::backend(s.parse::<SocketAddr>().unwrap(), 6);
    // What the kernel wrote: 10.0.0.1 held down, 10.0.0.2 failing.
    let held = lb_common::Health {
        backend: be("10.0.0.1:8080"),
        held_since_ns: 1,
        held_until_ns: u64::MAX,
        holds: 1,
        ..Default::default()
    };
    let failing = lb_common::Health { backend: be("10.0.0.2:8080"), failures: 2, ..Default::default() };
    a.reconciler_mut().writer_mut().put_health(held);
    a.reconciler_mut().writer_mut().put_health(failing);
    let mut last = BTreeMap::new();
    let r = a.sweep_health(&mut last, true).unwrap();
    assert_eq!((r.held.len(), r.departed.len()), (1, 0), "{r:?}");
    assert!(a.sweep_health(&mut last, true).unwrap().held.is_empty(), "one hold is reported once");
    // Both leave the Service: the EndpointSlice is the source of truth, their health goes.
    write_service(dir, &web, &eps(&["10.0.0.3"])).unwrap();
    a.sync(Instant::now()).unwrap();
    let r = a.sweep_health(&mut last, true).unwrap();
    assert_eq!(r.departed, [be("10.0.0.1:8080"), be("10.0.0.2:8080")]);
    assert!(r.recovered.is_empty(), "a departed backend is not reported healthy");
    assert!(a.reconciler().writer().health().unwrap().is_empty());
}

#[test]
fn plan_and_explain_name_both_services_on_one_vip_and_which_is_programmed() {
    let tmp = TempDir::new("plan-vip").unwrap();
    let dir = tmp.path();
    for name in ["b", "a"] {
        write_service(dir, &Svc::new(name, ip("10.96.0.10"), 80, 8080), &eps(&["10.0.0.1"])).unwrap();
    }
    write_service(dir, &Svc::new("c", ip("10.96.0.10"), 443, 8443), &eps(&["10.0.0.1"])).unwrap();
    let model = ManifestDir::new(dir).load().unwrap().model;
    let node = crate::model::NodeInfo::resolve("node-1", None, &model);
    let p = crate::plan::plan(&model, &node);
    let lints = crate::lint::lint(&model, &node, &p);
    let warnings = |svc: &str| {
        p.services
            .iter()
            .zip(&lints.ports)
            .filter(|(s, _)| *s.name.service.name == *svc)
            .flat_map(|(_, w)| w.clone())
            .collect::<Vec<_>>()
    };
    let rule = "(of Services on one VIP:port, a cluster IP wins over an external address, then the oldest \
                Service, then the first in namespace/name order is programmed)";
    assert_eq!(
        warnings("a"),
        [format!("10.96.0.10:80/TCP is also claimed by default/b: default/a is programmed {rule}")]
    );
    assert_eq!(
        warnings("b"),
        [format!(
            "10.96.0.10:80/TCP is also claimed by default/a: default/b is NOT programmed there until default/a \
             leaves it {rule}"
        )]
    );
    assert!(warnings("c").is_empty(), "another port of the VIP is no conflict");
    let text = crate::explain::explain(&model, &node, &ObjKey::new("default", "b")).unwrap();
    assert!(text.contains("warning: 10.96.0.10:80/TCP is also claimed by default/a"), "{text}");
}

/// Two Services list one externalIP (kubernetes#69599): the one created first keeps it, in the plan and in
/// the agent's maps, though the later one's namespace sorts first; the warning names both.
#[test]
fn of_two_services_on_one_external_ip_the_older_is_programmed_whatever_the_names() {
    let tmp = TempDir::new("plan-older").unwrap();
    let dir = tmp.path();
    for (ns, vip, created, ep) in [
        ("shop", "10.96.0.10", "2026-01-02T03:04:05Z", "10.0.0.1"),
        ("aaa", "10.96.0.20", "2026-06-01T00:00:00Z", "10.0.0.2"),
    ] {
        let mut docs = vec![Svc::new("web", ip(vip), 80, 8080).service()];
        docs.extend(Svc::new("web", ip(vip), 80, 8080).slices(&eps(&[ep])));
        for d in &mut docs {
            d["metadata"]["namespace"] = serde_json::json!(ns);
        }
        docs[0]["metadata"]["creationTimestamp"] = serde_json::json!(created);
        docs[0]["spec"]["externalIPs"] = serde_json::json!(["192.0.2.80"]);
        write_atomic(dir, &format!("{ns}.yaml"), &to_yaml(&docs)).unwrap();
    }
    let model = ManifestDir::new(dir).load().unwrap().model;
    let node = crate::model::NodeInfo::resolve("node-1", None, &model);
    let p = crate::plan::plan(&model, &node);
    let lints = crate::lint::lint(&model, &node, &p);
    let warned: Vec<String> = lints.ports.iter().flatten().map(ToString::to_string).collect();
    assert!(
        warned
            .iter()
            .any(|w| w.contains("192.0.2.80:80/TCP is also claimed by shop/web: aaa/web is NOT programmed")),
        "{warned:?}"
    );
    let mut a = agent(dir, 1 << 16);
    a.sync(Instant::now()).unwrap();
    let on = programmed(&a);
    assert_eq!(on.get("192.0.2.80:80").map(String::as_str), Some("shop/web:main"), "{on:?}");
}

/// A Service and its slices, each carrying `labels` (the EndpointSlice controller copies a Service's labels
/// to its slices).
fn write_labelled(dir: &Path, svc: &Svc, labels: &serde_json::Value) {
    let mut docs = vec![svc.service()];
    docs.extend(svc.slices(&eps(&["10.0.0.1"])));
    for d in &mut docs {
        let meta = d["metadata"].as_object_mut().unwrap();
        let l = meta.entry("labels").or_insert_with(|| serde_json::json!({}));
        for (k, v) in labels.as_object().unwrap() {
            l[k] = v.clone();
        }
    }
    write_atomic(dir, &format!("{}.yaml", svc.name), &to_yaml(&docs)).unwrap();
}

#[test]
fn a_service_meant_for_another_proxy_or_on_sctp_is_not_programmed_and_follows_its_label() {
    let tmp = TempDir::new("agent-proxy-label").unwrap();
    let dir = tmp.path();
    let none = serde_json::json!({});
    let other_proxy = serde_json::json!({"service.kubernetes.io/service-proxy-name": "kube-router"});
    write_labelled(dir, &Svc::new("web", ip("10.96.0.10"), 80, 8080), &none);
    write_labelled(dir, &Svc::new("routed", ip("10.96.0.20"), 80, 8080), &other_proxy);
    let mut sctp = Svc::new("diameter", ip("10.96.0.30"), 3868, 3868);
    sctp.protocol = "SCTP";
    write_labelled(dir, &sctp, &none);
    let mut a = agent(dir, 64);
    let t0 = Instant::now();
    a.sync(t0).unwrap();
    let only = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    };
    assert_eq!(programmed(&a), only(&[("10.96.0.10:80", "default/web:main")]));
    // The label goes: the Service is programmed. It comes back, or the other label appears: it leaves.
    write_labelled(dir, &Svc::new("routed", ip("10.96.0.20"), 80, 8080), &none);
    let r = a.sync(t0).unwrap();
    assert_eq!((r.added, r.removed), (1, 0));
    assert_eq!(
        programmed(&a),
        only(&[("10.96.0.10:80", "default/web:main"), ("10.96.0.20:80", "default/routed:main")])
    );
    write_labelled(
        dir,
        &Svc::new("web", ip("10.96.0.10"), 80, 8080),
        &serde_json::json!({"service.kubernetes.io/headless": ""}),
    );
    let r = a.sync(t0).unwrap();
    assert_eq!((r.added, r.removed), (0, 1));
    assert_eq!(programmed(&a), only(&[("10.96.0.20:80", "default/routed:main")]));
}

#[tokio::test]
async fn the_api_servers_address_comes_from_the_client_config_with_its_default_port() {
    let at = |url: &str| {
        let mut config = kube::Config::new(url.parse().unwrap());
        config.default_namespace = "default".into();
        config
    };
    let addrs = |url: &'static str| async move { crate::source::kube::api_server_addresses(&at(url)).await };
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert_eq!(addrs("https://192.168.0.10:6443").await, [sa("192.168.0.10:6443")]);
    assert_eq!(addrs("https://192.168.0.10").await, [sa("192.168.0.10:443")]);
    assert_eq!(addrs("https://[fd00::10]:6443").await, [sa("[fd00::10]:6443")]);
    // A name resolves as the client resolves it (here through /etc/hosts).
    assert!(addrs("https://localhost:6443").await.contains(&sa("127.0.0.1:6443")));
}

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
    // As JSON documents (YAML too): serde_yaml's writer would take longer than the agent's reading.
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
            super::ServiceLimits { slots: 2, ..super::DEFAULT_LIMITS },
            "3 backend slots",
            "--max-slots-per-service 2",
        ),
        (
            "frontends",
            super::ServiceLimits { frontends: 0, ..super::DEFAULT_LIMITS },
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

/// The memory structure, not a figure: after a sync, each Service and EndpointSlice is one allocation shared
/// by the source and the model (a deep copy anywhere on the way makes its count 1), node and zone names,
/// hint lists and namespaces are one allocation each however many endpoints and keys name them, and a slice
/// holds exactly its endpoints. The maps rebuilt with full nodes (`repack`, after a large sync) still serve
/// the next edit.
#[test]
fn objects_are_stored_once_and_names_shared_across_the_source_and_the_model() {
    use std::sync::Arc;
    let tmp = TempDir::new("agent-memory").unwrap();
    let dir = tmp.path();
    for (name, vip) in [("alpha", "10.96.0.11"), ("beta", "10.96.0.12")] {
        let eps = [
            Ep::ready(ip("10.0.0.1"), "node-1").zone("a").prefer_same_node(),
            Ep::ready(ip("10.0.0.2"), "node-2").zone("a").prefer_same_node(),
        ];
        write_service(dir, &Svc::new(name, ip(vip), 80, 8080), &eps).unwrap();
    }
    let mut a = agent(dir, 64);
    a.sync(Instant::now()).unwrap();
    let m = a.model();
    assert_eq!(m.services.len(), 2);
    for svc in m.services.values() {
        assert_eq!(Arc::strong_count(svc), 2, "{}: held by the source and the model only", svc.key);
    }
    let slices: Vec<Arc<crate::model::EndpointSlice>> =
        m.slices.values().map(|s| m.slices.get_shared(&s.key).unwrap()).collect();
    assert_eq!(slices.len(), 2);
    for s in &slices {
        // The source's, the model's and the one taken just above.
        assert_eq!(Arc::strong_count(s), 3, "{}: held by the source and the model only", s.key);
        // Its endpoints are a boxed slice: no spare room by type.
    }
    let (x, y) = (&slices[0].endpoints[0], &slices[1].endpoints[0]);
    assert_eq!(x.node_name.as_deref(), Some("node-1"));
    assert!(
        crate::model::Name::ptr_eq(x.node_name.as_ref().unwrap(), y.node_name.as_ref().unwrap()),
        "node name copied"
    );
    assert!(crate::model::Name::ptr_eq(x.zone.as_ref().unwrap(), y.zone.as_ref().unwrap()), "zone copied");
    assert_eq!(x.hints, y.hints);
    let (xn, yn) = (x.hints.for_nodes().unwrap(), y.hints.for_nodes().unwrap());
    assert_eq!(xn.as_slice(), [crate::model::intern("node-1")]);
    assert!(Arc::ptr_eq(xn, yn), "forNodes list copied");
    assert!(Arc::ptr_eq(x.hints.for_zones().unwrap(), y.hints.for_zones().unwrap()), "forZones list copied");
    assert!(
        crate::model::Name::ptr_eq(&slices[0].key.namespace, &slices[1].key.namespace),
        "namespace copied"
    );
    let keys: Vec<&ObjKey> = m.services.keys().collect();
    assert!(crate::model::Name::ptr_eq(&keys[0].namespace, &keys[1].namespace), "namespace copied");
    drop(slices);
    let before = programmed(&a);
    a.repack();
    assert_eq!(programmed(&a), before, "repacking changed what is programmed");
    let eps = [Ep::ready(ip("10.0.0.3"), "node-1")];
    write_service(dir, &Svc::new("alpha", ip("10.96.0.11"), 80, 8080), &eps).unwrap();
    let edit = a.sync(Instant::now()).unwrap();
    assert_eq!((edit.added, edit.updated, edit.removed), (0, 1, 0), "the edit after a repack");
}

/// The memory structure of planning, not a figure: what a planned Service wants is held, until the sync's
/// end, for every Service at once, so it is a list exactly its size (a map per Service took a 1.2 KiB
/// B-tree leaf even for one frontend), sorted by key with each key once, as the reconciler's map reads it.
#[test]
fn a_planned_services_frontends_are_a_sorted_list_exactly_its_size() {
    let tmp = TempDir::new("agent-lowered").unwrap();
    let dir = tmp.path();
    let mut svc = Svc::new("web", ip("10.96.0.11"), 80, 8080);
    svc.cluster_ips.push(ip("fd00::11"));
    svc.health_check_node_port = Some(32001);
    let eps = [Ep::ready(ip("10.0.0.1"), "node-1"), Ep::ready(ip("fd00::1"), "node-2")];
    write_service(dir, &svc, &eps).unwrap();
    let model = ManifestDir::new(dir).load().unwrap().model;
    let node = crate::model::NodeInfo::resolve("node-1", None, &model);
    let s = model.services.values().next().unwrap();
    let slices: Vec<&crate::model::EndpointSlice> = model.slices_of(&s.key).collect();
    let mine = super::lower::frontends(&crate::plan::plan_service(s, &slices, &node));
    assert_eq!(mine.len(), 2, "one frontend per cluster IP: {mine:?}");
    assert_eq!(mine.capacity(), mine.len(), "spare room held for the whole sync");
    assert!(mine.windows(2).all(|w| w[0].0 < w[1].0), "not sorted, or a key twice: {mine:?}");
}

/// A full sync of more Services than one thread plans (`PARALLEL_PLAN_MIN`): each is booked as its own, in
/// any order the threads finish. 1,500 Services of 1, 2 or 3 endpoints under a limit of 2 slots: every
/// third is refused for its slots and named so, every other VIP is programmed with its own Service's name
/// and endpoints.
#[test]
fn services_planned_on_two_threads_are_each_booked_as_their_own() {
    let tmp = TempDir::new("agent-parallel-plan").unwrap();
    let dir = tmp.path();
    let count = 1_500u32;
    let mut docs = Vec::new();
    for i in 0..count {
        let vip = IpAddr::from([10, 96, (i >> 8) as u8, i as u8]);
        let eps: Vec<Ep> =
            (0..=i % 3).map(|e| Ep::ready(IpAddr::from([10, 1, e as u8, 1]), "node-2")).collect();
        let svc = Svc::new(&format!("s{i}"), vip, 80, 8080);
        docs.push(svc.service().to_string());
        docs.extend(svc.slices(&eps).iter().map(ToString::to_string));
    }
    write_atomic(dir, "all.yaml", &docs.join("\n---\n")).unwrap();
    let limits = super::limits::ServiceLimits { slots: 2, ..super::limits::DEFAULT_LIMITS };
    let maps = FakeMaps::new(4096, 1 << 14);
    let mut agent = AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), maps).with_limits(limits);
    let report = agent.sync(Instant::now()).unwrap();
    assert!(
        report.errors.is_empty(),
        "{} errors, the first {:?}",
        report.errors.len(),
        report.errors.first()
    );
    let refused: Vec<u32> = (0..count).filter(|i| i % 3 == 2).collect();
    assert_eq!(report.frontends, (count as usize) - refused.len());
    let on = programmed(&agent);
    assert_eq!(on.len(), (count as usize) - refused.len());
    let w = agent.reconciler().writer();
    let backends: BTreeMap<String, usize> = datapath::read_back(w)
        .unwrap()
        .into_values()
        .map(|rb| (w.name(rb.value.svc_id).unwrap().unwrap(), rb.tiers[2].len()))
        .collect();
    for i in (0..count).filter(|i| i % 3 != 2) {
        let vip = format!("10.96.{}.{}:80", i >> 8, i & 0xff);
        let name = format!("default/s{i}:main");
        assert_eq!(on.get(&vip), Some(&name), "{vip}");
        assert_eq!(backends[&name], (i % 3 + 1) as usize, "{name}'s endpoints");
    }
    let u: BTreeMap<String, String> =
        agent.unprogrammed().into_iter().map(|u| (u.service.to_string(), u.reasons.join("; "))).collect();
    assert_eq!(u.len(), refused.len());
    for i in refused {
        assert!(u[&format!("default/s{i}")].contains("3 backend slots"), "{u:?}");
    }
}
