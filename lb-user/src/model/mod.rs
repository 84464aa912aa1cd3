//! tierlb's own view of the cluster: the parts of Services, EndpointSlices and Nodes the semantics read.
//! Independent of k8s-openapi so the plan is pure and easy to build in tests.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use serde::Serialize;

pub mod compact;
mod ids;
mod names;
pub mod node_addresses;
mod proxy_label;
mod slices;
pub use ids::{Kind, ObjKey, ObjectId, ParseNameError, ServicePortName};
pub use names::{Hints, Name, NameList, forget_unused as forget_unused_names, intern, intern_list};
pub use proxy_label::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, ProxyLabel};
pub use slices::Slices;

/// "TCP", "UDP" or "SCTP" for a map key's protocol number (`Protocol::number`; the data path holds no other).
pub fn proto_name(p: u8) -> &'static str {
    match p {
        lb_common::PROTO_TCP => "TCP",
        lb_common::PROTO_UDP => "UDP",
        _ => "SCTP",
    }
}

/// A Service or EndpointSlice port's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Protocol {
    /// TCP (the default).
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP (parsed, but not translated: see `translated`).
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// The Kubernetes spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }
    /// The IP protocol number the kernel hands a sock_addr program.
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => lb_common::PROTO_TCP,
            Self::Udp => lb_common::PROTO_UDP,
            Self::Sctp => lb_common::PROTO_SCTP,
        }
    }
    /// Whether tierlb programs ports of this protocol. SCTP is not: no test has shown an SCTP connect through
    /// a VIP (the kernels tierlb is tested on are built without SCTP), so its ports are listed as not handled
    /// (`plan`, `explain`) rather than written to maps nobody checked the kernel reads for SCTP.
    pub fn translated(self) -> bool {
        !matches!(self, Self::Sctp)
    }
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// An IP family: a dual-stack Service is planned once per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Family {
    /// IPv4.
    #[serde(rename = "IPv4")]
    V4,
    /// IPv6.
    #[serde(rename = "IPv6")]
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }
    /// The Kubernetes spelling (`IPv4`, `IPv6`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// An internal or external traffic policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Policy {
    /// Any endpoint (with topology hints applied).
    #[default]
    Cluster,
    /// Only this node's endpoints, hints ignored; none local means no traffic.
    Local,
}

impl Policy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cluster => "Cluster",
            Self::Local => "Local",
        }
    }
}

/// `spec.type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum ServiceType {
    /// A virtual IP inside the cluster.
    #[default]
    ClusterIP,
    /// Also a port on every node.
    NodePort,
    /// Also an external load balancer.
    LoadBalancer,
    /// A DNS alias: no VIP, nothing to translate.
    ExternalName,
}

/// One entry of `spec.ports`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServicePort {
    /// May be empty for a single-port Service.
    pub name: String,
    /// The port clients connect to on the VIP.
    pub port: u16,
    /// Its protocol.
    pub protocol: Protocol,
    /// `nodePort`, if allocated.
    pub node_port: Option<u16>,
}

