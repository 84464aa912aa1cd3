//! Every frontend a model must get on one node, and what it must hold, written from docs/DESIGN.md
//! ("Semantics" and the north-south data path), the doc comment of lb-user's `plan/external_frontends.rs`
//! and lb-common's frontend flags, not from `tierlb::plan`:
//!
//! - a cluster IP's frontend holds the internalTrafficPolicy's set;
//! - each external destination of the Service's family (node address x nodePort, ingress IP, externalIP)
//!   has two: the connect-time one, which holds kube-proxy's cluster set whatever either policy says
//!   (connects made on the node, from pods and the host, are short-circuited: "pod traffic for ... external
//!   destinations", "route LOCAL traffic for ... external destinations" in kube-proxy's `syncProxyRules`),
//!   and the outside-scope one (`SCOPE_OUTSIDE`, the tc programs'), which holds the
//!   externalTrafficPolicy's set, `FLAG_SNAT_TO_FRONTEND` for a node port and `FLAG_SOURCE_RANGES` for an
//!   ingress IP whose Service has `loadBalancerSourceRanges` of its family;
//! - a Local policy's set is the node tier alone, this node's endpoints (ready, else serving and
//!   terminating), with `FLAG_POLICY_LOCAL`, and `FLAG_EMPTY_IS_DROP` when the port has a usable endpoint
//!   anywhere (kube-proxy DROPs then, REJECTs when it has none); a Cluster policy's set is the topology
//!   tiers (node, zone, cluster), no flag;
//! - every frontend of a Service with sessionAffinity ClientIP carries its timeout;
//! - node ports are on the Node object's addresses (`--nodeport-addresses primary`: the first InternalIP of
//!   each family, else its first ExternalIP, kube-proxy's `GetNodeHostIPs`), never on a loopback address;
//!   an ingress IP or externalIP is never a frontend when it is loopback, link-local, unspecified,
//!   multicast or one of the node's own addresses, an externalIP not when it is outside
//!   `--external-ip-cidrs`, an ingress IP with `ipMode: Proxy` never (the model keeps those apart), and no
//!   external destination is a frontend on the API server's address.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use lb_common::{FLAG_EMPTY_IS_DROP, FLAG_POLICY_LOCAL, FLAG_SNAT_TO_FRONTEND, FLAG_SOURCE_RANGES};
use tierlb::model::{
    AddressType, Endpoint, Model, NameList, Policy, Protocol, Service, ServicePort, ServicePortName,
};

/// A frontend: an address, port and protocol, in the connect-time scope or the outside one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Frontend {
    /// Address and port.
    pub addr: SocketAddr,
    /// Protocol.
    pub protocol: Protocol,
    /// The outside scope (traffic from outside the node, `lb_common::SCOPE_OUTSIDE`).
    pub outside: bool,
}

/// What one frontend must hold.
#[derive(Debug, PartialEq, Eq)]
pub struct Expected {
    /// The Service port it belongs to.
    pub port: ServicePortName,
    /// Node (or Local set), zone and cluster tiers, each sorted.
    pub tiers: [Vec<SocketAddr>; 3],
    /// `FrontendValue::flags`.
    pub flags: u32,
    /// sessionAffinity ClientIP's timeout, 0 without.
    pub affinity_timeout_s: u32,
}

/// The planned node as its Node object and the agent's flags make it.
#[derive(Debug)]
pub struct NodeView {
    name: String,
    zone: Option<String>,
    node_ports: Vec<IpAddr>,
    own: Vec<IpAddr>,
    external_ip_cidrs: Option<Vec<(IpAddr, u8)>>,
    api_server: Option<SocketAddr>,
}

impl NodeView {
    /// Node `name` in `zone` whose Node object has `addresses` (is an `ExternalIP`, address) in this order;
    /// `primary`: `--nodeport-addresses primary`.
    pub fn new(
        name: &str,
        zone: Option<String>,
        addresses: &[(bool, IpAddr)],
        primary: bool,
        external_ip_cidrs: Option<Vec<(IpAddr, u8)>>,
        api_server: Option<SocketAddr>,
    ) -> Self {
        let mut node_ports: Vec<IpAddr> = if primary {
            [false, true]
                .into_iter()
                .filter_map(|v6| {
                    let first = |external: bool| {
                        addresses
                            .iter()
                            .find(|(e, ip)| *e == external && ip.is_ipv6() == v6)
                            .map(|(_, ip)| *ip)
                    };
                    first(false).or_else(|| first(true))
                })
                .collect()
        } else {
            addresses.iter().map(|(_, ip)| *ip).collect()
        };
        node_ports.retain(|ip| !ip.is_loopback());
        Self {
            name: name.to_owned(),
            zone,
            node_ports,
            own: addresses.iter().map(|(_, ip)| *ip).collect(),
            external_ip_cidrs,
            api_server,
        }
    }
}

