//! `AgentCore` against in-memory maps and a manifests directory.
use std::net::IpAddr;

use std::path::Path;

use super::*;
use crate::{
    datapath::{self, MapReader as _, fake::FakeMaps},
    source::manifests::ManifestDir,
};
use lb_testkit::{
    manifests::{Ep, Svc, node, to_yaml, write_atomic, write_service},
    sandbox::TempDir,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn core(dir: &Path) -> AgentCore<FakeMaps> {
    AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), FakeMaps::new(64, 1024))
}

/// What the data path sees, without service ids and generations: frontend -> (label, tiers, flags).
fn maps(
    c: &AgentCore<FakeMaps>,
) -> BTreeMap<lb_common::FrontendKey, (String, [Vec<lb_common::Backend>; 3], u32)> {
    let w = c.reconciler().writer();
    datapath::read_back(w)
        .unwrap()
        .into_iter()
        .map(|(k, rb)| (k, (w.name(rb.value.svc_id).unwrap().unwrap_or_default(), rb.tiers, rb.value.flags)))
        .collect()
}

type Edit = Box<dyn Fn(&Path)>;

fn web() -> Svc {
    let mut s = Svc::new("web", ip("10.96.0.10"), 80, 8080);
    s.traffic_distribution = Some("PreferSameNode".into());
    s
}

fn ep(addr: &str, node: &str, zone: &str) -> Ep {
    Ep::ready(ip(addr), node).zone(zone)
}

fn nodes(zone_of_node_1: &str) -> String {
    to_yaml(&[node("node-1", Some(zone_of_node_1)), node("node-2", Some("b"))])
}