/// The parts of a Service the semantics read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Service {
    /// Namespace and name.
    pub key: ObjKey,
    /// `metadata.creationTimestamp`, seconds since the epoch (none in a manifest that leaves it out): of
    /// two Services claiming one external address, the older keeps it (`plan::VIP_RULE`).
    pub created: Option<i64>,
    /// `spec.type`.
    pub type_: ServiceType,
    /// Empty for a headless Service (`clusterIP: None`).
    pub cluster_ips: Box<[IpAddr]>,
    /// `spec.ports`.
    pub ports: Box<[ServicePort]>,
    /// `spec.internalTrafficPolicy`.
    pub internal_policy: Policy,
    /// `spec.externalTrafficPolicy`.
    pub external_policy: Policy,
    /// `spec.externalIPs`.
    pub external_ips: Box<[IpAddr]>,
    /// `status.loadBalancer.ingress[].ip` whose `ipMode` is `VIP` or unset: kube-proxy's `LoadBalancerVIPs`
    /// (pkg/proxy/servicePort.go `newBaseServiceInfo`, `proxyutil.IsVIPMode`), the ones it captures.
    pub load_balancer_ips: Box<[IpAddr]>,
    /// `status.loadBalancer.ingress[].ip` with `ipMode: Proxy`: the load balancer proxies to the nodes, so
    /// kube-proxy leaves the address alone (traffic to it must reach the load balancer) and so does tierlb.
    pub load_balancer_proxy_ips: Box<[IpAddr]>,
    /// `spec.loadBalancerSourceRanges` (else the `service.beta.kubernetes.io/load-balancer-source-ranges`
    /// annotation, as kube-proxy reads it): the clients its load-balancer IPs accept; empty: every client.
    pub load_balancer_source_ranges: Box<[node_addresses::Cidr]>,
    /// `spec.healthCheckNodePort` (externalTrafficPolicy Local on a LoadBalancer Service).
    pub health_check_node_port: Option<u16>,
    /// `spec.trafficDistribution` as written (unknown values are kept so they can be linted). Interned, as
    /// the two annotations: a cluster's Services write a few values.
    pub traffic_distribution: Option<Name>,
    /// `service.kubernetes.io/topology-mode`.
    pub topology_mode_annotation: Option<Name>,
    /// The deprecated `service.kubernetes.io/topology-aware-hints`, which wins over `topology-mode`.
    pub topology_aware_hints_annotation: Option<Name>,
    /// `spec.sessionAffinity: ClientIP`: its `sessionAffinityConfig.clientIP.timeoutSeconds` (default 10800);
    /// `None` for no affinity.
    pub session_affinity_timeout: Option<u32>,
    /// The label that makes kube-proxy skip it (the model keeps such a Service apart: `Model::skipped`).
    pub not_proxied: Option<ProxyLabel>,
}

// A Service is kept behind an `Arc` for its life: with boxed slices (16 bytes, a `Vec` takes 24) it is 200
// bytes and the `Arc`'s block jemalloc's 224-byte class; with vectors it was 248, in the 320-byte class.
const _: () = assert!(size_of::<Service>() <= 208);

impl Service {
    /// kube-proxy's `ExternallyAccessible` for a port in one family: reachable through a node port, or
    /// load-balancer ingress IPs or external IPs of that family (`newBaseServiceInfo` keeps only its own
    /// family's, so a v4 externalIP does not make the v6 port externally reachable).
    pub fn externally_reachable(&self, port: &ServicePort, family: Family) -> bool {
        let of_family = |ips: &[IpAddr]| ips.iter().any(|ip| Family::of(ip) == family);
        port.node_port.is_some() || of_family(&self.load_balancer_ips) || of_family(&self.external_ips)
    }
}

/// Endpoint conditions as written; `None` gets Kubernetes' default (ready/serving: true, terminating: false).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Conditions {
    /// `conditions.ready`.
    pub ready: Option<bool>,
    /// `conditions.serving`.
    pub serving: Option<bool>,
    /// `conditions.terminating`.
    pub terminating: Option<bool>,
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// `addresses[0]`; kube-proxy ignores the rest.
    pub address: Option<IpAddr>,
    /// Its conditions as written.
    pub conditions: Conditions,
    /// `nodeName`: the endpoint is local to the node of that name (interned: `intern`).
    pub node_name: Option<Name>,
    /// `zone` (interned).
    pub zone: Option<Name>,
    /// `hints.forNodes[].name` and `hints.forZones[].name`, interned as a pair (`Hints`): shared by the
    /// endpoints with the same lists.
    #[serde(flatten)]
    pub hints: Hints,
}

// What one endpoint costs the agent, most of its memory (10 per Service in the scale runs): a regression that
// makes it larger fails here, not in a benchmark.
const _: () = assert!(size_of::<Endpoint>() <= 48);

impl Endpoint {
    /// `ready`, nil counting as true.
    pub fn is_ready(&self) -> bool {
        self.conditions.ready.unwrap_or(true)
    }
    /// `serving`, nil counting as true.
    pub fn is_serving(&self) -> bool {
        self.conditions.serving.unwrap_or(true)
    }
    /// `terminating`, nil counting as false.
    pub fn is_terminating(&self) -> bool {
        self.conditions.terminating.unwrap_or(false)
    }
    /// The node names of `hints.forNodes` (none when absent).
    pub fn node_hints(&self) -> &[Name] {
        self.hints.for_nodes().map_or(&[], |l| l.as_slice())
    }
    /// The zone names of `hints.forZones` (none when absent).
    pub fn zone_hints(&self) -> &[Name] {
        self.hints.for_zones().map_or(&[], |l| l.as_slice())
    }
}

