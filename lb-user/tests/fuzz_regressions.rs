//! What the fuzz targets (fuzz/, `cargo xtask fuzz`) found, each kept as a named test with its input inline.
use std::{net::SocketAddr, path::Path, sync::Arc, time::Instant};

use tierlb::{
    datapath::{Desired, DesiredFrontend, MapReader as _, Reconciler, addr, fake::FakeMaps},
    model::{ObjKey, ServicePortName},
    source::{Object, manifests::parse_text},
};

/// manifests target: a Node name whose first label is 85 characters was accepted, and the fuzz oracle
/// called it invalid. The API server agrees with tierlb: `IsDNS1123Subdomain` limits the whole name to 253
/// characters, not each label to 63 (the oracle was wrong, and was fixed).
#[test]
fn fuzz_manifests_a_node_name_label_longer_than_63_characters_is_valid() {
    let name = format!("node-{}", "9".repeat(80));
    let (objects, diagnostics) =
        parse_text(Path::new("x.yaml"), &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"));
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    assert!(matches!(&objects[..], [Object::Node(n)] if n.name == name));
    let too_long = format!("{}.{}", "a".repeat(200), "b".repeat(60));
    let (objects, diagnostics) = parse_text(
        Path::new("x.yaml"),
        &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {too_long}}}\n"),
    );
    assert!(objects.is_empty());
    assert!(diagnostics[0].message.contains("longer than 253"), "{diagnostics:?}");
}

/// reconcile target: a frontend whose first write fails (the slot map is full) gives its fresh service id
/// back, but its name stays stored under that id until the id is handed out again (nothing reads the name
/// of an unused id). What matters, and is checked here: the id is not lost, and the next frontend that gets
/// it gets its own name.
#[test]
fn fuzz_reconcile_a_failed_first_write_does_not_lose_its_service_id() {
    let mut r = Reconciler::new(FakeMaps::new(1, 1));
    let backend = |s: &str| addr::backend(s.parse::<SocketAddr>().unwrap(), lb_common::PROTO_TCP);
    let frontend = |service: &str, backends: Vec<lb_common::Backend>| {
        let name = Arc::new(ServicePortName::new(ObjKey::new("ns", service), ""));
        DesiredFrontend { name, tiers: [backends, Vec::new(), Vec::new()], flags: 0, affinity_timeout_s: 0 }
    };
    let key = |ip: &str| addr::frontend_key(ip.parse().unwrap(), 80, lb_common::PROTO_TCP);
    // Nine backends: two entries of the slot map, which has room for one.
    let nine = (1..=9).map(|i| backend(&format!("10.244.0.{i}:80"))).collect();
    let report = r.apply(&Desired::from([(key("10.96.0.1"), frontend("a", nine))]), Instant::now());
    assert_eq!(report.errors.len(), 1, "nine backends do not fit one entry of the slot map");
    assert_eq!(r.writer().name(1).unwrap(), None, "the failed frontend's id is not left named");
    let report = r.apply(&Desired::from([(key("10.96.0.2"), frontend("b", Vec::new()))]), Instant::now());
    assert!(report.errors.is_empty(), "the only service id is free again: {:?}", report.errors);
    let (_, value, _) = r.applied().next().unwrap();
    assert_eq!(r.writer().name(value.svc_id).unwrap().as_deref(), Some("ns/b"));
}

/// reconcile target (seed 82ee5ed3… in fuzz/seeds/reconcile, found by CI's short run after the writes were batched): a round of
/// frontends took every service id up front, so one that found none was refused even though an earlier
/// frontend's failed write (the slot map full) gave its id back. Written one by one in key order, as the
/// model has it, the id goes to the next frontend that needs one; the batched write must agree.
#[test]
fn fuzz_reconcile_an_id_freed_by_a_failed_write_goes_to_the_next_frontend_in_a_batch() {
    // Two service ids, two entries of the slot map (8 slots each): `a` (17 backends, three entries) cannot
    // fit and gives its id back; `b` and `c` (one backend each) get the two ids.
    let mut r = Reconciler::new(FakeMaps::new(2, 2));
    let backend = |i: u8| addr::backend(SocketAddr::from(([10, 244, 0, i], 80)), lb_common::PROTO_TCP);
    let frontend = |service: &str, backends: Vec<lb_common::Backend>| {
        let name = Arc::new(ServicePortName::new(ObjKey::new("ns", service), ""));
        DesiredFrontend { name, tiers: [backends, Vec::new(), Vec::new()], flags: 0, affinity_timeout_s: 0 }
    };
    let key = |ip: &str| addr::frontend_key(ip.parse().unwrap(), 80, lb_common::PROTO_TCP);
    let desired = Desired::from([
        (key("10.96.0.1"), frontend("a", (1..=17).map(backend).collect())),
        (key("10.96.0.2"), frontend("b", vec![backend(4)])),
        (key("10.96.0.3"), frontend("c", vec![backend(5)])),
    ]);
    let report = r.apply(&desired, Instant::now());
    let refused: Vec<String> = report.errors.iter().map(|e| e.name.to_string()).collect();
    assert_eq!(refused, ["ns/a"], "{:?}", report.errors);
    assert_eq!(report.added, 2);
}

/// kube_wire target (13,117 executions in): an EndpointSlice without `addressType` is read by k8s-openapi
/// (which defaults it to "") and refused by conversion, one object; the lean wire type failed the read
/// instead, which on a watch is the whole event. Now both read it and convert it to the same refusal.
#[test]
fn fuzz_kube_wire_a_slice_without_address_type_is_read_and_refused_as_the_full_type_does() {
    let doc = br#"{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}}, "addzessType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "n1"}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}"#;
    assert_eq!(tierlb::source::kube::lean_reads_as_full(false, doc), Ok(()));
}
