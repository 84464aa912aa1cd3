//! Input as strict as the API server: one named case per validation rule (the object is reported naming
//! the field and the fix, and not taken; the valid objects of the same file still are), warnings for
//! unknown fields, checked quantities, `tierlb plan`'s exit status, the last good state of a file that turns
//! invalid, and the fuzzers' findings as regression tests. Pure: no BPF, no root.
use std::{path::Path, process::Command};

use lb_testkit::sandbox::TempDir;
use tierlb::{
    model::{Model, NodeInfo},
    source::{Diagnostic, Object, Severity, manifests::ManifestDir, manifests::parse_text},
};

const TIERLB: &str = env!("CARGO_BIN_EXE_tierlb");

/// A valid Service: the first document of every case, which must still be read.
const GOOD: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: good}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n";

fn svc(spec: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n{spec}")
}

fn slice(address_type: &str, body: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels: {{kubernetes.io/service-name: web}}\naddressType: {address_type}\n{body}"
    )
}

fn endpoint(address: &str) -> String {
    slice("IPv4", &format!("ports: [{{port: 8080}}]\nendpoints: [{{addresses: ['{address}']}}]\n"))
}

fn node(body: &str) -> String {
    format!("apiVersion: v1\nkind: Node\n{body}")
}

fn read(doc: &str) -> (Vec<Object>, Vec<Diagnostic>) {
    parse_text(Path::new("dir/x.yaml"), &format!("{GOOD}---\n{doc}"))
}

struct Case {
    name: &'static str,
    doc: String,
    field: Option<&'static str>,
    message: &'static str,
}

fn case(name: &'static str, doc: String, field: &'static str, message: &'static str) -> Case {
    Case { name, doc, field: Some(field), message }
}

fn invalid_cases() -> Vec<Case> {
    [endpoint_cases(), slice_cases(), cluster_ip_cases(), port_cases(), policy_cases(), meta_cases()]
        .into_iter()
        .flatten()
        .collect()
}

fn endpoint_cases() -> Vec<Case> {
    vec![
        // Endpoint addresses: ValidateEndpointIP and strict parsing.
        case("endpoint_loopback", endpoint("127.0.0.1"), "endpoints[0].addresses[0]", "loopback range"),
        case("endpoint_unspecified", endpoint("0.0.0.0"), "endpoints[0].addresses[0]", "unspecified"),
        case(
            "endpoint_metadata_link_local",
            endpoint("169.254.169.254"),
            "endpoints[0].addresses[0]",
            "link-local range",
        ),
        case(
            "endpoint_link_local_multicast",
            endpoint("224.0.0.1"),
            "endpoints[0].addresses[0]",
            "link-local multicast",
        ),
        case(
            "endpoint_leading_zero",
            endpoint("010.244.0.1"),
            "endpoints[0].addresses[0]",
            "not an IP address",
        ),
        case(
            "endpoint_ipv6_loopback",
            slice("IPv6", "ports: [{port: 8080}]\nendpoints: [{addresses: ['::1']}]\n"),
            "endpoints[0].addresses[0]",
            "loopback range",
        ),
        case(
            "endpoint_ipv4_mapped",
            slice("IPv6", "ports: [{port: 8080}]\nendpoints: [{addresses: ['::ffff:10.244.0.5']}]\n"),
            "endpoints[0].addresses[0]",
            "write it as 10.244.0.5",
        ),
        case(
            "endpoint_wrong_family",
            endpoint("fd00::5"),
            "endpoints[0].addresses[0]",
            "does not match addressType IPv4",
        ),
        case(
            "endpoint_without_address",
            slice("IPv4", "ports: [{port: 8080}]\nendpoints: [{addresses: []}]\n"),
            "endpoints[0].addresses",
            "at least one address",
        ),
        case(
            "endpoint_node_name",
            slice("IPv4", "endpoints: [{addresses: [10.244.0.5], nodeName: Node_1}]\n"),
            "endpoints[0].nodeName",
            "DNS-1123 subdomain",
        ),
        case(
            "endpoint_zone",
            slice("IPv4", "endpoints: [{addresses: [10.244.0.5], zone: 'zone a'}]\n"),
            "endpoints[0].zone",
            "label value",
        ),
        case(
            "hints_too_many_zones",
            slice(
                "IPv4",
                "endpoints: [{addresses: [10.244.0.5], hints: {forZones: [{name: a}, {name: b}, {name: c}, {name: d}, {name: e}, {name: f}, {name: g}, {name: h}, {name: i}]}}]\n",
            ),
            "endpoints[0].hints.forZones",
            "at most 8",
        ),
        case(
            "hints_duplicate_node",
            slice(
                "IPv4",
                "endpoints: [{addresses: [10.244.0.5], hints: {forNodes: [{name: n1}, {name: n1}]}}]\n",
            ),
            "endpoints[0].hints.forNodes[1].name",
            "duplicate hint",
        ),
        case(
            "too_many_endpoints",
            slice("IPv4", &format!("endpoints: [{}]\n", vec!["{addresses: [10.244.0.5]}"; 1001].join(", "))),
            "endpoints",
            "at most 1000",
        ),
    ]
}