/// One entry of an EndpointSlice's `ports`: the target port a Service port name resolves to in that slice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlicePort {
    /// Matches a Service port's name.
    pub name: String,
    /// The endpoints' port.
    pub port: u16,
    /// Its protocol.
    pub protocol: Protocol,
}

/// `addressType` of an EndpointSlice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum AddressType {
    /// IPv4 addresses.
    IPv4,
    /// IPv6 addresses.
    IPv6,
    /// Names: never translated.
    #[serde(rename = "FQDN")]
    Fqdn,
}

/// The parts of an EndpointSlice the semantics read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EndpointSlice {
    /// Namespace and name.
    pub key: ObjKey,
    /// Label `kubernetes.io/service-name` (a thin `Name`: 8 bytes, where a `String` took 24).
    pub service_name: Option<Name>,
    /// Which addresses it holds.
    pub address_type: AddressType,
    /// Its ports.
    pub ports: Box<[SlicePort]>,
    /// Its endpoints.
    pub endpoints: Box<[Endpoint]>,
    /// The label that makes kube-proxy skip it (`Slices` does not keep such a slice).
    pub not_proxied: Option<ProxyLabel>,
    /// Annotation `endpoints.kubernetes.io/last-change-trigger-time`: when the change this version carries
    /// happened (a pod became ready, ...), the start of kube-proxy's network programming latency.
    pub last_change_trigger_time: Option<std::time::SystemTime>,
}

// Kept behind an `Arc` for its life, one or more per Service: 112 bytes and the `Arc`'s block jemalloc's
// 128-byte class (with vectors and a `String` it was 144, in the 160-byte class).
const _: () = assert!(size_of::<EndpointSlice>() <= 112);

impl EndpointSlice {
    /// The Service it belongs to: same namespace, named by the `kubernetes.io/service-name` label.
    pub fn owner(&self) -> Option<ObjKey> {
        self.service_name.as_ref().map(|name| ObjKey::new(self.key.namespace.clone(), name.clone()))
    }
}

/// The parts of a Node the semantics read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Node {
    /// Its name (what `nodeName` and `forNodes` name).
    pub name: String,
    /// Label `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// Allocatable CPU in millicores (used by the `topology-mode: Auto` hint emulation).
    pub allocatable_cpu_millis: Option<u64>,
    /// Left out of the `topology-mode: Auto` CPU shares, as the controller's topology cache leaves them out:
    /// labelled `node-role.kubernetes.io/control-plane` or `.../master`, or a `Ready` condition that is not
    /// `True`. (A Node with no `Ready` condition at all counts: the controller would leave it out, but
    /// hand-written manifests seldom carry `status.conditions`.)
    pub cpu_share_excluded: bool,
    /// `status.addresses` of type `InternalIP` and `ExternalIP` that parse as IPs, in their order.
    pub addresses: Vec<NodeAddress>,
    /// Why the node is not eligible for load balancer traffic, as kube-proxy's `/healthz` decides it
    /// (`NodeEligible`, pkg/proxy/healthcheck/proxy_health.go): it is being deleted (a
    /// `metadata.deletionTimestamp`) or tainted `ToBeDeletedByClusterAutoscaler`. `None`: eligible.
    pub not_eligible: Option<&'static str>,
}

/// The kind of a Node address tierlb reads (`status.addresses[].type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum NodeAddressKind {
    /// `InternalIP`.
    InternalIP,
    /// `ExternalIP`.
    ExternalIP,
}

/// One of a Node's `status.addresses`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NodeAddress {
    /// Its type.
    pub kind: NodeAddressKind,
    /// The address.
    pub ip: IpAddr,
}

