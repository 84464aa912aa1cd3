//! Semantics: one table-driven test per rule of kube-proxy's `CategorizeEndpoints` (Kubernetes 1.35) as
//! DESIGN.md states them, the KEP-3015 scenarios, and the controller's hint emulation. Pure: no BPF, no root.
use std::net::{IpAddr, SocketAddr};

use tierlb::{
    hints::{self, AutoDisabled, HintMode},
    lint,
    model::{
        AddressType, Conditions, Endpoint, EndpointSlice, Family, Model, Node, NodeInfo, ObjKey, Policy,
        Protocol, Service, ServicePort, ServiceType, SlicePort,
    },
    plan::{self, SelectedTier, TopologyMode, WhenEmpty},
};

// ---------- builders ----------

#[derive(Clone, Debug)]
struct E {
    ip: &'static str,
    node: &'static str,
    zone: Option<&'static str>,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
    for_nodes: Option<&'static [&'static str]>,
    for_zones: Option<&'static [&'static str]>,
}

fn e(ip: &'static str, node: &'static str) -> E {
    E {
        ip,
        node,
        zone: None,
        ready: Some(true),
        serving: Some(true),
        terminating: Some(false),
        for_nodes: None,
        for_zones: None,
    }
}

impl E {
    fn zone(mut self, z: &'static str) -> Self {
        self.zone = Some(z);
        self
    }
    fn nodes(mut self, n: &'static [&'static str]) -> Self {
        self.for_nodes = Some(n);
        self
    }
    fn zones(mut self, z: &'static [&'static str]) -> Self {
        self.for_zones = Some(z);
        self
    }
    /// PreferSameNode hints as the controller writes them.
    fn psn(self) -> Self {
        let node: &'static str = self.node;
        let n: &'static [&'static str] = Box::leak(Box::new([node]));
        let z: Option<&'static [&'static str]> =
            self.zone.map(|z| -> &'static [&'static str] { Box::leak(Box::new([z])) });
        Self { for_nodes: Some(n), for_zones: z, ..self }
    }
    fn terminating(mut self) -> Self {
        self.ready = Some(false);
        self.serving = Some(true);
        self.terminating = Some(true);
        self
    }
    fn not_ready(mut self) -> Self {
        self.ready = Some(false);
        self.serving = Some(false);
        self
    }
    fn conditions(mut self, ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> Self {
        self.ready = ready;
        self.serving = serving;
        self.terminating = terminating;
        self
    }
    fn build(&self) -> Endpoint {
        let strings = |v: Option<&[&str]>| v.map(|v| v.iter().map(|s| (*s).to_owned()).collect());
        Endpoint {
            address: Some(self.ip.parse().unwrap()),
            conditions: Conditions {
                ready: self.ready,
                serving: self.serving,
                terminating: self.terminating,
            },
            node_name: Some(self.node.to_owned()).filter(|n| !n.is_empty()),
            zone: self.zone.map(str::to_owned),
            for_nodes: strings(self.for_nodes),
            for_zones: strings(self.for_zones),
        }
    }
}

fn svc() -> Service {
    Service {
        key: ObjKey::new("default", "web"),
        type_: ServiceType::ClusterIP,
        cluster_ips: vec!["10.96.0.10".parse().unwrap()],
        ports: vec![ServicePort { name: "http".into(), port: 80, protocol: Protocol::Tcp, node_port: None }],
        ..Service::default()
    }
}

fn slice(name: &str, family: AddressType, port: u16, eps: &[E]) -> EndpointSlice {
    EndpointSlice {
        key: ObjKey::new("default", name),
        service_name: Some("web".into()),
        address_type: family,
        ports: vec![SlicePort { name: "http".into(), port, protocol: Protocol::Tcp }],
        endpoints: eps.iter().map(E::build).collect(),
    }
}

fn model(svc: Service, eps: &[E]) -> Model {
    let mut m = Model::default();
    let s = slice("web-abc", AddressType::IPv4, 8080, eps);
    m.slices.insert(s.key.clone(), s);
    m.services.insert(svc.key.clone(), svc);
    m
}

fn node(name: &str, zone: Option<&str>) -> NodeInfo {
    NodeInfo { name: name.into(), zone: zone.map(str::to_owned) }
}

fn ips(v: &[SocketAddr]) -> Vec<String> {
    v.iter().map(|a| a.ip().to_string()).collect()
}