fn slice_cases() -> Vec<Case> {
    vec![
        // EndpointSlice ports and address type.
        case(
            "slice_address_type",
            slice("IP", "endpoints: []\n"),
            "addressType",
            "unknown address type \"IP\"",
        ),
        case(
            "slice_duplicate_port_name",
            slice("IPv4", "ports: [{name: http, port: 80}, {name: http, port: 81}]\nendpoints: []\n"),
            "ports[1].name",
            "duplicate port name",
        ),
        case(
            "slice_two_unnamed_ports",
            slice("IPv4", "ports: [{port: 80}, {port: 81}]\nendpoints: []\n"),
            "ports[1].name",
            "duplicate port name \"\"",
        ),
        case(
            "slice_port_name",
            slice("IPv4", "ports: [{name: Http, port: 80}]\nendpoints: []\n"),
            "ports[0].name",
            "DNS-1123 label",
        ),
        case(
            "slice_protocol",
            slice("IPv4", "ports: [{port: 80, protocol: udp}]\nendpoints: []\n"),
            "ports[0].protocol",
            "TCP, UDP or SCTP",
        ),
        case(
            "slice_port_range",
            slice("IPv4", "ports: [{port: 70000}]\nendpoints: []\n"),
            "ports[0].port",
            "out of range",
        ),
    ]
}

fn cluster_ip_cases() -> Vec<Case> {
    vec![
        // Cluster IPs: ValidateServiceClusterIPsRelatedFields.
        case(
            "vip_ipv4_mapped",
            svc("  clusterIP: '::ffff:10.96.0.10'\n  ports: [{port: 80}]\n"),
            "spec.clusterIPs[0]",
            "IPv4-mapped",
        ),
        case(
            "three_cluster_ips",
            svc("  clusterIPs: [10.96.0.10, 'fd00::10', 10.96.0.11]\n  ports: [{port: 80}]\n"),
            "spec.clusterIPs",
            "at most 2",
        ),
        case(
            "two_cluster_ips_one_family",
            svc("  clusterIPs: [10.96.0.10, 10.96.0.11]\n  ports: [{port: 80}]\n"),
            "spec.clusterIPs[1]",
            "same family",
        ),
        case(
            "cluster_ip_differs_from_cluster_ips",
            svc("  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.11]\n  ports: [{port: 80}]\n"),
            "spec.clusterIPs",
            "must equal clusterIP",
        ),
        case(
            "headless_with_an_ip",
            svc("  clusterIPs: [None, 10.96.0.11]\n  ports: [{port: 80}]\n"),
            "spec.clusterIPs[0]",
            "must be the only value",
        ),
        case(
            "vip_loopback",
            svc("  clusterIP: 127.0.0.1\n  ports: [{port: 80}]\n"),
            "spec.clusterIPs[0]",
            "loopback range",
        ),
        case(
            "vip_not_an_ip",
            svc("  clusterIP: 10.96.0.999\n  ports: [{port: 80}]\n"),
            "spec.clusterIPs[0]",
            "not an IP address",
        ),
        case(
            "external_name_with_cluster_ip",
            svc("  type: ExternalName\n  externalName: example.com\n  clusterIP: 10.96.0.10\n"),
            "spec.clusterIPs",
            "ExternalName",
        ),
    ]
}

