//! Agent-level tests of what point 3 of the "under pressure" issue asks: Services that failed to apply are
//! retried on a timer with backoff, two Services on one VIP:port resolve the same way whatever the order, and
//! backend marks go with the backend. Against the in-memory maps, with a manifests directory as the source.
//! `limits`: what one Service may take; `scale`: the memory structure and the planning of a large sync.
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
    // Room for one entry of the slot map: alpha's two slots.
    let mut a = agent(dir, 1);
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
    // Nine slots: two entries of the slot map, which has room for one.
    let nine: Vec<String> = (1..=9).map(|i| format!("10.0.0.{i}")).collect();
    let nine: Vec<&str> = nine.iter().map(String::as_str).collect();
    write_service(dir, &Svc::new("big", ip("10.96.0.11"), 80, 8080), &eps(&nine)).unwrap();
    let mut a = agent(dir, 1);
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

mod limits;
mod scale;