fn internal(m: &Model, n: &NodeInfo) -> plan::TrafficPlan {
    let p = plan::plan(m, n);
    assert_eq!(p.services.len(), 1, "one port planned");
    p.services[0].internal.clone()
}

struct Case {
    name: &'static str,
    svc: Service,
    eps: Vec<E>,
    node: NodeInfo,
    tier: SelectedTier,
    want: &'static [&'static str],
}

fn check(cases: Vec<Case>) {
    for c in cases {
        let m = model(c.svc, &c.eps);
        let t = internal(&m, &c.node);
        assert_eq!(t.selected_tier, c.tier, "{}", c.name);
        assert_eq!(ips(&t.endpoints), c.want, "{}", c.name);
    }
}

fn psn() -> Service {
    Service { traffic_distribution: Some("PreferSameNode".into()), ..svc() }
}

// ---------- rules ----------

#[test]
fn nil_conditions_mean_ready_serving_and_not_terminating() {
    let eps = [
        e("10.0.0.1", "n1").conditions(None, None, None),
        e("10.0.0.2", "n2").conditions(Some(false), None, None),
    ];
    let m = model(svc(), &eps);
    let t = internal(&m, &node("n1", None));
    // 10.0.0.2: not ready, serving defaults to true but terminating to false, so not usable at all.
    assert_eq!(ips(&t.endpoints), ["10.0.0.1"]);
}