fn port_cases() -> Vec<Case> {
    vec![
        // Ports: validateServicePort and the duplicate checks of ValidateService.
        case(
            "duplicate_service_port",
            svc("  clusterIP: 10.96.0.10\n  ports: [{name: a, port: 80}, {name: b, port: 80}]\n"),
            "spec.ports[1].port",
            "duplicate port 80/TCP",
        ),
        case(
            "duplicate_service_port_name",
            svc("  clusterIP: 10.96.0.10\n  ports: [{name: a, port: 80}, {name: a, port: 81}]\n"),
            "spec.ports[1].name",
            "duplicate port name",
        ),
        case(
            "unnamed_port_among_several",
            svc("  clusterIP: 10.96.0.10\n  ports: [{port: 80}, {name: b, port: 81}]\n"),
            "spec.ports[0].name",
            "needs a name",
        ),
        case(
            "port_name",
            svc("  clusterIP: 10.96.0.10\n  ports: [{name: HTTP, port: 80}]\n"),
            "spec.ports[0].name",
            "DNS-1123 label",
        ),
        case(
            "port_zero",
            svc("  clusterIP: 10.96.0.10\n  ports: [{port: 0}]\n"),
            "spec.ports[0].port",
            "out of range",
        ),
        case(
            "port_protocol",
            svc("  clusterIP: 10.96.0.10\n  ports: [{port: 80, protocol: tcp}]\n"),
            "spec.ports[0].protocol",
            "TCP, UDP or SCTP",
        ),
        case("no_ports", svc("  clusterIP: 10.96.0.10\n"), "spec.ports", "at least one port"),
        case(
            "node_port_on_cluster_ip",
            svc("  clusterIP: 10.96.0.10\n  ports: [{port: 80, nodePort: 30080}]\n"),
            "spec.ports[0].nodePort",
            "when type is ClusterIP",
        ),
        case(
            "duplicate_node_port",
            svc(
                "  type: NodePort\n  clusterIP: 10.96.0.10\n  ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 81, nodePort: 30080}]\n",
            ),
            "spec.ports[1].nodePort",
            "duplicate nodePort",
        ),
    ]
}

fn policy_cases() -> Vec<Case> {
    let ports80 = "  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n";
    vec![
        // Traffic policies: validateServiceExternalTrafficPolicy, validateServiceInternalTrafficFieldsValue.
        case(
            "internal_policy_value",
            svc(&format!("{ports80}  internalTrafficPolicy: Nearby\n")),
            "spec.internalTrafficPolicy",
            "Cluster or Local",
        ),
        case(
            "external_policy_on_cluster_ip",
            svc(&format!("{ports80}  externalTrafficPolicy: Local\n")),
            "spec.externalTrafficPolicy",
            "externally reachable",
        ),
        case(
            "health_check_port_without_local_load_balancer",
            svc(
                "  type: NodePort\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n  healthCheckNodePort: 30000\n",
            ),
            "spec.healthCheckNodePort",
            "LoadBalancer",
        ),
        case(
            "service_type",
            svc(&format!("{ports80}  type: Internal\n")),
            "spec.type",
            "unknown Service type",
        ),
        case(
            "external_ip_loopback",
            svc(&format!("{ports80}  externalIPs: [127.0.0.1]\n")),
            "spec.externalIPs[0]",
            "loopback range",
        ),
        case(
            "load_balancer_ingress_ip",
            format!(
                "{}status: {{loadBalancer: {{ingress: [{{ip: '::ffff:1.2.3.4'}}]}}}}\n",
                svc("  type: LoadBalancer\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n")
            ),
            "status.loadBalancer.ingress[0].ip",
            "IPv4-mapped",
        ),
    ]
}

