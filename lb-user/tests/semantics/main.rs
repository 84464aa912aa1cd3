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

mod controller_hints;
mod external;
mod hint_oracle;
mod lints;
mod oracle;
mod props;
mod rules;
mod scenarios;
mod skipped;

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
        let strings = |v: Option<&[&str]>| {
            v.map(|v| tierlb::model::intern_list(v.iter().map(|s| (*s).into()).collect()))
        };
        Endpoint {
            address: Some(self.ip.parse().unwrap()),
            conditions: Conditions {
                ready: self.ready,
                serving: self.serving,
                terminating: self.terminating,
            },
            node_name: Some(self.node.into()).filter(|n: &tierlb::model::Name| !n.is_empty()),
            zone: self.zone.map(Into::into),
            hints: tierlb::model::Hints::new(strings(self.for_nodes), strings(self.for_zones)),
        }
    }
}

fn svc() -> Service {
    Service {
        key: ObjKey::new("default", "web"),
        type_: ServiceType::ClusterIP,
        cluster_ips: vec!["10.96.0.10".parse().unwrap()].into(),
        ports: vec![ServicePort { name: "http".into(), port: 80, protocol: Protocol::Tcp, node_port: None }]
            .into(),
        ..Service::default()
    }
}

fn slice(name: &str, family: AddressType, port: u16, eps: &[E]) -> EndpointSlice {
    EndpointSlice {
        key: ObjKey::new("default", name),
        service_name: Some("web".into()),
        address_type: family,
        ports: vec![SlicePort { name: "http".into(), port, protocol: Protocol::Tcp }].into(),
        endpoints: eps.iter().map(E::build).collect(),
        not_proxied: None,
        last_change_trigger_time: None,
    }
}

fn model(svc: Service, eps: &[E]) -> Model {
    let mut m = Model::default();
    let s = slice("web-abc", AddressType::IPv4, 8080, eps);
    m.slices.insert(s.key.clone(), s);
    m.services.insert(svc.key.clone(), svc.into());
    m
}

fn node(name: &str, zone: Option<&str>) -> NodeInfo {
    NodeInfo::new(name, zone.map(str::to_owned))
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