/// Everything the sources know, keyed for deterministic iteration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    /// Services by key (those kube-proxy would program; `put_service` keeps the others apart).
    pub services: BTreeMap<ObjKey, Arc<Service>>,
    /// Services whose labels make kube-proxy skip them (`Service::not_proxied`): never planned, listed by
    /// `plan` and `explain` with the reason.
    pub skipped: BTreeMap<ObjKey, Arc<Service>>,
    /// EndpointSlices, indexed by their Service.
    pub slices: Slices,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Node>,
}

impl Model {
    /// Add or replace a Service: among `services`, or among `skipped` when a label keeps kube-proxy away (a
    /// Service that gains or loses the label moves).
    /// Shared with the source that delivered it (`source::Object::Service`): one copy in memory.
    pub fn put_service(&mut self, s: impl Into<Arc<Service>>) {
        let s = s.into();
        let (to, from) = match s.not_proxied {
            Some(_) => (&mut self.skipped, &mut self.services),
            None => (&mut self.services, &mut self.skipped),
        };
        from.remove(&s.key);
        to.insert(s.key.clone(), s);
    }

    /// Remove a Service, programmed or skipped.
    pub fn remove_service(&mut self, key: &ObjKey) {
        self.services.remove(key);
        self.skipped.remove(key);
    }

    /// Rebuild the maps with full nodes (`compact::repack`).
    pub fn repack(&mut self) {
        compact::repack(&mut self.services);
        compact::repack(&mut self.skipped);
        compact::repack(&mut self.nodes);
        self.slices.repack();
    }

    /// The EndpointSlices that belong to a Service (same namespace, `kubernetes.io/service-name` label), in
    /// key order.
    pub fn slices_of<'a>(&'a self, svc: &'a ObjKey) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.slices.of(svc)
    }
}

/// The node the plan is computed for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// Its zone, if it has one.
    pub zone: Option<String>,
    /// The addresses its NodePorts are translated on (`node_addresses::node_port_addresses`).
    pub node_port_addresses: Vec<IpAddr>,
    /// `--external-ip-cidrs`: externalIPs outside them are not translated (`None`: no limit).
    pub external_ip_cidrs: Option<Vec<node_addresses::Cidr>>,
    /// The node's own addresses (its Node object's and its NodePort addresses): never a load-balancer IP or
    /// an externalIP, which would capture connects to the node's own services (kubelet, sshd).
    pub own_addresses: Vec<IpAddr>,
    /// Addresses no frontend may take: the API server's, which the agent itself connects to.
    pub protected: Vec<SocketAddr>,
}

impl NodeInfo {
    /// A node with no external address settings: no NodePort address, every externalIP allowed.
    pub fn new(name: impl Into<String>, zone: Option<String>) -> Self {
        Self {
            name: name.into(),
            zone,
            node_port_addresses: Vec::new(),
            external_ip_cidrs: None,
            own_addresses: Vec::new(),
            protected: Vec::new(),
        }
    }

    /// `--zone` wins; else the Node object's zone label; else none. NodePorts on the Node object's addresses,
    /// every externalIP translated (the defaults of `ExternalConfig`).
    pub fn resolve(name: &str, zone_flag: Option<&str>, model: &Model) -> Self {
        Self::resolve_with(name, zone_flag, model, &node_addresses::ExternalConfig::default())
    }

    /// `resolve` with the external address settings of `cfg` (which may read this host's interfaces).
    pub fn resolve_with(
        name: &str,
        zone_flag: Option<&str>,
        model: &Model,
        cfg: &node_addresses::ExternalConfig,
    ) -> Self {
        let zone = zone_flag
            .map(str::to_owned)
            .or_else(|| model.nodes.get(name).and_then(|n| n.zone.clone()))
            .filter(|z| !z.is_empty());
        let node_port_addresses = node_addresses::resolve_node_ports(cfg, name, model);
        let mut own_addresses: Vec<IpAddr> =
            model.nodes.get(name).iter().flat_map(|n| &n.addresses).map(|a| a.ip).collect();
        own_addresses.extend(&node_port_addresses);
        own_addresses.sort();
        own_addresses.dedup();
        Self {
            name: name.to_owned(),
            zone,
            node_port_addresses,
            external_ip_cidrs: cfg.external_ip_cidrs.clone(),
            own_addresses,
            protected: cfg.protected.clone(),
        }
    }
}