fn meta_cases() -> Vec<Case> {
    let ports80 = "  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n";
    vec![
        // Names: ValidateObjectMeta.
        case(
            "service_name",
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: Web}}\nspec:\n{ports80}"),
            "metadata.name",
            "DNS-1035 label",
        ),
        case(
            "namespace",
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: Prod}}\nspec:\n{ports80}"),
            "metadata.namespace",
            "DNS-1123 label",
        ),
        case(
            "slice_service_label",
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: 'web!'}}\naddressType: IPv4\nendpoints: []\n".into(),
            "metadata.labels[kubernetes.io/service-name]",
            "label value",
        ),
        // Nodes: ValidateNode.
        case("node_name", node("metadata: {name: 'Node 1'}\n"), "metadata.name", "DNS-1123 subdomain"),
        case(
            "node_zone_label",
            node("metadata: {name: n1, labels: {topology.kubernetes.io/zone: 'zone a'}}\n"),
            "metadata.labels[topology.kubernetes.io/zone]",
            "label value",
        ),
        case("node_negative_cpu", node("metadata: {name: n1}\nstatus: {allocatable: {cpu: '-1'}}\n"), "status.allocatable.cpu", "negative"),
        case("node_cpu_not_a_quantity", node("metadata: {name: n1}\nstatus: {allocatable: {cpu: lots}}\n"), "status.allocatable.cpu", "not a quantity"),
    ]
}

#[test]
fn each_invalid_object_is_reported_with_its_field_and_not_taken() {
    for c in invalid_cases() {
        let (objects, diagnostics) = read(&c.doc);
        let errors: Vec<&Diagnostic> = diagnostics.iter().filter(|d| d.severity == Severity::Error).collect();
        assert!(!errors.is_empty(), "{}: accepted; diagnostics {diagnostics:?}", c.name);
        assert!(
            errors.iter().any(|d| d.field.as_deref() == c.field && d.message.contains(c.message)),
            "{}: wanted field {:?} with {:?}, got {errors:#?}",
            c.name,
            c.field,
            c.message
        );
        for d in &errors {
            // The second document, counted from 1, at its first line (GOOD's lines, then `---`).
            let at = format!("dir/x.yaml:{} document 2 (", GOOD.lines().count() + 2);
            assert!(d.to_string().starts_with(&at), "{}: {d}", c.name);
        }
        assert_eq!(objects.len(), 1, "{}: only the good Service is taken: {objects:?}", c.name);
    }
}

#[test]
fn valid_objects_near_each_rule_are_accepted() {
    let docs = [
        svc(
            "  clusterIPs: [10.96.0.10, 'fd00::10']\n  ports: [{name: a, port: 80}, {name: b, port: 80, protocol: UDP}]\n",
        ),
        svc("  clusterIP: None\n  ports: [{port: 80}]\n"),
        svc("  type: ExternalName\n  externalName: example.com\n"),
        svc(
            "  type: LoadBalancer\n  clusterIP: 10.96.0.10\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30000\n  ports: [{port: 80, nodePort: 30080}]\n",
        ),
        svc(
            "  clusterIP: 10.96.0.10\n  externalIPs: [192.0.2.7]\n  externalTrafficPolicy: Local\n  ports: [{port: 80}]\n  trafficDistribution: PreferSomewhereNew\n",
        ),
        endpoint("239.1.1.1"),
        slice(
            "IPv6",
            "ports: [{name: '', port: 8080}]\nendpoints: [{addresses: ['fd00::5'], nodeName: node-1.example, zone: Zone_A, hints: {forNodes: [{name: n1}], forZones: [{name: a}]}}]\n",
        ),
        node(
            "metadata: {name: n1, labels: {topology.kubernetes.io/zone: a}}\nstatus: {allocatable: {cpu: 18446744073709551615m}}\n",
        ),
    ];
    for doc in docs {
        let (objects, diagnostics) = read(&doc);
        assert!(diagnostics.is_empty(), "{doc}: {diagnostics:#?}");
        assert_eq!(objects.len(), 2, "{doc}");
    }
}

