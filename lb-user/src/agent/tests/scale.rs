//! The memory structure and the planning of a large sync: objects and names stored once across the source
//! and the model, a Service's planned frontends exactly their size, and a full sync planned on two threads.
use std::{collections::BTreeMap, net::IpAddr, time::Instant};

use lb_testkit::manifests::{Ep, Svc, write_atomic, write_service};
use lb_testkit::sandbox::TempDir;

use super::{agent, ip, programmed};
use crate::{
    agent::AgentCore,
    datapath::{self, MapReader as _, fake::FakeMaps},
    model::ObjKey,
    source::manifests::ManifestDir,
};

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
    let mine = crate::agent::lower::frontends(&crate::plan::plan_service(s, &slices, &node));
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
    let limits = crate::agent::ServiceLimits { slots: 2, ..crate::agent::DEFAULT_LIMITS };
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