#[test]
fn a_service_that_did_not_fit_is_tried_again_on_the_next_sync() {
    let tmp = TempDir::new("agent-retry").unwrap();
    let dir = tmp.path();
    let two = [ep("10.0.0.1", "node-1", "a"), ep("10.0.0.2", "node-2", "b")];
    write_service(dir, &Svc::new("alpha", ip("10.96.0.11"), 80, 8080), &two).unwrap();
    write_service(dir, &Svc::new("beta", ip("10.96.0.12"), 80, 8080), &two).unwrap();
    // Room for one entry of the slot map (8 slots): alpha fits, beta does not.
    let mut agent = AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), FakeMaps::new(64, 1));
    let r = agent.sync(Instant::now()).unwrap();
    assert_eq!((r.added, r.errors.len()), (1, 1), "{:?}", r.errors);
    // alpha goes away (after its grace period its slots are free); beta's file is untouched.
    std::fs::remove_file(dir.join("alpha.yaml")).unwrap();
    let later = Instant::now() + datapath::DEFAULT_GRACE * 2;
    agent.collect_garbage(later);
    let r = agent.sync(later).unwrap();
    assert_eq!(r.removed, 1);
    agent.collect_garbage(later + datapath::DEFAULT_GRACE * 2);
    let r = agent.sync(later + datapath::DEFAULT_GRACE * 2).unwrap();
    assert_eq!((r.added, r.errors.len()), (1, 0), "beta tried again: {:?}", r.errors);
    assert_eq!(
        maps(&agent).values().map(|(label, ..)| label.as_str()).collect::<Vec<_>>(),
        ["default/beta:main"]
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one table of edits, a row each; split, it would no longer be one table"
)]
fn incremental_syncs_program_exactly_what_a_full_sync_would() {
    let tmp = TempDir::new("agent-incremental").unwrap();
    let dir = tmp.path();
    write_service(dir, &web(), &[ep("10.0.0.1", "node-1", "a"), ep("10.0.0.2", "node-2", "b")]).unwrap();
    let mut db = Svc::new("db", ip("10.96.0.11"), 5432, 5432);
    db.internal_traffic_policy = Some("Local");
    write_service(dir, &db, &[ep("10.0.1.1", "node-1", "a")]).unwrap();
    let mut lb = Svc::new("lb", ip("10.96.0.12"), 443, 8443);
    lb.health_check_node_port = Some(32000);
    write_service(dir, &lb, &[ep("10.0.2.1", "node-1", "a"), ep("10.0.2.2", "node-2", "b")]).unwrap();
    write_atomic(dir, "nodes.yaml", &nodes("a")).unwrap();
    let slice_of = |svc: &Svc, name: &str, eps: &[Ep]| {
        let mut v = svc.slices(eps).remove(0);
        v["metadata"]["name"] = name.into();
        to_yaml(&[v])
    };

    let mut agent = core(dir);
    let first = agent.sync(Instant::now()).unwrap();
    assert_eq!((first.replanned, first.added, first.frontends), (3, 3, 3));

    // (what, the edit, Services it replans); after each, the maps equal a fresh agent's on the same files
    // (but while a file is broken, when they stay as they were: a fresh agent has no last good version).
    let steps: Vec<(&str, Edit, usize)> = vec![
        (
            "one EndpointSlice edited",
            Box::new(|d| {
                write_service(d, &web(), &[ep("10.0.0.2", "node-2", "b")]).unwrap();
            }),
            1,
        ),
        (
            "a slice of its own file added to a Service",
            Box::new(move |d| {
                write_atomic(
                    d,
                    "extra.yaml",
                    &slice_of(&web(), "web-extra", &[ep("10.0.0.3", "node-1", "a")]),
                )
                .unwrap();
            }),
            1,
        ),
        (
            "the slice relabelled to another Service (both replanned)",
            Box::new(move |d| {
                let mut db = Svc::new("db", ip("10.96.0.11"), 5432, 5432);
                db.target_port = 8080;
                write_atomic(d, "extra.yaml", &slice_of(&db, "web-extra", &[ep("10.0.0.3", "node-1", "a")]))
                    .unwrap();
            }),
            2,
        ),
        ("a Service deleted", Box::new(|d| std::fs::remove_file(d.join("db.yaml")).unwrap()), 1),
        (
            "a Service added",
            Box::new(|d| {
                write_service(
                    d,
                    &Svc::new("cache", ip("10.96.0.13"), 6379, 6379),
                    &[ep("10.0.3.1", "node-2", "b")],
                )
                .unwrap();
            }),
            1,
        ),
        (
            "a broken file keeps its last good objects",
            Box::new(|d| {
                write_atomic(d, "web.yaml", "kind: Service\nmetadata: [").unwrap();
            }),
            0,
        ),
        (
            "the broken file mended",
            Box::new(|d| {
                write_service(d, &web(), &[ep("10.0.0.4", "node-1", "a")]).unwrap();
            }),
            1,
        ),
        (
            "a slice moved to another file unchanged",
            Box::new(|d| {
                let text = std::fs::read_to_string(d.join("lb.yaml")).unwrap();
                let (svc, slice) = text.split_once("---\n").unwrap();
                write_atomic(d, "z-lb-slice.yaml", slice).unwrap();
                write_atomic(d, "lb.yaml", svc).unwrap();
            }),
            1,
        ),
        (
            "a duplicate in an earlier file wins: everything is replanned",
            Box::new(|d| {
                let mut docs = vec![web().service()];
                docs.extend(web().slices(&[ep("10.0.0.9", "node-2", "b")]));
                write_atomic(d, "a-web.yaml", &to_yaml(&docs)).unwrap();
            }),
            3,
        ),
        ("the duplicate removed", Box::new(|d| std::fs::remove_file(d.join("a-web.yaml")).unwrap()), 3),
        (
            "this node's zone label changes: everything is replanned",
            Box::new(|d| {
                write_atomic(d, "nodes.yaml", &nodes("b")).unwrap();
            }),
            3,
        ),
    ];
    for (what, edit, replanned) in steps {
        let before = maps(&agent);
        edit(dir);
        let r = agent.sync(Instant::now()).unwrap();
        if !r.stale.is_empty() {
            assert_eq!((r.replanned, maps(&agent)), (replanned, before), "{what}");
            continue;
        }
        let mut fresh = core(dir);
        let full = fresh.sync(Instant::now()).unwrap();
        assert_eq!(r.replanned, replanned, "{what}: Services planned");
        assert_eq!(maps(&agent), maps(&fresh), "{what}: maps");
        assert_eq!(
            (r.frontends, r.hints_filled, &r.health_ports, r.stale.len(), r.diagnostics.len()),
            (full.frontends, full.hints_filled, &full.health_ports, full.stale.len(), full.diagnostics.len()),
            "{what}: report"
        );
        assert_eq!(
            agent.hints_filled(),
            fresh.hints_filled(),
            "{what}: Services with the controller's hints"
        );
    }
    let again = agent.sync(Instant::now()).unwrap();
    assert_eq!((again.replanned, again.added + again.updated + again.removed), (0, 0), "nothing changed");
}

/// The metric lines of `tierlb_service_topology` and `tierlb_service_ready_endpoints` for one Service.
fn topology_lines(c: &mut AgentCore<FakeMaps>, svc: &str) -> Vec<String> {
    let snap = crate::metrics::Snapshot::of(c.reconciler(), 1024).with_topology(c.topology());
    let text = crate::metrics::encode_text(&snap, &crate::metrics::AgentStats::default(), None);
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("tierlb_service_") && l.contains(&format!("service=\"default/{svc}\"")))
        .map(str::to_owned)
        .collect();
    out.sort();
    out
}