#[test]
fn unknown_fields_are_warned_about_by_path_with_the_likely_spelling() {
    let cases = [
        (
            svc("  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n  internalTraficPolicy: Local\n"),
            "spec.internalTraficPolicy",
            "did you mean \"internalTrafficPolicy\"",
        ),
        (
            svc("  clusterIP: 10.96.0.10\n  ports: [{port: 80, nme: http}]\n"),
            "spec.ports[0].nme",
            "did you mean \"name\"",
        ),
        (
            slice("IPv4", "endpoints: [{addresses: [10.244.0.5], condition: {ready: false}}]\n"),
            "endpoints[0].condition",
            "did you mean \"conditions\"",
        ),
        (svc("  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n  colour: blue\n"), "spec.colour", "ignored"),
    ];
    for (doc, field, message) in cases {
        let (objects, diagnostics) = read(&doc);
        assert_eq!(objects.len(), 2, "a warning does not drop the object: {diagnostics:?}");
        assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
        let d = &diagnostics[0];
        assert_eq!((d.severity, d.field.as_deref()), (Severity::Warning, Some(field)), "{d}");
        assert!(d.message.contains(message), "{d}");
    }
}

fn model_of(objects: Vec<Object>) -> Model {
    let mut m = Model::default();
    for o in objects {
        o.insert_into(&mut m);
    }
    m
}

/// Two Nodes at the largest allocatable CPU the API server accepts overflowed the u64 sum of the `Auto`
/// hints emulation (a panic in a debug build; this test is one).
#[test]
fn huge_allocatable_cpu_does_not_overflow_the_hints_emulation() {
    let text = "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {topology.kubernetes.io/zone: a}}\nstatus: {allocatable: {cpu: 18446744073709551615m}}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n2, labels: {topology.kubernetes.io/zone: b}}\nstatus: {allocatable: {cpu: 18446744073709551615m}}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, annotations: {service.kubernetes.io/topology-mode: Auto}}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n- {addresses: [10.244.0.1], zone: a, nodeName: n1}\n- {addresses: [10.244.0.2], zone: b, nodeName: n2}\n";
    let (objects, diagnostics) = parse_text(Path::new("x.yaml"), text);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let mut model = model_of(objects);
    assert_eq!(tierlb::hints::fill_missing(&mut model), [tierlb::model::ObjKey::new("default", "web")]);
    let plan = tierlb::plan::plan(&model, &NodeInfo::resolve("n1", None, &model));
    assert_eq!(
        plan.services[0].internal.endpoints,
        ["10.244.0.1:8080".parse().unwrap()],
        "equal shares: own zone"
    );
}

/// The Nodes the `topology-mode: Auto` emulation leaves out of the CPU shares, as the controller's topology
/// cache does (`hasExcludedLabels`, `isNodeReady`), read from the manifest.
#[test]
fn control_plane_and_not_ready_nodes_are_left_out_of_the_cpu_shares() {
    let cases = [
        ("a worker", "labels: {topology.kubernetes.io/zone: a}}", "", false),
        ("control-plane", "labels: {node-role.kubernetes.io/control-plane: ''}}", "", true),
        ("master", "labels: {node-role.kubernetes.io/master: 'true'}}", "", true),
        ("Ready", "labels: {}}", ", conditions: [{type: Ready, status: 'True'}]", false),
        ("not Ready", "labels: {}}", ", conditions: [{type: Ready, status: 'False'}]", true),
        ("Ready unknown", "labels: {}}", ", conditions: [{type: Ready, status: Unknown}]", true),
        (
            "no Ready condition (hand-written)",
            "labels: {}}",
            ", conditions: [{type: DiskPressure, status: 'False'}]",
            false,
        ),
    ];
    for (name, meta, conditions, excluded) in cases {
        let text = node(&format!(
            "metadata: {{name: n1, {meta}\nstatus: {{allocatable: {{cpu: '4'}}{conditions}}}\n"
        ));
        let (objects, diagnostics) = parse_text(Path::new("x.yaml"), &text);
        assert!(diagnostics.is_empty(), "{name}: {diagnostics:?}");
        let m = model_of(objects);
        assert_eq!(m.nodes["n1"].cpu_share_excluded, excluded, "{name}");
    }
}