#[test]
fn node_hints_apply_only_when_every_ready_endpoint_has_them_and_one_names_this_node() {
    check(vec![
        Case {
            name: "all ready have forNodes, one names n1",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").psn()],
            node: node("n1", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "one ready endpoint lacks forNodes: no node filtering",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "all have forNodes but none names this node",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").psn()],
            node: node("n3", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "a not-ready endpoint without hints does not count",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").not_ready()],
            node: node("n1", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "an endpoint may name several nodes",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").nodes(&["n1", "n3"]), e("10.0.0.2", "n2").nodes(&["n2"])],
            node: node("n3", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "hints are read even without trafficDistribution (kube-proxy never reads the field)",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").psn(), e("10.0.0.2", "n2").psn()],
            node: node("n2", None),
            tier: SelectedTier::Node,
            want: &["10.0.0.2"],
        },
    ]);
}

#[test]
fn zone_hints_follow_the_same_all_or_nothing_rule_and_a_node_without_zone_never_matches() {
    check(vec![
        Case {
            name: "all ready have forZones, one names zone a",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("a")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.1"],
        },
        Case {
            name: "one ready endpoint lacks forZones",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2")],
            node: node("n3", Some("a")),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "node without zone label",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "node with an empty zone label",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&[""]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("")),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "several zone hints per endpoint (Auto mode lends endpoints to other zones)",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a", "c"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("c")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.1"],
        },
        Case {
            name: "no endpoint names this zone",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").zones(&["a"]), e("10.0.0.2", "n2").zones(&["b"])],
            node: node("n3", Some("z")),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "node hints but not for this node: zone hints are used",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").zone("a").psn(), e("10.0.0.2", "n2").zone("b").psn()],
            node: node("n3", Some("b")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.2"],
        },
    ]);
}

#[test]
fn the_cluster_set_falls_back_to_serving_terminating_endpoints_when_none_is_ready() {
    check(vec![
        Case {
            name: "ready ones win over serving+terminating",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").terminating(), e("10.0.0.2", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.2"],
        },
        Case {
            name: "nothing ready: serving+terminating, topology ignored",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").psn().terminating(), e("10.0.0.2", "n2").psn().terminating()],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
        Case {
            name: "terminating but not serving is never used",
            svc: svc(),
            eps: vec![e("10.0.0.1", "n1").conditions(Some(false), Some(false), Some(true))],
            node: node("n1", None),
            tier: SelectedTier::None,
            want: &[],
        },
    ]);
}

#[test]
fn the_local_set_is_local_ready_then_local_serving_terminating_and_ignores_hints() {
    let local = || Service { internal_policy: Policy::Local, ..svc() };
    check(vec![
        Case {
            name: "local ready endpoints",
            svc: local(),
            eps: vec![e("10.0.0.1", "n1"), e("10.0.0.2", "n1").terminating(), e("10.0.0.3", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Local,
            want: &["10.0.0.1"],
        },
        Case {
            name: "no local ready: local serving+terminating",
            svc: local(),
            eps: vec![e("10.0.0.2", "n1").terminating(), e("10.0.0.3", "n2")],
            node: node("n1", None),
            tier: SelectedTier::Local,
            want: &["10.0.0.2"],
        },
        Case {
            name: "hints naming another node do not matter",
            svc: local(),
            eps: vec![e("10.0.0.1", "n1").nodes(&["n2"]), e("10.0.0.3", "n2").nodes(&["n2"])],
            node: node("n1", None),
            tier: SelectedTier::Local,
            want: &["10.0.0.1"],
        },
    ]);
}

#[test]
fn a_local_internal_policy_always_wins_over_traffic_distribution() {
    let s = Service {
        internal_policy: Policy::Local,
        traffic_distribution: Some("PreferSameNode".into()),
        ..svc()
    };
    let m = model(s, &[e("10.0.0.2", "n2").psn()]);
    let p = plan::plan(&m, &node("n1", None));
    let t = &p.services[0].internal;
    assert_eq!(t.selected_tier, SelectedTier::None);
    assert_eq!(t.when_empty, Some(WhenEmpty::Drop), "no fallback to n2: DROP");
    assert!(p.services[0].warnings.iter().any(|w| w.contains("dead line")), "{:?}", p.services[0].warnings);
}

#[test]
fn external_policy_local_applies_only_to_externally_reachable_ports() {
    struct X {
        name: &'static str,
        svc: Service,
        external: Option<SelectedTier>,
    }
    let eps = [e("10.0.0.1", "n1"), e("10.0.0.2", "n2")];
    let etp = |f: fn(&mut Service)| {
        let mut s = Service { external_policy: Policy::Local, ..svc() };
        f(&mut s);
        s
    };
    let cases = [
        X {
            name: "pure ClusterIP: ETP Local ignored, no external traffic",
            svc: etp(|_| {}),
            external: None,
        },
        X {
            name: "nodePort",
            svc: etp(|s| {
                s.type_ = ServiceType::NodePort;
                s.ports[0].node_port = Some(30080);
            }),
            external: Some(SelectedTier::Local),
        },
        X {
            name: "load-balancer ingress IP",
            svc: etp(|s| s.load_balancer_ips = vec!["192.0.2.10".parse().unwrap()]),
            external: Some(SelectedTier::Local),
        },
        X {
            name: "external IP",
            svc: etp(|s| s.external_ips = vec!["192.0.2.11".parse().unwrap()]),
            external: Some(SelectedTier::Local),
        },
    ];
    for c in cases {
        let m = model(c.svc, &eps);
        let p = plan::plan(&m, &node("n2", None));
        let s = &p.services[0];
        assert_eq!(s.external.as_ref().map(|t| t.selected_tier), c.external, "{}", c.name);
        // Internal traffic keeps its own (Cluster) policy whatever ETP says.
        assert_eq!(s.internal.selected_tier, SelectedTier::Cluster, "{}", c.name);
        if let Some(x) = &s.external {
            assert_eq!(ips(&x.endpoints), ["10.0.0.2"], "{}", c.name);
        }
    }
}

#[test]
fn reject_when_there_is_no_usable_endpoint_drop_when_a_local_policy_finds_only_remote_ones() {
    struct X {
        name: &'static str,
        policy: Policy,
        eps: Vec<E>,
        has_any: bool,
        when_empty: Option<WhenEmpty>,
    }
    let cases = [
        X {
            name: "no endpoints, Cluster",
            policy: Policy::Cluster,
            eps: vec![],
            has_any: false,
            when_empty: Some(WhenEmpty::Reject),
        },
        X {
            name: "no endpoints, Local",
            policy: Policy::Local,
            eps: vec![],
            has_any: false,
            when_empty: Some(WhenEmpty::Reject),
        },
        X {
            name: "only not-ready endpoints",
            policy: Policy::Cluster,
            eps: vec![e("10.0.0.1", "n2").not_ready()],
            has_any: false,
            when_empty: Some(WhenEmpty::Reject),
        },
        X {
            name: "Local, endpoint elsewhere",
            policy: Policy::Local,
            eps: vec![e("10.0.0.1", "n2")],
            has_any: true,
            when_empty: Some(WhenEmpty::Drop),
        },
        X {
            name: "Local, serving+terminating endpoint elsewhere counts as an endpoint",
            policy: Policy::Local,
            eps: vec![e("10.0.0.1", "n2").terminating()],
            has_any: true,
            when_empty: Some(WhenEmpty::Drop),
        },
        X {
            name: "Cluster, endpoint elsewhere",
            policy: Policy::Cluster,
            eps: vec![e("10.0.0.1", "n2")],
            has_any: true,
            when_empty: None,
        },
    ];
    for c in cases {
        let m = model(Service { internal_policy: c.policy, ..svc() }, &c.eps);
        let p = plan::plan(&m, &node("n1", None));
        assert_eq!(p.services[0].has_any_endpoints, c.has_any, "{}", c.name);
        assert_eq!(p.services[0].internal.when_empty, c.when_empty, "{}", c.name);
    }
}

#[test]
fn duplicate_ip_port_across_slices_is_merged_keeping_the_local_copy() {
    let mut m = model(psn(), &[e("10.0.0.1", "n2").psn()]);
    let dup = slice("web-dup", AddressType::IPv4, 8080, &[e("10.0.0.1", "n1").psn()]);
    m.slices.insert(dup.key.clone(), dup);
    let eps =
        plan::port_endpoints(m.slices_of(&ObjKey::new("default", "web")), &psn().ports[0], Family::V4, "n1");
    assert_eq!(eps.len(), 1);
    assert!(eps[0].local);
    let t = internal(&m, &node("n1", None));
    assert_eq!((t.selected_tier, ips(&t.endpoints)), (SelectedTier::Node, vec!["10.0.0.1".to_owned()]));
}

#[test]
fn endpoints_of_the_other_ip_family_are_ignored() {
    let mut s = svc();
    s.cluster_ips = vec!["10.96.0.10".parse().unwrap(), "fd00::10".parse().unwrap()];
    let mut m = model(s, &[e("10.0.0.1", "n1")]);
    let v6 = slice("web-v6", AddressType::IPv6, 8080, &[e("fd00::1", "n2")]);
    m.slices.insert(v6.key.clone(), v6);
    let p = plan::plan(&m, &node("n1", None));
    assert_eq!(p.services.len(), 2, "one entry per family");
    for s in &p.services {
        let want: &[&str] = if s.family == Family::V4 { &["10.0.0.1"] } else { &["fd00::1"] };
        assert_eq!(ips(&s.internal.endpoints), want);
        assert!(s.cluster_ips.iter().all(|ip| Family::of(ip) == s.family));
    }
}

#[test]
fn named_target_ports_resolve_per_slice() {
    let mut m = model(svc(), &[e("10.0.0.1", "n1")]);
    // A second slice (pods of another version) resolved the same port name to another number.
    let other = slice("web-v2", AddressType::IPv4, 9090, &[e("10.0.0.2", "n2")]);
    m.slices.insert(other.key.clone(), other);
    // A slice whose port has another name or protocol does not serve this Service port.
    let mut wrong = slice("web-x", AddressType::IPv4, 7070, &[e("10.0.0.3", "n3")]);
    wrong.ports[0].name = "metrics".into();
    m.slices.insert(wrong.key.clone(), wrong);
    let mut udp = slice("web-u", AddressType::IPv4, 6060, &[e("10.0.0.4", "n4")]);
    udp.ports[0].protocol = Protocol::Udp;
    m.slices.insert(udp.key.clone(), udp);
    let t = internal(&m, &node("n1", None));
    let got: Vec<String> = t.endpoints.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["10.0.0.1:8080", "10.0.0.2:9090"]);
}

#[test]
fn only_the_first_address_of_an_endpoint_counts_and_headless_services_get_no_plan() {
    let mut m = model(svc(), &[e("10.0.0.1", "n1")]);
    let k = ObjKey::new("default", "web-abc");
    let mut changed = std::sync::Arc::unwrap_or_clone(m.slices.remove(&k).unwrap());
    changed.endpoints[0].address = Some("10.0.0.1".parse().unwrap());
    m.slices.insert(k.clone(), changed);
    let t = internal(&m, &node("n1", None));
    assert_eq!(ips(&t.endpoints), ["10.0.0.1"]);
    let mut headless = svc();
    headless.cluster_ips.clear();
    let m = model(headless, &[e("10.0.0.1", "n1")]);
    assert!(plan::plan(&m, &node("n1", None)).services.is_empty());
}

// ---------- KEP-3015 scenarios and the story ----------

#[test]
fn kep3015_prefer_same_node_scenarios() {
    let three = || {
        vec![
            e("10.0.0.1", "n1").zone("a").psn(),
            e("10.0.0.2", "n2").zone("a").psn(),
            e("10.0.0.3", "n3").zone("b").psn(),
        ]
    };
    check(vec![
        Case {
            name: "local endpoint ready: node tier",
            svc: psn(),
            eps: three(),
            node: node("n1", Some("a")),
            tier: SelectedTier::Node,
            want: &["10.0.0.1"],
        },
        Case {
            name: "local endpoint gone: same zone",
            svc: psn(),
            eps: vec![e("10.0.0.2", "n2").zone("a").psn(), e("10.0.0.3", "n3").zone("b").psn()],
            node: node("n1", Some("a")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.2"],
        },
        Case {
            name: "local endpoint terminating keeps its old hints, is skipped: same zone",
            svc: psn(),
            eps: vec![
                e("10.0.0.1", "n1").zone("a").psn().terminating(),
                e("10.0.0.2", "n2").zone("a").psn(),
                e("10.0.0.3", "n3").zone("b").psn(),
            ],
            node: node("n1", Some("a")),
            tier: SelectedTier::Zone,
            want: &["10.0.0.2"],
        },
        Case {
            name: "no zone hints (no zone labels): cluster",
            svc: psn(),
            eps: vec![e("10.0.0.2", "n2").psn(), e("10.0.0.3", "n3").psn()],
            node: node("n1", None),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.2", "10.0.0.3"],
        },
        Case {
            name: "one endpoint without hints: no filtering at all",
            svc: psn(),
            eps: vec![e("10.0.0.1", "n1").zone("a").psn(), e("10.0.0.2", "n2").zone("a")],
            node: node("n1", Some("a")),
            tier: SelectedTier::Cluster,
            want: &["10.0.0.1", "10.0.0.2"],
        },
    ]);
}

#[test]
fn the_data_path_tiers_behind_kube_proxys_choice_are_zone_then_cluster() {
    let m = model(
        psn(),
        &[
            e("10.0.0.1", "n1").zone("a").psn(),
            e("10.0.0.2", "n2").zone("a").psn(),
            e("10.0.0.3", "n3").zone("b").psn(),
        ],
    );
    let t = internal(&m, &node("n1", Some("a")));
    assert_eq!(ips(&t.tiers.node), ["10.0.0.1"]);
    assert_eq!(ips(&t.tiers.zone), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(ips(&t.tiers.cluster), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    assert_eq!(plan::plan(&m, &node("n1", Some("a"))).services[0].topology.mode, TopologyMode::Node);
}

fn story_model() -> Model {
    // The PDF-resume service: two replicas (n1, n3) on three nodes, one zone, no zone label.
    let mut m = model(psn(), &[e("10.0.0.1", "n1").psn(), e("10.0.0.3", "n3").psn()]);
    for n in ["n1", "n2", "n3"] {
        m.nodes.insert(n.into(), Node { name: n.into(), zone: None, allocatable_cpu_millis: Some(4000) });
    }
    m
}

#[test]
fn two_replicas_on_three_nodes_under_prefer_same_node_skew_load_65_35() {
    let m = story_model();
    let s = &m.services[&ObjKey::new("default", "web")];
    let weights = vec![(node("n1", None), 0.5), (node("n2", None), 0.3), (node("n3", None), 0.2)];
    let shares = lint::shares(&m, s, &s.ports[0], Family::V4, &weights);
    let a: SocketAddr = "10.0.0.1:8080".parse().unwrap();
    let b: SocketAddr = "10.0.0.3:8080".parse().unwrap();
    assert!((shares.by_endpoint[&a] - 0.65).abs() < 1e-9, "{shares:?}");
    assert!((shares.by_endpoint[&b] - 0.35).abs() < 1e-9, "{shares:?}");
    assert_eq!(shares.failed, 0.0);
    let w = lint::skew_warning(&m, s, &s.ports[0], Family::V4).expect("skew lint");
    assert!(w.contains("2 ready endpoints on 3 nodes"), "{w}");
}

// ---------- controller hint emulation ----------

fn hinted(td: Option<&str>, eps: &[E]) -> (Vec<Endpoint>, hints::HintOutcome) {
    let s = Service { traffic_distribution: td.map(str::to_owned), ..svc() };
    let m = model(s.clone(), eps);
    let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
    let out = hints::apply(&m, &s, &mut slices);
    (slices.into_iter().flat_map(|s| s.endpoints).collect(), out)
}

fn strs(v: &Option<Vec<String>>) -> Option<Vec<&str>> {
    v.as_ref().map(|v| v.iter().map(String::as_str).collect())
}

#[test]
fn controller_hints_per_traffic_distribution_value() {
    struct X {
        name: &'static str,
        td: Option<&'static str>,
        nodes: Option<Vec<&'static str>>,
        zones: Option<Vec<&'static str>>,
    }
    let cases = [
        X { name: "PreferSameZone", td: Some("PreferSameZone"), nodes: None, zones: Some(vec!["a"]) },
        X { name: "PreferClose (alias)", td: Some("PreferClose"), nodes: None, zones: Some(vec!["a"]) },
        X {
            name: "PreferSameNode",
            td: Some("PreferSameNode"),
            nodes: Some(vec!["n1"]),
            zones: Some(vec!["a"]),
        },
        X { name: "unset removes hints", td: None, nodes: None, zones: None },
        X { name: "unknown value removes hints", td: Some("PreferFarAway"), nodes: None, zones: None },
    ];
    for c in cases {
        let (eps, _) = hinted(c.td, &[e("10.0.0.1", "n1").zone("a").nodes(&["old"]).zones(&["old"])]);
        assert_eq!(strs(&eps[0].for_nodes), c.nodes, "{}", c.name);
        assert_eq!(strs(&eps[0].for_zones), c.zones, "{}", c.name);
    }
}

#[test]
fn controller_skips_not_ready_endpoints_and_writes_no_zone_hint_without_a_zone() {
    let (eps, _) = hinted(
        Some("PreferSameNode"),
        &[e("10.0.0.1", "n1").terminating().nodes(&["old"]), e("10.0.0.2", "n2")],
    );
    assert_eq!(strs(&eps[0].for_nodes), Some(vec!["old"]), "not-ready endpoints keep their old hints");
    assert_eq!(strs(&eps[1].for_nodes), Some(vec!["n2"]));
    assert_eq!(eps[1].for_zones, None, "no zone, no zone hint");
}

#[test]
fn topology_annotation_takes_precedence_over_the_field_and_the_deprecated_one_wins() {
    let base = Service { traffic_distribution: Some("PreferSameNode".into()), ..svc() };
    let cases = [
        (Some("Auto"), None, HintMode::AutoAnnotation),
        (Some("auto"), None, HintMode::AutoAnnotation),
        (Some("Disabled"), None, HintMode::PreferSameNode),
        (None, Some("Auto"), HintMode::AutoAnnotation),
        (Some("Auto"), Some("Disabled"), HintMode::PreferSameNode),
        (Some("Disabled"), Some("Auto"), HintMode::AutoAnnotation),
    ];
    for (mode_ann, deprecated, want) in cases {
        let s = Service {
            topology_mode_annotation: mode_ann.map(str::to_owned),
            topology_aware_hints_annotation: deprecated.map(str::to_owned),
            ..base.clone()
        };
        assert_eq!(hints::mode(&s), want, "topology-mode {mode_ann:?}, topology-aware-hints {deprecated:?}");
    }
}

fn auto_model(nodes: &[(&str, Option<&str>, Option<u64>)], eps: &[E]) -> (Model, Service) {
    let s = Service { topology_mode_annotation: Some("Auto".into()), ..svc() };
    let mut m = model(s.clone(), eps);
    for (n, z, cpu) in nodes {
        m.nodes.insert(
            (*n).into(),
            Node { name: (*n).into(), zone: z.map(str::to_owned), allocatable_cpu_millis: *cpu },
        );
    }
    (m, s)
}

/// (name, nodes as (name, zone, CPU millis), endpoints, why Auto mode is off)
type AutoCase = (&'static str, Vec<NodeSpec>, Vec<E>, Option<AutoDisabled>);
type NodeSpec = (&'static str, Option<&'static str>, Option<u64>);

#[test]
fn auto_mode_safeguards_disable_hints() {
    let two_zones = [("n1", Some("a"), Some(4000)), ("n2", Some("b"), Some(4000))];
    let eps2 = [e("10.0.0.1", "n1").zone("a"), e("10.0.0.2", "n2").zone("b")];
    let cases: Vec<AutoCase> = vec![
        ("two balanced zones: hints", two_zones.to_vec(), eps2.to_vec(), None),
        (
            "one zone only",
            vec![("n1", Some("a"), Some(4000)), ("n2", Some("a"), Some(4000))],
            eps2.to_vec(),
            Some(AutoDisabled::NodesReadyInOneZoneOnly),
        ),
        (
            "a node without CPU",
            vec![("n1", Some("a"), Some(4000)), ("n2", Some("b"), None)],
            eps2.to_vec(),
            Some(AutoDisabled::InsufficientNodeInfo),
        ),
        (
            "a node without zone",
            vec![("n1", Some("a"), Some(4000)), ("n2", None, Some(4000))],
            eps2.to_vec(),
            Some(AutoDisabled::InsufficientNodeInfo),
        ),
        (
            "fewer endpoints than zones",
            two_zones.to_vec(),
            vec![e("10.0.0.1", "n1").zone("a")],
            Some(AutoDisabled::InsufficientNumberOfEndpoints { endpoints: 1, zones: 2 }),
        ),
        (
            "overload threshold: 3 endpoints over zones of 1:1:1 CPU with one tiny extra zone",
            vec![
                ("n1", Some("a"), Some(1000)),
                ("n2", Some("b"), Some(1000)),
                ("n3", Some("c"), Some(1000)),
                ("n4", Some("d"), Some(1000)),
            ],
            vec![
                e("10.0.0.1", "n1").zone("a"),
                e("10.0.0.2", "n2").zone("b"),
                e("10.0.0.3", "n3").zone("c"),
                e("10.0.0.4", "n3").zone("c"),
                e("10.0.0.5", "n3").zone("c"),
            ],
            Some(AutoDisabled::MinAllocationExceedsOverloadThreshold { endpoints: 5, zones: 4 }),
        ),
        (
            "an endpoint without zone",
            two_zones.to_vec(),
            vec![e("10.0.0.1", "n1").zone("a"), e("10.0.0.2", "n2")],
            Some(AutoDisabled::NoZoneSpecified),
        ),
    ];
    for (name, nodes, eps, want) in cases {
        let (m, s) = auto_model(&nodes, &eps);
        let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
        let out = hints::apply(&m, &s, &mut slices);
        assert_eq!(out.auto_disabled, want, "{name}");
        let any_hint = slices.iter().flat_map(|s| &s.endpoints).any(|e| e.for_zones.is_some());
        assert_eq!(any_hint, want.is_none(), "{name}");
    }
}

#[test]
fn auto_mode_moves_hints_from_overloaded_zones_by_cpu_share() {
    // Zone a has 3 endpoints, zone b 1, but both zones have the same CPU: b should get one of a's.
    let (m, s) = auto_model(
        &[("n1", Some("a"), Some(4000)), ("n2", Some("b"), Some(4000))],
        &[
            e("10.0.0.1", "n1").zone("a"),
            e("10.0.0.2", "n1").zone("a"),
            e("10.0.0.3", "n1").zone("a"),
            e("10.0.0.4", "n2").zone("b"),
        ],
    );
    let mut slices: Vec<EndpointSlice> = m.slices.values().cloned().collect();
    hints::apply(&m, &s, &mut slices);
    let zones: Vec<String> =
        slices[0].endpoints.iter().map(|e| e.for_zones.clone().unwrap().join(",")).collect();
    assert_eq!(zones.iter().filter(|z| *z == "b").count(), 2, "{zones:?}");
    assert_eq!(zones.iter().filter(|z| *z == "a").count(), 2, "{zones:?}");
}

#[test]
fn manifests_without_hints_get_the_controllers_hints() {
    let mut m = model(psn(), &[e("10.0.0.1", "n1"), e("10.0.0.2", "n2")]);
    let filled = hints::fill_missing(&mut m);
    assert_eq!(filled, ["default/web"]);
    let t = internal(&m, &node("n1", None));
    assert_eq!((t.selected_tier, ips(&t.endpoints)), (SelectedTier::Node, vec!["10.0.0.1".to_owned()]));
    // Slices that already carry hints are left as they are.
    let mut m = model(psn(), &[e("10.0.0.1", "n1").nodes(&["n2"]), e("10.0.0.2", "n2").nodes(&["n2"])]);
    assert!(hints::fill_missing(&mut m).is_empty());
}

// ---------- lints ----------

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

// ---------- properties ----------

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
                for t in [&sp.internal].into_iter().chain(sp.external.as_ref()) {
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