#[test]
fn the_metrics_say_which_topology_each_service_port_asks_for_and_which_this_node_applies_and_why() {
    let tmp = TempDir::new("agent-topology").unwrap();
    let dir = tmp.path();
    write_atomic(dir, "nodes.yaml", &nodes("a")).unwrap();
    let near =
        [ep("10.0.0.1", "node-1", "a").prefer_same_node(), ep("10.0.0.2", "node-2", "b").prefer_same_node()];
    write_service(dir, &web(), &near).unwrap();
    // PreferSameZone, one endpoint without its zone hint: the all-or-nothing rule turns zone hints off.
    let mut zonal = Svc::new("zonal", ip("10.96.0.11"), 80, 8080);
    zonal.traffic_distribution = Some("PreferSameZone".into());
    let half = [ep("10.0.1.1", "node-1", "a").hints(None, Some(&["a"])), ep("10.0.1.2", "node-2", "b")];
    write_service(dir, &zonal, &half).unwrap();
    let mut local = Svc::new("local", ip("10.96.0.12"), 80, 8080);
    local.internal_traffic_policy = Some("Local");
    write_service(dir, &local, &[ep("10.0.2.2", "node-2", "b")]).unwrap();
    // The annotation wins over the field: Auto's zone hints, no node hints.
    let auto = {
        let mut s = Svc::new("auto", ip("10.96.0.13"), 80, 8080);
        s.traffic_distribution = Some("PreferSameNode".into());
        s
    };
    let zoned = [
        ep("10.0.3.1", "node-1", "a").hints(None, Some(&["a"])),
        ep("10.0.3.2", "node-2", "b").hints(None, Some(&["b"])),
    ];
    let mut docs = vec![auto.service()];
    docs[0]["metadata"]["annotations"] = serde_json::json!({"service.kubernetes.io/topology-mode": "Auto"});
    docs.extend(auto.slices(&zoned));
    write_atomic(dir, "auto.yaml", &to_yaml(&docs)).unwrap();
    let mut c = core(dir);
    c.sync(Instant::now()).unwrap();
    let topo = |requested: &str, applied: &str, reason: &str| {
        format!("family=\"IPv4\",requested=\"{requested}\",applied=\"{applied}\",reason=\"{reason}\"}} 1")
    };
    let cases = [
        ("web", topo("PreferSameNode", "node", "node_hint_names_this_node"), [2, 0, 2, 0]),
        ("zonal", topo("PreferSameZone", "cluster", "endpoint_without_zone_hint"), [0, 2, 1, 1]),
        ("local", topo("Local", "none", "no_local_endpoint"), [0, 1, 0, 1]),
        ("auto", topo("Auto", "zone", "zone_hint_names_this_zone"), [0, 2, 2, 0]),
    ];
    for (svc, topology, [node_with, node_without, zone_with, zone_without]) in cases {
        let lines = topology_lines(&mut c, svc);
        assert!(
            lines.iter().any(|l| l.starts_with("tierlb_service_topology{") && l.ends_with(&topology)),
            "{svc}: {lines:#?}"
        );
        for (hint, hinted, n) in [
            ("node", "true", node_with),
            ("node", "false", node_without),
            ("zone", "true", zone_with),
            ("zone", "false", zone_without),
        ] {
            let want = format!("hint=\"{hint}\",hinted=\"{hinted}\"}} {n}");
            assert!(
                lines.iter().any(|l| l.starts_with("tierlb_service_ready_endpoints{") && l.ends_with(&want)),
                "{svc} {want}: {lines:#?}"
            );
        }
        assert_eq!(lines.len(), 5, "one topology series and four endpoint counts per port: {lines:#?}");
    }
    assert!(!c.topology_changed());
    // The local endpoint goes: node hints name no endpoint here, the zone hints name zone b only.
    write_service(dir, &web(), &near[1..]).unwrap();
    c.sync(Instant::now()).unwrap();
    assert!(c.topology_changed(), "the snapshot is taken again");
    let lines = topology_lines(&mut c, "web");
    let want = topo("PreferSameNode", "cluster", "no_node_hint_names_this_node");
    assert!(lines.iter().any(|l| l.ends_with(&want)), "{lines:#?}");
    std::fs::remove_file(dir.join("web.yaml")).unwrap();
    c.sync(Instant::now()).unwrap();
    assert!(topology_lines(&mut c, "web").is_empty(), "a Service that left has no series");
}

#[test]
fn dsr_marks_the_outside_frontends_of_cluster_policy_services_only() {
    use serde_json::json;
    // (case, --dsr, externalTrafficPolicy, whether its outside frontends get FLAG_DSR)
    let cases = [
        ("--dsr, Cluster", true, "Cluster", true),
        ("--dsr, Local: only local backends, no other node to return from", true, "Local", false),
        ("no --dsr", false, "Cluster", false),
    ];
    for (case, dsr, etp, want) in cases {
        let tmp = TempDir::new("agent-dsr").unwrap();
        let dir = tmp.path();
        let svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": etp, "clusterIP": "10.96.0.10",
                     "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10"}]}},
        });
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "node-1", "conditions": {"ready": true}},
                          {"addresses": ["10.0.0.2"], "nodeName": "node-2", "conditions": {"ready": true}}],
        });
        let mut n1 = node("node-1", None);
        n1["status"] = json!({"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]});
        write_atomic(dir, "web.yaml", &to_yaml(&[svc, slice, n1])).unwrap();
        let mut agent = core(dir).with_dsr(dsr);
        agent.sync(Instant::now()).unwrap();
        let fes = maps(&agent);
        let outside: Vec<_> = fes.iter().filter(|(k, _)| k.is_outside()).collect();
        assert_eq!(outside.len(), 2, "{case}: the node port and the load-balancer IP: {fes:?}");
        for (k, (_, _, flags)) in &fes {
            let dsr_flag = flags & lb_common::FLAG_DSR != 0;
            assert_eq!(dsr_flag, want && k.is_outside(), "{case}: {k:?} (a connect-time frontend never)");
        }
    }
}