/// Which kind of external destination.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    NodePort,
    LoadBalancer,
    ExternalIp,
}

/// Every frontend of the model with what it must hold.
pub fn expected(model: &Model, node: &NodeView) -> BTreeMap<Frontend, Expected> {
    let mut out = BTreeMap::new();
    for svc in model.services.values() {
        let affinity_timeout_s = svc.session_affinity_timeout.unwrap_or(0);
        for vip in &svc.cluster_ips {
            let v4 = vip.is_ipv4();
            for port in &svc.ports {
                let eps = endpoints(model, svc, port, v4, &node.name);
                let mut add =
                    |addr: SocketAddr, outside: bool, (tiers, flags): ([Vec<SocketAddr>; 3], u32)| {
                        let port_name = ServicePortName::new(svc.key.clone(), port.name.clone());
                        let frontend = Frontend { addr, protocol: port.protocol, outside };
                        out.insert(frontend, Expected { port: port_name, tiers, flags, affinity_timeout_s });
                    };
                add(SocketAddr::new(*vip, port.port), false, policy_set(svc.internal_policy, &eps, node));
                for (kind, addr) in external_destinations(svc, port, v4, node) {
                    add(addr, false, policy_set(Policy::Cluster, &eps, node));
                    let (tiers, mut flags) = policy_set(svc.external_policy, &eps, node);
                    if kind == Kind::NodePort {
                        flags |= FLAG_SNAT_TO_FRONTEND;
                    }
                    if kind == Kind::LoadBalancer
                        && svc.load_balancer_source_ranges.iter().any(|r| r.ip.is_ipv4() == v4)
                    {
                        flags |= FLAG_SOURCE_RANGES;
                    }
                    add(addr, true, (tiers, flags));
                }
            }
        }
    }
    out
}

/// Whether `ip` is inside `net`/`len` (never across families).
fn inside(ip: IpAddr, (net, len): (IpAddr, u8)) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            len == 0 || (u32::from(a) ^ u32::from(n)) >> (32 - u32::from(len)) == 0
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            len == 0 || (u128::from(a) ^ u128::from(n)) >> (128 - u32::from(len)) == 0
        }
        _ => false,
    }
}

/// An address no Service may take: loopback, unspecified, link-local, multicast, broadcast.
fn special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_loopback() || a.is_unspecified() || a.is_link_local() || a.is_multicast() || a.is_broadcast()
        }
        IpAddr::V6(a) => {
            a.is_loopback() || a.is_unspecified() || a.is_unicast_link_local() || a.is_multicast()
        }
    }
}

/// The external destinations of `port` in the family of `v4` that are translated on this node.
fn external_destinations(
    svc: &Service,
    port: &ServicePort,
    v4: bool,
    node: &NodeView,
) -> Vec<(Kind, SocketAddr)> {
    let family = |ip: &&IpAddr| ip.is_ipv4() == v4;
    let mut out = Vec::new();
    if let Some(np) = port.node_port {
        for ip in node.node_ports.iter().filter(family) {
            out.push((Kind::NodePort, SocketAddr::new(*ip, np)));
        }
    }
    let anyones = |ip: &&IpAddr| !special(**ip) && !node.own.contains(ip);
    for ip in svc.load_balancer_ips.iter().filter(family).filter(anyones) {
        out.push((Kind::LoadBalancer, SocketAddr::new(*ip, port.port)));
    }
    let allowed =
        |ip: &&IpAddr| node.external_ip_cidrs.as_ref().is_none_or(|c| c.iter().any(|c| inside(**ip, *c)));
    for ip in svc.external_ips.iter().filter(family).filter(anyones).filter(allowed) {
        out.push((Kind::ExternalIp, SocketAddr::new(*ip, port.port)));
    }
    out.retain(|(_, addr)| node.api_server != Some(*addr));
    out
}