/// A Node's eligibility for load balancer traffic, as kube-proxy's `/healthz` reads it (`NodeEligible`):
/// not eligible while being deleted or tainted for the cluster autoscaler; other taints do not count.
#[test]
fn a_node_being_deleted_or_tainted_for_the_autoscaler_is_not_eligible() {
    let cases = [
        ("a worker", "", "", None),
        (
            "being deleted",
            ", deletionTimestamp: '2026-12-06T08:00:00Z', finalizers: [x]",
            "",
            Some("the Node is being deleted"),
        ),
        (
            "the autoscaler's taint",
            "",
            "spec: {taints: [{key: ToBeDeletedByClusterAutoscaler, value: '1700000000', effect: NoSchedule}]}\n",
            Some("the Node is tainted ToBeDeletedByClusterAutoscaler"),
        ),
        ("another taint", "", "spec: {taints: [{key: dedicated, value: db, effect: NoSchedule}]}\n", None),
    ];
    for (name, meta, spec, want) in cases {
        let (objects, diagnostics) =
            parse_text(Path::new("x.yaml"), &node(&format!("metadata: {{name: n1{meta}}}\n{spec}")));
        assert!(diagnostics.is_empty(), "{name}: {diagnostics:?}");
        assert_eq!(model_of(objects).nodes["n1"].not_eligible, want, "{name}");
    }
}

fn run_plan(dir: &Path) -> (i32, String, String) {
    let out = Command::new(TIERLB)
        .args(["plan", "--node", "n1", "--manifests"])
        .arg(dir)
        .output()
        .expect("run tierlb plan");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plan_exits_3_on_invalid_objects_after_printing_the_valid_ones() {
    let dir = TempDir::new("input-exit").unwrap();
    std::fs::write(dir.path().join("good.yaml"), GOOD).unwrap();
    assert_eq!(run_plan(dir.path()).0, 0, "clean input");
    std::fs::write(
        dir.path().join("warn.yaml"),
        svc("  clusterIP: 10.96.0.20\n  ports: [{port: 80}]\n  internalTraficPolicy: Local\n"),
    )
    .unwrap();
    let (code, _, stderr) = run_plan(dir.path());
    assert_eq!(code, 0, "warnings only: {stderr}");
    assert!(stderr.contains("warning: ") && stderr.contains("field spec.internalTraficPolicy"), "{stderr}");
    std::fs::write(dir.path().join("bad.yaml"), endpoint("127.0.0.1").replace("web-1", "bad")).unwrap();
    let (code, stdout, stderr) = run_plan(dir.path());
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stdout.contains("default/good") && stdout.contains("default/web"),
        "the valid ones are planned: {stdout}"
    );
    assert!(
        stderr.contains("bad.yaml:1 document 1 (EndpointSlice bad) field endpoints[0].addresses[0]: 127.0.0.1 may not be in the loopback range (127.0.0.0/8, ::1/128): use the pod's address"),
        "{stderr}"
    );
    assert!(stderr.contains("1 error(s)"), "{stderr}");
}

#[test]
fn a_file_that_turns_invalid_keeps_its_last_good_objects() {
    let dir = TempDir::new("input-lastgood").unwrap();
    let file = dir.path().join("web.yaml");
    let good =
        format!("{}---\n{}", svc("  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n"), endpoint("10.244.0.5"));
    std::fs::write(&file, &good).unwrap();
    let mut md = ManifestDir::new(dir.path());
    let first = md.load().unwrap();
    assert!(first.diagnostics.is_empty(), "{:?}", first.diagnostics);
    std::fs::write(&file, good.replace("10.244.0.5", "127.0.0.1")).unwrap();
    let loaded = md.load().unwrap();
    assert_eq!(loaded.model, first.model, "the last good endpoints stay");
    assert_eq!(loaded.stale_files, std::slice::from_ref(&file));
    assert!(loaded.diagnostics.iter().any(|d| d.message.contains("loopback")), "{:?}", loaded.diagnostics);
}