struct Ep<'a> {
    addr: SocketAddr,
    e: &'a Endpoint,
    local: bool,
}

/// Merged endpoints of a port: the slice port of the same name and protocol, `addresses[0]`, duplicates
/// keeping the local copy.
fn endpoints<'a>(model: &'a Model, svc: &Service, port: &ServicePort, v4: bool, node: &str) -> Vec<Ep<'a>> {
    let mut merged: BTreeMap<SocketAddr, Ep<'a>> = BTreeMap::new();
    for s in model.slices.values().filter(|s| s.service_name.as_deref() == Some(&svc.key.name)) {
        if (s.address_type == AddressType::IPv4) != v4 {
            continue;
        }
        let Some(sp) = s.ports.iter().find(|p| p.name == port.name && p.protocol == port.protocol) else {
            continue;
        };
        for e in &s.endpoints {
            let addr = SocketAddr::new(e.address.expect("generated"), sp.port);
            let local = e.node_name.as_deref() == Some(node);
            if merged.get(&addr).is_none_or(|old| !old.local && local) {
                merged.insert(addr, Ep { addr, e, local });
            }
        }
    }
    merged.into_values().collect()
}

fn sorted<'a>(it: impl Iterator<Item = &'a Ep<'a>>) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = it.map(|e| e.addr).collect();
    v.sort();
    v
}

fn node_hints(e: &Endpoint) -> Option<&NameList> {
    e.hints.for_nodes()
}

fn zone_hints(e: &Endpoint) -> Option<&NameList> {
    e.hints.for_zones()
}

fn ready(e: &Endpoint) -> bool {
    e.conditions.ready.unwrap_or(true)
}

fn serving_terminating(e: &Endpoint) -> bool {
    e.conditions.serving.unwrap_or(true) && e.conditions.terminating.unwrap_or(false)
}

/// The tiers and flags of traffic under `policy`.
fn policy_set(policy: Policy, eps: &[Ep<'_>], node: &NodeView) -> ([Vec<SocketAddr>; 3], u32) {
    match policy {
        Policy::Local => {
            let any = eps.iter().any(|e| ready(e.e) || serving_terminating(e.e));
            let flags = FLAG_POLICY_LOCAL | if any { FLAG_EMPTY_IS_DROP } else { 0 };
            ([local_set(eps), Vec::new(), Vec::new()], flags)
        }
        Policy::Cluster => (cluster_tiers(eps, &node.name, node.zone.as_deref()), 0),
    }
}

/// Local set: this node's ready endpoints, else its serving and terminating ones; hints never apply.
fn local_set(eps: &[Ep<'_>]) -> Vec<SocketAddr> {
    let set = sorted(eps.iter().filter(|e| e.local && ready(e.e)));
    if set.is_empty() { sorted(eps.iter().filter(|e| e.local && serving_terminating(e.e))) } else { set }
}

/// DESIGN.md's semantics: node hints only if every ready endpoint has forNodes and one names this node; else
/// zone hints under the same rule; cluster = ready, else serving+terminating.
fn cluster_tiers(eps: &[Ep<'_>], node: &str, zone: Option<&str>) -> [Vec<SocketAddr>; 3] {
    let r: Vec<&Ep<'_>> = eps.iter().filter(|e| ready(e.e)).collect();
    let all = |f: fn(&Endpoint) -> Option<&NameList>| {
        !r.is_empty() && r.iter().all(|e| f(e.e).is_some_and(|v| !v.is_empty()))
    };
    let names = |e: &Ep<'_>, f: fn(&Endpoint) -> Option<&NameList>, want: &str| {
        f(e.e).is_some_and(|v| v.iter().any(|x| **x == *want))
    };
    let node_tier = if all(node_hints) && r.iter().any(|e| names(e, node_hints, node)) {
        sorted(r.iter().copied().filter(|e| names(e, node_hints, node)))
    } else {
        Vec::new()
    };
    let zone_tier = match zone {
        Some(z) if all(zone_hints) && r.iter().any(|e| names(e, zone_hints, z)) => {
            sorted(r.iter().copied().filter(|e| names(e, zone_hints, z)))
        }
        _ => Vec::new(),
    };
    let mut cluster = sorted(r.iter().copied());
    if cluster.is_empty() {
        cluster = sorted(eps.iter().filter(|e| serving_terminating(e.e)));
    }
    [node_tier, zone_tier, cluster]
}
